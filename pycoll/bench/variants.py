"""The variants one sweep of ``pycoll bench`` times, interleaved: pycoll's collective for every (algorithm
x codec) and the baselines' (``make_variants``), and calibration's ``compression="auto"``
(``auto_variant``); ``CodecInputs``, the inputs and judge of a compressed variant. Creating pycoll's
variants needs no communicator; running them does (``pycoll.init()``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pycoll.bench.collectives import Collective, get_collective
from pycoll.bench.inputs import (
    CODEC_OPS,
    INPUT_SEED,
    Inputs,
    JudgeFn,
    gaussian_input,
    resolve_dtype,
)
from pycoll.bench.timing import Variant

if TYPE_CHECKING:
    import numpy as np

    from pycoll.bench.baselines import Baseline

__all__ = ["CodecInputs", "auto_variant", "codec_pairs", "make_variants"]

#: Elements judged at a time in compressed runs (about; whole codec blocks).
_JUDGE_CHUNK = 1 << 16


def make_variants(
    algorithms: Sequence[str] = ("auto",),
    codecs: Sequence[str] = ("none",),
    baselines: Sequence[str | Baseline] = (),
    *,
    op: str = "sum",
    dtype: Any = "float32",
    collective: str = "allreduce",
) -> list[Variant]:
    """The variants one sweep of ``pycoll bench`` times, interleaved: pycoll's ``collective`` for every
    (algorithm x codec) that runs (``codec_pairs``: a compressed reduce-scatter runs direct or
    hierarchical, an all-gather too, or auto), algorithm-major, then each baseline that can run
    ``op`` on ``dtype``.

    Each ``Variant`` names its series: ``library`` ("pycoll" or the baseline), ``algorithm`` (the
    pycoll algorithm as given, "default" for a baseline), ``codec`` ("none" or the codec), ``op``
    ("none" for the all-gather, whatever ``op`` says); ``label`` joins them (``pycoll/ring``,
    ``pycoll/direct/int8``, ``gloo``). ``baselines`` are ``pycoll.bench.baselines.Baseline`` objects
    (``baselines.connect``) or names, connected here (then every rank must call this alike). An unknown
    algorithm, or a codec on a type or op it does not take, raises ValueError. Creating pycoll's
    variants needs no communicator; running them does (``pycoll.init()``)."""
    coll = get_collective(collective)
    dt_name = resolve_dtype(dtype).name
    op = op if coll.reduces else "none"
    coll.check_op(op)
    if any(codec != "none" for codec in codecs) and (dt_name != "float32" or op not in (*CODEC_OPS, "none")):
        raise ValueError(f"compression works on float32 with op sum or avg, not {dt_name} {op}")
    variants = [
        _variant(coll, codec, algorithm, op) for algorithm, codec in codec_pairs(coll, algorithms, codecs)
    ]
    names = [b for b in baselines if isinstance(b, str)]
    connected = iter(_connect(names) if names else [])
    for b in baselines:
        baseline = next(connected) if isinstance(b, str) else b
        variant = baseline.variant(op, dt_name, coll.name)
        if variant is not None:
            variants.append(variant)
    return variants


def codec_pairs(
    collective: str | Collective, algorithms: Sequence[str], codecs: Sequence[str]
) -> list[tuple[str, str]]:
    """The (algorithm, codec) pairs of pycoll's variants, algorithm-major: every algorithm uncompressed,
    and with each codec where ``collective`` takes one (``Collective.codec_algorithms``: any all-reduce
    algorithm; a reduce-scatter's or all-gather's direct, hierarchical and auto).
    ValueError for an algorithm the collective does not have."""
    coll = get_collective(collective)
    for algorithm in algorithms:
        if algorithm != "auto" and algorithm not in coll.algorithms:
            raise ValueError(
                f"unknown algorithm {algorithm!r} for {coll.name}; expected one of auto, "
                f"{', '.join(coll.algorithms)}"
            )
    return [
        (algorithm, codec)
        for algorithm in algorithms
        for codec in codecs
        if codec == "none" or algorithm in coll.codec_algorithms
    ]


def _connect(names: Sequence[str]) -> list[Baseline]:
    from pycoll.bench import baselines

    return baselines.connect(names)


def _variant(coll: Collective, name: str, algorithm: str, op: str = "sum") -> Variant:
    """pycoll's ``coll`` with one ``--compression`` value and ``algorithm``, with its inputs."""
    from pycoll.compression import get_codec

    codec = get_codec(name)
    call = coll.pycoll_call(op, algorithm, codec)
    kwargs: dict[str, Any] = {"library": "pycoll", "algorithm": algorithm, "op": op, "collective": coll.name}
    if codec is None:
        return Variant("none", call, **kwargs)
    inputs = CodecInputs(codec, coll.compressed_plan(algorithm), op=op, collective=coll.name)
    return Variant(name, call, inputs, **kwargs)


