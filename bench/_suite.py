"""The machinery of the pytest-benchmark suite in bench/ (conftest.py, test_allreduce.py,
test_reduce_scatter_all_gather.py).

How a measurement reaches pytest-benchmark
------------------------------------------
A collective is timed across processes: one number per iteration is the *slowest rank's* time, known
only after the ranks combined their clocks. pytest-benchmark times a callable in the pytest process,
which cannot measure that. So the measuring happens in a multi-rank **job** per world size and
collective: ``pycoll bench --worker`` ranks (started by ``pycoll bench``, through ``mpirun`` when the MPI
baseline is in), every variant (pycoll's algorithm x codec, Gloo, Open MPI, NCCL) interleaved size by
size, writing JSON lines whose ``times_us`` are the per-iteration slowest-rank times
(pycoll/bench/timing.py). The rank processes never run inside pytest. ``JobCache`` (a session fixture)
runs each job on first use, with a timeout, and keeps its records, or its error, which every case of
that job then fails with.

Each test case is one point (collective, world, size, library/algorithm, codec). It *replays* that
point's times into the ``benchmark`` fixture: ``benchmark.pedantic(step, rounds=len(times),
iterations=1)`` where each round's ``step()`` makes a replay clock advance by the next measured time.
The clock reaches pytest-benchmark through the ``benchmark`` marker's ``timer`` option
(``@pytest.mark.benchmark(timer=replay_timer)``, set on the suite module): of the ways pytest-benchmark
offers to choose the timer
(``--benchmark-timer``, global and on the user's command line; the marker, per test; replacing the
fixture's private ``_timer``), the marker is documented, scoped to these tests, and needs nothing from
the user. In pedantic mode pytest-benchmark calls the timer exactly twice per round (before and after
the target) and never calibrates (no timer-precision probing), so each round's duration is exactly
``end - start`` of the replay clock. ``ReplayClock.now`` returns 0.0 for a round's start and the
injected time for its end, so that difference is the measured float itself (no rounding from a running
sum). The stats pytest-benchmark derives (min, max, mean, median, stddev, IQR, rounds) are then those of
the measured per-iteration times, and ``--benchmark-save`` / ``--benchmark-json`` /
``--benchmark-compare`` work as for any benchmark. What no timer can carry (busbw, algbw, the codec's
error, #wrong, the series) goes into ``benchmark.extra_info``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------
# The replay clock


class ReplayClock:
    """A timer for pytest-benchmark that replays measured durations: ``elapse(d)`` (called by the
    benchmarked function) makes the next ``now()`` return ``d``; every other ``now()`` returns 0.0.
    So a pedantic round (``start = now(); target(); end = now()``) lasts exactly ``d`` seconds."""

    def __init__(self) -> None:
        self._pending = 0.0

    def now(self) -> float:
        value, self._pending = self._pending, 0.0
        return value

    def elapse(self, seconds: float) -> None:
        self._pending = float(seconds)


CLOCK = ReplayClock()


def replay_timer() -> float:
    """The timer the suite's ``benchmark`` marker names (``_suite.replay_timer`` in saved results)."""
    return CLOCK.now()


def replay(benchmark: Any, times_s: Sequence[float]) -> None:
    """Feed ``times_s`` (seconds, one per iteration, in the order measured) into the ``benchmark``
    fixture as that many rounds of one iteration each; the fixture must use ``replay_timer``."""
    if not times_s:
        raise ValueError("no measured times to replay")
    pending = iter([float(t) for t in times_s])

    def step() -> None:
        CLOCK.elapse(next(pending))

    benchmark.pedantic(step, rounds=len(times_s), iterations=1, warmup_rounds=0)


# ---------------------------------------------------------------------------------------------------
# The grid


