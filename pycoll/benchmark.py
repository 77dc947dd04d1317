"""The all-reduce timing loop shared by ``pycoll bench`` and the baselines in ``bench/baselines``.

This module knows nothing about any communication library: the caller hands it three callables
(an in-place all-reduce, a barrier and an element-wise max all-reduce) and it measures, so pycoll,
Open MPI and Gloo are timed by exactly the same code. It imports only numpy and the standard library
and never the rest of pycoll, so the baselines can load it without pycoll's native module.

What is reported follows nccl-tests (see DESIGN.md, "Measuring"):

- ``time``: for every timed iteration the slowest rank's time (per-iteration times combined across
  ranks with ``reduce_max``), then the median over the iterations. Every iteration, timed or not, is
  preceded by a barrier, so an iteration's time is that of one isolated all-reduce started together.
- ``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n`` (bytes in GB/s, 1 GB = 1e9 bytes).
- ``#wrong``: with checking on, every iteration (warm-up included) starts from the rank-dependent
  input ``x_r[i] = r + 1 + (i % 7)`` and its result is compared element by element with the closed
  form ``n(n+1)/2 + n * (i % 7)``; per iteration the differing elements are summed over the ranks and
  the worst iteration is reported. The input is re-filled between iterations, outside the timed
  region. With checking off the input is not re-filled (values simply keep growing) and ``#wrong`` is
  not known (``None``, printed as ``N/A``).

The sum is exact in float32 up to several thousand ranks (every partial sum is an integer below 2**24),
so a correct all-reduce reports 0 whatever order it adds in.

Lossy all-reduce (compression, ``pycoll bench --compression``): the caller passes ``inputs=``, an
``Inputs`` object that gives each rank's input and judges a result (``ExactInputs``, the default, is the
pattern above). For a codec, pycoll/cli/bench.py gives Gaussian inputs (``gaussian_input``), counts as
``#wrong`` the elements outside the codec's derived error bound, and reports ``error``, the relative L2
error ||out - exact|| / ||exact|| against the float64 exact sum (worst iteration, worst rank). ``bytes``
stays the uncompressed size, so algbw and busbw are *effective* bandwidths. ``run_interleaved_sweep``
times several variants (e.g. no codec and int8) size by size, A B A B, so their ratios come from the
same minutes of a noisy machine.

Other reduction ops and element types (``pycoll bench -o`` / ``-d``, nccl-tests' names in
``DATATYPES`` / ``REDOPS``): ``ExactInputs(op)`` picks, per op, type and world size, inputs whose
reduction is exact in that type whatever order the ranks combine them in, and a closed form of the
result (``exact_input`` / ``exact_expected``; the derivation is in ``exact_pattern``'s docstring), so
``#wrong`` stays an exact element-by-element comparison for every op and type.

Every ``Result`` names its series (``library``, ``algorithm``, ``codec``; ``label`` joins them) and
keeps ``times_us``, the per-iteration slowest-rank times the median was taken from.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import DTypeLike
else:
    DTypeLike = Any

# numpy is imported where it is used, not here: `pycoll --help` loads this module (for the flags of
# `pycoll bench`) and must stay fast.

__all__ = [
    "DATATYPES",
    "REDOPS",
    "ExactInputs",
    "Inputs",
    "ProgressLine",
    "Result",
    "Variant",
    "add_sweep_arguments",
    "bus_factor",
    "default_iters",
    "default_warmup",
    "exact_expected",
    "exact_input",
    "exact_pattern",
    "expected_sum",
    "format_footer",
    "format_header",
    "format_json_lines",
    "format_row",
    "format_size",
    "format_table",
    "gaussian_input",
    "make_result",
    "memcpy_bandwidth",
    "parse_size",
    "rank_input",
    "read_json_lines",
    "relative_error",
    "resolve_dtype",
    "result_from_dict",
    "result_to_dict",
    "run_allreduce_sweep",
    "run_and_report",
    "run_interleaved_sweep",
    "sweep_kwargs",
    "sweep_sizes",
    "variant_label",
]

AllReduceFn = Callable[["np.ndarray"], Any]
BarrierFn = Callable[[], Any]
ReduceMaxFn = Callable[["np.ndarray"], "np.ndarray"]
#: Judges one result on one rank: (elements wrong / outside the bound, relative L2 error or None).
JudgeFn = Callable[["np.ndarray"], "tuple[int, float | None]"]
#: Untimed work of a variant around each iteration (e.g. copying to and from a GPU).
HookFn = Callable[["np.ndarray"], Any]
#: Called before each (size, variant) of a sweep: (size index, number of sizes, bytes, variant).
ProgressFn = Callable[[int, int, int, "Variant"], Any]

#: nccl-tests' ``-d`` names and the numpy dtype names pycoll reports them as (the ``type`` column).
DATATYPES: dict[str, str] = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
#: nccl-tests' ``-o`` names (the ``redop`` column), in nccl-tests' order.
REDOPS = ("sum", "prod", "max", "min", "avg")
#: Significant bits of the floating types: every integer up to 2**bits is exact in them.
_SIGNIFICANT_BITS = {"float32": 24, "float64": 53, "float16": 11, "bfloat16": 8}

# Iteration counts when the caller gives none: about 128 MiB of payload per size, between 5 and 100
# timed iterations, plus a fifth of that (at least 2) as warm-up; and fewer timed iterations when the
# warm-up shows they would take more than DEFAULT_TIME_BUDGET_S. The 4 KiB..64 MiB sweep then moves
# at most ~1.7 GiB per rank and takes seconds for pycoll and Open MPI, ~20 s for Gloo at 4 ranks on 2
# cores (whose small messages take ~7 ms each there).
_BYTES_PER_SIZE = 128 << 20
_MIN_ITERS = 5
_MAX_ITERS = 100
_MIN_WARMUP = 2
#: With automatic iteration counts, about the most seconds the timed iterations of one size may take.
DEFAULT_TIME_BUDGET_S = 0.5


@dataclass(frozen=True)
class Result:
    """One row of the table: all-reduce of ``bytes`` bytes (``count`` elements) on ``world`` ranks."""

    bytes: int
    count: int
    dtype: str
    redop: str
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int | None
    world: int
    iters: int
    warmup: int
    #: "none", or the codec the all-reduce compressed with (``bytes`` is still the uncompressed size).
    codec: str = "none"
    #: ||out - exact|| / ||exact|| of the worst checked iteration and rank (None when not checked).
    rel_error: float | None = None
    #: Who did the all-reduce: "pycoll", "gloo", "mpi", "nccl" ("" when the caller did not say).
    library: str = ""
    #: The library's algorithm: pycoll's auto/ring/tree/direct; "default" for a baseline's own choice.
    algorithm: str = ""
    #: Per timed iteration, the slowest rank's time (us), in the order run: ``time_us`` is their median.
    times_us: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        """The series this result belongs to (``variant_label``)."""
        return variant_label(self.library, self.algorithm, self.codec)


def variant_label(library: str, algorithm: str = "", codec: str = "none") -> str:
    """A series' name: ``library/algorithm/codec`` without the parts that say nothing.

    ``("pycoll", "ring", "none")`` -> ``"pycoll/ring"``, ``("pycoll", "direct", "int8")`` ->
    ``"pycoll/direct/int8"``, ``("gloo", "default", "none")`` -> ``"gloo"``; an empty library (results
    of callers that name none) leaves the codec alone."""
    parts = [part for part in (library, "" if algorithm == "default" else algorithm) if part]
    if codec != "none" or not parts:
        parts.append(codec)
    return "/".join(parts)


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n: the share of the buffer each rank must
    send (and receive) in a bandwidth-optimal all-reduce, so busbw compares across world sizes."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    return 2.0 * (world - 1) / world


def make_result(
    nbytes: int,
    count: int,
    dtype: DTypeLike,
    time_us: float,
    world: int,
    *,
    wrong: int | None,
    redop: str = "sum",
    iters: int = 0,
    warmup: int = 0,
    codec: str = "none",
    rel_error: float | None = None,
    library: str = "",
    algorithm: str = "",
    times_us: Sequence[float] = (),
) -> Result:
    """Build a ``Result``, deriving algbw and busbw from ``nbytes`` and ``time_us`` (for a compressed
    all-reduce ``nbytes`` is the uncompressed size: effective bandwidth)."""
    import numpy as np

    algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else math.inf
    return Result(
        bytes=nbytes,
        count=count,
        dtype=np.dtype(dtype).name,
        redop=redop,
        time_us=time_us,
        algbw_GBps=algbw,
        busbw_GBps=algbw * bus_factor(world),
        wrong=wrong,
        world=world,
        iters=iters,
        warmup=warmup,
        codec=codec,
        rel_error=rel_error,
        library=library,
        algorithm=algorithm,
        times_us=tuple(float(t) for t in times_us),
    )


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int | float) -> list[int]:
    """Message sizes min_bytes, min_bytes*factor, ... up to and including max_bytes."""
    if min_bytes <= 0:
        raise ValueError(f"min_bytes must be > 0, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValueError(f"max_bytes ({max_bytes}) must be >= min_bytes ({min_bytes})")
    if factor <= 1:
        raise ValueError(f"factor must be > 1, got {factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size = max(size + 1, int(size * factor))
    return sizes


def default_iters(nbytes: int) -> int:
    """Timed iterations for a message of ``nbytes`` when none are given: fewer for larger messages."""
    return int(min(_MAX_ITERS, max(_MIN_ITERS, _BYTES_PER_SIZE // max(nbytes, 1))))


def default_warmup(nbytes: int) -> int:
    """Warm-up iterations for a message of ``nbytes`` when none are given."""
    return max(_MIN_WARMUP, default_iters(nbytes) // 5)


def rank_input(rank: int, count: int, dtype: DTypeLike = "float32") -> np.ndarray:
    """Rank ``rank``'s input: ``x[i] = rank + 1 + (i % 7)``, small integers exact in every dtype."""
    import numpy as np

    pattern = np.arange(count, dtype=np.int64) % 7
    pattern += rank + 1
    return pattern.astype(dtype)


