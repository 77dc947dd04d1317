"""The timing loop shared by ``pycoll bench``, calibration and the baselines in ``bench/baselines``: the
clock, warm-up, medians, the slowest rank's time, for any collective of ``pycoll.bench.collectives``.

This module knows nothing about any communication library: the caller hands it the collective to time
(a ``Variant``'s callable), a barrier and an element-wise max all-reduce, and it measures, so pycoll,
Open MPI and Gloo are timed by exactly the same code. Like the whole of ``pycoll.bench`` at import
time it loads only the standard library (numpy where it is used) and never the rest of pycoll, so the
baselines can load it without pycoll's native module.

What is reported follows nccl-tests (see docs/benchmarking.md#measuring):

- ``bytes``: the size, nccl-tests' (``collectives``: the all-reduce's buffer, the reduce-scatter's
  input, the all-gather's output; for the last two the element count is rounded down to a multiple of
  the world size).
- ``time``: for every timed iteration the slowest rank's time (per-iteration times combined across
  ranks with ``reduce_max``), then the median over the iterations. Every iteration, timed or not, is
  preceded by a barrier, so an iteration's time is that of one isolated collective started together.
- ``algbw = bytes / time`` and ``busbw = algbw * factor``, the collective's bus factor: 2(n-1)/n for
  all-reduce, (n-1)/n for reduce-scatter and all-gather (bytes in GB/s, 1 GB = 1e9 bytes).
- ``#wrong``: with checking on, every iteration (warm-up included) starts from the rank's input
  (``pycoll.bench.inputs``: ``x_r[i] = r + 1 + (i % 7)`` for a float32 sum) and its result is judged
  against a closed form; per iteration the differing elements are summed over the ranks and the worst
  iteration is reported. The input is re-filled (and a separate result buffer poisoned with NaN)
  between iterations, outside the timed region. With checking off nothing is re-filled (an
  all-reduce's values simply keep growing) and ``#wrong`` is not known (``None``, printed as ``N/A``).

Lossy collectives (compression, ``pycoll bench --compression``): a ``Variant`` carries ``inputs=``, an
``Inputs`` object that gives each rank's input and judges a result (``ExactInputs``, the default;
``CodecInputs`` for a codec, which counts as ``#wrong`` the elements outside the codec's derived error
bound and reports ``error``, the relative L2 error against the float64 exact result). ``bytes`` stays
the uncompressed size, so algbw and busbw are *effective* bandwidths. ``run_interleaved_sweep`` times
several variants size by size, A B A B, so their ratios come from the same minutes of a noisy machine.

Every ``Result`` names its series (``library``, ``algorithm``, ``codec``; ``label`` joins them) and
keeps ``times_us``, the per-iteration slowest-rank times the median was taken from; with a
``link.LinkCounter`` also the bytes and packets each rank's network interface sent per call.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pycoll.bench.collectives import get_collective
from pycoll.bench.inputs import ExactInputs, Inputs, resolve_dtype

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import DTypeLike

    from pycoll.bench.collectives import Collective
    from pycoll.bench.link import LinkCounter
else:
    DTypeLike = Any

__all__ = [
    "DEFAULT_TIME_BUDGET_S",
    "CollectiveFn",
    "Result",
    "Variant",
    "bus_factor",
    "default_iters",
    "default_warmup",
    "make_result",
    "memcpy_bandwidth",
    "run_allreduce_sweep",
    "run_interleaved_sweep",
    "sweep_sizes",
    "variant_label",
]

#: A variant's collective: called with ``Collective.args(x, out)``, ``(x,)`` for the in-place all-reduce.
CollectiveFn = Callable[..., Any]
AllReduceFn = CollectiveFn
BarrierFn = Callable[[], Any]
ReduceMaxFn = Callable[["np.ndarray"], "np.ndarray"]
#: Untimed work of a variant around each iteration (e.g. copying to and from a GPU), given the same
#: arguments as the collective.
HookFn = Callable[..., Any]
#: Called before each (size, variant) of a sweep: (size index, number of sizes, bytes, variant).
ProgressFn = Callable[[int, int, int, "Variant"], Any]

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
    """One row of the table: a collective of ``bytes`` bytes (``count`` elements: nccl-tests' size, see
    ``collectives``) on ``world`` ranks."""

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
    #: "none", or the codec the collective compressed with (``bytes`` is still the uncompressed size).
    codec: str = "none"
    #: ||out - exact|| / ||exact|| of the worst checked iteration and rank (None when not checked).
    rel_error: float | None = None
    #: Who ran the collective: "pycoll", "gloo", "mpi", "nccl" ("" when the caller did not say).
    library: str = ""
    #: The library's algorithm: pycoll's auto/ring/tree/direct; "default" for a baseline's own choice.
    algorithm: str = ""
    #: Per timed iteration, the slowest rank's time (us), in the order run: ``time_us`` is their median.
    times_us: tuple[float, ...] = ()
    #: "allreduce", "reduce_scatter" or "all_gather" (``collectives.COLLECTIVES``).
    collective: str = "allreduce"
    #: Per rank, the bytes and packets its network interface sent per call, and the TCP segments its host
    #: retransmitted (``link.LinkCounter``; empty when not counted).
    link_tx_bytes: tuple[float, ...] = ()
    link_tx_packets: tuple[float, ...] = ()
    link_tx_retrans: tuple[float, ...] = ()

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


def bus_factor(world: int, collective: str = "allreduce") -> float:
    """nccl-tests' bus-bandwidth factor of ``collective`` (2(n-1)/n for all-reduce, (n-1)/n for
    reduce-scatter and all-gather): the share of the buffer each rank must send (and receive) in a
    bandwidth-optimal algorithm, so busbw compares across world sizes (``collectives``)."""
    return get_collective(collective).bus_factor(world)


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
    collective: str = "allreduce",
) -> Result:
    """Build a ``Result``, deriving algbw and busbw (with ``collective``'s bus factor) from ``nbytes`` and
    ``time_us`` (for a compressed collective ``nbytes`` is the uncompressed size: effective bandwidth)."""
    import numpy as np

    algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else math.inf
    return Result(
        bytes=nbytes,
        count=count,
        dtype=np.dtype(dtype).name,
        redop=redop,
        time_us=time_us,
        algbw_GBps=algbw,
        busbw_GBps=algbw * bus_factor(world, collective),
        wrong=wrong,
        world=world,
        iters=iters,
        warmup=warmup,
        codec=codec,
        rel_error=rel_error,
        library=library,
        algorithm=algorithm,
        times_us=tuple(float(t) for t in times_us),
        collective=collective,
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


@dataclass(frozen=True)
class Variant:
    """One of the collectives ``run_interleaved_sweep`` compares: its codec ("none" without), the
    ``call`` and its inputs (``None``: ``ExactInputs(op, collective)``), the ``collective`` (a name of
    ``collectives.COLLECTIVES``; ``call`` is given its ``args``: ``call(x)`` reduces ``x`` in place for
    "allreduce", ``call(x, out)`` for the others), and what names its series: ``library``,
    ``algorithm`` (copied into each ``Result``) and ``op`` (the ``redop`` column; the collective must
    reduce with it; "none" for the all-gather). ``before(*args)`` / ``after(*args)``, when given, run
    around every iteration outside the timed region: ``before`` ahead of the barrier (after the input is
    re-filled), ``after`` once the timed call returned and before the result is checked (e.g. copying
    to a GPU tensor and back)."""

    codec: str
    call: CollectiveFn
    inputs: Inputs | None = None
    library: str = ""
    algorithm: str = ""
    op: str = "sum"
    before: HookFn | None = None
    after: HookFn | None = None
    collective: str = "allreduce"

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
    link: LinkCounter | None = None,
) -> list[Result]:
    """``run_allreduce_sweep`` for several variants, interleaved: for each size every variant in turn
    (A B C, A B C, ...), so variants compared on a noisy machine are timed in the same minutes.
    Returns the results size by size, variant by variant within a size. ``progress(i, n, bytes,
    variant)``, when given, is called before each variant of each size (i: index of the size, n: the
    number of sizes); a ``ProgressLine`` draws it on a terminal. ``link``, when given, counts what each
    rank's network interface sends per call, in a block of ``link.iters`` calls after each variant's
    timed iterations (``pycoll.bench.link``)."""
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
        n_iters = iters if iters is not None else default_iters(nbytes)
        n_warmup = warmup if warmup is not None else default_warmup(nbytes)
        budget = time_budget_s if iters is None else None
        for variant in variants:
            if progress is not None:
                progress(index, len(sizes), nbytes, variant)
            count = _element_count(get_collective(variant.collective), nbytes, dt, world)
            sweep = _SizeRun(variant, barrier, reduce_max, rank, world, count, dt, check)
            result = sweep.time(n_iters, n_warmup, budget)
            if link is not None:
                result = sweep.count_link(result, link)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def _element_count(collective: Collective, nbytes: int, dt: np.dtype, world: int) -> int:
    count = collective.count(nbytes, dt.itemsize, world)
    if count < 1:
        raise ValueError(
            f"{nbytes} bytes of {dt.name} is less than one element per rank for a {collective.label} of "
            f"{world} ranks"
        )
    return count


class _SizeRun:
    """One variant at one size: its buffers, and the iterations that time and check it."""

    def __init__(
        self,
        variant: Variant,
        barrier: BarrierFn,
        reduce_max: ReduceMaxFn,
        rank: int,
        world: int,
        count: int,
        dt: np.dtype,
        check: bool,
    ) -> None:
        self.variant, self.barrier, self.reduce_max = variant, barrier, reduce_max
        self.rank, self.world, self.count, self.dt, self.check = rank, world, count, dt, check
        self.collective = get_collective(variant.collective)
        inputs = variant.inputs if variant.inputs is not None else ExactInputs(variant.op, self.collective)
        self.template = inputs.input(rank, world, count, dt)
        self.judge = inputs.judge(rank, world, count, dt) if check else None
        self.x, self.out = self.collective.buffers(self.template, count, world)
        self.args = self.collective.args(self.x, self.out)
        self.wrong_counts: list[int] = []  # this rank's wrong elements, per iteration (warm-up included)
        self.worst_error = 0.0  # this rank's largest relative error over the iterations (nan counted as inf)
        self.error_known = check

    def iteration(self, first: bool) -> int:
        """One iteration: re-fill (when checking), barrier, the timed call, check. Returns ns."""
        variant, args = self.variant, self.args
        if self.check and not first:
            self.collective.refill(self.x, self.out, self.template)
        if variant.before is not None:
            variant.before(*args)
        self.barrier()
        t0 = time.perf_counter_ns()
        variant.call(*args)
        t1 = time.perf_counter_ns()
        if variant.after is not None:
            variant.after(*args)
        if self.judge is not None:
            wrong, error = self.judge(self.out)
            self.wrong_counts.append(int(wrong))
            if error is None:
                self.error_known = False
            else:
                self.worst_error = max(self.worst_error, math.inf if math.isnan(error) else float(error))
        return t1 - t0

    def time(self, n_iters: int, n_warmup: int, budget_s: float | None) -> Result:
        """Warm-up, then the timed iterations (fewer within ``budget_s``), combined over the ranks."""
        import numpy as np

        start = time.perf_counter_ns()
        for it in range(n_warmup):
            self.iteration(first=it == 0)
        if budget_s is not None and n_warmup > 0 and n_iters > _MIN_ITERS:
            # Fewer timed iterations when the slowest rank's warm-up says the default count would take
            # longer than the budget (Gloo's milliseconds per small message). Every rank gets the same
            # maximum, so every rank picks the same count.
            per_iter_ns = (time.perf_counter_ns() - start) / n_warmup
            slowest = float(np.asarray(self.reduce_max(np.array([per_iter_ns], dtype=np.float64)))[0])
            n_iters = max(_MIN_ITERS, min(n_iters, int(budget_s * 1e9 / max(slowest, 1.0))))
        times_ns = np.array(
            [self.iteration(first=n_warmup == 0 and it == 0) for it in range(n_iters)], dtype=np.float64
        )
        return self._combine(times_ns, n_warmup)

    def _combine(self, times_ns: np.ndarray, n_warmup: int) -> Result:
        """The ``Result``, from one reduce_max over the ranks: the per-iteration times, then a (iterations
        x world) matrix in which this rank fills only its own column with its wrong counts, so that after
        the element-wise max every rank holds every rank's counts; when checking, last, the worst
        relative error and a flag set by any rank that could not give one (then it is unknown for all)."""
        import numpy as np

        n_iters, world, check, variant = len(times_ns), self.world, self.check, self.variant
        wrong = np.zeros((len(self.wrong_counts), world), dtype=np.float64)
        wrong[:, self.rank] = self.wrong_counts
        parts = [times_ns, wrong.ravel()]
        if check:
            parts.append(np.array([self.worst_error, 0.0 if self.error_known else 1.0], dtype=np.float64))
        combined = np.asarray(self.reduce_max(np.concatenate(parts)), dtype=np.float64)
        slowest_ns = combined[:n_iters]
        wrong_all = combined[n_iters : n_iters + wrong.size].reshape(wrong.shape)
        return make_result(
            self.count * self.dt.itemsize,
            self.count,
            self.dt,
            float(statistics.median(slowest_ns.tolist())) / 1e3,
            world,
            wrong=int(wrong_all.sum(axis=1).max()) if check else None,
            redop=variant.op,
            iters=n_iters,
            warmup=n_warmup,
            codec=variant.codec,
            rel_error=float(combined[-2]) if check and combined[-1] == 0 else None,
            library=variant.library,
            algorithm=variant.algorithm,
            times_us=(slowest_ns / 1e3).tolist(),
            collective=self.collective.name,
        )

    def count_link(self, result: Result, link: LinkCounter) -> Result:
        """``result`` with the bytes and packets each rank's interface sent per call, over ``link.iters``
        calls back to back between barriers (``pycoll.bench.link``); not checked, not timed."""
        import numpy as np

        # A barrier after each read too: ranks sharing an interface must not send while one reads.
        self.barrier()
        before = link.read()
        self.barrier()
        for _ in range(link.iters):
            self.variant.call(*self.args)
        self.barrier()
        after = link.read()
        self.barrier()
        mine = np.full((3, self.world), -1.0)
        mine[:, self.rank] = np.subtract(after, before) / (link.iters * max(1, link.share))
        every = np.asarray(self.reduce_max(mine.ravel()), dtype=np.float64).reshape(3, self.world)
        tx_bytes, packets, retrans = (tuple(row.tolist()) for row in every)
        return replace(result, link_tx_bytes=tx_bytes, link_tx_packets=packets, link_tx_retrans=retrans)


# ---------------------------------------------------------------------------------------------------
# The physical limit on one host: memory bandwidth.


def memcpy_bandwidth(nbytes: int = 64 << 20, repeats: int = 10) -> dict[str, float]:
    """Single-process large copy (numpy) of ``nbytes``: median time and bandwidth.

    ``copy_GBps`` counts the bytes copied; ``rw_GBps`` counts bytes read plus bytes written (2x), the
    figure the design notes and the issues quote ("one process copies memory at ~40 GB/s").
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
