"""Reduce-scatter and all-gather: pycoll (algorithm x codec where it takes one) against Gloo,
Open MPI and NCCL, per world size and message size, as pytest-benchmark results, exactly as
test_allreduce.py does for the all-reduce (the size is nccl-tests' whole buffer; busbw = algbw * (n-1)/n).
"""

from __future__ import annotations

import pytest
from _suite import Grid, JobCache, Point, check_point, replay_timer

pytestmark = pytest.mark.benchmark(timer=replay_timer)

#: The collectives whose points the tests of this module get (conftest.pytest_generate_tests).
COLLECTIVES = ("reduce_scatter", "all_gather")


def test_reduce_scatter_all_gather(benchmark, bench_jobs: JobCache, bench_grid: Grid, point: Point) -> None:  # type: ignore[no-untyped-def]
    check_point(benchmark, bench_jobs, bench_grid, point)
