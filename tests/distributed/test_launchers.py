"""pycoll.init() under each launcher a user would reach for: pycoll run, torchrun, Open MPI's mpirun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "allreduce.py"
WORLD = 3


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _assert_all_ranks_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for r in range(WORLD):
        assert f"rank {r} of {WORLD}: allreduce ok" in proc.stdout, proc.stdout + proc.stderr


def test_pycoll_run() -> None:
    _assert_all_ranks_ok(_run([sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(EXAMPLE)]))


def test_pycoll_run_names_the_failed_rank(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "import pycoll\n"
        "pycoll.init()\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    proc = _run([sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(script)], timeout=60)
    assert proc.returncode != 0
    assert "rank 1" in proc.stderr, proc.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun (torch) is not installed")
def test_torchrun() -> None:
    cmd = ["torchrun", "--standalone", f"--nproc-per-node={WORLD}", str(EXAMPLE)]
    _assert_all_ranks_ok(_run(cmd))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_mpirun() -> None:
    cmd = ["mpirun", "-n", str(WORLD), sys.executable, str(EXAMPLE)]
    if os.geteuid() == 0:
        cmd[1:1] = ["--allow-run-as-root"]
    cmd[1:1] = ["--oversubscribe"]
    _assert_all_ranks_ok(_run(cmd))
