"""Hang and desync diagnosis at 4 ranks (pycoll/flight/): every rank's error says where the others are,
names the culprit's place (its stack, read while its Python is busy), and points at a dump directory that
``pycoll trace analyze`` reads."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import numpy as np
import pytest
from harness import run_ranks

import pycoll
from pycoll import _C
from pycoll.flight.analysis import analyze_dumps


def load_batch(rank: int, how: str) -> np.ndarray:
    if rank == 3 and how == "sleep":
        time.sleep(6)
    if rank == 3 and how == "gil":
        _C.testing.hold_gil(6)
    return np.full(256, rank, np.float32)


def body(comm, rank, world, how):
    x = np.ones(256, np.float32)
    pycoll.allreduce(x, comm=comm)
    t0 = time.monotonic()
    try:
        if how == "skip" and rank == 3:
            pycoll.allreduce(np.ones(1, np.float32), comm=comm, timeout=2)  # skipped the batch's all-reduce
        else:
            pycoll.allreduce(load_batch(rank, how), comm=comm, timeout=2)
            pycoll.allreduce(np.ones(1, np.float32), comm=comm, timeout=2)  # the loss
    except pycoll.PycollError as exc:
        return {"type": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - t0}
    return {"type": None}


@pytest.mark.parametrize("how", ["sleep", "gil"])
def test_a_stuck_rank_is_named_with_its_stack(how):
    results = run_ranks(4, body, how, timeout=90)
    for r in (0, 1, 2):
        res = results[r]
        assert res["type"] == "CollectiveTimeoutError", res
        msg = res["message"]
        assert "rank 3 is behind, outside any collective: its last was #1" in msg, msg
        assert "in load_batch (test_hang_diagnosis.py:" in msg, msg
        assert "sleeping (clock_nanosleep)" in msg, msg
        others = ", ".join(str(x) for x in (0, 1, 2) if x != r)
        assert f"ranks {others} wait in it at test_hang_diagnosis.py:" in msg, msg
        assert res["elapsed"] < 2 + 3.0, res  # the deadline, and the probes' time
        directory = msg.split("pycoll trace analyze ")[1].rstrip(").")
        assert os.path.exists(os.path.join(directory, f"rank{r}.json"))
    # Every rank's dump holds what the others answered when it failed: rank 3's stack in load_batch.
    with open(os.path.join(directory, "rank0.json")) as f:
        dump = json.load(f)
    assert "load_batch" in dump["probed"]["3"]["stacks"]
    assert "communicator" in analyze_dumps(directory)


def test_a_skipped_collective_shows_both_call_sites():
    results = run_ranks(4, body, "skip", timeout=90)
    for r in range(4):
        assert results[r]["type"] == "CollectiveMismatchError", results[r]
    msg = results[0]["message"]
    assert "rank 3 called allreduce(1 x float32, sum) at test_hang_diagnosis.py:" in msg, msg
    assert "(rank 0 called allreduce(256 x float32, sum) at test_hang_diagnosis.py:" in msg, msg
    assert "ranks 1, 2 wait in it" in msg, msg
    assert "ranks 0-2 called allreduce(256 x float32, sum)" in results[3]["message"], results[3]


def body_die(comm, rank, world):
    x = np.ones(256, np.float32)
    pycoll.allreduce(x, comm=comm)
    if rank == 3:
        os.kill(os.getpid(), 9)
    try:
        pycoll.allreduce(x, comm=comm, timeout=20)
    except pycoll.PycollError as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": None}


def test_a_dead_rank_is_named_and_the_others_placed():
    results = run_ranks(4, body_die, timeout=90, allow_exit=True)
    for r in (0, 1, 2):
        res = results[r]
        assert res["type"] == "PeerLostError", res
        assert "rank 3 is lost (" in res["message"].split("Where the ranks are")[1], res
        assert " wait in it at test_hang_diagnosis.py:" in res["message"], res


def body_torch(comm, rank, world, path):
    import torch
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401 - registers the backend (and torch's files as internal)

    store = dist.FileStore(path, world)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=20))
    dist.all_reduce(torch.ones(8))
    try:
        dist.all_reduce(torch.ones(1 if rank == 3 else 256))  # rank 3 reduces another tensor
    except Exception as exc:  # noqa: BLE001 - what torch.distributed raises is what the user sees
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": None}


def test_torch_backend_errors_name_the_users_call_sites(tmp_path):
    # init_process_group("pycoll"): the call sites are the script's lines, outside torch's frames.
    results = run_ranks(4, body_torch, str(tmp_path / "store"), timeout=90)
    for r in range(4):
        assert results[r]["type"] == "CollectiveMismatchError", results[r]
    site = f"test_hang_diagnosis.py:{body_torch.__code__.co_firstlineno + 10} in body_torch"  # the try's
    msg = results[0]["message"]
    assert f"rank 3 called allreduce(1 x float32, sum) at {site}" in msg, msg
    assert f"(rank 0 called allreduce(256 x float32, sum) at {site}" in msg, msg
    assert "distributed_c10d" not in msg and "pycoll/torch" not in msg, msg
