"""Failure behaviour: no hangs, typed errors that say what happened, nothing left in /dev/shm.

(a) a rank that never calls: the others raise CollectiveTimeoutError within timeout + slack, naming the
    missing rank(s) and the collective (per-call timeout=, init(timeout=) and PYCOLL_TIMEOUT);
(b) a rank SIGKILLed before its call while the others wait, and during a loop of large all-reduces:
    every survivor raises PeerLostError naming it (.rank) within 10 s of the kill;
(c) ranks calling with different count / dtype / op / algorithm / root / collective: every rank raises
    CollectiveMismatchError naming what differs (the field and both values), long before the deadline;
(d) bad input raises InvalidUsageError before any byte is sent: only one rank makes each bad call, then
    every rank runs a correct collective, which would mismatch or time out had the bad call entered the
    collective on that rank;
(e) /dev/shm holds no new entry after a normal run, an exception or a SIGKILLed rank, and no rank maps
    or holds open anything under /dev/shm while its communicator lives (shared memory is memfd);
(f) after any failure every later call on that communicator raises CommunicatorBrokenError.

Tests that break a communicator run on fresh processes (``run_ranks``); (d) runs on a pooled one.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _inputs import bits_of, expected_bits, expected_values, make_input
from harness import RankExited, run_ranks

import pycoll
from pycoll.compression import Int8

SHM = Path("/dev/shm")
#: /dev/shm entries other programs on this machine create (Open MPI, multiprocessing, torch, OpenMP):
#: ignored when comparing listings, since other jobs may run beside the tests.
FOREIGN_SHM = ("vader", "sm_segment", "ompi", "open_mpi", "sem.mp-", "psm_", "torch_", "__KMP_REGISTERED_LIB",
               "pym-")
COLLECTIVES = ("allreduce", "broadcast", "barrier", "reduce_scatter", "all_gather")


# ---- helpers (test process) -----------------------------------------------------------------------------
def shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except FileNotFoundError:
        return set()


def assert_no_new_shm(before: set[str], when: str) -> None:
    new = sorted(n for n in shm_entries() - before if not n.startswith(FOREIGN_SHM))
    assert not new, f"/dev/shm has new entries after {when}: {new}"


def named_ranks(message: str) -> set[int]:
    """Every rank number the message names ("rank 3", "rank(s) 1, 3", "ranks [1, 3]")."""
    out: set[int] = set()
    for m in re.finditer(r"\branks?(?:\(s\))?\s*\[?((?:\d+)(?:\s*,\s*\d+)*)", message):
        out |= {int(n) for n in re.findall(r"\d+", m.group(1))}
    return out


# ---- helpers (rank processes) ---------------------------------------------------------------------------
def shm_mappings() -> list[str]:
    """Paths under /dev/shm this process maps or holds open (memfds show as /memfd:..., not here)."""
    found = []
    with open("/proc/self/maps") as f:
        found += [line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            found.append(target)
    return sorted(set(found))


def _call(name: str, comm, rank: int, world: int, *, timeout=None, async_op=False, count=1000,
          dtype="float32", op="sum", algorithm="auto", root=0, compression=None):
    """One collective of the given kind with inputs of the given shape."""
    if name == "allreduce":
        x = np.ones(count, dtype=dtype)
        return pycoll.allreduce(x, op, algorithm=algorithm, comm=comm, timeout=timeout, async_op=async_op,
                                compression=compression)
    if name == "broadcast":
        x = np.full(count, rank, dtype=dtype)
        return pycoll.broadcast(x, root, algorithm=algorithm, comm=comm, timeout=timeout, async_op=async_op)
    if name == "barrier":
        return pycoll.barrier(comm=comm, timeout=timeout)
    if name == "reduce_scatter":
        x = np.ones(world * count, dtype=dtype)
        out = np.zeros(count, dtype=dtype)
        return pycoll.reduce_scatter(x, out, op, algorithm=algorithm, comm=comm, timeout=timeout,
                                     async_op=async_op)
    if name == "all_gather":
        x = np.ones(count, dtype=dtype)
        out = np.zeros(world * count, dtype=dtype)
        return pycoll.all_gather(x, out, algorithm=algorithm, comm=comm, timeout=timeout, async_op=async_op)
    raise ValueError(name)


def _error(exc: BaseException, t0: float) -> dict:
    return {"error": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - t0,
            "t_error": time.time(), "rank_attr": getattr(exc, "rank", None)}


def _later_calls(comm, rank: int, world: int) -> dict[str, str]:
    """What each kind of call raises on a communicator that failed (expected: CommunicatorBrokenError)."""
    out = {}
    for name in COLLECTIVES:
        try:
            _call(name, comm, rank, world, timeout=5)
            out[name] = "no error"
        except Exception as exc:  # noqa: BLE001
            out[name] = type(exc).__name__
    try:
        work = _call("allreduce", comm, rank, world, timeout=5, async_op=True)
        err = work.exception()
        out["allreduce async"] = "no error" if err is None else type(err).__name__
    except Exception as exc:  # noqa: BLE001 - raising at the call is fine too
        out["allreduce async"] = type(exc).__name__
    return out


def _assert_broken_afterwards(res: dict, r: int) -> None:
    bad = {k: v for k, v in res["later"].items() if v != "CommunicatorBrokenError"}
    assert not bad, f"rank {r}: later calls on the failed communicator raised {bad}, " \
                    "not CommunicatorBrokenError"


# ---- (a) timeouts --------------------------------------------------------------------------------------
def body_skip_call(comm, rank, world, missing, collective, timeout, algorithm="auto"):
    if rank in missing:
        return {"skipped": True}
    t0 = time.monotonic()
    # broadcast: the missing rank is the root, so every other rank waits for it (a root that is present
    # may finish early: its sends are buffered, see test_mismatch_names_what_differs)
    kwargs = {"root": missing[0]} if collective == "broadcast" else {}
    if collective != "barrier":
        kwargs["algorithm"] = algorithm
    try:
        _call(collective, comm, rank, world, timeout=timeout, **kwargs)
        return {"error": None, "elapsed": time.monotonic() - t0}
    except Exception as exc:  # noqa: BLE001
        out = _error(exc, t0)
    out["later"] = _later_calls(comm, rank, world)
    return out


def _check_timeouts(results, missing, collective, timeout, slack=4.0):
    for r, res in enumerate(results):
        if r in missing:
            continue
        assert res["error"] == "CollectiveTimeoutError", f"rank {r}: {res}"
        msg = res["message"]
        took = res["elapsed"]
        # Not much earlier than the deadline: a rank may raise a little before its own when a peer that
        # entered earlier timed out first and aborted the communicator.
        assert timeout * 0.5 <= took <= timeout + slack, f"rank {r} raised after {took:.2f} s"
        assert collective in msg, f"rank {r}: the message does not name {collective}: {msg}"
        assert set(missing) <= named_ranks(msg), f"rank {r}: the message does not name ranks {missing}: {msg}"
        _assert_broken_afterwards(res, r)


TIMEOUT_CASES = [(c, "auto") for c in COLLECTIVES] + [("allreduce", "ring"), ("allreduce", "tree"),
                                                      ("broadcast", "ring"), ("reduce_scatter", "ring")]


@pytest.mark.parametrize("collective,algorithm", TIMEOUT_CASES)
def test_timeout_names_missing_rank_and_collective(collective, algorithm):
    before = shm_entries()
    results = run_ranks(3, body_skip_call, [2], collective, 1.0, algorithm, timeout=60)
    _check_timeouts(results, [2], collective, 1.0)
    assert_no_new_shm(before, "a timed-out collective")


def test_timeout_names_every_missing_rank():
    results = run_ranks(4, body_skip_call, [1, 3], "allreduce", 1.0, timeout=60)
    _check_timeouts(results, [1, 3], "allreduce", 1.0)


def test_timeout_default_from_init():
    results = run_ranks(2, body_skip_call, [1], "allreduce", None, timeout=60, comm_timeout=1.5)
    _check_timeouts(results, [1], "allreduce", 1.5)


def test_timeout_default_from_environment():
    results = run_ranks(2, body_skip_call, [1], "allreduce", None, timeout=60, comm_timeout=None,
                        env={"PYCOLL_TIMEOUT": "1.5"})
    _check_timeouts(results, [1], "allreduce", 1.5)


# ---- (b) a SIGKILLed peer ------------------------------------------------------------------------------
def _kill_self(stamp: str) -> None:
    Path(stamp).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def body_kill_before_call(comm, rank, world, victim, collective, algorithm, stamp):
    pycoll.barrier(comm=comm, timeout=30)
    if rank == victim:
        time.sleep(0.5)  # the others are waiting in the collective by now
        _kill_self(stamp)
    t0 = time.monotonic()
    kwargs = {} if collective == "barrier" else {"algorithm": algorithm, "count": 1 << 20}
    try:
        _call(collective, comm, rank, world, timeout=60, **kwargs)
        return {"error": None}
    except Exception as exc:  # noqa: BLE001
        out = _error(exc, t0)
    out["later"] = _later_calls(comm, rank, world)
    out["shm_mappings"] = shm_mappings()
    return out


def body_kill_during_loop(comm, rank, world, victim, algorithm, stamp, delay):
    x = np.ones(4 << 20, dtype=np.float32)  # 16 MiB: each all-reduce takes a while on 2 cores
    if rank == victim:
        threading.Thread(target=lambda: (time.sleep(delay), _kill_self(stamp)), daemon=True).start()
    t0 = time.monotonic()
    iterations = 0
    try:
        while time.monotonic() - t0 < 60:
            pycoll.allreduce(x, "max", algorithm=algorithm, comm=comm, timeout=60)
            iterations += 1
        return {"error": None, "iterations": iterations}
    except Exception as exc:  # noqa: BLE001
        out = _error(exc, t0)
    out["iterations"] = iterations
    out["later"] = _later_calls(comm, rank, world)
    return out


def _check_peer_lost(results, victim, stamp: Path):
    dead = results[victim]
    assert isinstance(dead, RankExited) and dead.signal == signal.SIGKILL, dead
    t_kill = float(stamp.read_text())
    for r, res in enumerate(results):
        if r == victim:
            continue
        assert res["error"] == "PeerLostError", f"rank {r}: {res}"
        assert res["rank_attr"] == victim, f"rank {r}: PeerLostError.rank is {res['rank_attr']}, not {victim}"
        assert str(victim) in res["message"], res["message"]
        late = res["t_error"] - t_kill
        assert late < 10, f"rank {r} noticed the lost peer {late:.1f} s after the kill"
        _assert_broken_afterwards(res, r)


@pytest.mark.parametrize("collective,algorithm", [("allreduce", "ring"), ("allreduce", "tree"),
                                                  ("allreduce", "direct"), ("broadcast", "tree"),
                                                  ("barrier", None)])
def test_peer_killed_before_its_call(tmp_path, collective, algorithm):
    world, victim = 4, 2
    stamp = tmp_path / "killed_at"
    before = shm_entries()
    results = run_ranks(world, body_kill_before_call, victim, collective, algorithm, str(stamp),
                        timeout=90, allow_exit=True)
    _check_peer_lost(results, victim, stamp)
    for r, res in enumerate(results):
        if r != victim:
            assert res["shm_mappings"] == [], f"rank {r} maps files under /dev/shm: {res['shm_mappings']}"
    assert_no_new_shm(before, "a SIGKILLed rank")


@pytest.mark.parametrize("algorithm", ("ring", "tree", "direct"))
def test_peer_killed_during_large_allreduce_loop(tmp_path, algorithm):
    world, victim = 4, 1
    stamp = tmp_path / "killed_at"
    before = shm_entries()
    results = run_ranks(world, body_kill_during_loop, victim, algorithm, str(stamp), 0.7,
                        timeout=120, allow_exit=True)
    _check_peer_lost(results, victim, stamp)
    assert_no_new_shm(before, "a rank SIGKILLed mid-collective")


# ---- (c) mismatched calls ------------------------------------------------------------------------------
# kind -> (arguments of the agreeing ranks, arguments of the odd rank, strings the message must contain)
MISMATCHES = {
    "count": (dict(count=1000), dict(count=1001), ("count", "1000", "1001")),
    "count-large": (dict(count=1 << 20), dict(count=(1 << 20) + 3),
                    ("count", str(1 << 20), str((1 << 20) + 3))),
    "dtype": (dict(dtype="float32"), dict(dtype="float64"), ("dtype", "float32", "float64")),
    "op": (dict(op="sum"), dict(op="max"), ("op", "sum", "max")),
    "algorithm": (dict(algorithm="ring"), dict(algorithm="tree"), ("algorithm", "ring", "tree")),
    "root": (dict(collective="broadcast", root=0), dict(collective="broadcast", root=1), ("root",)),
    "collective": (dict(collective="allreduce"), dict(collective="broadcast"), ("allreduce", "broadcast")),
    # a rank with nothing to move must still find out
    "count-zero": (dict(count=1000), dict(count=0), ("count", "1000", "count=0")),
    "barrier": (dict(collective="allreduce", count=0), dict(collective="barrier"), ("allreduce", "barrier")),
    "codec": (dict(compression="int8"), dict(compression="int4"), ("codec", "int8", "int4")),
    "codec-block": (dict(compression="int8"), dict(compression=Int8(block=32)), ("codec", "block=32")),
    "codec-none": (dict(compression="fp16"), dict(), ("codec", "fp16")),
}


def body_mismatch(comm, rank, world, kind, odd_rank, async_op=False):
    same, odd, _ = MISMATCHES[kind]
    args = dict(odd if rank == odd_rank else same)
    collective = args.pop("collective", "allreduce")
    if collective == "allreduce" and "algorithm" not in args:
        args["algorithm"] = "ring"
    t0 = time.monotonic()
    out: dict = {}
    try:
        res = _call(collective, comm, rank, world, timeout=30, async_op=async_op, **args)
        if async_op:
            out["is_completed_after_exception"] = None
            err = res.exception()  # blocks until it finished
            out["is_completed_after_exception"] = res.is_completed()
            out["exception_type"] = type(err).__name__ if err is not None else None
            res.wait()
        out["error"] = None
    except Exception as exc:  # noqa: BLE001
        out.update(_error(exc, t0))
    if out["error"] is None:
        # A rank whose part needed nothing from the others (the root of a broadcast: its sends are
        # buffered) may finish before the mismatch is found; the error must then come with its next call.
        time.sleep(1.0)
        t1 = time.monotonic()
        try:
            _call("allreduce", comm, rank, world, timeout=30)
            out["next_error"] = None
        except Exception as exc:  # noqa: BLE001
            out["next"] = _error(exc, t1)
            out["next_error"] = type(exc).__name__
    out["later"] = _later_calls(comm, rank, world)
    return out


@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_mismatch_names_what_differs(kind):
    world, odd_rank = 3, 2
    before = shm_entries()
    results = run_ranks(world, body_mismatch, kind, odd_rank, timeout=60)
    must = MISMATCHES[kind][2]
    for r, res in enumerate(results):
        if kind == "root" and r == 0 and res["error"] is None:
            # rank 0 believes it is the root: its broadcast only sends (buffered) and may return before
            # anyone noticed; the mismatch must then be raised by its next call instead of being lost
            assert res["next_error"] == "CollectiveMismatchError", f"rank {r}: {res}"
            res = {**res["next"], "later": res["later"]}
        assert res["error"] == "CollectiveMismatchError", f"rank {r}: {res}"
        assert res["elapsed"] < 10, f"rank {r} took {res['elapsed']:.1f} s to notice the mismatch"
        missing = [s for s in must if s not in res["message"]]
        assert not missing, f"rank {r}: the message does not name {missing}: {res['message']}"
        _assert_broken_afterwards(res, r)
    assert_no_new_shm(before, "a CollectiveMismatchError")


def test_broadcast_root_raises_mismatch_at_the_call():
    results = run_ranks(3, body_mismatch, "root", 2, timeout=60)
    assert results[0]["error"] == "CollectiveMismatchError", f"rank 0 (the root): {results[0]}"


@pytest.mark.parametrize("world", (2, 4))
def test_count_mismatch_other_world_sizes(world):
    results = run_ranks(world, body_mismatch, "count", 1, timeout=60)
    for r, res in enumerate(results):
        assert res["error"] == "CollectiveMismatchError", f"rank {r}: {res}"
        assert "1000" in res["message"] and "1001" in res["message"], res["message"]


def test_async_mismatch_is_reported_by_work():
    results = run_ranks(3, body_mismatch, "dtype", 0, True, timeout=60)
    for r, res in enumerate(results):
        assert res["exception_type"] == "CollectiveMismatchError", f"rank {r}: {res}"
        assert res["is_completed_after_exception"] is True, f"rank {r}: {res}"
        assert res["error"] == "CollectiveMismatchError", f"rank {r}: Work.wait() did not raise it: {res}"
        _assert_broken_afterwards(res, r)


# ---- (d) bad input -------------------------------------------------------------------------------------
def _bad_cases(world: int):
    """(name, call, strings one of which the message must contain); call() makes one bad call."""
    f32 = np.ones(16, dtype=np.float32)
    readonly = np.ones(8, dtype=np.float32)
    readonly.flags.writeable = False
    overlap = np.zeros(world * 4, dtype=np.float32)
    cases = [
        ("non-contiguous numpy", lambda: pycoll.allreduce(np.ones(20, np.float32)[::2]), ("contiguous",)),
        ("complex64 numpy", lambda: pycoll.allreduce(np.ones(4, np.complex64)), ("complex64", "dtype")),
        ("uint16 numpy", lambda: pycoll.allreduce(np.ones(4, np.uint16)), ("uint16", "dtype")),
        ("bool numpy", lambda: pycoll.allreduce(np.ones(4, bool)), ("bool", "dtype")),
        ("big-endian", lambda: pycoll.allreduce(np.ones(4, ">f4")), ("endian", "byte order")),
        ("unknown op", lambda: pycoll.allreduce(f32.copy(), "bogus"), ("op",)),
        ("op None", lambda: pycoll.allreduce(f32.copy(), None), ("op",)),
        ("avg on int32", lambda: pycoll.allreduce(np.ones(4, np.int32), "avg"), ("avg",)),
        ("avg on uint8", lambda: pycoll.allreduce(np.ones(4, np.uint8), "avg"), ("avg",)),
        ("read-only", lambda: pycoll.allreduce(readonly), ("read-only", "writable", "writeable")),
        ("python list", lambda: pycoll.allreduce([1.0, 2.0]), ("numpy", "tensor")),
        ("unknown algorithm", lambda: pycoll.allreduce(f32.copy(), algorithm="bogus"), ("algorithm",)),
        ("tree reduce_scatter", lambda: pycoll.reduce_scatter(np.ones(world * 4, np.float32),
                                                              np.ones(4, np.float32), algorithm="tree"),
         ("algorithm",)),
        ("compression on int32", lambda: pycoll.allreduce(np.ones(4, np.int32), compression="int8"),
         ("int32", "float32")),
        ("compression on float64", lambda: pycoll.allreduce(np.ones(4, np.float64), compression="fp16"),
         ("float64",)),
        ("compression with max", lambda: pycoll.allreduce(f32.copy(), "max", compression="int4"), ("op",)),
        ("unknown codec", lambda: pycoll.allreduce(f32.copy(), compression="int3"), ("compression", "int8")),
        ("residual without codec", lambda: pycoll.allreduce(f32.copy(), residual=f32.copy()),
         ("compression",)),
        ("residual wrong size", lambda: pycoll.allreduce(f32.copy(), compression="int8",
                                                         residual=np.zeros(15, np.float32)),
         ("residual", "16")),
        ("residual wrong dtype", lambda: pycoll.allreduce(f32.copy(), compression="int8",
                                                          residual=np.zeros(16, np.float64)), ("float32",)),
        ("residual aliases x", lambda: pycoll.allreduce(f32, compression="int8", residual=f32), ("overlap",)),
        ("timeout 0", lambda: pycoll.allreduce(f32.copy(), timeout=0), ("timeout",)),
        ("timeout negative", lambda: pycoll.barrier(timeout=-1), ("timeout",)),
        ("root out of range", lambda: pycoll.broadcast(f32.copy(), world), ("root",)),
        ("root negative", lambda: pycoll.broadcast(f32.copy(), -1), ("root",)),
        ("reduce_scatter wrong out size",
         lambda: pycoll.reduce_scatter(np.ones(world * 4, np.float32), np.ones(5, np.float32)),
         ("elements",)),
        ("reduce_scatter dtype differs", lambda: pycoll.reduce_scatter(np.ones(world * 4, np.float32),
                                                                       np.ones(4, np.float64)), ("dtype",)),
        ("reduce_scatter read-only out", lambda: pycoll.reduce_scatter(np.ones(world * 4, np.float32),
                                                                       readonly[:4]), ("read-only",)),
        ("reduce_scatter avg ints", lambda: pycoll.reduce_scatter(np.ones(world * 4, np.int64),
                                                                  np.ones(4, np.int64), "avg"), ("avg",)),
        ("all_gather wrong out size", lambda: pycoll.all_gather(np.ones(4, np.float32),
                                                                np.ones(world * 4 + 1, np.float32)),
         ("elements",)),
        ("all_gather non-contiguous out", lambda: pycoll.all_gather(np.ones(4, np.float32),
                                                                    np.ones(world * 8, np.float32)[::2]),
         ("contiguous",)),
        ("all_gather overlapping", lambda: pycoll.all_gather(overlap[:4], overlap), ("overlap",)),
    ]
    try:
        import torch
    except ImportError:
        return cases, "torch is not installed: torch bad-input cases skipped"
    cases += [
        ("meta tensor", lambda: pycoll.allreduce(torch.empty(8, device="meta")), ("meta", "cpu", "CPU")),
        ("non-contiguous tensor", lambda: pycoll.allreduce(torch.ones(4, 6).t()), ("contiguous",)),
        ("complex64 tensor", lambda: pycoll.allreduce(torch.ones(4, dtype=torch.complex64)),
         ("complex64", "dtype")),
        ("bool tensor", lambda: pycoll.allreduce(torch.ones(4, dtype=torch.bool)), ("bool", "dtype")),
        ("avg on int tensor", lambda: pycoll.allreduce(torch.ones(4, dtype=torch.int32), "avg"), ("avg",)),
        ("all_gather meta out",
         lambda: pycoll.all_gather(torch.ones(4), torch.empty(world * 4, device="meta")),
         ("meta", "cpu", "CPU")),
    ]
    return cases, None


def body_bad_inputs(comm, rank, world):
    failures = []
    cases, note = _bad_cases(world)
    for k, (name, call, words) in enumerate(cases):
        if rank == k % world:  # one rank makes the bad call; the others go straight on
            try:
                call()
                failures.append(f"{name}: no error")
            except pycoll.InvalidUsageError as exc:
                if not isinstance(exc, ValueError):
                    failures.append(f"{name}: InvalidUsageError is not a ValueError")
                if not any(w in str(exc) for w in words):
                    failures.append(f"{name}: the message names none of {words}: {exc}")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{name}: raised {type(exc).__name__}: {exc}, not InvalidUsageError")
        # every rank: the next correct collective works, so the bad call sent nothing
        x = make_input("int32", "sum", rank, world, 1000 + k)
        try:
            pycoll.allreduce(x, algorithm=("ring", "tree", "direct")[k % 3], timeout=10)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"after {name!r} on rank {k % world}: the next allreduce raised "
                            f"{type(exc).__name__}: {exc}")
            return failures, note
        want = expected_bits(expected_values("int32", "sum", world, 1000 + k), "int32")
        if not np.array_equal(bits_of(x), want):
            failures.append(f"after {name!r}: the next allreduce gave a wrong result")
    # every rank making the same bad call at once is fine too
    try:
        pycoll.allreduce(np.ones(4, np.int8), "avg")
        failures.append("avg on int8 on every rank: no error")
    except pycoll.InvalidUsageError:
        pass
    y = np.full(3, rank + 1.0)
    pycoll.allreduce(y, timeout=10)
    if not np.array_equal(y, np.full(3, world * (world + 1) / 2)):
        failures.append("the allreduce after every rank's bad call gave a wrong result")
    return failures, note


@pytest.mark.parametrize("world", (1, 3))
def test_bad_input_raises_before_sending(rank_pool, world):
    results = rank_pool(world).run(body_bad_inputs, timeout=120)
    failures = [f for res in results for f in res[0]]
    assert not failures, "\n".join(failures)
    if results[0][1]:
        pytest.skip(f"numpy cases passed; {results[0][1]}")


# ---- (e) /dev/shm after a normal run --------------------------------------------------------------------
def body_normal_run(comm, rank, world):
    x = np.arange(300_000, dtype=np.float64)
    pycoll.allreduce(x, algorithm="ring", comm=comm, timeout=30)
    pycoll.barrier(comm=comm, timeout=30)
    return {"ok": bool(np.array_equal(x, np.arange(300_000, dtype=np.float64) * world)),
            "shm_mappings": shm_mappings()}


def test_nothing_left_in_dev_shm_after_normal_run():
    before = shm_entries()
    results = run_ranks(3, body_normal_run, timeout=60)
    for r, res in enumerate(results):
        assert res["ok"], f"rank {r}: wrong result"
        assert res["shm_mappings"] == [], f"rank {r} maps files under /dev/shm: {res['shm_mappings']}"
    assert_no_new_shm(before, "a normal run")


def test_named_ranks_helper():
    assert named_ranks("timed out on rank 0 after 1.0 s: rank(s) 1, 3 have not entered it") == {0, 1, 3}
    assert named_ranks("ranks [2, 5] missing; waiting for rank 7") == {2, 5, 7}
