"""Options and fixtures of the pytest-benchmark suite (``pytest bench/ --benchmark-only``); how it
measures is in _suite.py.

    pytest bench/ --benchmark-only                        # worlds 2 and 4, 4K..16M, every variant
    pytest bench/ --benchmark-only --quick                # a smoke subset, well under a minute
    pytest bench/ --benchmark-only --bench-worlds 2 --bench-sizes 1M,16M --bench-codecs none,int8
    pytest bench/ --benchmark-only --bench-collectives reduce_scatter   # one collective only
    pytest bench/ --benchmark-only --benchmark-save=base  # then, later: --benchmark-compare=0001
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # `import _suite` under any import mode
    sys.path.insert(0, HERE)

import _suite  # noqa: E402

#: The default grid: sized to finish within 10 minutes on the 2-vCPU development VM.
DEFAULTS = {
    "collectives": "allreduce,reduce_scatter,all_gather",
    "worlds": "2,4",
    "sizes": "4K,64K,1M,16M",
    "algorithms": "ring,tree,direct",
    "codecs": "none,fp16,bf16,int8,int4",
    "baselines": "gloo,mpi,nccl",
    "iters": 50,
    "warmup": 10,
    "timeout": 300.0,
}
#: --quick: one world, two sizes, four pycoll variants and the CPU baselines, few iterations.
QUICK = {
    "collectives": "allreduce,reduce_scatter,all_gather",
    "worlds": "2",
    "sizes": "4K,1M",
    "algorithms": "ring,direct",
    "codecs": "none,int8",
    "baselines": "gloo,mpi,nccl",
    "iters": 5,
    "warmup": 2,
    "timeout": 120.0,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pycoll-bench", "pycoll collectives' benchmark suite (bench/)")
    group.addoption(
        "--quick", action="store_true", help="smoke subset: world 2, sizes 4K and 1M, few variants"
    )
    group.addoption(
        "--bench-collectives", default=None, help=f"collectives timed ({DEFAULTS['collectives']})"
    )
    group.addoption("--bench-worlds", default=None, help=f"world sizes ({DEFAULTS['worlds']})")
    group.addoption("--bench-sizes", default=None, help=f"message sizes, geometric ({DEFAULTS['sizes']})")
    group.addoption("--bench-algorithms", default=None, help=f"pycoll algorithms ({DEFAULTS['algorithms']})")
    group.addoption("--bench-codecs", default=None, help=f"pycoll codecs ({DEFAULTS['codecs']})")
    group.addoption(
        "--bench-baselines",
        default=None,
        help=f"baselines in the same jobs ({DEFAULTS['baselines']}; 'none' for none); "
        "one that cannot run here skips with the reason",
    )
    group.addoption(
        "--bench-iters",
        type=int,
        default=None,
        help=f"timed iterations per point, 0 for pycoll bench's automatic counts ({DEFAULTS['iters']})",
    )
    group.addoption(
        "--bench-warmup", type=int, default=None, help=f"warm-up iterations ({DEFAULTS['warmup']})"
    )
    group.addoption(
        "--bench-timeout",
        type=float,
        default=None,
        help=f"seconds one world's job may take ({DEFAULTS['timeout']:.0f}; --quick {QUICK['timeout']:.0f})",
    )


def _count(given: int | None, default: object, *, zero_is_auto: bool = False) -> int | None:
    """An iteration count: the option's value (0 meaning automatic where ``zero_is_auto``), else the
    default."""
    if given is not None:
        return None if (zero_is_auto and given == 0) else given
    return default if isinstance(default, int) else None


def _grid(config: pytest.Config) -> _suite.Grid:
    grid = getattr(config, "_pycoll_bench_grid", None)
    if grid is not None:
        return grid
    base = QUICK if config.getoption("quick") else DEFAULTS

    def option(name: str) -> str:
        value = config.getoption(f"bench_{name}")
        return str(base[name]) if value is None else str(value)

    from pycoll.bench import baselines
    from pycoll.bench.options import parse_collective, parse_size

    try:
        grid = _suite.Grid(
            collectives=[parse_collective(c) for c in _suite.parse_list(option("collectives"))],
            worlds=[int(w) for w in _suite.parse_list(option("worlds"))],
            sizes=[parse_size(s) for s in _suite.parse_list(option("sizes"))],
            algorithms=_suite.parse_list(option("algorithms")),
            codecs=_suite.parse_list(option("codecs")) or ["none"],
            baselines=_suite.parse_list(option("baselines")),
            iters=_count(config.getoption("bench_iters"), base.get("iters"), zero_is_auto=True),
            warmup=_count(config.getoption("bench_warmup"), base.get("warmup")),
            timeout_s=float(config.getoption("bench_timeout") or base["timeout"]),
        )
        if "none" in option("codecs").split(","):
            grid.codecs = ["none", *[c for c in grid.codecs if c != "none"]]
        grid.sweep()
    except Exception as exc:  # noqa: BLE001 - a usage error, reported as such
        raise pytest.UsageError(f"bench/: bad --bench-* option: {exc}") from None
    for name in grid.baselines:
        for world in grid.worlds:
            reason = baselines.unavailable(name, world)
            if reason:
                grid.unavailable[(name, world)] = reason
    config._pycoll_bench_grid = grid  # type: ignore[attr-defined]
    return grid


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``point``: the grid's cases of the collectives the test module times (its ``COLLECTIVES``)."""
    if "point" in metafunc.fixturenames:
        collectives = getattr(metafunc.module, "COLLECTIVES", ("allreduce",))
        points = _grid(metafunc.config).points(collectives)
        metafunc.parametrize("point", points, ids=[p.id for p in points])


@pytest.fixture(scope="session")
def bench_grid(request: pytest.FixtureRequest) -> _suite.Grid:
    return _grid(request.config)


@pytest.fixture(scope="session")
def bench_jobs(
    request: pytest.FixtureRequest, bench_grid: _suite.Grid, tmp_path_factory: pytest.TempPathFactory
) -> _suite.JobCache:
    """``bench_jobs.get(world)``: that world's job, run on first use (see _suite.py)."""
    cache = _suite.JobCache(bench_grid, tmp_path_factory.mktemp("bench-jobs"))
    request.config._pycoll_bench_cache = cache  # type: ignore[attr-defined]  (for the summary)
    return cache


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    grid = getattr(config, "_pycoll_bench_grid", None)
    cache = getattr(config, "_pycoll_bench_cache", None)
    if grid is None or cache is None:
        return
    for job in cache.jobs():
        terminalreporter.write_line(
            f"pycoll bench job, {job.collective}, {job.world} ranks: {len(job.records)} points in "
            f"{job.wall_s:.1f} s"
        )