def expected_sum(world: int, count: int, dtype: DTypeLike = "float32") -> np.ndarray:
    """The all-reduce (sum) of ``rank_input`` over ``world`` ranks: ``n(n+1)/2 + n * (i % 7)``."""
    import numpy as np

    pattern = np.arange(count, dtype=np.int64) % 7
    pattern *= world
    pattern += world * (world + 1) // 2
    return pattern.astype(dtype)


def relative_error(out: np.ndarray, exact: np.ndarray) -> float:
    """||out - exact|| / ||exact|| (L2, in float64); 0 when both are zero, inf when only ``exact`` is.

    Computed without BLAS: OpenBLAS's threads spin for a while after a call (np.linalg.norm, np.dot)
    and would take the cores from the ranks of the next timed iteration."""
    import numpy as np

    exact64 = np.asarray(exact, dtype=np.float64)
    diff = math.sqrt(float(np.sum(np.square(np.asarray(out, dtype=np.float64) - exact64))))
    norm = math.sqrt(float(np.sum(np.square(exact64))))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def gaussian_input(rank: int, count: int, seed: int = 0, dtype: DTypeLike = "float32") -> np.ndarray:
    """Rank ``rank``'s Gaussian input (mean 0, standard deviation 1): a pure function of (rank, count,
    seed), so every rank can rebuild every rank's input and the exact sum."""
    import numpy as np

    rng = np.random.default_rng([seed, rank, count])
    return rng.standard_normal(count, dtype=np.float32).astype(dtype, copy=False)


