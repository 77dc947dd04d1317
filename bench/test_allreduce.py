"""All-reduce: pycoll (algorithm x codec) against Gloo, Open MPI and NCCL, per world size and message
size, as pytest-benchmark results (``pytest bench/ --benchmark-only``; options in conftest.py).

Each case replays the per-iteration slowest-rank times that its world's job measured (see _suite.py),
so pytest-benchmark's min / median / max are those of the all-reduce itself, and saves busbw, algbw,
the codec's error and #wrong in ``extra_info``. A case whose all-reduce returned a wrong result fails
after its times are recorded.
"""

from __future__ import annotations

import pytest
from _suite import Grid, JobCache, Point, extra_info, replay, replay_timer, size_name

pytestmark = pytest.mark.benchmark(timer=replay_timer)


def test_allreduce(benchmark, bench_jobs: JobCache, bench_grid: Grid, point: Point) -> None:  # type: ignore[no-untyped-def]
    reason = bench_grid.unavailable.get((point.library, point.world))
    if reason:
        pytest.skip(reason)
    record = bench_jobs.get(point.world).record(point)
    benchmark.group = f"all-reduce {record.get('dtype', 'float32')} {record.get('redop', 'sum')}, " \
        f"{point.world} ranks, {size_name(point.nbytes)}"
    benchmark.extra_info.update(extra_info(point, record))
    replay(benchmark, [t * 1e-6 for t in record["times_us"]])
    assert record["wrong"] == 0, f"{point.label}: {record['wrong']} wrong elements at {point.nbytes} bytes"