def auto_variant(error_budget: float = 1e-2) -> Variant:
    """pycoll's all-reduce with ``compression="auto"`` within ``error_budget`` (which picks its
    algorithm too), summing: the series ``pycoll/auto/auto`` that calibration checks auto's choices
    with."""
    import pycoll

    def auto(x: np.ndarray) -> None:
        pycoll.allreduce(x, compression="auto", error_budget=error_budget)

    return Variant("auto", auto, library="pycoll", algorithm="auto")


class CodecInputs(Inputs):
    """Inputs of a compressed run of ``collective`` with ``plan`` (the algorithm that runs): Gaussian,
    rank-dependent (``gaussian_input``); a result is judged against the float64 exact one, every rank
    rebuilding every rank's input: elements outside the codec's derived bound
    (``pycoll.compression.bounds``, through ``Collective.codec_reference``) are wrong, and the relative
    L2 error is reported. With ``op="avg"`` the result times the world size is judged as the sum."""

    def __init__(
        self,
        codec: Any,
        algorithm: str,
        seed: int = INPUT_SEED,
        *,
        op: str = "sum",
        collective: str = "allreduce",
    ) -> None:
        self.collective = get_collective(collective)
        if self.collective.reduces and op not in CODEC_OPS:
            raise ValueError(f"a codec takes op sum or avg, got {op!r}")
        self.codec = codec
        self.algorithm = algorithm
        self.seed = seed
        self.op = op

    def input(self, rank: int, world: int, count: int, dtype: Any) -> np.ndarray:
        return gaussian_input(rank, self.collective.input_count(count, world), self.seed, dtype)

    def judge(self, rank: int, world: int, count: int, dtype: Any) -> JudgeFn:
        import numpy as np

        if np.dtype(dtype) != np.float32:
            raise ValueError(f"compressed runs are checked for float32 data, got {np.dtype(dtype)}")
        # Chunks of whole codec blocks, so that judging allocates only small temporaries. No BLAS here
        # (np.dot, np.linalg.norm): OpenBLAS's worker threads keep spinning for a while after a call
        # and take the cores from the ranks, which slowed the next all-reduces 5-10x on two vCPUs.
        n = self.collective.output_count(count, world)
        block = max(1, int(self.codec.block_elems))
        step = block * max(1, _JUDGE_CHUNK // block)
        chunks = [(start, min(start + step, n)) for start in range(0, n, step)]
        exact, bound_of = self.collective.codec_reference(
            self.codec, self.algorithm, rank, world, count, self.seed, chunks
        )
        norm = _l2(exact)
        # The last result judged, and its verdict. Nearest rounding gives the same bits every iteration,
        # and a bitwise comparison costs what the exact check of an uncompressed run costs, so the
        # timed iterations are not spaced out by milliseconds of checking.
        last = np.empty(n, dtype=np.float32)
        verdict: list[tuple[int, float] | None] = [None]
        scale = world if self.op == "avg" else 1

        def judge(out: np.ndarray) -> tuple[int, float | None]:
            if verdict[0] is not None and np.array_equal(out, last):
                return verdict[0]
            wrong, squares = 0, 0.0
            for lo, hi in chunks:
                part = out[lo:hi].astype(np.float64) * scale  # as the sum
                err = np.abs(part - exact[lo:hi])
                wrong += int(np.count_nonzero(~(err <= bound_of(lo, hi, part))))  # NaN is wrong
                squares += _l2(err) ** 2
            diff = math.sqrt(squares)
            rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
            np.copyto(last, out)
            verdict[0] = (wrong, rel)
            return wrong, rel

        return judge


def _l2(a: np.ndarray) -> float:
    """||a||_2 without BLAS (see CodecInputs.judge)."""
    import numpy as np

    return math.sqrt(float(np.sum(np.square(a, dtype=np.float64))))
