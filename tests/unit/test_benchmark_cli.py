"""``pycoll bench`` (pycoll/cli/bench.py): arguments, and a short end-to-end run when pycoll is built."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pycoll.cli import bench

REPO = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    args = bench.build_parser().parse_args([])
    assert args.ranks == 4
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (4096, 64 << 20, 2)
    assert args.iters is None and args.warmup_iters is None
    assert args.check == 1 and args.algorithm == "auto" and not args.worker and args.json is None


def test_worker_arguments_round_trip(tmp_path: Path) -> None:
    parser = bench.build_parser()
    out = tmp_path / "r.jsonl"
    args = parser.parse_args(
        ["--ranks", "2", "-b", "1M", "-e", "8M", "-f", "4", "-n", "3", "-w", "0", "-c", "0"]
        + ["--algorithm", "ring", "--json", str(out)]
    )
    again = parser.parse_args(["--worker", *bench.worker_arguments(args)])
    assert again.worker
    for name in ("minbytes", "maxbytes", "stepfactor", "iters", "warmup_iters", "check", "algorithm"):
        assert getattr(again, name) == getattr(args, name), name
    assert again.json == str(out.resolve())


def test_rejects_bad_arguments() -> None:
    parser = bench.build_parser()
    for bad in (["--algorithm", "star"], ["-c", "2"], ["-n", "0"], ["-b", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert bench.main(parser.parse_args(["--ranks", "0"])) == 2


def test_registered_in_pycoll_command() -> None:
    from pycoll.cli import main

    parser = main.build_parser()
    args = parser.parse_args(["bench", "--ranks", "2", "-e", "8K"])
    assert args.func is bench.main and args.ranks == 2 and args.maxbytes == 8192


def test_help_does_not_import_numpy() -> None:
    code = "import sys; from pycoll.cli import bench; bench.build_parser(); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _native_available() -> bool:
    try:
        return importlib.util.find_spec("pycoll._C") is not None
    except ImportError:
        return False


@pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
@pytest.mark.parametrize("ranks", [1, 2])
def test_end_to_end(tmp_path: Path, ranks: int) -> None:
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", str(ranks), "-b", "4K", "-e", "64K"]
    cmd += ["-f", "4", "-n", "3", "-w", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert [row[0] for row in rows] == ["4096", "16384", "65536"]
    assert all(row[-1] == "0" for row in rows)  # #wrong
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["wrong"] for r in records] == [0, 0, 0]
    assert all(r["library"] == "pycoll" and r["world"] == ranks for r in records)


def test_namespace_from_main_parser_is_accepted_by_worker_arguments() -> None:
    ns = argparse.Namespace(
        minbytes=4096,
        maxbytes=8192,
        stepfactor=2.0,
        check=1,
        algorithm="auto",
        iters=None,
        warmup_iters=None,
        json=None,
    )
    assert bench.worker_arguments(ns) == [
        "-b",
        "4096",
        "-e",
        "8192",
        "-f",
        "2.0",
        "-c",
        "1",
        "--algorithm",
        "auto",
    ]
