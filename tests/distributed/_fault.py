"""Rank bodies of test_fault_tolerance.py (not a test module), and two scripts of its own:

    python _fault.py join ADDRESS OUT MODE          a process asking a job to admit it (pycoll.init(join=))
    python _fault.py store RANK WORLD PORT ARGS     a rank of a job whose rank 0 hosts the rendezvous store

Every body returns plain data (dicts, lists, tuples, strings, numbers) that the test process checks: what
each rank raised (type, ``.rank``, when, as ``time.time()``), the new communicator's rank, size, epoch,
``parent_ranks`` and transport, and a digest of every all-reduce result on it (``check_allreduces``: exact
closed-form results, checked here; the digests must match across ranks, which the test process checks).

Times are ``time.time()`` (one clock for every process of this host), so that the test process can measure
from the kill (a stamp file the victim writes just before it dies) to the first correct all-reduce on the
communicator the survivors made.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from test_failures import shm_mappings  # the same check the failure tests make

import pycoll

HERE = Path(__file__).resolve()
#: The all-reduces ``check_allreduces`` runs: a small one with every algorithm, then one of many segments.
SMALL = 1003
LARGE = 1 << 20
SMALL_ALGORITHMS = ("auto", "ring", "tree", "direct")
#: The all-reduces that run until a failure (op max: the values stay put however often it runs).
LOOP_COUNT = 1 << 18
#: Seconds every deadline inside a body is bounded by (the harness deadline is longer).
BODY_TIMEOUT = 15.0


# ---- inputs and checks -------------------------------------------------------------------------------------
def pattern(rank: int, count: int) -> np.ndarray:
    """Rank r's input: (i % 7 + 1) * (r + 1), integer-valued float32 (every partial sum is exact)."""
    return ((np.arange(count) % 7) + 1).astype(np.float32) * np.float32(rank + 1)