@dataclass(frozen=True)
class Point:
    """One test case: a series (library, algorithm, codec) of ``collective`` at one size and world size."""

    world: int
    nbytes: int
    library: str
    algorithm: str
    codec: str
    collective: str = "allreduce"

    @property
    def label(self) -> str:
        from pycoll.bench.timing import variant_label

        return variant_label(self.library, self.algorithm, self.codec)

    @property
    def id(self) -> str:
        head = "" if self.collective == "allreduce" else f"{self.collective}-"
        return f"{head}w{self.world}-{size_name(self.nbytes)}-{self.label.replace('/', '-')}"

    @property
    def measured_bytes(self) -> int:
        """The size the job reports for ``nbytes`` (float32; rounded down to whole chunks, nccl-tests')."""
        from pycoll.bench.collectives import get_collective

        return get_collective(self.collective).count(self.nbytes, 4, self.world) * 4


def size_name(nbytes: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


@dataclass
class Grid:
    """What the suite measures: every collective x world x size x (pycoll algorithm x codec where the
    collective takes it, and each baseline)."""

    worlds: list[int]
    sizes: list[int]
    algorithms: list[str]
    codecs: list[str]
    baselines: list[str]
    iters: int | None = None
    warmup: int | None = None
    timeout_s: float = 600.0
    #: Baselines that cannot run here, per world: the reason their cases skip.
    unavailable: dict[tuple[str, int], str] = field(default_factory=dict)
    collectives: list[str] = field(default_factory=lambda: ["allreduce"])

    def pairs(self, collective: str) -> list[tuple[str, str]]:
        """pycoll's (algorithm, codec) of ``collective``: the grid's algorithms it has, codecs where it
        takes them (``pycoll.bench.variants.codec_pairs``)."""
        from pycoll.bench.collectives import get_collective
        from pycoll.bench.variants import codec_pairs

        has = get_collective(collective).algorithms
        return codec_pairs(collective, [a for a in self.algorithms if a == "auto" or a in has], self.codecs)

    def points(self, collectives: Sequence[str] | None = None) -> list[Point]:
        """The cases of ``collectives`` (default: the grid's)."""
        out = []
        for collective in [c for c in self.collectives if collectives is None or c in collectives]:
            pairs = self.pairs(collective)
            for world in self.worlds:
                for nbytes in self.sizes:
                    out += [Point(world, nbytes, "pycoll", a, c, collective) for a, c in pairs]
                    out += [
                        Point(world, nbytes, name, "default", "none", collective) for name in self.baselines
                    ]
        return out

    def available_baselines(self, world: int) -> list[str]:
        return [name for name in self.baselines if (name, world) not in self.unavailable]

    def sweep(self) -> tuple[int, int, int]:
        """(-b, -e, -f) of ``pycoll bench`` giving exactly ``sizes`` (which must be geometric)."""
        from pycoll.bench.timing import sweep_sizes

        sizes = self.sizes
        factor = sizes[1] // sizes[0] if len(sizes) > 1 else 2
        if len(sizes) > 1 and sweep_sizes(sizes[0], sizes[-1], factor) != sizes:
            raise ValueError(f"sizes must grow by one whole factor, got {sizes}")
        return sizes[0], sizes[-1], factor

    def command(self, world: int, json_path: str, collective: str = "allreduce") -> list[str]:
        """The job measuring every point of ``world`` and ``collective``: ``pycoll bench`` with all
        variants."""
        from pycoll.bench import jobs

        low, high, factor = self.sweep()
        algorithms = sorted({a for a, _ in self.pairs(collective)}, key=self.algorithms.index)
        job = jobs.Job(
            ranks=world,
            collective=collective,
            minbytes=low,
            maxbytes=high,
            stepfactor=factor,
            iters=self.iters,
            warmup_iters=self.warmup,
            algorithm=tuple(algorithms),
            compression=tuple(self.codecs),
            baseline=tuple(self.available_baselines(world)),
            json=json_path,
            progress="off",
        )
        return jobs.job_command(job)


def parse_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip() and item.strip() != "none"]


# ---------------------------------------------------------------------------------------------------
# Jobs


class JobFailed(Exception):
    """A world's job failed (exit code, timeout, no results): every case of that job fails with it."""


