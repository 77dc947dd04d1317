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
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import DTypeLike
else:
    DTypeLike = Any

# numpy is imported where it is used, not here: `pycoll --help` loads this module (for the flags of
# `pycoll bench`) and must stay fast.

__all__ = [
    "ExactInputs",
    "Inputs",
    "Result",
    "Variant",
    "add_sweep_arguments",
    "bus_factor",
    "default_iters",
    "default_warmup",
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
    "result_to_dict",
    "run_allreduce_sweep",
    "run_and_report",
    "run_interleaved_sweep",
    "sweep_kwargs",
    "sweep_sizes",
]

AllReduceFn = Callable[["np.ndarray"], Any]
BarrierFn = Callable[[], Any]
ReduceMaxFn = Callable[["np.ndarray"], "np.ndarray"]
#: Judges one result on one rank: (elements wrong / outside the bound, relative L2 error or None).
JudgeFn = Callable[["np.ndarray"], "tuple[int, float | None]"]

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
    """``rank_input`` / ``expected_sum``: exact in float32, so any differing element is wrong."""

    def input(self, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        return rank_input(rank, count, dtype)

    def judge(self, rank: int, world: int, count: int, dtype: DTypeLike) -> JudgeFn:
        import numpy as np

        expected = expected_sum(world, count, dtype)

        def judge(x: np.ndarray) -> tuple[int, float | None]:
            wrong = int(np.count_nonzero(x != expected))
            return wrong, (relative_error(x, expected) if wrong else 0.0)

        return judge


@dataclass(frozen=True)
class Variant:
    """One of the all-reduces ``run_interleaved_sweep`` compares: a label (the codec, "none" without),
    the in-place all-reduce and its inputs (``None``: ``ExactInputs``)."""

    codec: str
    allreduce: AllReduceFn
    inputs: Inputs | None = None


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
) -> list[Result]:
    """Time an in-place sum all-reduce for each size of the sweep; every rank must call this.

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
    variant = Variant(codec, allreduce, inputs)
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
) -> list[Result]:
    """``run_allreduce_sweep`` for several variants, interleaved: for each size every variant in turn
    (A B C, A B C, ...), so variants compared on a noisy machine are timed in the same minutes.
    Returns the results size by size, variant by variant within a size."""
    import numpy as np

    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, {world})")
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if warmup is not None and warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not variants:
        raise ValueError("no variants to time")
    dt = np.dtype(dtype)
    results: list[Result] = []
    for nbytes in sweep_sizes(min_bytes, max_bytes, factor):
        count = nbytes // dt.itemsize
        n_iters = iters if iters is not None else default_iters(nbytes)
        n_warmup = warmup if warmup is not None else default_warmup(nbytes)
        budget = time_budget_s if iters is None else None
        for variant in variants:
            result = _time_one_size(
                variant.allreduce,
                barrier,
                reduce_max,
                rank,
                world,
                count,
                dt,
                n_iters,
                n_warmup,
                check,
                budget,
                variant.inputs if variant.inputs is not None else ExactInputs(),
                variant.codec,
            )
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def _time_one_size(
    allreduce: AllReduceFn,
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
    inputs: Inputs,
    codec: str,
) -> Result:
    import numpy as np

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
        barrier()
        t0 = time.perf_counter_ns()
        allreduce(x)
        t1 = time.perf_counter_ns()
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
        iters=n_iters,
        warmup=n_warmup,
        codec=codec,
        rel_error=rel_error,
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
# With a codec: which one, after redop, and the relative error, before #wrong (which stays last).
_CODEC_COLUMNS = _COLUMNS[:4] + (("codec", "", 6),) + _COLUMNS[4:7] + (("error", "(rel)", 8),) + _COLUMNS[7:]
_COLUMN_SEP = "  "


def _columns(codec_columns: bool) -> tuple[tuple[str, str, int], ...]:
    return _CODEC_COLUMNS if codec_columns else _COLUMNS


def _has_codec(results: Sequence[Result]) -> bool:
    return any(r.codec != "none" for r in results)


def format_header(title: str | None = None, *, codec_columns: bool = False) -> str:
    """The table's title (if any) and two header lines, each starting with '#' as in nccl-tests.
    ``codec_columns`` adds the codec and its relative error (compressed runs)."""
    columns = _columns(codec_columns)
    names = _COLUMN_SEP.join(f"{name:>{width}}" for name, _, width in columns)
    units = _COLUMN_SEP.join(f"{unit:>{width}}" for _, unit, width in columns)
    lines = [f"# {title}"] if title else []
    lines += ["#" + names[1:], "#" + units[1:]]
    return "\n".join(lines)


def _format_error(error: float | None) -> str:
    return "N/A" if error is None else f"{error:.2e}"


def format_row(result: Result, *, codec_columns: bool | None = None) -> str:
    """One table line for ``result`` (with codec columns when ``codec_columns``; by default when
    ``result`` was compressed)."""
    if codec_columns is None:
        codec_columns = result.codec != "none"
    wrong = "N/A" if result.wrong is None else str(result.wrong)
    time_us = f"{result.time_us:.2f}" if result.time_us < 1e6 else f"{result.time_us:.4g}"
    values: tuple[str, ...] = (str(result.bytes), str(result.count), result.dtype, result.redop)
    if codec_columns:
        values += (result.codec,)
    values += (time_us, f"{result.algbw_GBps:.2f}", f"{result.busbw_GBps:.2f}")
    if codec_columns:
        values += (_format_error(result.rel_error),)
    values += (wrong,)
    cells = (f"{value:>{width}}" for value, (_, _, width) in zip(values, _columns(codec_columns)))
    return _COLUMN_SEP.join(cells)


def format_footer(results: Sequence[Result]) -> str:
    """Summary lines: wrong-result count and average bus bandwidth, as nccl-tests ends its output.

    With compressed results "out of bounds" counts elements outside the codec's error bound, and the
    average bus bandwidth and the largest relative error are given per codec."""
    known = [r.wrong for r in results if r.wrong is not None]
    wrong = str(sum(known)) if known else "N/A"
    if not _has_codec(results):
        avg = statistics.fmean(r.busbw_GBps for r in results) if results else 0.0
        return f"# Out of bounds values : {wrong}\n# Avg bus bandwidth    : {avg:.3f}"
    codecs = list(dict.fromkeys(r.codec for r in results))
    avgs, errors = [], []
    for codec in codecs:
        rows = [r for r in results if r.codec == codec]
        avgs.append(f"{codec} {statistics.fmean(r.busbw_GBps for r in rows):.3f}")
        errs = [r.rel_error for r in rows]
        worst = None if any(e is None for e in errs) else max(e for e in errs if e is not None)
        errors.append(f"{codec} {_format_error(worst)}")
    return (
        f"# Out of bounds values : {wrong}\n"
        f"# Avg bus bandwidth    : {', '.join(avgs)}\n"
        f"# Max rel. error       : {', '.join(errors)}"
    )


def format_table(results: Sequence[Result], title: str | None = None) -> str:
    """The whole table: header, one row per result, footer (codec columns if any result has a codec)."""
    codec_columns = _has_codec(results)
    parts = [format_header(title, codec_columns=codec_columns)]
    parts += [format_row(r, codec_columns=codec_columns) for r in results]
    parts.append(format_footer(results))
    return "\n".join(parts)


def result_to_dict(result: Result, **extra: Any) -> dict[str, Any]:
    """``result`` as a JSON-ready dict, with ``extra`` keys (library, algorithm...) merged in."""
    record = dict(extra)
    record.update(asdict(result))
    return record


def format_json_lines(results: Iterable[Result], **extra: Any) -> str:
    """One JSON object per line per result, each carrying ``extra`` (e.g. library="mpi")."""
    return "".join(json.dumps(result_to_dict(r, **extra), sort_keys=True) + "\n" for r in results)


def read_json_lines(text: str) -> list[dict[str, Any]]:
    """Parse what ``format_json_lines`` wrote (blank lines ignored)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


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
    meta: dict[str, Any] | None = None,
    print_fn: Callable[[str], None] | None = None,
    variants: Sequence[Variant] | None = None,
) -> list[Result]:
    """Run ``run_allreduce_sweep`` with the flags of ``add_sweep_arguments``; rank 0 prints the table
    row by row as sizes finish and, with ``--json FILE``, writes one JSON line per size carrying
    ``meta`` (library, algorithm, versions...) besides the ``Result`` fields.

    With ``variants`` (then ``allreduce`` is ignored and may be None) they are timed interleaved
    (``run_interleaved_sweep``), one row per size and variant, with codec columns if any variant has a
    codec."""
    lead = rank == 0
    if print_fn is None:
        print_fn = _print_flush
    if variants is None:
        if allreduce is None:
            raise ValueError("run_and_report needs allreduce or variants")
        variants = [Variant("none", allreduce)]
    codec_columns = any(v.codec != "none" for v in variants)

    def show(result: Result) -> None:
        if lead:
            print_fn(format_row(result, codec_columns=codec_columns))

    if lead:
        print_fn(format_header(title, codec_columns=codec_columns))
    results = run_interleaved_sweep(
        variants, barrier, reduce_max, rank, world, on_result=show, **sweep_kwargs(args)
    )
    if lead:
        print_fn(format_footer(results))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(format_json_lines(results, **(meta or {})))
    return results