class Inputs:
    """What a sweep feeds the all-reduce and how it judges the result (subclass and override both)."""

    def input(self, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        """Rank ``rank``'s input for one size (re-filled before every checked iteration)."""
        raise NotImplementedError

    def judge(self, rank: int, world: int, count: int, dtype: DTypeLike) -> JudgeFn:
        """A function judging rank ``rank``'s result for one size (made once per size, only when
        checking): it returns how many elements are wrong and the relative L2 error (or None)."""
        raise NotImplementedError


class ExactInputs(Inputs):
    """Inputs whose all-reduce with ``op`` is exact in the element type, and its closed form
    (``exact_input`` / ``exact_expected``): any differing element is wrong. With ``op="sum"`` on
    float32 these are ``rank_input`` / ``expected_sum``."""

    def __init__(self, op: str = "sum") -> None:
        if op not in REDOPS:
            raise ValueError(f"unknown op {op!r}; expected one of {', '.join(REDOPS)}")
        self.op = op

    def input(self, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        return exact_input(self.op, rank, world, count, dtype)

    def judge(self, rank: int, world: int, count: int, dtype: DTypeLike) -> JudgeFn:
        import numpy as np

        expected = exact_expected(self.op, world, count, dtype)

        def judge(x: np.ndarray) -> tuple[int, float | None]:
            wrong = int(np.count_nonzero(x != expected))
            return wrong, (relative_error(x, expected) if wrong else 0.0)

        return judge


# ---------------------------------------------------------------------------------------------------
# Exact inputs and closed forms for every op and type (``pycoll bench -o ... -d ...``).


def resolve_dtype(name: DTypeLike) -> np.dtype:
    """A numpy dtype from an nccl-tests name (``float``, ``half``, ``double``...), a numpy name or a
    dtype; ``bfloat16`` comes from ``ml_dtypes`` (ValueError naming the package when it is missing)."""
    import numpy as np

    if isinstance(name, str):
        key = DATATYPES.get(name.strip().lower(), name.strip().lower())
        if key == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise ValueError("bfloat16 needs the ml_dtypes package: pip install ml_dtypes") from None
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(key)
    return np.dtype(name)


def _is_float(dt: np.dtype) -> bool:
    return dt.name in _SIGNIFICANT_BITS


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """The type pycoll's kernels reduce ``dt`` in: float64 for float64, float32 for float32, float16
    and bfloat16 (which are rounded back to their own type after every step), ``dt`` for integers."""
    import numpy as np

    if dt.name == "float64" or not _is_float(dt):
        return dt
    return np.dtype(np.float32)


def exact_pattern(op: str, world: int, dtype: DTypeLike) -> str:
    """Which inputs ``exact_input`` gives for ``op`` on ``world`` ranks of ``dtype``, chosen so that
    every rank ends with a result known in closed form, bit for bit, whatever order the ranks add in.

    ``"ranks"``: ``x_r[i] = r + 1 + (i % 7)`` (the pattern of ``rank_input``), with ``k = i % 7``:
        sum = n(n+1)/2 + n·k, min = 1 + k, max = n + k, avg = sum / n = (n+1)/2 + k.
        Floating types: every input and every partial sum is an integer no larger than the total
        T = n(n+1)/2 + 6n, so when T <= 2**p (p significant bits: float32 24, float64 53, float16 11,
        bfloat16 8) no addition rounds, in any order, and the partial sums stored back in a half type
        after each step are exact too. The average is then exact as well: T / n = (n+1)/2 + k is a
        multiple of 1/2 below 2**(p-1), so float32(sum) / float32(n) in the compute type (float32
        for half and bfloat16) is exact and rounding it to the element type changes nothing.
        Integer types: sum wraps modulo 2**bits exactly as numpy's does, in any order (the expected
        value is the closed form cast to the type); min and max need n + 6 <= the type's maximum.
        Used for sum/avg while T <= 2**p (bfloat16: n <= 17, float16: n <= 57, float32: n <= 5785)
        and for min/max while n + 6 fits (int8: n <= 121, bfloat16: n <= 250).
    ``"pairs"``: ``x_r[i] = 1 + ((r + i) % 2)`` for larger worlds: the total is at most n + ceil(n/2),
        exact while that is <= 2**p; sum = n + (n // 2 if i is even else (n + 1) // 2); min and max are
        1 and 2 (for n = 1: 1 + (i % 2)); avg = float32(sum) / float32(n) rounded once to the type.
    ``"powers"`` (prod): ``x_r[i] = 2`` when ``(r + i) % 7 == 0``, else 1: the product is 2**c with
        c = #{r < n : (r + i) % 7 == 0}, a power of two, exact in every floating type (it overflows
        float16 to inf only past 105 ranks, which is then the expected value) and, in integer types,
        wrapping as numpy's does (2**7 in int8 is -128, 2**8 is 0).

    ValueError when no pattern is exact (``op="avg"`` on an integer type, or sums past 2**p with
    both patterns, e.g. bfloat16 on more than 170 ranks)."""
    import numpy as np

    if op not in REDOPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(REDOPS)}")
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    dt = resolve_dtype(dtype)
    n = world
    if op == "prod":
        return "powers"
    if op == "avg" and not _is_float(dt):
        raise ValueError(f"op avg needs a floating-point type, got {dt.name}")
    if _is_float(dt):
        limit = 2 ** _SIGNIFICANT_BITS[dt.name]
        if op in ("min", "max"):
            return "ranks" if n + 6 <= limit else "pairs"
        if n * (n + 1) // 2 + 6 * n <= limit:
            return "ranks"
        if n + (n + 1) // 2 <= limit:
            return "pairs"
        raise ValueError(
            f"no exact check of {op} on {dt.name} with {n} ranks (its sums round); run with -c 0"
        )
    if op in ("min", "max") and n + 6 > int(np.iinfo(dt).max):
        return "pairs"
    return "ranks"


def exact_input(op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
    """Rank ``rank``'s input for an exact check of ``op`` (see ``exact_pattern``)."""
    import numpy as np

    dt = resolve_dtype(dtype)
    pattern = exact_pattern(op, world, dt)
    i = np.arange(count, dtype=np.int64)
    if pattern == "ranks":
        values = i % 7 + (rank + 1)
    elif pattern == "pairs":
        values = (i + rank) % 2 + 1
    else:
        values = np.where((i + rank) % 7 == 0, 2, 1)
    return values.astype(dt)


def exact_expected(op: str, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
    """The closed form of the all-reduce with ``op`` of ``exact_input`` over ``world`` ranks, in
    ``dtype``, bit for bit (see ``exact_pattern``)."""
    import numpy as np

    dt = resolve_dtype(dtype)
    pattern = exact_pattern(op, world, dt)
    n = world
    i = np.arange(count, dtype=np.int64)
    if pattern == "powers":
        j = (-i) % 7  # the ranks r with (r + i) % 7 == 0 are r = j, j + 7, ...
        c = np.maximum(0, (n - j + 6) // 7)
        out = np.empty(count, dtype=dt)
        for power in np.unique(c).tolist():
            out[c == power] = _power_of_two(int(power), dt)
        return out
    if pattern == "ranks":
        k = i % 7
        total = n * (n + 1) // 2 + n * k
        low, high = 1 + k, n + k
    else:
        odd_ranks = np.where(i % 2 == 0, n // 2, (n + 1) // 2)  # ranks whose input is 2
        total = n + odd_ranks
        low = 1 + i % 2 if n == 1 else np.ones(count, dtype=np.int64)
        high = 1 + i % 2 if n == 1 else np.full(count, 2, dtype=np.int64)
    if op == "sum":
        return total.astype(dt)  # integers wrap here as they do in the all-reduce
    if op == "min":
        return low.astype(dt)
    if op == "max":
        return high.astype(dt)
    compute = _compute_dtype(dt)  # avg: float(sum) / float(n) in the compute type, rounded once
    return (total.astype(compute) / compute.type(n)).astype(dt)


def _power_of_two(power: int, dt: np.dtype) -> Any:
    """2**power in ``dt``: wrapping in integer types (as numpy's multiplication), inf past a float's
    range."""
    import numpy as np

    if _is_float(dt):
        with np.errstate(over="ignore"):
            return np.array(2.0**power if power < 1024 else math.inf, dtype=np.float64).astype(dt)[()]
    bits = dt.itemsize * 8
    value = (1 << power) % (1 << bits)
    if dt.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return dt.type(value)


@dataclass(frozen=True)
class Variant:
    """One of the all-reduces ``run_interleaved_sweep`` compares: its codec ("none" without), the
    in-place all-reduce and its inputs (``None``: ``ExactInputs(op)``), and what names its series:
    ``library``, ``algorithm`` (copied into each ``Result``) and ``op`` (the ``redop`` column; the
    all-reduce must reduce with it). ``before(x)`` / ``after(x)``, when given, run around every
    iteration outside the timed region: ``before`` ahead of the barrier (after the input is re-filled),
    ``after`` once the timed call returned and before the result is checked (e.g. copying ``x`` to a
    GPU tensor and back)."""

    codec: str
    allreduce: AllReduceFn
    inputs: Inputs | None = None
    library: str = ""
    algorithm: str = ""
    op: str = "sum"
    before: HookFn | None = None
    after: HookFn | None = None

    @property
    def label(self) -> str:
        """The series' name (``variant_label``): ``pycoll/ring``, ``pycoll/direct/int8``, ``gloo``."""
        return variant_label(self.library, self.algorithm, self.codec)


def run_allreduce_sweep(
    allreduce: AllReduceFn,
    barrier: BarrierFn,
    reduce_max: ReduceMaxFn,
    rank: int,
    world: int,
    *,
    min_bytes: int = 4096,
    max_bytes: int = 64 << 20,
    factor: int | float = 2,
    iters: int | None = None,
    warmup: int | None = None,
    check: bool = True,
    dtype: DTypeLike = "float32",
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S,
    on_result: Callable[[Result], None] | None = None,
    inputs: Inputs | None = None,
    codec: str = "none",
    op: str = "sum",
) -> list[Result]:
    """Time an in-place all-reduce (sum, or ``op``) for each size of the sweep; every rank must call this.

    ``allreduce(x)`` must reduce the numpy array ``x`` in place (its return value is ignored); within
    one size it is always given the same array object, so a wrapper may cache a view of it (e.g. a
    torch tensor sharing its memory). ``barrier()`` synchronises all ranks. ``reduce_max(a)`` returns
    the element-wise maximum of the float64 array ``a`` over all ranks (in place or not); it is used
    only to combine measurements, never on the data being checked.

    ``iters`` / ``warmup`` of ``None`` pick per-size counts (``default_iters`` / ``default_warmup``);
    with ``iters=None`` the timed count is further lowered (not below 5) when the warm-up shows that
    it would take the slowest rank more than ``time_budget_s`` seconds (``None``: no limit).
    ``on_result`` is called with each size's ``Result`` as soon as it is known (on every rank).
    ``inputs`` gives the inputs and judges results (``ExactInputs`` when ``None``); ``codec`` labels
    the results. Every rank returns the same list.
    """
    variant = Variant(codec, allreduce, inputs, op=op)
    return run_interleaved_sweep(
        [variant],
        barrier,
        reduce_max,
        rank,
        world,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        factor=factor,
        iters=iters,
        warmup=warmup,
        check=check,
        dtype=dtype,
        time_budget_s=time_budget_s,
        on_result=on_result,
    )


def run_interleaved_sweep(
    variants: Sequence[Variant],
    barrier: BarrierFn,
    reduce_max: ReduceMaxFn,
    rank: int,
    world: int,
    *,
    min_bytes: int = 4096,
    max_bytes: int = 64 << 20,
    factor: int | float = 2,
    iters: int | None = None,
    warmup: int | None = None,
    check: bool = True,
    dtype: DTypeLike = "float32",
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S,
    on_result: Callable[[Result], None] | None = None,
    progress: ProgressFn | None = None,
) -> list[Result]:
    """``run_allreduce_sweep`` for several variants, interleaved: for each size every variant in turn
    (A B C, A B C, ...), so variants compared on a noisy machine are timed in the same minutes.
    Returns the results size by size, variant by variant within a size. ``progress(i, n, bytes,
    variant)``, when given, is called before each variant of each size (i: index of the size, n: the
    number of sizes); a ``ProgressLine`` draws it on a terminal."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, {world})")
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if warmup is not None and warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not variants:
        raise ValueError("no variants to time")
    dt = resolve_dtype(dtype)
    results: list[Result] = []
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    for index, nbytes in enumerate(sizes):
        count = nbytes // dt.itemsize
        n_iters = iters if iters is not None else default_iters(nbytes)
        n_warmup = warmup if warmup is not None else default_warmup(nbytes)
        budget = time_budget_s if iters is None else None
        for variant in variants:
            if progress is not None:
                progress(index, len(sizes), nbytes, variant)
            result = _time_one_size(
                variant, barrier, reduce_max, rank, world, count, dt, n_iters, n_warmup, check, budget
            )
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def _time_one_size(
    variant: Variant,
    barrier: BarrierFn,
    reduce_max: ReduceMaxFn,
    rank: int,
    world: int,
    count: int,
    dt: np.dtype,
    n_iters: int,
    n_warmup: int,
    check: bool,
    budget_s: float | None,
) -> Result:
    import numpy as np

    allreduce, before, after = variant.allreduce, variant.before, variant.after
    inputs = variant.inputs if variant.inputs is not None else ExactInputs(variant.op)
    template = inputs.input(rank, world, count, dt)
    judge = inputs.judge(rank, world, count, dt) if check else None
    x = template.copy()
    wrong_counts: list[int] = []  # this rank's wrong elements, per iteration (warm-up included)
    worst_error = 0.0  # this rank's largest relative error over the iterations (nan counted as inf)
    error_known = check

    def iteration(first: bool) -> int:
        """One iteration: re-fill (when checking), barrier, timed all-reduce, check. Returns ns."""
        if check and not first:
            np.copyto(x, template)
        if before is not None:
            before(x)
        barrier()
        t0 = time.perf_counter_ns()
        allreduce(x)
        t1 = time.perf_counter_ns()
        if after is not None:
            after(x)
        if judge is not None:
            nonlocal worst_error, error_known
            wrong, error = judge(x)
            wrong_counts.append(int(wrong))
            if error is None:
                error_known = False
            else:
                worst_error = max(worst_error, math.inf if math.isnan(error) else float(error))
        return t1 - t0

    start = time.perf_counter_ns()
    for it in range(n_warmup):
        iteration(first=it == 0)
    if budget_s is not None and n_warmup > 0 and n_iters > _MIN_ITERS:
        # Fewer timed iterations when the slowest rank's warm-up says the default count would take
        # longer than the budget (Gloo's milliseconds per small message). Every rank gets the same
        # maximum, so every rank picks the same count.
        per_iter_ns = (time.perf_counter_ns() - start) / n_warmup
        slowest = float(np.asarray(reduce_max(np.array([per_iter_ns], dtype=np.float64)))[0])
        n_iters = max(_MIN_ITERS, min(n_iters, int(budget_s * 1e9 / max(slowest, 1.0))))
    times_ns = np.array(
        [iteration(first=n_warmup == 0 and it == 0) for it in range(n_iters)], dtype=np.float64
    )

    # Combine across ranks with one reduce_max: the per-iteration times, then a (iterations x world)
    # matrix in which this rank fills only its own column with its wrong counts, so that after the
    # element-wise max every rank holds every rank's counts; when checking, last, the worst relative
    # error and a flag set by any rank that could not give one (then it is unknown for all).
    wrong = np.zeros((len(wrong_counts), world), dtype=np.float64)
    wrong[:, rank] = wrong_counts
    parts = [times_ns, wrong.ravel()]
    if check:
        parts.append(np.array([worst_error, 0.0 if error_known else 1.0], dtype=np.float64))
    combined = np.asarray(reduce_max(np.concatenate(parts)), dtype=np.float64)
    slowest_ns = combined[:n_iters]
    wrong_all = combined[n_iters : n_iters + wrong.size].reshape(wrong.shape)
    time_us = float(statistics.median(slowest_ns.tolist())) / 1e3
    n_wrong = int(wrong_all.sum(axis=1).max()) if check else None
    rel_error = float(combined[-2]) if check and combined[-1] == 0 else None
    return make_result(
        count * dt.itemsize,
        count,
        dt,
        time_us,
        world,
        wrong=n_wrong,
        redop=variant.op,
        iters=n_iters,
        warmup=n_warmup,
        codec=variant.codec,
        rel_error=rel_error,
        library=variant.library,
        algorithm=variant.algorithm,
        times_us=(slowest_ns / 1e3).tolist(),
    )


# ---------------------------------------------------------------------------------------------------
# Output: an nccl-tests-style table and JSON lines.

_COLUMNS = (
    # (header, unit, width)
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 8),
    ("redop", "", 6),
    ("time", "(us)", 10),
    ("algbw", "(GB/s)", 7),
    ("busbw", "(GB/s)", 7),
    ("#wrong", "", 6),
)
#: With several libraries or algorithms: the series without its codec (``pycoll/ring``, ``gloo``),
#: after redop.
_VARIANT_COLUMN = ("variant", "", 19)  # fits "pycoll/hierarchical"
#: With a codec: which one (after redop and variant) and the relative error (before #wrong, which
#: stays last).
_CODEC_COLUMN = ("codec", "", 6)
_ERROR_COLUMN = ("error", "(rel)", 8)
_COLUMN_SEP = "  "


def _columns(codec_columns: bool, variant_column: bool = False) -> tuple[tuple[str, str, int], ...]:
    head: list[tuple[str, str, int]] = list(_COLUMNS[:4])
    if variant_column:
        head.append(_VARIANT_COLUMN)
    if codec_columns:
        head.append(_CODEC_COLUMN)
    head += _COLUMNS[4:7]
    if codec_columns:
        head.append(_ERROR_COLUMN)
    return (*head, *_COLUMNS[7:])


def _has_codec(results: Sequence[Result] | Sequence[Variant]) -> bool:
    return any(r.codec != "none" for r in results)


def _several_variants(results: Sequence[Result] | Sequence[Variant]) -> bool:
    """True when the results come from more than one (library, algorithm): the variant column."""
    return len({(r.library, r.algorithm) for r in results}) > 1


def _series_name(result: Result, full: bool) -> str:
    """How the footer names a result's series: the codec alone when only codecs differ."""
    return result.label if full else result.codec


def format_header(
    title: str | None = None, *, codec_columns: bool = False, variant_column: bool = False
) -> str:
    """The table's title (if any) and two header lines, each starting with '#' as in nccl-tests.
    ``codec_columns`` adds the codec and its relative error (compressed runs); ``variant_column`` the
    library/algorithm of each row (several variants)."""
    columns = _columns(codec_columns, variant_column)
    names = _COLUMN_SEP.join(f"{name:>{width}}" for name, _, width in columns)
    units = _COLUMN_SEP.join(f"{unit:>{width}}" for _, unit, width in columns)
    lines = [f"# {title}"] if title else []
    lines += ["#" + names[1:], "#" + units[1:]]
    return "\n".join(lines)


def _format_error(error: float | None) -> str:
    return "N/A" if error is None else f"{error:.2e}"


def format_row(result: Result, *, codec_columns: bool | None = None, variant_column: bool = False) -> str:
    """One table line for ``result`` (with codec columns when ``codec_columns``; by default when
    ``result`` was compressed; with its library/algorithm when ``variant_column``)."""
    if codec_columns is None:
        codec_columns = result.codec != "none"
    wrong = "N/A" if result.wrong is None else str(result.wrong)
    time_us = f"{result.time_us:.2f}" if result.time_us < 1e6 else f"{result.time_us:.4g}"
    values: tuple[str, ...] = (str(result.bytes), str(result.count), result.dtype, result.redop)
    if variant_column:
        values += (variant_label(result.library, result.algorithm),)
    if codec_columns:
        values += (result.codec,)
    values += (time_us, f"{result.algbw_GBps:.2f}", f"{result.busbw_GBps:.2f}")
    if codec_columns:
        values += (_format_error(result.rel_error),)
    values += (wrong,)
    columns = _columns(codec_columns, variant_column)
    cells = (f"{value:>{width}}" for value, (_, _, width) in zip(values, columns))
    return _COLUMN_SEP.join(cells)


def format_footer(results: Sequence[Result]) -> str:
    """Summary lines: wrong-result count and average bus bandwidth, as nccl-tests ends its output.

    With several series (codecs, libraries, algorithms) the average bus bandwidth is given per series
    (named by the codec alone when only codecs differ), and with compressed results the largest
    relative error too; "out of bounds" then also counts elements outside a codec's error bound."""
    known = [r.wrong for r in results if r.wrong is not None]
    wrong = str(sum(known)) if known else "N/A"
    full = _several_variants(results)
    names = list(dict.fromkeys(_series_name(r, full) for r in results))
    if len(names) <= 1 and not _has_codec(results):
        avg = statistics.fmean(r.busbw_GBps for r in results) if results else 0.0
        return f"# Out of bounds values : {wrong}\n# Avg bus bandwidth    : {avg:.3f}"
    avgs, errors = [], []
    for name in names:
        rows = [r for r in results if _series_name(r, full) == name]
        avgs.append(f"{name} {statistics.fmean(r.busbw_GBps for r in rows):.3f}")
        errs = [r.rel_error for r in rows]
        worst = None if any(e is None for e in errs) else max(e for e in errs if e is not None)
        errors.append(f"{name} {_format_error(worst)}")
    lines = [f"# Out of bounds values : {wrong}", f"# Avg bus bandwidth    : {', '.join(avgs)}"]
    if _has_codec(results):
        lines.append(f"# Max rel. error       : {', '.join(errors)}")
    return "\n".join(lines)


def format_table(results: Sequence[Result], title: str | None = None) -> str:
    """The whole table: header, one row per result, footer (codec columns if any result has a codec,
    the variant column if the results come from several libraries or algorithms)."""
    codec_columns = _has_codec(results)
    variant_column = _several_variants(results)
    parts = [format_header(title, codec_columns=codec_columns, variant_column=variant_column)]
    parts += [format_row(r, codec_columns=codec_columns, variant_column=variant_column) for r in results]
    parts.append(format_footer(results))
    return "\n".join(parts)


def result_to_dict(result: Result, **extra: Any) -> dict[str, Any]:
    """``result`` as a JSON-ready dict, with ``extra`` keys (host, library_version...) merged in.

    The ``Result`` fields win over ``extra``, except an empty ``library`` / ``algorithm`` (a caller
    that did not name them in its variants), which ``extra`` may then give. ``label`` (the series'
    name, ``variant_label``) is added; ``times_us`` is a list."""
    record = dict(extra)
    for key, value in asdict(result).items():
        if key in ("library", "algorithm") and not value and key in extra:
            continue
        record[key] = list(value) if key == "times_us" else value
    record["label"] = variant_label(record.get("library", ""), record.get("algorithm", ""), result.codec)
    return record


_RESULT_FIELDS = tuple(f.name for f in fields(Result))


def result_from_dict(record: Mapping[str, Any]) -> Result:
    """The ``Result`` a JSON record (``result_to_dict``) was made from; other keys are ignored."""
    values = {key: record[key] for key in _RESULT_FIELDS if key in record}
    if "times_us" in values:
        values["times_us"] = tuple(float(t) for t in values["times_us"])
    return Result(**values)


def format_json_lines(results: Iterable[Result], **extra: Any) -> str:
    """One JSON object per line per result, each carrying ``extra`` (e.g. host=...)."""
    return "".join(json.dumps(result_to_dict(r, **extra), sort_keys=True) + "\n" for r in results)


def read_json_lines(text: str) -> list[dict[str, Any]]:
    """Parse what ``format_json_lines`` wrote (blank lines ignored)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# Progress on a terminal


class ProgressLine:
    """A one-line progress display for long sweeps, redrawn in place with a carriage return:

        [ 37%]  size 5/15 (64 KiB)  pycoll/ring  float32 sum  12.3 s

    Drawn only when ``enabled`` (default: when ``stream``, default stderr, is a terminal), so logs and
    pipes get nothing. Call it as ``run_interleaved_sweep``'s ``progress``; ``context`` (e.g. the type
    and op of the current sweep) is shown after the variant; ``total_steps`` (every (size, variant) of
    every sweep) gives the percentage. ``clear()`` wipes the line (before printing a row) and
    ``close()`` ends it."""

    def __init__(
        self,
        total_steps: int = 0,
        stream: IO[str] | None = None,
        *,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            try:
                enabled = bool(isatty()) if isatty is not None else False
            except (OSError, ValueError):
                enabled = False
        self.enabled = enabled
        self.total_steps = total_steps
        self.context = ""
        self.steps = 0
        self._clock = clock
        self._start = clock()
        self._width = 0

    def __call__(self, index: int, n_sizes: int, nbytes: int, variant: Variant) -> None:
        self.steps += 1
        if not self.enabled:
            return
        parts = []
        if self.total_steps > 0:
            parts.append(f"[{min(100, 100 * (self.steps - 1) // self.total_steps):3d}%]")
        parts.append(f"size {index + 1}/{n_sizes} ({format_size(nbytes)})")
        parts.append(variant.label)
        if self.context:
            parts.append(self.context)
        parts.append(f"{self._clock() - self._start:.1f} s")
        self._draw("  ".join(parts))

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Wipe the line (the cursor goes back to its start)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def close(self) -> None:
        self.clear()


# ---------------------------------------------------------------------------------------------------
# Command-line helpers shared by `pycoll bench` and the baseline scripts, so all take the same flags.

_SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'4096', '4K', '64M', '1G' (binary multiples, as nccl-tests) -> bytes."""
    s = text.strip().upper()
    if s.endswith("IB"):
        s = s[:-2]
    elif len(s) > 1 and s.endswith("B") and s[-2] in "KMG":
        s = s[:-1]
    unit = s[-1] if s and s[-1] in _SUFFIXES else ""
    number = s[: len(s) - len(unit)] if unit else s
    try:
        value = float(number) * _SUFFIXES[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 4K, 64M)") from None
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"size must be a positive whole number of bytes: {text!r}")
    return int(value)


def format_size(nbytes: int) -> str:
    """4096 -> '4 KiB', 67108864 -> '64 MiB' (exact binary multiples only, else bytes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add nccl-tests-like flags: -b/-e/-f sizes, -n iters, -w warm-up, -c check, --json FILE."""
    parser.add_argument(
        "-b", "--minbytes", type=parse_size, default=4096, metavar="SIZE", help="smallest size (4K)"
    )
    parser.add_argument(
        "-e", "--maxbytes", type=parse_size, default=64 << 20, metavar="SIZE", help="largest size (64M)"
    )
    parser.add_argument("-f", "--stepfactor", type=float, default=2, metavar="F", help="size multiplier (2)")
    parser.add_argument(
        "-n",
        "--iters",
        type=_positive_int,
        default=None,
        metavar="N",
        help="timed iterations per size (auto)",
    )
    parser.add_argument(
        "-w",
        "--warmup_iters",
        type=_nonnegative_int,
        default=None,
        metavar="N",
        help="warm-up iterations (auto)",
    )
    parser.add_argument(
        "-c", "--check", type=int, choices=(0, 1), default=1, help="check results (1) or not (0)"
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="also write JSON lines to FILE")


def sweep_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``run_allreduce_sweep`` from flags added by ``add_sweep_arguments``."""
    factor = args.stepfactor
    return {
        "min_bytes": args.minbytes,
        "max_bytes": args.maxbytes,
        "factor": int(factor) if float(factor).is_integer() else factor,
        "iters": args.iters,
        "warmup": args.warmup_iters,
        "check": bool(args.check),
    }


# ---------------------------------------------------------------------------------------------------
# The physical limit on one host: memory bandwidth.


def memcpy_bandwidth(nbytes: int = 64 << 20, repeats: int = 10) -> dict[str, float]:
    """Single-process large copy (numpy) of ``nbytes``: median time and bandwidth.

    ``copy_GBps`` counts the bytes copied; ``rw_GBps`` counts bytes read plus bytes written (2x), the
    figure DESIGN.md and the issues quote ("one process copies memory at ~40 GB/s").
    """
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)  # fault in the pages before timing
    samples = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter_ns()
        np.copyto(dst, src)
        samples.append(time.perf_counter_ns() - t0)
    t_s = statistics.median(samples) * 1e-9
    return {
        "bytes": float(nbytes),
        "time_us": t_s * 1e6,
        "copy_GBps": nbytes / t_s / 1e9,
        "rw_GBps": 2 * nbytes / t_s / 1e9,
    }


# ---------------------------------------------------------------------------------------------------
# One call for a benchmark program's rank: run the sweep, print the table on rank 0, write JSON lines.


def _print_flush(line: str) -> None:
    print(line, flush=True)


def run_and_report(
    allreduce: AllReduceFn | None,
    barrier: BarrierFn,
    reduce_max: ReduceMaxFn,
    rank: int,
    world: int,
    args: argparse.Namespace,
    *,
    title: str,
    meta: Mapping[str, Any] | None = None,
    print_fn: Callable[[str], None] | None = None,
    variants: Sequence[Variant] | None = None,
    sweeps: Sequence[tuple[DTypeLike, Sequence[Variant]]] | None = None,
    record_meta: Callable[[Result], Mapping[str, Any]] | None = None,
    progress: ProgressLine | None = None,
) -> list[Result]:
    """Run ``run_allreduce_sweep`` with the flags of ``add_sweep_arguments``; rank 0 prints the table
    row by row as sizes finish and, with ``--json FILE``, writes one JSON line per size carrying
    ``meta`` (host, versions...) and ``record_meta(result)`` besides the ``Result`` fields.

    With ``variants`` (then ``allreduce`` is ignored and may be None) they are timed interleaved
    (``run_interleaved_sweep``), one row per size and variant, with codec columns if any variant has a
    codec and the variant column if they come from several libraries or algorithms. ``sweeps``, a list
    of (dtype, variants), runs one interleaved sweep after the other (e.g. one per type and op) into one
    table. ``progress`` (used on rank 0 only) is drawn while the sweeps run and wiped before each row."""
    lead = rank == 0
    if print_fn is None:
        print_fn = _print_flush
    if sweeps is None:
        if variants is None:
            if allreduce is None:
                raise ValueError("run_and_report needs allreduce, variants or sweeps")
            variants = [Variant("none", allreduce)]
        sweeps = [(getattr(args, "dtype", None) or "float32", variants)]
    sweeps = [(dtype, list(group)) for dtype, group in sweeps if group]
    if not sweeps:
        raise ValueError("no variants to time")
    every = [v for _, group in sweeps for v in group]
    codec_columns = _has_codec(every)
    variant_column = _several_variants(every)
    kwargs = sweep_kwargs(args)
    if not lead:
        progress = None
    if progress is not None:
        n_sizes = len(sweep_sizes(kwargs["min_bytes"], kwargs["max_bytes"], kwargs["factor"]))
        progress.total_steps = n_sizes * len(every)

    def show(result: Result) -> None:
        if lead:
            if progress is not None:
                progress.clear()
            print_fn(format_row(result, codec_columns=codec_columns, variant_column=variant_column))

    if lead:
        print_fn(format_header(title, codec_columns=codec_columns, variant_column=variant_column))
    results: list[Result] = []
    try:
        for dtype, group in sweeps:
            if progress is not None:
                ops = "/".join(dict.fromkeys(v.op for v in group))
                progress.context = f"{resolve_dtype(dtype).name} {ops}"
            results += run_interleaved_sweep(
                group, barrier, reduce_max, rank, world, dtype=dtype, on_result=show, progress=progress,
                **kwargs,
            )
    finally:
        if progress is not None:
            progress.close()
    if lead:
        print_fn(format_footer(results))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                for result in results:
                    extra = dict(meta or {})
                    if record_meta is not None:
                        extra.update(record_meta(result))
                    f.write(format_json_lines([result], **extra))
    return results