@dataclass
class Job:
    world: int
    command: list[str]
    records: dict[tuple[int, str, str, str], dict[str, Any]]
    wall_s: float
    output: str
    collective: str = "allreduce"

    def record(self, point: Point) -> dict[str, Any]:
        key = (point.measured_bytes, point.library, point.algorithm, point.codec)
        if key not in self.records:
            raise JobFailed(
                f"the {self.world}-rank {self.collective} job wrote no result for {point.label} at "
                f"{point.nbytes} bytes (it wrote {len(self.records)}); its output ends:\n{_tail(self.output)}"
            )
        return self.records[key]


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_job(
    cmd: list[str], json_path: Path, timeout_s: float, world: int, collective: str = "allreduce"
) -> Job:
    """Run one job, killing it (and its ranks) past ``timeout_s``; its records keyed by point."""
    from pycoll.bench.report import read_json_lines

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: a timeout stops the launcher and the ranks
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        output = _stop(proc)
        raise JobFailed(
            f"the {world}-rank job did not finish within {timeout_s:.0f} s (--bench-timeout) and was "
            f"stopped; command: {' '.join(cmd)}\n{_tail(output)}"
        ) from None
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise JobFailed(
            f"the {world}-rank job failed (exit code {proc.returncode}); command: {' '.join(cmd)}\n"
            f"{_tail(output)}"
        )
    try:
        rows = read_json_lines(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobFailed(f"the {world}-rank job wrote no readable results ({exc})\n{_tail(output)}") from None
    records = {(int(r["bytes"]), r["library"], r["algorithm"], r["codec"]): r for r in rows}
    return Job(world, cmd, records, wall, output, collective)


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM to the job's process group (the launcher stops its ranks; mpirun too), then SIGKILL."""
    for signum, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            output, _ = proc.communicate(timeout=wait_s)
            return output or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


class JobCache:
    """One job per world size and collective, run on first use; later uses get its records, or its
    error again."""

    def __init__(self, grid: Grid, workdir: Path) -> None:
        self.grid = grid
        self.workdir = workdir
        self._done: dict[tuple[int, str], Job | JobFailed] = {}

    def get(self, world: int, collective: str = "allreduce") -> Job:
        key = (world, collective)
        if key not in self._done:
            json_path = self.workdir / f"{collective}-{world}ranks.jsonl"
            cmd = self.grid.command(world, str(json_path), collective)
            try:
                self._done[key] = run_job(cmd, json_path, self.grid.timeout_s, world, collective)
            except JobFailed as exc:
                self._done[key] = exc
        result = self._done[key]
        if isinstance(result, JobFailed):
            raise JobFailed(str(result)) from None  # a fresh one per case: no stacked tracebacks
        return result

    def jobs(self) -> Iterable[Job]:
        return [job for job in self._done.values() if isinstance(job, Job)]


def extra_info(point: Point, record: dict[str, Any]) -> dict[str, Any]:
    """What the benchmark's JSON keeps besides the replayed times."""
    return {
        "algbw_GBps": record["algbw_GBps"],
        "busbw_GBps": record["busbw_GBps"],
        "error": record.get("rel_error"),
        "wrong": record.get("wrong"),
        "library": point.library,
        "algorithm": point.algorithm,
        "codec": point.codec,
        "world": point.world,
        "collective": point.collective,
        "bytes": record["bytes"],
        "dtype": record.get("dtype", "float32"),
        "library_version": record.get("library_version"),
        "time_us": record["time_us"],
    }


def check_point(benchmark: Any, bench_jobs: JobCache, bench_grid: Grid, point: Point) -> None:
    """One test case: replay ``point``'s measured times into ``benchmark`` (skipped, with the reason,
    when its baseline cannot run here); fail if its results were wrong."""
    import pytest

    reason = bench_grid.unavailable.get((point.library, point.world))
    if reason:
        pytest.skip(reason)
    record = bench_jobs.get(point.world, point.collective).record(point)
    from pycoll.bench.collectives import get_collective

    label = get_collective(point.collective).label  # "all-reduce": the groups' names as before
    what = f"{label} {record.get('dtype', 'float32')} {record.get('redop', 'sum')}"
    benchmark.group = f"{what}, {point.world} ranks, {size_name(point.nbytes)}"
    benchmark.extra_info.update(extra_info(point, record))
    replay(benchmark, [t * 1e-6 for t in record["times_us"]])
    assert record["wrong"] == 0, f"{point.label}: {record['wrong']} wrong elements at {point.nbytes} bytes"
