"""Fail-over of a pycoll communicator (issue 18): kill a rank, shrink, go on; grow with a joiner.

    python bench/failover.py                     # shm + TCP (loopback), 3/4/8 ranks, 5 runs each
    python bench/failover.py --netns             # also TCP across network namespaces (root; 10gbit links)
    python bench/failover.py --quick             # smoke run: 1 run per configuration
    python bench/failover.py --runs 9 --worlds 4,8 --transports tcp --json out.jsonl

Part 1, shrink. For each transport (``shm``: one host, shared memory; ``tcp``: one host,
PYCOLL_TRANSPORT=tcp over loopback; ``netns``: one rank per virtual host of tests/netns.py, every link
shaped with tbf to ``--rate`` both ways), world size (``--worlds``) and victim (``mid``: rank world // 2,
``0``: rank 0, which also hosts the job's rendezvous store), fresh rank processes form a communicator
(``pycoll.init``, default settings but ``timeout``) and run 1 MiB (``--bytes``) float32 all-reduces in a
loop; the victim SIGKILLs itself from a helper thread at a random moment (uniform in ``--kill-window``
seconds after the loop started, so almost always inside an all-reduce). Just before ``os.kill`` it writes
``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine, network namespaces
included). Every survivor records, on the same clock: the error its all-reduce raised (*detect*),
``comm.shrink()`` returned (*shrink*), and the first all-reduce on the shrunk communicator returned
(*first*). That all-reduce's input is rank-dependent and integer-valued: survivor p (old rank) with new
rank q gives ``(p + 1) * (i % 251 + 1) + q`` at element i, so the sum is known in closed form; each
survivor checks it exactly (and world size, ``parent_ranks``, epoch) and reports a SHA-256 of the
result, compared across survivors. A run's figure is the slowest survivor's; per configuration the
table gives the median [min - max] over ``--runs`` runs (configurations interleaved run by run), the
target (issue 18: first correct all-reduce <= 0.5 s after the kill on shared memory, <= 1 s over TCP)
and the verdict on the median and on the slowest run.

Part 2, grow. 3 members + 1 joining process (``pycoll.init(join=rank 0's comm.join_address)``, started
by this script; on its own virtual host with ``--netns``). Rank 0 waits until the joiner's request is
held (``comm.joiners``), so the joiner's Python start-up is not counted; the members meet (an
all-reduce) and call ``comm.grow(min_joiners=1)``: *grow* = first member's call -> the last of the 4
ranks has its new communicator. Then, on the grown communicator, an exact all-reduce check, the link
rate beside (shm / tcp: the 4-rank all-reduce busbw at 16 MiB, and one process's memcpy rate; netns:
the shaped rate, the busbw shown too), and the elastic loop's state transfer
(``pycoll.elastic.state.send_to_joiners``, holders = the 3 members) of 1, 16 and 64 MiB
(``--state-mib``), each after a barrier, timed first start -> last return, the joiner's copy checked
exactly. Target (issue 18): grow + transfer <= 1 s + state bytes / (0.8 x link rate). The part 2 ranks
take large buffers from a heap they pre-faulted at start (glibc's mmap off, no trimming), so that the
transfer is not timed against the machine's first-touch page faults (slow in some sandboxes and VMs: the
first line says how fast; ``--cold-memory`` leaves that out and times them too).

After its checks every rank agrees (``comm.agree``) and finalizes; errors there are counted apart
("teardown"), not as failed checks. Every run has a hard deadline (``--deadline``): past it its
processes are SIGKILLed and the run counts as a hang; nothing waits without a deadline. The last line
sums up hangs and failed checks; the exit status is 1 when there was any (or a target was missed with
``--strict``), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: Issue 18's targets: kill -> first correct all-reduce on the shrunk communicator, seconds.
SHRINK_TARGET_S = {"shm": 0.5, "tcp": 1.0, "netns": 1.0}
#: grow + state transfer <= GROW_BASE_S + bytes / (GROW_LINK_SHARE x link rate)
GROW_BASE_S = 1.0
GROW_LINK_SHARE = 0.8
GROW_MEMBERS = 3
TRANSPORT_NAMES = {
    "shm": "shm (1 host)",
    "tcp": "tcp loopback",
    "netns": "tcp netns",
}
EVENT = "@@failover "  # the prefix of a worker's event lines on stdout


# =========================================================================================================
# Rank side (``failover.py --worker SPEC``)


def _emit(**event: Any) -> None:
    sys.stdout.write(EVENT + json.dumps(event) + "\n")
    sys.stdout.flush()


def _pattern(count: int):
    import numpy as np

    return (np.arange(count, dtype=np.int64) % 251 + 1).astype(np.float32)


def _digest(array: Any) -> str:
    return hashlib.sha256(memoryview(array).cast("B")).hexdigest()[:16]


def _state_pattern(nbytes: int):
    """The members' state of ``nbytes``: a uint32 hash of the index (every byte position differs)."""
    import numpy as np

    a = np.arange(nbytes // 4, dtype=np.uint32)
    a *= np.uint32(2654435761)
    a ^= np.uint32(nbytes & 0xFFFFFFFF)
    return a


def _init(spec: dict[str, Any]):
    import pycoll

    return pycoll.init(
        rank=spec["rank"],
        world_size=spec["world"],
        master_addr=spec["addr"],
        master_port=spec["port"],
        timeout=spec["comm_timeout"],
    )


def _worker_shrink(spec: dict[str, Any]) -> int:
    import numpy as np

    import pycoll

    rank, world, victim = spec["rank"], spec["world"], spec["victim"]
    comm = _init(spec)
    count = spec["bytes"] // 4
    pattern = _pattern(count)
    x = pattern * np.float32(rank + 1)
    pycoll.allreduce(x, comm=comm)
    if not np.array_equal(x, pattern * np.float32(world * (world + 1) // 2)):
        _emit(ev="error", rank=rank, msg="the warm-up all-reduce is wrong")
        return 1
    state = {"iters": 0, "in_call": False}
    if rank == victim:

        def kill() -> None:
            time.sleep(spec["kill_delay"])
            t = time.monotonic()
            _emit(ev="kill", rank=rank, t=t, iters=state["iters"], in_call=state["in_call"])
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
    y = np.empty_like(pattern)
    loop_end = time.monotonic() + spec["loop_s"]
    try:
        while True:
            np.multiply(pattern, np.float32(rank + 1), out=y)
            state["in_call"] = True
            pycoll.allreduce(y, comm=comm)
            state["in_call"] = False
            state["iters"] += 1
            if time.monotonic() > loop_end:
                _emit(ev="error", rank=rank, msg=f"no error within {spec['loop_s']} s of all-reduces")
                return 1
    except pycoll.PycollError as exc:
        t_err = time.monotonic()
        err = f"{type(exc).__name__}: {exc}"
    new = comm.shrink(timeout=spec["shrink_timeout"])
    t_shrink = time.monotonic()
    z = pattern * np.float32(rank + 1) + np.float32(new.rank)
    pycoll.allreduce(z, comm=new)
    t_first = time.monotonic()
    survivors = [r for r in range(world) if r != victim]
    n = len(survivors)
    expected = pattern * np.float32(sum(p + 1 for p in survivors)) + np.float32(n * (n - 1) // 2)
    problems = []
    if not np.array_equal(z, expected):
        problems.append(f"{int((z != expected).sum())} of {count} elements wrong")
    if new.world_size != n:
        problems.append(f"world size {new.world_size}, expected {n}")
    if tuple(new.parent_ranks) != tuple(survivors):
        problems.append(f"parent_ranks {tuple(new.parent_ranks)}, expected {tuple(survivors)}")
    if new.epoch != comm.epoch + 1:
        problems.append(f"epoch {new.epoch}, expected {comm.epoch + 1}")
    _emit(
        ev="result", rank=rank, new_rank=new.rank, t_err=t_err, t_shrink=t_shrink, t_first=t_first,
        err=err[:300], problems=problems, digest=_digest(z), iters=state["iters"],
    )  # fmt: skip
    _teardown(new, rank, spec)
    return 0


def _teardown(comm: Any, rank: int, spec: dict[str, Any]) -> None:
    """After the checks: agree (so that no rank leaves while another is still in the last collective),
    then finalize. Errors here are reported as teardown errors, apart from the fail-over's checks."""
    import pycoll

    t0 = time.monotonic()
    for what, fn in (
        ("agree", lambda: comm.agree(True, spec["comm_timeout"])),
        ("finalize", lambda: pycoll.finalize(comm)),
    ):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            _emit(ev="teardown_error", rank=rank, msg=f"{what}: {type(exc).__name__}: {exc}"[:300])
    _emit(ev="finalized", rank=rank, seconds=time.monotonic() - t0)


def _barrier(comm: Any) -> None:
    import numpy as np

    import pycoll

    pycoll.allreduce(np.zeros(1, np.float32), comm=comm)


def _after_grow(new: Any, spec: dict[str, Any], is_joiner: bool) -> int:
    """Every rank of the grown communicator: check, link rate, state transfers."""
    import numpy as np

    import pycoll
    from pycoll.elastic import state as elastic_state

    rank, world = new.rank, new.world_size
    count = (1 << 20) // 4
    pattern = _pattern(count)
    z = pattern * np.float32(rank + 1)
    pycoll.allreduce(z, comm=new)
    problems = []
    if world != GROW_MEMBERS + 1:
        problems.append(f"world size {world}, expected {GROW_MEMBERS + 1}")
    if not np.array_equal(z, pattern * np.float32(world * (world + 1) // 2)):
        problems.append("the all-reduce on the grown communicator is wrong")
    want_parents = tuple(range(GROW_MEMBERS)) + (-1,)
    if not is_joiner and tuple(new.parent_ranks) != want_parents:
        problems.append(f"parent_ranks {tuple(new.parent_ranks)}, expected {want_parents}")
    _emit(ev="check", rank=rank, problems=problems, digest=_digest(z))

    # The link rate beside: all-reduce busbw (4 ranks, 16 MiB) and one process's memcpy rate.
    big = np.zeros((16 << 20) // 4, np.float32)
    pycoll.allreduce(big, comm=new)
    times = []
    for _ in range(spec["rate_iters"]):
        _barrier(new)
        t0 = time.perf_counter()
        pycoll.allreduce(big, comm=new)
        times.append(time.perf_counter() - t0)
    slowest = np.array(times, np.float64)
    pycoll.allreduce(slowest, "max", comm=new)
    t_ar = float(np.median(slowest))
    busbw = big.nbytes / t_ar * 2 * (world - 1) / world
    memcpy = None
    if rank == 0:
        src, dst = np.ones(64 << 20, np.uint8), np.empty(64 << 20, np.uint8)
        best = min(_timed_copy(dst, src) for _ in range(3))
        memcpy = src.nbytes / best
    _emit(ev="rate", rank=rank, busbw=busbw, allreduce_s=t_ar, memcpy=memcpy)
    del big

    for k, mib in enumerate(spec["state_mib"]):
        nbytes = int(mib * (1 << 20)) // 4 * 4
        if is_joiner:
            st = {"w": np.zeros(nbytes // 4, np.uint32)}
        else:
            st = {"w": _state_pattern(nbytes)}
        _barrier(new)
        t0 = time.monotonic()
        step = elastic_state.send_to_joiners(new, st, GROW_MEMBERS, 100 + k)
        t1 = time.monotonic()
        problems = []
        digest = None
        if step != 100 + k:
            problems.append(f"step {step}, expected {100 + k}")
        if is_joiner:
            if not np.array_equal(st["w"], _state_pattern(nbytes)):
                problems.append("the joiner's state differs from the members'")
            digest = _digest(st["w"])
        elif rank == 0:
            digest = _digest(st["w"])
        _emit(ev="state", rank=rank, mib=mib, bytes=nbytes, t0=t0, t1=t1, problems=problems, digest=digest)
        del st
    _teardown(new, rank, spec)
    return 0


def _timed_copy(dst: Any, src: Any) -> float:
    import numpy as np

    t0 = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - t0


def _warm_heap(spec: dict[str, Any]) -> None:
    """Touches and frees ``warm_mib`` of heap (malloc's mmap is off in the workers' environment, and the
    heap is never trimmed), so that the buffers allocated later, send_to_joiners' included, reuse pages
    this process already faulted in; see ``--cold-memory``."""
    if spec.get("warm_mib"):
        import numpy as np

        a = np.ones(int(spec["warm_mib"]) << 20, np.uint8)
        del a


def _worker_grow(spec: dict[str, Any]) -> int:
    _warm_heap(spec)
    rank = spec["rank"]
    comm = _init(spec)
    if rank == 0:
        _emit(ev="join_address", rank=rank, address=comm.join_address)
        deadline = time.monotonic() + spec["join_wait_s"]
        while not comm.joiners.alive():
            if time.monotonic() > deadline:
                _emit(ev="error", rank=rank, msg=f"no join request within {spec['join_wait_s']} s")
                return 1
            time.sleep(0.005)
        _emit(ev="joiner_held", rank=rank, t=time.monotonic())
    _barrier(comm)
    t0 = time.monotonic()
    new = comm.grow(timeout=spec["grow_timeout"], min_joiners=1)
    t1 = time.monotonic()
    _emit(ev="grown", rank=rank, new_rank=new.rank, t0=t0, t1=t1, epoch=new.epoch)
    return _after_grow(new, spec, is_joiner=False)


def _worker_joiner(spec: dict[str, Any]) -> int:
    import pycoll

    _warm_heap(spec)
    _emit(ev="joining", rank=-1, t=time.monotonic())
    new = pycoll.init(join=spec["address"], timeout=spec["comm_timeout"])
    t1 = time.monotonic()
    _emit(ev="grown", rank=-1, new_rank=new.rank, t0=None, t1=t1, epoch=new.epoch)
    return _after_grow(new, spec, is_joiner=True)


def worker_main(spec_text: str) -> int:
    spec = json.loads(spec_text)
    try:
        return {"shrink": _worker_shrink, "grow": _worker_grow, "joiner": _worker_joiner}[spec["kind"]](spec)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        _emit(ev="error", rank=spec.get("rank", -1), msg=f"{type(exc).__name__}: {exc}",
              tb=traceback.format_exc()[-3000:])  # fmt: skip
        return 1


# =========================================================================================================
# Parent side: start ranks, read their events, enforce the deadline


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    err_path: Path
    buf: bytes = b""
    events: list[dict[str, Any]] = field(default_factory=list)
    eof: bool = False

    def stderr_tail(self, limit: int = 1500) -> str:
        try:
            data = self.err_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace")

    def find(self, ev: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("ev") == ev), None)


class Runner:
    """Where ranks run: this host (shm / tcp) or one virtual host each (netns)."""

    def __init__(self, transport: str, tmp: Path, hosts: Sequence[Any] = (), warm: bool = True) -> None:
        self.transport = transport
        self.tmp = tmp
        self.hosts = list(hosts)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
        env.pop("PYCOLL_TRANSPORT", None)
        if transport == "tcp":
            env["PYCOLL_TRANSPORT"] = "tcp"
        if warm:  # large buffers from the (never trimmed) heap: see _warm_heap
            env["MALLOC_MMAP_MAX_"] = "0"
            env["MALLOC_TRIM_THRESHOLD_"] = str(1 << 40)
        self.env = env
        self.count = 0

    @property
    def addr(self) -> str:
        return self.hosts[0].address if self.hosts else "127.0.0.1"

    def free_port(self) -> int:
        if self.hosts:
            return int(self.hosts[0].free_port())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def start(self, name: str, host_index: int, spec: dict[str, Any]) -> Proc:
        self.count += 1
        err_path = self.tmp / f"{self.count:04d}-{name}.err"
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        with open(err_path, "wb") as err:
            kw = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, cwd=str(REPO))
            if self.hosts:
                popen = self.hosts[host_index].popen(argv, env=self.env, **kw)
            else:
                popen = subprocess.Popen(argv, env=self.env, **kw)
        return Proc(name, popen, err_path)


def pump(procs: Sequence[Proc], deadline: float, until: Any = None) -> bool:
    """Reads the processes' event lines until every one has ended (True), ``until()`` is true (True), or
    the deadline passed (False)."""
    sel = selectors.DefaultSelector()
    for p in procs:
        if not p.eof:
            os.set_blocking(p.popen.stdout.fileno(), False)
            sel.register(p.popen.stdout, selectors.EVENT_READ, p)
    try:
        while True:
            if until is not None and until():
                return True
            if all(p.eof for p in procs):
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.popen.wait(timeout=max(0.01, deadline - time.monotonic()))
                return all(p.popen.returncode is not None for p in procs)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in sel.select(timeout=min(left, 0.2)):
                p = key.data
                try:
                    chunk = os.read(p.popen.stdout.fileno(), 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    p.eof = True
                    sel.unregister(p.popen.stdout)
                    continue
                p.buf += chunk
                while b"\n" in p.buf:
                    line, p.buf = p.buf.split(b"\n", 1)
                    text = line.decode("utf-8", "replace")
                    if text.startswith(EVENT):
                        with contextlib.suppress(ValueError):
                            p.events.append(json.loads(text[len(EVENT) :]))
    finally:
        sel.close()


def kill_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.popen.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=10)
        with contextlib.suppress(OSError):
            p.popen.stdout.close()


def _teardown_errors(procs: Sequence[Proc]) -> list[str]:
    return [f"{p.name}: {e['msg']}" for p in procs for e in p.events if e.get("ev") == "teardown_error"]


def _errors(procs: Sequence[Proc]) -> list[str]:
    out = []
    for p in procs:
        for e in p.events:
            if e.get("ev") == "error":
                tb = e.get("tb", "")
                out.append(f"{p.name}: {e['msg']}" + (f"\n{tb}" if tb else ""))
    return out


# ---- part 1 ---------------------------------------------------------------------------------------------


@dataclass
class ShrinkRun:
    transport: str
    world: int
    victim_kind: str
    victim: int
    run: int
    kill_delay: float
    hang: bool = False
    failed: list[str] = field(default_factory=list)
    detect: float | None = None
    shrink: float | None = None
    first: float | None = None
    in_call: bool | None = None
    finalize_max: float | None = None
    teardown: list[str] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.hang and not self.failed and self.first is not None


def run_shrink(
    runner: Runner, world: int, victim_kind: str, run: int, args: Any, rng: random.Random
) -> ShrinkRun:
    victim = 0 if victim_kind == "0" else world // 2
    lo, hi = args.kill_window
    r = ShrinkRun(runner.transport, world, victim_kind, victim, run, rng.uniform(lo, hi))
    t_start = time.monotonic()
    port = runner.free_port()
    base = {
        "kind": "shrink", "world": world, "addr": runner.addr, "port": port, "victim": victim,
        "kill_delay": r.kill_delay, "bytes": args.bytes, "comm_timeout": args.comm_timeout,
        "shrink_timeout": args.comm_timeout, "loop_s": args.loop_s,
    }  # fmt: skip
    procs: list[Proc] = []
    try:
        for rank in range(world):
            procs.append(runner.start(f"{runner.transport}-w{world}-r{rank}", rank, {**base, "rank": rank}))
        finished = pump(procs, t_start + args.deadline)
    finally:
        kill_all(procs)
    r.wall = time.monotonic() - t_start
    kill = procs[victim].find("kill")
    results = {rank: procs[rank].find("result") for rank in range(world) if rank != victim}
    if not finished:
        r.hang = True
        missing = [rank for rank, res in results.items() if res is None]
        r.failed.append(f"deadline {args.deadline:g} s passed; no result from rank(s) {missing}")
    r.failed += _errors(procs)
    r.teardown = _teardown_errors(procs)
    if kill is None:
        r.failed.append(f"the victim (rank {victim}) did not report its kill")
    elif procs[victim].popen.returncode != -signal.SIGKILL:
        r.failed.append(f"the victim's exit status is {procs[victim].popen.returncode}, not -9")
    got = {rank: res for rank, res in results.items() if res is not None}
    for rank, res in got.items():
        r.failed += [f"rank {rank}: {why}" for why in res["problems"]]
    digests = {res["digest"] for res in got.values()}
    if len(digests) > 1:
        r.failed.append(f"survivors' results differ: {sorted(digests)}")
    if kill is not None and len(got) == world - 1:
        t_kill = kill["t"]
        r.in_call = kill["in_call"]
        r.detect = max(res["t_err"] - t_kill for res in got.values())
        r.shrink = max(res["t_shrink"] - t_kill for res in got.values())
        r.first = max(res["t_first"] - t_kill for res in got.values())
    fins = [e["seconds"] for p in procs for e in p.events if e.get("ev") == "finalized"]
    if fins:
        r.finalize_max = max(fins)
    if not r.ok and args.verbose:
        for p in procs:
            tail = p.stderr_tail()
            if tail.strip():
                print(f"--- {p.name} stderr:\n{tail}", file=sys.stderr)
    return r


# ---- part 2 ---------------------------------------------------------------------------------------------


@dataclass
class GrowRun:
    transport: str
    run: int
    hang: bool = False
    failed: list[str] = field(default_factory=list)
    grow: float | None = None
    busbw: float | None = None
    memcpy: float | None = None
    transfer: dict[float, float] = field(default_factory=dict)  # MiB -> seconds
    state_bytes: dict[float, int] = field(default_factory=dict)
    teardown: list[str] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.hang and not self.failed and self.grow is not None


def run_grow(runner: Runner, run: int, args: Any) -> GrowRun:
    g = GrowRun(runner.transport, run)
    t_start = time.monotonic()
    deadline = t_start + args.deadline
    port = runner.free_port()
    base = {
        "world": GROW_MEMBERS, "addr": runner.addr, "port": port, "comm_timeout": args.comm_timeout,
        "grow_timeout": args.comm_timeout, "join_wait_s": min(args.comm_timeout, args.deadline),
        "state_mib": args.state_mib, "rate_iters": args.rate_iters,
        "warm_mib": 0 if args.cold_memory else int(3 * max(args.state_mib) + 64),
    }  # fmt: skip
    procs: list[Proc] = []
    finished = False
    try:
        for rank in range(GROW_MEMBERS):
            procs.append(
                runner.start(f"{runner.transport}-grow-r{rank}", rank, {**base, "kind": "grow", "rank": rank})
            )
        got_address = pump(procs, deadline, until=lambda: procs[0].find("join_address") is not None
                           or procs[0].find("error") is not None)  # fmt: skip
        addr = procs[0].find("join_address")
        if got_address and addr is not None:
            procs.append(runner.start(f"{runner.transport}-grow-joiner", GROW_MEMBERS,
                                      {**base, "kind": "joiner", "address": addr["address"]}))  # fmt: skip
            finished = pump(procs, deadline)
    finally:
        kill_all(procs)
    g.wall = time.monotonic() - t_start
    if not finished:
        g.hang = True
        g.failed.append(f"deadline {args.deadline:g} s passed (or no join address)")
    g.failed += _errors(procs)
    g.teardown = _teardown_errors(procs)
    grown = [p.find("grown") for p in procs]
    if len(procs) == GROW_MEMBERS + 1 and all(grown):
        g.grow = max(e["t1"] for e in grown) - min(e["t0"] for e in grown if e["t0"] is not None)
    checks = [p.find("check") for p in procs]
    for p, c in zip(procs, checks):
        if c is not None:
            g.failed += [f"{p.name}: {why}" for why in c["problems"]]
    if all(checks) and len({c["digest"] for c in checks}) > 1:
        g.failed.append("the ranks' all-reduce results on the grown communicator differ")
    rates = [p.find("rate") for p in procs]
    if all(rates):
        g.busbw = rates[0]["busbw"]
        g.memcpy = next((e["memcpy"] for e in rates if e["memcpy"]), None)
    for mib in args.state_mib:
        evs = [next((e for e in p.events if e.get("ev") == "state" and e["mib"] == mib), None) for p in procs]
        if not all(evs) or len(evs) != GROW_MEMBERS + 1:
            continue
        g.transfer[mib] = max(e["t1"] for e in evs) - min(e["t0"] for e in evs)
        g.state_bytes[mib] = evs[0]["bytes"]
        for p, e in zip(procs, evs):
            g.failed += [f"{p.name}: {mib} MiB state: {why}" for why in e["problems"]]
        digests = {e["digest"] for e in evs if e["digest"]}
        if len(digests) > 1:
            g.failed.append(f"{mib} MiB state: the joiner's copy hashes differently from rank 0's")
    if not g.ok and args.verbose:
        for p in procs:
            tail = p.stderr_tail()
            if tail.strip():
                print(f"--- {p.name} stderr:\n{tail}", file=sys.stderr)
    return g


# =========================================================================================================
# Tables


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{_ms(statistics.median(values))} [{_ms(min(values))}-{_ms(max(values))}]"


def _verdict(values: Sequence[float], target: float, failures: int) -> str:
    if not values:
        return "NO DATA"
    med_ok, max_ok = statistics.median(values) <= target, max(values) <= target
    text = "ok" if med_ok and max_ok else ("median ok, max MISS" if med_ok else "MISS")
    return text + (f" ({failures} failed)" if failures else "")


def shrink_table(runs: Sequence[ShrinkRun], args: Any) -> tuple[str, list[str]]:
    lines = [
        f"== part 1: SIGKILL one rank during a loop of {args.bytes >> 10} KiB float32 all-reduces, then "
        "shrink ==",
        "times from the kill (victim's CLOCK_MONOTONIC just before os.kill) to: the survivor's all-reduce "
        "raising (detect), shrink returning, the first all-reduce on the shrunk communicator returning "
        "(first; result checked exactly, hashes equal across survivors); slowest survivor per run; "
        "median [min-max] over runs, ms",
        f"{'transport':<13} {'ranks':>5} {'victim':>6} {'runs':>6} {'in-call':>7}  {'detect ms':<22} "
        f"{'shrink ms':<22} {'first all-reduce ms':<22} {'target':>7}  verdict (median, slowest run)",
    ]
    misses = []
    keys = []
    for r in runs:
        k = (r.transport, r.world, r.victim_kind)
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in runs if (r.transport, r.world, r.victim_kind) == k]
        ok = [r for r in rs if r.ok]
        target = SHRINK_TARGET_S[k[0]]
        firsts = [r.first for r in ok]
        verdict = _verdict(firsts, target, len(rs) - len(ok))
        if verdict != "ok":
            misses.append(f"{TRANSPORT_NAMES[k[0]]} {k[1]} ranks victim {k[2]}: {verdict}")
        victim = f"{rs[0].victim}" + ("" if k[2] == "0" else "m")
        in_call = f"{sum(1 for r in ok if r.in_call)}/{len(ok)}"
        lines.append(
            f"{TRANSPORT_NAMES[k[0]]:<13} {k[1]:>5} {victim:>6} {len(ok):>2}/{len(rs):<3} {in_call:>7}  "
            f"{_spread([r.detect for r in ok]):<22} {_spread([r.shrink for r in ok]):<22} "
            f"{_spread(firsts):<22} {target * 1e3:>5.0f}ms  {verdict}"
        )
    lines.append(
        "victim: the killed rank (m: the middle one, world // 2); in-call: kills that hit inside an "
        "all-reduce (the rest between two)"
    )
    fins = [r.finalize_max for r in runs if r.finalize_max is not None]
    if fins:
        lines.append(
            f"finalize of the shrunk communicator afterwards: median {_ms(statistics.median(fins))} "
            f"ms, max {_ms(max(fins))} ms (slowest rank per run)"
        )
    return "\n".join(lines), misses


def grow_table(runs: Sequence[GrowRun], args: Any, rate_note: dict[str, float]) -> tuple[str, list[str]]:
    lines = [
        f"== part 2: grow {GROW_MEMBERS} -> {GROW_MEMBERS + 1} ranks (the joiner's request already held), "
        "then the elastic state transfer to the joiner ==",
        "grow: first member's grow() call -> last rank (joiner included) has the new communicator; "
        "transfer: pycoll.elastic.state.send_to_joiners, first start -> last return; median [min-max] over "
        "runs, ms; bound = 1 s + bytes / (0.8 x link rate); verdict on grow + transfer (median, slowest run)",
        f"{'transport':<13} {'link rate GB/s (how)':<34} {'runs':>6} {'grow ms':<22} {'state':>7} "
        f"{'transfer ms':<22} {'grow+transfer ms':<22} {'bound ms':>8} {'@busbw':>7}  verdict",
    ]
    misses = []
    for transport in dict.fromkeys(r.transport for r in runs):
        rs = [r for r in runs if r.transport == transport]
        ok = [r for r in rs if r.ok]
        busbws = [r.busbw for r in ok if r.busbw]
        memcpys = [r.memcpy for r in ok if r.memcpy]
        if transport == "netns":
            rate = rate_note["netns"]
            how = (
                f"{rate:.3g} shaped; busbw {statistics.median(busbws) / 1e9:.3g}"
                if busbws
                else f"{rate:.3g} shaped"
            )
            rate_bps = rate * 1e9
        else:
            rate_bps = statistics.median(busbws) if busbws else None
            how = (f"{rate_bps / 1e9:.3g} busbw; memcpy {statistics.median(memcpys) / 1e9:.3g}"
                   if rate_bps and memcpys else "-")  # fmt: skip
        grows = [r.grow for r in ok]
        for i, mib in enumerate(args.state_mib):
            transfers = [r.transfer[mib] for r in ok if mib in r.transfer]
            totals = [r.grow + r.transfer[mib] for r in ok if mib in r.transfer]
            nbytes = next((r.state_bytes[mib] for r in ok if mib in r.state_bytes), int(mib * (1 << 20)))
            bound = GROW_BASE_S + nbytes / (GROW_LINK_SHARE * rate_bps) if rate_bps else None
            busbw = statistics.median(busbws) if busbws else None
            bound_busbw = GROW_BASE_S + nbytes / (GROW_LINK_SHARE * busbw) if busbw else None
            verdict = _verdict(totals, bound, len(rs) - len(ok)) if bound else "NO DATA"
            if verdict != "ok":
                misses.append(f"grow {TRANSPORT_NAMES[transport]} {mib:g} MiB: {verdict}")
            first = i == 0
            lines.append(
                f"{TRANSPORT_NAMES[transport] if first else '':<13} {how if first else '':<34} "
                f"{f'{len(ok)}/{len(rs)}' if first else '':>6} {_spread(grows) if first else '':<22} "
                f"{f'{mib:g} MiB':>7} {_spread(transfers):<22} {_spread(totals):<22} "
                f"{'-' if bound is None else f'{bound * 1e3:.0f}':>8} "
                f"{'-' if bound_busbw is None else f'{bound_busbw * 1e3:.0f}':>7}  {verdict}"
            )
    lines.append(
        "link rate: shm / tcp loopback: the grown 4-rank communicator's 16 MiB all-reduce busbw "
        "(median over runs; used for the bound) and one process's 64 MiB memcpy rate (shown); "
        "netns: the tbf rate of every link (used), with the busbw measured beside; @busbw: the "
        "bound with the measured busbw as the link rate"
    )
    return "\n".join(lines), misses


# =========================================================================================================
# main


def first_touch_Bps(nbytes: int = 64 << 20) -> float:
    """Bytes per second at which this process faults in fresh anonymous memory (a new mmap, written once):
    a few GB/s on bare metal, far less in some sandboxes and VMs."""
    import mmap

    m = mmap.mmap(-1, nbytes)
    page = b"x" * 4096
    t0 = time.perf_counter()
    for off in range(0, nbytes, 4096):
        m[off : off + 4096] = page
    seconds = time.perf_counter() - t0
    m.close()
    return nbytes / seconds


def _floats(text: str) -> list[float]:
    return [float(w) for w in text.split(",") if w.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="pycoll fail-over: kill -> shrink -> first correct all-reduce, and grow",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=None, help="runs per configuration (5; --quick: 1)")
    p.add_argument("--worlds", default="3,4,8", help="world sizes of part 1 (3,4,8)")
    p.add_argument("--victims", default="mid,0", help="victims: mid (rank world//2) and/or 0 (mid,0)")
    p.add_argument("--transports", default="shm,tcp", help="shm, tcp (loopback), netns (shm,tcp)")
    p.add_argument("--netns", action="store_true", help="add netns: one rank per namespace (root)")
    p.add_argument("--rate", default="10gbit", help="--netns: tbf rate of every link, each way (10gbit)")
    p.add_argument("--bytes", type=int, default=1 << 20, help="all-reduce size of part 1, bytes (1 MiB)")
    p.add_argument("--kill-window", type=_floats, default=[0.05, 0.5],
                   help="the kill comes uniformly in LO,HI s after the loop starts (0.05,0.5)")  # fmt: skip
    p.add_argument("--state-mib", type=_floats, default=[1, 16, 64], help="part 2 state sizes, MiB (1,16,64)")
    p.add_argument("--rate-iters", type=int, default=5, help="part 2: timed 16 MiB all-reduces for busbw (5)")
    p.add_argument("--parts", default="shrink,grow", help="shrink and/or grow (both)")
    p.add_argument("--deadline", type=float, default=60.0, help="hard deadline of one run, s (60)")
    p.add_argument("--comm-timeout", type=float, default=20.0, help="pycoll timeout of set-up, "
                   "collectives, shrink and grow, s (20)")  # fmt: skip
    p.add_argument(
        "--loop-s", type=float, default=15.0, help="a survivor gives up on seeing an error after (15)"
    )
    p.add_argument("--cold-memory", action="store_true", help="part 2: no pre-faulted heap in the ranks "
                   "(buffers then pay this machine's first-touch page faults)")  # fmt: skip
    p.add_argument("--seed", type=int, default=18, help="seed of the kill moments (18)")
    p.add_argument("--json", default=None, metavar="FILE", help="write every run as JSON lines")
    p.add_argument("--strict", action="store_true", help="exit 1 also when a target is missed")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 run per configuration")
    p.add_argument("--verbose", action="store_true", help="show the stderr of the ranks of failed runs")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def _netns_module() -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    import netns  # tests/netns.py

    return netns


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    if args.runs is None:
        args.runs = 1 if args.quick else 5
    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    victims = [v.strip() for v in args.victims.split(",") if v.strip()]
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if args.netns and "netns" not in transports:
        transports.append("netns")
    bad = [t for t in transports if t not in TRANSPORT_NAMES] + [v for v in victims if v not in ("mid", "0")]
    if bad or any(w < 2 for w in worlds) or not parts <= {"shrink", "grow"}:
        print(f"failover: bad --transports / --victims / --worlds / --parts ({bad})", file=sys.stderr)
        return 2
    started = time.monotonic()
    load0 = os.getloadavg()[0]
    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    print(f"# {os.cpu_count()} CPUs; {args.runs} run(s) per configuration; every run's deadline "
          f"{args.deadline:g} s; pycoll timeout {args.comm_timeout:g} s", flush=True)  # fmt: skip
    touch = first_touch_Bps()
    print(f"# first touch of fresh memory (64 MiB, one process): {touch / 1e9:.2g} GB/s; part 2's ranks "
          + ("pre-fault their heap (--cold-memory: not)" if not args.cold_memory else "do not pre-fault "
             "(--cold-memory)"), flush=True)  # fmt: skip
    rng = random.Random(args.seed)
    shrink_runs: list[ShrinkRun] = []
    grow_runs: list[GrowRun] = []
    rate_note: dict[str, float] = {}
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pycoll-failover-")))
        warm = not args.cold_memory
        runners = {t: Runner(t, tmp, warm=warm) for t in transports if t != "netns"}
        if "netns" in transports:
            netns = _netns_module()
            problem = netns.why_no_netns(args.rate)
            if problem:
                notes.append(f"netns skipped: {problem}")
                transports.remove("netns")
            else:
                n_hosts = max(worlds + [GROW_MEMBERS + 1])
                hosts = stack.enter_context(netns.virtual_hosts(n_hosts, args.rate))
                runners["netns"] = Runner("netns", tmp, hosts, warm=warm)
                rate_note["netns"] = netns.rate_bits_per_s(args.rate) / 8 / 1e9
                print(
                    f"# netns: {n_hosts} virtual hosts, tbf rate {args.rate} each way on every link",
                    flush=True,
                )
        configs = [(t, w, v) for t in transports for w in worlds for v in victims]
        try:
            for run in range(args.runs):
                if "shrink" in parts:
                    for t, w, v in configs:
                        r = run_shrink(runners[t], w, v, run, args, rng)
                        shrink_runs.append(r)
                        state = "ok" if r.ok else ("HANG" if r.hang else "FAILED")
                        print(f"  run {run + 1}/{args.runs} {t:<5} {w} ranks victim {r.victim}: {state} "
                              f"detect {_ms(r.detect)} shrink {_ms(r.shrink)} first {_ms(r.first)} ms "
                              f"(kill at +{r.kill_delay:.2f} s; {r.wall:.1f} s)", flush=True)  # fmt: skip
                        for why in r.failed:
                            print(f"    {why}", flush=True)
                        for why in r.teardown:
                            print(f"    teardown (after the checks): {why}", flush=True)
                if "grow" in parts:
                    for t in transports:
                        g = run_grow(runners[t], run, args)
                        grow_runs.append(g)
                        state = "ok" if g.ok else ("HANG" if g.hang else "FAILED")
                        tr = " ".join(f"{m:g}MiB {_ms(s)}" for m, s in g.transfer.items())
                        print(f"  run {run + 1}/{args.runs} {t:<5} grow: {state} grow {_ms(g.grow)} ms, "
                              f"transfer {tr} ms ({g.wall:.1f} s)", flush=True)  # fmt: skip
                        for why in g.failed:
                            print(f"    {why}", flush=True)
                        for why in g.teardown:
                            print(f"    teardown (after the checks): {why}", flush=True)
        except KeyboardInterrupt:
            print("failover: interrupted", file=sys.stderr)
            return 130
    print()
    misses: list[str] = []
    if shrink_runs:
        text, m = shrink_table(shrink_runs, args)
        misses += m
        print(text + "\n")
    if grow_runs:
        text, m = grow_table(grow_runs, args, rate_note)
        misses += m
        print(text + "\n")
    for note in notes:
        print(f"# {note}")
    all_runs: list[Any] = [*shrink_runs, *grow_runs]
    hangs = sum(1 for r in all_runs if r.hang)
    failed = sum(1 for r in all_runs if r.failed and not r.hang)
    teardown = sum(1 for r in all_runs if r.teardown and not r.failed and not r.hang)
    wall = time.monotonic() - started
    print(
        f"summary: {len(all_runs)} runs, {hangs} hang(s) (past the {args.deadline:g} s deadline, killed), "
        f"{failed} with failed checks, {teardown} more with errors only in the teardown after the checks; "
        f"targets missed: {', '.join(misses) if misses else 'none'}; load average "
        f"{os.getloadavg()[0]:.1f} (at the start {load0:.1f}); wall {wall:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            for r in all_runs:
                rec = {"part": "shrink" if isinstance(r, ShrinkRun) else "grow", **r.__dict__}
                if "transfer" in rec:
                    rec["transfer"] = {str(k): v for k, v in rec["transfer"].items()}
                    rec["state_bytes"] = {str(k): v for k, v in rec["state_bytes"].items()}
                f.write(json.dumps(rec, sort_keys=True) + "\n")
    return 1 if hangs or failed or (args.strict and misses) else 0


if __name__ == "__main__":
    sys.exit(main())
