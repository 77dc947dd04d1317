"""bench/compare.py's summary (medians over rounds, per-round ratios, targets, markdown), on made-up runs."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import _bench_scripts
import pytest

from pycoll.bench.jobs import Job
from pycoll.bootstrap.spawn import module_command


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    return _bench_scripts.load("compare.py", "_bench_compare")


def _records(times_us: dict[int, float], world: int) -> list[dict[str, Any]]:
    factor = 2 * (world - 1) / world
    out = []
    for nbytes, t in times_us.items():
        algbw = nbytes / (t * 1e-6) / 1e9
        out.append(
            {"bytes": nbytes, "time_us": t, "algbw_GBps": algbw, "busbw_GBps": algbw * factor, "wrong": 0}
        )
    return out


def _run(compare: ModuleType, lib: str, world: int, rnd: int, times: dict[int, float]) -> Any:
    run = compare.Run(lib, world, rnd, ["true"])
    run.ok = True
    run.records = _records(times, world)
    return run


KB4, MB1, MB64 = 4 << 10, 1 << 20, 64 << 20


def test_ratios_are_medians_of_per_round_ratios(compare: ModuleType) -> None:
    # round 0 is a slow placement for everyone, rounds 1 and 2 fast: the per-round ratio stays 2.
    runs = []
    for rnd, scale in enumerate([3.0, 1.0, 1.0]):
        runs.append(_run(compare, "pycoll", 2, rnd, {KB4: 1.0 * scale, MB64: 5000.0 * scale}))
        runs.append(_run(compare, "mpi", 2, rnd, {KB4: 2.0 * scale, MB64: 10000.0 * scale}))
    summary = compare.summarize(runs, ["pycoll", "mpi"], [2])
    rows = {row["bytes"]: row for row in summary[2]}
    assert rows[MB64]["busbw_ratio"]["mpi"] == pytest.approx(2.0)
    assert rows[MB64]["busbw_ratio_range"]["mpi"] == pytest.approx([2.0, 2.0])
    assert rows[KB4]["latency_ratio"]["mpi"] == pytest.approx(0.5)
    assert rows[MB64]["time_us"]["pycoll"] == pytest.approx(5000.0)  # median over rounds


def test_targets(compare: ModuleType) -> None:
    runs = [
        _run(compare, "pycoll", 4, 0, {KB4: 10.0, MB1: 100.0, MB64: 1000.0}),
        _run(compare, "mpi", 4, 0, {KB4: 2.0, MB1: 150.0, MB64: 4000.0}),
        _run(compare, "gloo", 4, 0, {KB4: 100.0, MB1: 1000.0, MB64: 10000.0}),
    ]
    summary = compare.summarize(runs, ["pycoll", "mpi", "gloo"], [4])
    met = {(t["bytes"], t["target"]): t["met"] for t in compare.check_targets(summary, "pycoll")}
    assert met[(MB64, "busbw >= 3x Open MPI")] is True  # 4x
    assert met[(MB64, "busbw >= 5x Gloo")] is True  # 10x
    assert met[(MB1, "busbw >= 1x Open MPI")] is True
    assert met[(KB4, "latency <= 3x Open MPI")] is False  # 5x
    assert met[(KB4, "latency <= 0.2x Gloo")] is True  # 0.1x
    assert compare.check_targets(summary, "mpi") == []


def test_markdown_and_failed_runs(compare: ModuleType) -> None:
    runs = [
        _run(compare, "pycoll", 2, 0, {KB4: 1.0, MB64: 5000.0}),
        _run(compare, "mpi", 2, 0, {KB4: 2.0, MB64: 10000.0}),
    ]
    broken = compare.Run("gloo", 2, 0, ["false"])
    broken.error = "exit code 1: boom"
    runs.append(broken)
    libs = ["pycoll", "mpi", "gloo"]
    summary = compare.summarize(runs, libs, [2])
    meta = {"host": "h", "cpus": 2, "date": "d", "rounds": 1, "versions": {"mpi": "Open MPI v5"}}
    memcpy = [{"bytes": float(MB64), "rw_GBps": 40.0}]
    text = compare.markdown(summary, libs, memcpy, runs, compare.check_targets(summary, "pycoll"), meta)
    assert "| 64 MiB |" in text and "| 4 KiB |" in text
    assert "pycoll/Open MPI busbw" in text and "2.00×" in text
    assert "memcpy of 64 MiB" in text and "40.0 GB/s" in text
    assert "Failed runs" in text and "boom" in text
    assert "—" in text  # Gloo's missing figures


def test_commands(compare: ModuleType) -> None:
    args = compare.parse_args(["-e", "1M", "-n", "5"])
    assert args.libraries == ["pycoll", "mpi", "gloo"] and args.ranks == [2, 4] and args.rounds == 3
    mpi = compare.command_for("mpi", 4, "/tmp/x.jsonl", args)
    assert (
        "--oversubscribe" in mpi
        and mpi[mpi.index("-n") + 1] == "4"
        and mpi[-2:] == ["--json", "/tmp/x.jsonl"]
    )
    gloo = compare.command_for("gloo", 2, "/tmp/y.jsonl", args)
    assert "--nproc-per-node=2" in gloo and "torch.distributed.run" in gloo
    pyc = compare.command_for("pycoll", 2, "/tmp/z.jsonl", args)
    assert pyc[:3] == module_command("pycoll.bench.jobs") and pyc[3] == "--job"
    job = Job.from_json(pyc[4])
    assert job.ranks == 2 and job.json == "/tmp/z.jsonl" and job.iters == 5
    assert job.maxbytes == 1 << 20


def test_error_summary(compare: ModuleType) -> None:
    tail = (
        'exit code 1: Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
        "ImportError: pycoll/_C.so: file too short\npycoll run: rank 1 failed (exit code 1)\n"
    )
    assert compare.error_summary(tail) == "ImportError: pycoll/_C.so: file too short"
    assert compare.error_summary("timed out after 600 s") == "timed out after 600 s"
    assert compare.error_summary("") == "unknown error"


def test_retry_keeps_the_failed_attempt(compare: ModuleType, tmp_path: Path) -> None:
    marker = tmp_path / "tried"
    out = tmp_path / "r.jsonl"
    record = '{"bytes": 4096, "time_us": 1.0, "busbw_GBps": 1.0, "algbw_GBps": 1.0, "wrong": 0}'
    code = (
        f"import pathlib, sys; m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n    m.touch(); sys.exit('RuntimeError: first try fails')\n"
        f"pathlib.Path({str(out)!r}).write_text({record!r} + '\\n')\n"
    )
    run = compare.Run("mpi", 2, 0, [sys.executable, "-c", code])
    compare.execute(run, str(out), timeout=60, verbose=False, retries=1)
    assert run.ok and run.records[0]["bytes"] == 4096
    assert len(run.failed_attempts) == 1 and "first try fails" in run.failed_attempts[0]
