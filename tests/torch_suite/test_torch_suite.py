"""PyTorch's own generic distributed tests (``distributed_test``, shipped in the torch wheel) against the
"pycoll" backend, world size 2: the curated ``CI_TESTS`` of driver.py, in one driver run with a deadline
per test. Every one must pass, except the few whose bodies or skips the suite keeps for gloo (listed
here with the reason); docs/torch-backend.md has the full-suite figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("expecttest", reason="torch's distributed_test needs expecttest (pip install expecttest)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.torch_suite.driver import CI_TESTS  # noqa: E402

#: Tests of CI_TESTS the suite itself skips for pycoll, and why.
_GLOO_BODY = "its body builds the model only for gloo and mpi"
EXPECTED_SKIPS = {
    "test_send_recv_any_source": "no receive from any source (the suite's skip_collective)",
    "test_accumulate_gradients_no_sync": _GLOO_BODY,
    "test_accumulate_gradients_no_sync_grad_is_view": _GLOO_BODY,
    "test_accumulate_gradients_no_sync_allreduce_hook": _GLOO_BODY,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _GLOO_BODY,
}


def test_pytorch_distributed_suite_on_pycoll(tmp_path: Path) -> None:
    out = tmp_path / "suite.json"
    cmd = [sys.executable, "-m", "tests.torch_suite.driver", "--backend", "pycoll", "--timeout", "60",
           "--json", str(out), "--log", str(tmp_path / "ranks.log")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"no results (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    records = {r["name"]: r for r in json.loads(out.read_text())["tests"]}
    assert set(records) == set(CI_TESTS)
    failed = {n: r["detail"] for n, r in records.items() if r["status"] == "fail"}
    assert not failed, f"{len(failed)} of torch's tests failed on pycoll: {failed}"
    skipped = {n for n, r in records.items() if r["status"] == "skip"}
    assert skipped == set(EXPECTED_SKIPS), f"unexpected skips: {skipped ^ set(EXPECTED_SKIPS)}"
    assert proc.returncode == 0, proc.stdout
