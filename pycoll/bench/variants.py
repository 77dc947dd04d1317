"""The variants one sweep of ``pycoll bench`` times, interleaved: pycoll's all-reduce for every
(algorithm x codec) and the baselines' (``make_variants``), and calibration's ``compression="auto"``
(``auto_variant``). Creating pycoll's variants needs no communicator; running them does
(``pycoll.init()``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pycoll.bench.inputs import CODEC_OPS, REDOPS, CodecInputs, resolve_dtype
from pycoll.bench.options import ALGORITHMS
from pycoll.bench.timing import Variant

if TYPE_CHECKING:
    import numpy as np

    from pycoll.bench.baselines import Baseline

__all__ = ["auto_variant", "make_variants"]


def make_variants(
    algorithms: Sequence[str] = ("auto",),
    codecs: Sequence[str] = ("none",),
    baselines: Sequence[str | Baseline] = (),
    *,
    op: str = "sum",
    dtype: Any = "float32",
) -> list[Variant]:
    """The variants one sweep of ``pycoll bench`` times, interleaved: pycoll's all-reduce for every
    (algorithm x codec), algorithm-major, then each baseline that can reduce ``op`` on ``dtype``.

    Each ``Variant`` names its series: ``library`` ("pycoll" or the baseline), ``algorithm`` (the
    pycoll algorithm as given, "default" for a baseline), ``codec`` ("none" or the codec), ``op``;
    ``label`` joins them (``pycoll/ring``, ``pycoll/direct/int8``, ``gloo``). ``baselines`` are
    ``pycoll.bench.baselines.Baseline`` objects (``baselines.connect``) or names, connected here
    (then every rank must call this alike). A codec on a type or op it does not take raises ValueError.
    Creating pycoll's variants needs no communicator; running them does (``pycoll.init()``)."""
    dt_name = resolve_dtype(dtype).name
    if op not in REDOPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(REDOPS)}")
    for algorithm in algorithms:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    variants = [_variant(codec, algorithm, op) for algorithm in algorithms for codec in codecs]
    if any(codec != "none" for codec in codecs) and (dt_name != "float32" or op not in CODEC_OPS):
        raise ValueError(f"compression works on float32 with op sum or avg, not {dt_name} {op}")
    names = [b for b in baselines if isinstance(b, str)]
    connected = iter(_connect(names) if names else [])
    for b in baselines:
        baseline = next(connected) if isinstance(b, str) else b
        variant = baseline.variant(op, dt_name)
        if variant is not None:
            variants.append(variant)
    return variants


def _connect(names: Sequence[str]) -> list[Baseline]:
    from pycoll.bench import baselines

    return baselines.connect(names)


def _variant(name: str, algorithm: str, op: str = "sum") -> Variant:
    """pycoll's all-reduce with one ``--compression`` value and ``algorithm``, with its inputs."""
    import pycoll
    from pycoll.algorithms.compressed import DEFAULT_COMPRESSED_ALGORITHM
    from pycoll.api import auto_compressed_algorithm
    from pycoll.compression import get_codec

    codec = get_codec(name)
    if codec is None:

        def plain(x: np.ndarray) -> None:
            pycoll.allreduce(x, op, algorithm=algorithm)

        return Variant("none", plain, library="pycoll", algorithm=algorithm, op=op)

    def compressed(x: np.ndarray) -> None:
        pycoll.allreduce(x, op, algorithm=algorithm, compression=codec)

    plan = algorithm
    if algorithm == "auto":  # the plan that runs decides the error bound
        initialized = pycoll.is_initialized()
        plan = auto_compressed_algorithm(pycoll.get_comm()) if initialized else DEFAULT_COMPRESSED_ALGORITHM
    inputs = CodecInputs(codec, plan, op=op)
    return Variant(name, compressed, inputs, library="pycoll", algorithm=algorithm, op=op)


def auto_variant(error_budget: float = 1e-2) -> Variant:
    """pycoll's all-reduce with ``compression="auto"`` within ``error_budget`` (which picks its
    algorithm too), summing: the series ``pycoll/auto/auto`` that calibration checks auto's choices
    with."""
    import pycoll

    def auto(x: np.ndarray) -> None:
        pycoll.allreduce(x, compression="auto", error_budget=error_budget)

    return Variant("auto", auto, library="pycoll", algorithm="auto")