def expected(world: int, count: int) -> np.ndarray:
    return ((np.arange(count) % 7) + 1).astype(np.float32) * np.float32(world * (world + 1) // 2)


def check_allreduces(comm: Any, what: str) -> dict[str, Any]:
    """All-reduces of SMALL (every algorithm) and LARGE elements on ``comm``, each checked against the
    closed form; the digest of every result and when the first one was right."""
    digest = hashlib.sha256()
    t_first = None
    for count, algorithm in [(SMALL, a) for a in SMALL_ALGORITHMS] + [(LARGE, "auto")]:
        x = pattern(comm.rank, count)
        pycoll.allreduce(x, algorithm=algorithm, comm=comm, timeout=BODY_TIMEOUT)
        want = expected(comm.world_size, count)
        if not np.array_equal(x, want):
            bad = np.flatnonzero(x != want)
            raise AssertionError(
                f"{what}: rank {comm.rank} of {comm.world_size}: all-reduce ({algorithm}) of {count} "
                f"elements is wrong at {bad.size} elements, first [{bad[0]}]: {x[bad[0]]} != {want[bad[0]]}"
            )
        if t_first is None:
            t_first = time.time()
        digest.update(x.tobytes())
    return {"digest": digest.hexdigest(), "t_first_ok": t_first}


def describe(exc: BaseException | None) -> dict[str, Any] | None:
    if exc is None:
        return None
    return {"type": type(exc).__name__, "rank": getattr(exc, "rank", None), "message": str(exc)[:500],
            "t": time.time()}




def describe_comm(old: Any, new: Any, what: str) -> dict[str, Any]:
    """What the test process checks about ``new`` (made from ``old``), and its all-reduces."""
    t_made = time.time()
    out = {
        "t_made": t_made,
        "new_rank": new.rank,
        "world": new.world_size,
        "parents": tuple(new.parent_ranks),
        "epoch": new.epoch,
        "old_epoch": old.epoch,
        "transport": new.transport,
        "default_follows": pycoll.get_comm() is new,
        "plane": new.plane_required().id,
        "allreduce_error": None,
    }
    try:  # an error goes back as data, with the rest, so that the test can say what every rank had
        out.update(check_allreduces(new, what))
    except (pycoll.PycollError, AssertionError) as exc:
        out["allreduce_error"] = describe(exc)
    out["shm_mappings"] = shm_mappings()
    return out


# ---- failures ----------------------------------------------------------------------------------------------
def stamp(path: str | None) -> None:
    if path:
        Path(path).write_text(repr(time.time()))


def die(path: str | None = None, others: tuple[int, ...] = ()) -> None:
    """Writes the time to ``path``, then SIGKILLs the processes ``others`` and this one."""
    stamp(path)
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def die_later(delay: float, path: str | None, others: tuple[int, ...] = ()) -> None:
    threading.Thread(target=lambda: (time.sleep(delay), die(path, others)), daemon=True).start()


def pids_of(comm: Any) -> list[int]:
    """Every rank's process id (an all-gather)."""
    out = np.zeros(comm.world_size, np.int64)
    pycoll.all_gather(np.array([os.getpid()], np.int64), out, comm=comm, timeout=BODY_TIMEOUT)
    return [int(p) for p in out]


def loop_until_error(comm: Any, rank: int, count: int = LOOP_COUNT, limit_s: float = BODY_TIMEOUT,
                     after_first: Any = None):
    """All-reduces until one raises: (describe(the error), how many completed before). ``after_first()``
    runs once the first one completed (a victim arms its kill there: the kill lands in the loop). The
    exception itself is not kept (its traceback would hold the failed call's frames)."""
    x = pattern(rank, count)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < limit_s:
        try:
            pycoll.allreduce(x, "max", comm=comm, timeout=BODY_TIMEOUT)
        except pycoll.PycollError as exc:
            return describe(exc), n
        n += 1
        if n == 1 and after_first is not None:
            after_first()
    raise AssertionError(f"rank {rank}: {n} all-reduces in {limit_s:.0f} s and none failed")


def later_call(comm: Any) -> str:
    """What a collective on ``comm`` raises now."""
    try:
        pycoll.allreduce(np.ones(8, np.float32), comm=comm, timeout=5)
        return "no error"
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__


def _count_builds() -> list[int]:
    """Counts this process's shrink/grow build attempts (pycoll.fault.membership._build calls)."""
    import pycoll.fault.membership as membership

    calls = [0]
    real = membership._build

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    membership._build = counted
    return calls


def _arm_death_in_shrink(comm: Any, how: str, path: str) -> None:
    """Makes this rank die inside its coming shrink: right after the first message it sends in the shrink's
    agreement ("propose": its subtree's entries up the tree, or, at the root, its decision to its first
    child only), at the start of its build of the new communicator ("build"), or at the commit agreement,
    before it proposes there ("commit")."""
    import pycoll.fault.membership as membership

    if how == "propose":
        plane = comm.plane_required()
        real = plane.send

        def send(peer: int, msg: dict[str, Any]) -> bool:
            sent = real(peer, msg)
            if msg.get("t") in ("up", "decide"):
                die(path)
            return sent

        plane.send = send
    elif how == "build":
        membership._build = lambda *a, **k: die(path)
    elif how == "commit":
        membership._commit = lambda *a, **k: die(path)
    else:
        raise ValueError(how)


# ---- bodies: kills, shrink ---------------------------------------------------------------------------------
def body_kill(comm, rank, world, victims, stamp_path, delay=0.1, mismatch_after=None):
    """The lowest victim SIGKILLs every victim (itself last) ``delay`` s into a loop of all-reduces; the
    survivors report the error and shrink. ``mismatch_after`` (a survivor's old rank): then a mismatched
    call on the new communicator and a shrink of it (mismatch_then_shrink)."""
    pids = pids_of(comm)
    arm = None
    if rank == min(victims):
        arm = lambda: die_later(delay, stamp_path, tuple(pids[v] for v in victims if v != rank))  # noqa: E731
    error, iterations = loop_until_error(comm, rank, after_first=arm)
    out = {"error": error, "iterations": iterations, "later": later_call(comm),
           "hosts_store": any(type(o).__name__ == "TCPStoreServer" for o in comm._owned)}
    new = comm.shrink(timeout=BODY_TIMEOUT)
    out.update(describe_comm(comm, new, "after shrink"))
    if mismatch_after and out["allreduce_error"] is None:
        out["mismatch"] = mismatch_then_shrink(new, mismatch_after)
    return out


def mismatch_then_shrink(comm: Any, odd_parent: int) -> dict[str, Any]:
    """The survivor that was rank ``odd_parent`` all-reduces 1001 elements, the others 1000: what each
    raised; then a shrink (nobody is dead: the same ranks) and all-reduces on it."""
    count = 1001 if comm.parent_ranks[comm.rank] == odd_parent else 1000
    t0 = time.time()
    out: dict[str, Any] = {}
    try:
        pycoll.allreduce(np.ones(count, np.float32), comm=comm, timeout=BODY_TIMEOUT)
        out["error"] = None
    except pycoll.PycollError as exc:
        out["error"] = describe(exc)
        out["error"]["elapsed"] = time.time() - t0
    # Every rank has its error before any rank goes on: shrink revokes the communicator, and a revocation
    # that arrives while a rank is still reporting its error would be reported instead (see
    # test_mismatch_error_is_not_replaced_by_a_revocation)
    comm.agree(True, timeout=BODY_TIMEOUT)
    out["later"] = later_call(comm)
    comm.agree(True, timeout=BODY_TIMEOUT)
    again = comm.shrink(timeout=BODY_TIMEOUT)
    out["again"] = describe_comm(comm, again, "after the shrink that followed the mismatch")
    return out


def body_kill_in_shrink(comm, rank, world, first, second, how, stamp_path, stamp2_path, delay=0.1):
    """``first`` dies mid-all-reduce; ``second`` dies inside the survivors' shrink (``how``)."""
    builds = _count_builds()
    arm = (lambda: die_later(delay, stamp_path)) if rank == first else None
    error, iterations = loop_until_error(comm, rank, after_first=arm)
    out = {"error": error, "iterations": iterations}
    if rank == second:
        _arm_death_in_shrink(comm, how, stamp2_path)
    new = comm.shrink(timeout=BODY_TIMEOUT)
    out.update(describe_comm(comm, new, "after a shrink that lost a rank"))
    out["builds"] = builds[0]
    return out


def body_revoke(comm, rank, world, revoker, falser, delay=0.5):
    """Every rank but ``revoker`` blocks in an all-reduce; ``revoker`` revokes. Then agreements on the
    revoked communicator, and a shrink of it (nobody is dead: the same ranks)."""
    check_allreduces(comm, "before revoke")
    out: dict[str, Any] = {}
    if rank == revoker:
        time.sleep(delay)
        out["t_revoke"] = time.time()
        comm.revoke("revoked by the test")
        out["error"] = None
    else:
        t0 = time.time()
        try:
            pycoll.allreduce(np.ones(1 << 16, np.float32), comm=comm, timeout=BODY_TIMEOUT)
            out["error"] = None
        except pycoll.PycollError as exc:
            out["error"] = describe(exc)
            out["error"]["elapsed"] = time.time() - t0
    out["later"] = later_call(comm)
    flag, dead = comm.agree(True, timeout=BODY_TIMEOUT)
    out["agree_true"] = (flag, dead)
    flag, dead = comm.agree(rank != falser, timeout=BODY_TIMEOUT)
    out["agree_false"] = (flag, dead)
    new = comm.shrink(timeout=BODY_TIMEOUT)
    out.update(describe_comm(comm, new, "after shrinking a revoked communicator"))
    return out


def body_stop(comm, rank, world, victim, stop_s, stamp_dir):
    """``victim`` is SIGSTOPped for ``stop_s`` s mid-loop (by a helper process), then SIGCONTed. The others
    shrink meanwhile; the victim, once resumed, must find itself evicted. The survivors wait until it is
    back (it writes ``evicted``) and use their new communicator again."""
    d = Path(stamp_dir)
    helper = None
    if rank == victim:
        code = ("import os, signal, sys, time\n"
                "pid, d, s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])\n"
                "time.sleep(0.2)\n"
                "open(d + '/stopped', 'w').write(repr(time.time()))\n"
                "os.kill(pid, signal.SIGSTOP)\n"
                "time.sleep(s)\n"
                "open(d + '/continued', 'w').write(repr(time.time()))\n"
                "os.kill(pid, signal.SIGCONT)\n")
        helper = subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), str(d), str(stop_s)])
    error, iterations = loop_until_error(comm, rank, 1 << 10)
    out = {"error": error, "iterations": iterations}
    if rank == victim:
        try:
            comm.shrink(timeout=10)
            out["shrink_error"] = None
        except pycoll.PycollError as exc2:
            out["shrink_error"] = describe(exc2)
        out["later"] = later_call(comm)
        helper.wait(timeout=BODY_TIMEOUT)
        (d / "evicted").write_text(repr(time.time()))
        return out
    new = comm.shrink(timeout=BODY_TIMEOUT)
    out.update(describe_comm(comm, new, "after shrink"))
    if out["allreduce_error"] is not None:
        return out
    end = time.monotonic() + BODY_TIMEOUT
    while not (d / "evicted").exists():  # the victim is running again and found itself evicted
        if time.monotonic() > end:
            raise AssertionError("the stopped rank never reported back")
        time.sleep(0.02)
    out["after_victim_back"] = check_allreduces(new, "after the stopped rank is back")["digest"]
    return out


