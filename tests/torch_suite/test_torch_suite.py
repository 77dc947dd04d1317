"""PyTorch's own generic distributed tests (``distributed_test``, shipped in the torch wheel) against the
"pycoll" backend, world size 2: the whole ``_DistTestBase`` in one driver run, with its skips decided as
for gloo (driver.py ``--gates gloo``) and a deadline per test. Every test gloo passes must pass on pycoll
(gloo's results: gloo_baseline.json, recorded with this torch; with another torch, gloo is run here too),
except those whose bodies are gloo's own (``GLOO_OWN``, each with its reason: none at world size 2); the
tests the suite keeps for MPI although pycoll has the op (CPU all-to-all) must pass too; nothing fails.
docs/torch-backend.md has the counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("expecttest", reason="torch's distributed_test needs expecttest (pip install expecttest)")

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("gloo_baseline.json")

#: Tests gloo passes whose bodies are gloo's own (they check gloo-only behaviour), and why. At world size 2
#: there are none: the monitored-barrier tests pass on pycoll's own report, which opens with the phrases
#: torch and gloo use (pycoll/torch/monitored.py).
GLOO_OWN: dict[str, str] = {}
#: What pycoll runs beyond gloo: the suite's CPU all-to-all tests, which it keeps for MPI.
BEYOND_GLOO = "test_all_to_all"


def _suite(backend: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{backend}.json"
    cmd = [sys.executable, "-m", "tests.torch_suite.driver", "--backend", backend, "--timeout", "60",
           "--json", str(out), "--log", str(tmp_path / f"{backend}-ranks.log")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), f"no results for {backend} (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


def _gloo(tmp_path: Path) -> dict[str, str]:
    """Each test's status with gloo: the recorded run, or a run now if it was recorded with another torch."""
    recorded = json.loads(BASELINE.read_text())
    if recorded["torch"] == torch.__version__:
        return {name: row[0] for name, row in recorded["tests"].items()}
    return {t["name"]: t["status"] for t in _suite("gloo", tmp_path)["tests"]}


def test_pytorch_distributed_suite_on_pycoll_as_on_gloo(tmp_path: Path) -> None:
    gloo = _gloo(tmp_path)
    got = _suite("pycoll", tmp_path)
    assert got["gates"] == "gloo" and got["world_size"] == 2
    pycoll = {t["name"]: t for t in got["tests"]}
    assert set(pycoll) == set(gloo), "the suite's tests differ from the gloo run's"
    failed = {n: t["detail"] for n, t in pycoll.items() if t["status"] == "fail"}
    assert not failed, f"{len(failed)} of torch's tests failed on pycoll: {failed}"
    passed_by_gloo = [n for n, status in gloo.items() if status == "pass"]
    not_passed = {n: pycoll[n]["detail"] for n in passed_by_gloo if pycoll[n]["status"] != "pass"}
    assert not_passed.keys() == GLOO_OWN.keys(), f"gloo passes these, pycoll does not: {not_passed}"
    beyond = {n for n, t in pycoll.items() if t["status"] == "pass" and gloo[n] != "pass"}
    assert beyond and all(n.startswith(BEYOND_GLOO) for n in beyond), sorted(beyond)
