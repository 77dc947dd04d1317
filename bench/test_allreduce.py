"""All-reduce: pycoll (algorithm x codec) against Gloo, Open MPI and NCCL, per world size and message
size, as pytest-benchmark results (``pytest bench/ --benchmark-only``; options in conftest.py).

Each case replays the per-iteration slowest-rank times that its world's job measured (see _suite.py),
so pytest-benchmark's min / median / max are those of the all-reduce itself, and saves busbw, algbw,
the codec's error and #wrong in ``extra_info``. A case whose all-reduce returned a wrong result fails
after its times are recorded. test_reduce_scatter_all_gather.py does the same for those two.
"""

from __future__ import annotations

import pytest
from _suite import Grid, JobCache, Point, check_point, replay_timer

pytestmark = pytest.mark.benchmark(timer=replay_timer)

#: The collectives whose points the tests of this module get (conftest.pytest_generate_tests).
COLLECTIVES = ("allreduce",)


def test_allreduce(benchmark, bench_jobs: JobCache, bench_grid: Grid, point: Point) -> None:  # type: ignore[no-untyped-def]
    check_point(benchmark, bench_jobs, bench_grid, point)