# ---- bodies: grow ------------------------------------------------------------------------------------------
def spawn_joiner(address: str, out_path: str, mode: str = "ok") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE), "join", address, out_path, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(comm: Any) -> None:
    """Finalizes a communicator a joiner is part of, together with it: a TCP transport being torn down
    waits (2 s at most) for its peers to close their ends too, and the joiner exits after its all-reduces."""
    pycoll.finalize(comm)


def reap(procs: list[subprocess.Popen], out_paths: list[str]) -> list[Any]:
    """The joiners' reports (their JSON files), once they exited; their output when there is none."""
    results = []
    for p, path in zip(procs, out_paths):
        try:
            output, _ = p.communicate(timeout=BODY_TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            output, _ = p.communicate()
        try:
            results.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            results.append({"rc": p.returncode, "output": output.decode("utf-8", "replace")[-3000:]})
    return results


def body_grow(comm, rank, world, joiners, holder, out_dir):
    """``holder`` starts ``joiners`` processes that ask it to be admitted; every member grows."""
    procs, paths = [], []
    if rank == holder:
        for i in range(joiners):
            paths.append(str(Path(out_dir) / f"joiner{i}.json"))
            procs.append(spawn_joiner(comm.join_address, paths[-1]))
    t0 = time.time()
    new = comm.grow(timeout=BODY_TIMEOUT, min_joiners=joiners)
    out = {"t_grow": t0}
    out.update(describe_comm(comm, new, "after grow"))
    finish(new)
    out["joiners"] = reap(procs, paths)
    return out


def body_grow_fails(comm, rank, world, holder, mode, out_dir, grow_timeout):
    """A joiner dies in the middle of the grow (``mode``: "die-assign", right after it got its rank;
    "die-plane", once its fault plane is up): every member's grow raises, the old communicator still
    works, and a grow with a healthy joiner then succeeds."""
    procs, paths = [], []
    if rank == holder:
        paths.append(str(Path(out_dir) / "dying.json"))
        procs.append(spawn_joiner(comm.join_address, paths[-1], mode))
        end = time.monotonic() + BODY_TIMEOUT
        while not comm.joiners.alive():  # its request arrived: the short grow deadline is for the grow
            if time.monotonic() > end:
                raise AssertionError("the joining process never asked to join")
            time.sleep(0.01)
    pycoll.barrier(comm=comm, timeout=BODY_TIMEOUT)
    t0 = time.time()
    out: dict[str, Any] = {}
    try:
        comm.grow(timeout=grow_timeout, min_joiners=1)
        out["error"] = None
    except pycoll.PycollError as exc:
        out["error"] = describe(exc)
        out["error"]["elapsed"] = time.time() - t0
    out["dying"] = [{"rc": p.wait(timeout=BODY_TIMEOUT)} for p in procs]
    out["old_usable"] = check_allreduces(comm, "the old communicator after the failed grow")  # raises
    out["old_epoch"] = comm.epoch
    procs, paths = [], []
    if rank == holder:
        paths.append(str(Path(out_dir) / "healthy.json"))
        procs.append(spawn_joiner(comm.join_address, paths[-1]))
    new = comm.grow(timeout=BODY_TIMEOUT, min_joiners=1)
    out["grown"] = describe_comm(comm, new, "after the grow that followed the failed one")
    finish(new)
    out["joiners"] = reap(procs, paths)
    return out


def body_shrink_grow(comm, rank, world, victim, stamp_path, out_dir, delay=0.1):
    """Kill ``victim``, shrink, then a replacement process joins the shrunk job (grown back to ``world``)."""
    arm = (lambda: die_later(delay, stamp_path)) if rank == victim else None
    error, _ = loop_until_error(comm, rank, after_first=arm)
    new = comm.shrink(timeout=BODY_TIMEOUT)
    out = {"error": error}
    out["shrunk"] = describe_comm(comm, new, "after shrink")
    if out["shrunk"]["allreduce_error"] is not None:
        return {**out, **out["shrunk"]}
    procs, paths = [], []
    if new.rank == 0:
        paths.append(str(Path(out_dir) / "replacement.json"))
        procs.append(spawn_joiner(new.join_address, paths[-1]))
    grown = new.grow(timeout=BODY_TIMEOUT, min_joiners=1)
    out.update(describe_comm(new, grown, "after growing back"))
    finish(grown)
    out["joiners"] = reap(procs, paths)
    return out


def body_no_fault_tolerance(comm, rank, world):
    """A communicator without a fault plane: shrink / grow / agree / join_address raise
    InvalidUsageError, and the communicator still works afterwards."""
    out = {"has_plane": comm.plane is not None}
    calls = {
        "shrink": lambda: comm.shrink(timeout=5),
        "grow": lambda: comm.grow(timeout=5),
        "agree": lambda: comm.agree(True, timeout=5),
        "join_address": lambda: comm.join_address,
    }
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except Exception as exc:  # noqa: BLE001
            out[name] = describe(exc)
    out["after"] = check_allreduces(comm, "after the refused calls")["digest"]
    return out


# ---- bodies: minimal reproductions of library bugs (see the tests that use them) ------------------------
def body_shrink_repeatedly(comm, rank, world, n, timeout):
    """``n`` shrinks in a row with nobody dead: each must give the same ranks back."""
    c = comm
    for i in range(n):
        try:
            c = c.shrink(timeout=timeout)
        except pycoll.PycollError as exc:
            return {"at": i, "error": describe(exc)}
        if c.world_size != world or c.rank != rank:
            return {"at": i, "error": None, "world": c.world_size, "rank": c.rank}
    return {"at": None, "epoch": c.epoch, "digest": check_allreduces(c, "after the shrinks")["digest"]}


def body_bye_race(comm, rank, world, delay):
    """Rank 0 leaves (finalize), its ``bye`` to the last rank ``delay`` s after the others' (as when the
    closing thread is preempted mid-broadcast). The others, still on the communicator, report what their
    fault plane believes afterwards, and agree among themselves."""
    plane = comm.plane_required()
    if rank == 0:
        real = plane.send

        def send(peer: int, msg: dict[str, Any]) -> bool:
            if msg.get("t") == "bye" and peer == world - 1:
                time.sleep(delay)
            return real(peer, msg)

        plane.send = send
        pycoll.finalize(comm)
        return None
    time.sleep(delay + 0.4)
    out = {"dead": sorted(plane.dead), "left": sorted(plane.left), "evicted": plane.evicted}
    try:
        out["agree"] = comm.agree(True, timeout=5)
    except pycoll.PycollError as exc:
        out["agree"] = describe(exc)
    return out


def body_settle_time(comm, rank, world, victim):
    """How long the failed collective spent in Plane.settle after ``victim`` was killed."""
    import pycoll.fault.plane as plane_mod

    spent: list[float] = []
    real = plane_mod.Plane.settle

    def timed(self: Any, timeout: float = 0.2) -> None:
        t0 = time.monotonic()
        real(self, timeout)
        spent.append(time.monotonic() - t0)

    plane_mod.Plane.settle = timed
    if rank == victim:
        die_later(0.1, None)
    error, _ = loop_until_error(comm, rank)
    return {"error": error, "settle": spent}


def body_second_death_after_error(comm, rank, world, first, second):
    """``first`` dies mid-all-reduce; ``second`` dies 30 ms after its fault plane found ``first`` dead
    (while the other ranks are still reporting the error of their all-reduce)."""
    if rank == first:
        die_later(0.1, None)
    if rank == second:
        def on_event(kind: str, r: int, why: str) -> None:
            if kind == "dead" and r == first:
                die_later(0.03, None)

        comm.plane_required().add_listener(on_event)
    error, _ = loop_until_error(comm, rank)
    return error


def body_mismatch_then_revoke(comm, rank, world, odd):
    """Mismatched all-reduce (``odd`` gives 1001 elements); each rank revokes as soon as its own call
    raised, as a rank going on to shrink does."""
    try:
        pycoll.allreduce(np.ones(1001 if rank == odd else 1000, np.float32), comm=comm, timeout=BODY_TIMEOUT)
        error = None
    except pycoll.PycollError as exc:
        error = describe(exc)
    comm.revoke(f"rank {rank} goes on to shrink")
    return error


def body_build_abandoned(comm, rank, world, first, second, slow, timeout, fix=False):
    """``first`` dies mid-all-reduce. In the shrink that follows, ``second`` dies 0.1 s into its build of the
    new communicator, and the ranks ``slow`` start their builds 0.3 s late: by then ``second`` is gone,
    their builds fail at once, and they wait in the commit agreement. ``fix``: try the remedy (a build
    gives up as soon as any member of the attempt is dead)."""
    import pycoll.fault.membership as membership

    real = membership._build
    if rank == second:
        membership._build = lambda *a, **k: (time.sleep(0.1), die())
    elif rank in slow:
        membership._build = lambda *a, **k: (time.sleep(0.3), real(*a, **k))[1]
    if fix:
        plane = comm.plane_required()
        inner = membership._build

        def fixed(old, members, r, plane_id, token, parents, deadline, gone):
            def any_gone(_r: int) -> str | None:
                return next((plane.dead[a] for a in parents if a in plane.dead), None)

            return inner(old, members, r, plane_id, token, parents, deadline, any_gone)

        membership._build = fixed
    if rank == first:
        die_later(0.1, None)
    error, _ = loop_until_error(comm, rank)
    t0 = time.time()
    try:
        new = comm.shrink(timeout=timeout)
    except pycoll.PycollError as exc:
        return {"error": error, "shrink_error": describe(exc), "elapsed": time.time() - t0}
    out = {"error": error, "shrink_error": None, "elapsed": time.time() - t0}
    out.update(describe_comm(comm, new, "after the shrink"))
    return out


def body_native_notices_first(comm, rank, world, victim, busy, hold, compute):
    """``victim`` dies 0.1 s after a barrier. Every survivor's control thread takes ``hold`` s longer to
    find it dead by itself (its own end-of-file, reset or failed send; what other ranks report still counts
    at once), so the loss is seen first by the data transport (on TCP its sockets reset at once; in the
    matrix the control link's reset was read a few ms later): rank 0, waiting in an all-reduce, raises and
    shrinks, which revokes. Rank ``busy`` computes for ``compute`` s, then all-reduces. What each
    survivor's all-reduce raised."""
    import pycoll.fault.plane as plane_mod

    plane = comm.plane_required()
    real = plane_mod.Plane.found_dead
    pending: list[threading.Timer] = []

    def found_dead(self: Any, peer: int, why: str, **kwargs: Any) -> None:
        first_hand = "reported by" not in why and "found dead by" not in why
        if self is plane and peer == victim and first_hand and threading.current_thread() is self._thread:
            if not pending:  # found by this rank's own control thread: later
                pending.append(threading.Timer(hold, lambda: real(self, peer, why, **kwargs)))
                pending[0].start()
            return
        real(self, peer, why, **kwargs)

    plane_mod.Plane.found_dead = found_dead
    pycoll.barrier(comm=comm, timeout=BODY_TIMEOUT)
    if rank == victim:
        time.sleep(0.1)
        die()
    if rank == busy:
        time.sleep(compute)
    try:
        pycoll.allreduce(np.ones(1000, np.float32), comm=comm, timeout=BODY_TIMEOUT)
        error = None
    except pycoll.PycollError as exc:
        error = describe(exc)
    comm.shrink(timeout=BODY_TIMEOUT)
    return error


def _resources() -> dict[str, int]:
    maps = sum(1 for line in open("/proc/self/maps") if "memfd:" in line)
    return {"threads": len(os.listdir("/proc/self/task")), "memfd_mappings": maps}


def body_transport_released(comm, rank, world, victim):
    """This process's threads and shared-memory mappings with the first communicator, and once it was
    shrunk (the old one finalized) after ``victim`` died."""
    before = _resources()
    if rank == victim:
        die_later(0.1, None)
    error, _ = loop_until_error(comm, rank)
    comm.shrink(timeout=BODY_TIMEOUT)
    time.sleep(0.3)  # threads that end on their own (control-socket handshakes) are gone
    return {"error": error, "before": before, "after": _resources()}


# ---- scripts -----------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def joiner_main(address: str, out_path: str, mode: str) -> int:
    """A process asking the job at ``address`` to admit it; writes its report to ``out_path``.
    mode "die-assign": SIGKILLs itself right after it got its rank (before it dials anyone);
    "die-plane": once its fault plane with the members is up (as its communicator is being made)."""
    import pycoll.comm
    import pycoll.fault.membership as membership

    if mode == "die-assign":
        membership.form = lambda *a, **k: die()
    elif mode == "die-plane":
        pycoll.comm.Communicator.__init__ = lambda *a, **k: die()
    elif mode != "ok":
        raise ValueError(mode)
    t0 = time.time()
    comm = pycoll.init(join=address, timeout=BODY_TIMEOUT)
    report = {"t_join": t0, "t_joined": time.time(), "rank": comm.rank, "world": comm.world_size,
              "epoch": comm.epoch, "parents": list(comm.parent_ranks), "transport": comm.transport}
    report.update(check_allreduces(comm, "on the joiner"))
    Path(out_path).write_text(json.dumps(report))
    pycoll.finalize()
    return 0


def store_rank_main(rank: int, world: int, port: int, args: dict[str, Any]) -> int:
    """Rank ``rank`` of a job formed with explicit rank/world/master address: rank 0 hosts the store.
    Runs body_kill with ``args`` and writes what it returns (JSON) to args["out"]."""
    comm = pycoll.init(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                       timeout=BODY_TIMEOUT)
    result = body_kill(comm, rank, world, args["victims"], args["stamp"])
    try:  # the store went with rank 0
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        result["store_gone"] = False
    except OSError:
        result["store_gone"] = True
    Path(args["out"]).write_text(json.dumps(result))
    pycoll.finalize()
    return 0


def main(argv: list[str]) -> int:
    _die_with_parent()
    if argv[0] == "join":
        return joiner_main(argv[1], argv[2], argv[3])
    if argv[0] == "store":
        return store_rank_main(int(argv[1]), int(argv[2]), int(argv[3]), json.loads(argv[4]))
    raise SystemExit(f"unknown command {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
