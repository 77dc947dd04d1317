"""The harness itself: results per rank, forwarded tracebacks, deadlines that never hang, dead ranks."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import RankError, RankExited, RankPool, RankTimeout, run_ranks


def body_identity(comm, rank, world, extra, *, key=None):
    return {"rank": rank, "world": world, "comm_rank": comm.rank, "comm_world": comm.world_size,
            "extra": extra, "key": key, "pid": os.getpid()}


def body_raise_on_rank(comm, rank, world, bad):
    if rank == bad:
        raise ValueError(f"deliberate failure on rank {rank}")
    return rank


def _sleeping_forever_here(seconds):
    time.sleep(seconds)


def body_hang_on_rank(comm, rank, world, bad):
    if rank == bad:
        _sleeping_forever_here(600)
    return rank


def body_deaf_hang_on_rank(comm, rank, world, bad):
    """Hangs where the Python-level SIGUSR1 handler cannot run (as a rank stuck in native code would)."""
    if rank == bad:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        _sleeping_forever_here(600)
    return rank


def body_exit_on_rank(comm, rank, world, bad):
    if rank == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def body_unpicklable_result(comm, rank, world):
    return (lambda: None) if rank == 1 else rank


def test_unpicklable_result_is_reported():
    with pytest.raises(RankError, match="cannot be pickled"):
        run_ranks(2, body_unpicklable_result, timeout=30)


def test_results_in_rank_order_and_pool_reuse(rank_pool):
    pool = rank_pool(3)
    out = pool.run(body_identity, "x", key=5, timeout=30)
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(o["comm_rank"] == o["rank"] and o["comm_world"] == 3 == o["world"] for o in out)
    assert all(o["extra"] == "x" and o["key"] == 5 for o in out)
    again = rank_pool(3)
    assert again is pool, "a healthy pool is reused"
    assert [o["pid"] for o in again.run(body_identity, None, timeout=30)] == [o["pid"] for o in out]


def test_child_traceback_is_forwarded_with_rank():
    with pytest.raises(RankError) as info:
        run_ranks(2, body_raise_on_rank, 1, timeout=30)
    text = str(info.value)
    assert "rank 1: ValueError: deliberate failure on rank 1" in text
    assert "Traceback (most recent call last)" in text and "body_raise_on_rank" in text
    assert list(info.value.failures) == [1]


def test_deadline_dumps_stacks_kills_and_names_missing_rank():
    pool = RankPool(2)
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        pool.run(body_hang_on_rank, 1, timeout=3)
    assert time.monotonic() - start < 3 + 10
    assert info.value.missing == [1]
    text = str(info.value)
    assert "rank(s) 1 of 2 did not answer" in text
    assert "_sleeping_forever_here" in text, text  # the hung rank's Python stack
    assert pool.closed
    for pid in pool.pids:
        with pytest.raises(ProcessLookupError):  # killed and reaped
            os.kill(pid, 0)


def test_a_rank_deaf_to_the_first_signal_still_shows_its_stack():
    pool = RankPool(2)
    with pytest.raises(RankTimeout) as info:
        pool.run(body_deaf_hang_on_rank, 1, timeout=3)
    text = str(info.value)
    assert "_sleeping_forever_here" in text and "body_deaf_hang_on_rank" in text, text  # from SIGUSR2
    assert pool.closed


def test_dead_rank_fails_the_run_or_is_reported_when_allowed():
    with pytest.raises(RankError) as info:
        run_ranks(2, body_exit_on_rank, 0, timeout=30)
    assert "killed by SIGKILL" in str(info.value)
    out = run_ranks(2, body_exit_on_rank, 0, timeout=30, allow_exit=True)
    assert out[0] == RankExited(0, -signal.SIGKILL) and out[0].signal == signal.SIGKILL
    assert out[1] == 1


def test_broken_pool_is_replaced(rank_pool):
    pool = rank_pool(2)
    with pytest.raises(RankError):
        pool.run(body_raise_on_rank, 0, timeout=30)
    assert not pool.alive
    fresh = rank_pool(2)
    assert fresh is not pool and fresh.alive
    assert fresh.run(body_raise_on_rank, -1, timeout=30) == [0, 1]


def test_worker_killed_between_runs_fails_the_next_run():
    pool = RankPool(2)
    os.kill(pool.pids[1], signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(RankError, match="SIGKILL"):
        pool.run(body_identity, None, timeout=30)
    assert pool.closed
