"""pycoll across "hosts" on one machine: Linux network namespaces joined by veth pairs and a bridge
(tests/netns.py), one ``pycoll run --nnodes H --node-rank k`` launcher started inside each namespace
(``ip netns exec``), 1 or 2 ranks per host. Each namespace is a host of its own to pycoll
(PYCOLL_HOST_ID = the namespace, PYCOLL_SOCKET_IFNAME = its veth), so the ranks meet over TCP between
namespaces exactly as between machines.

- collectives on 2 and 4 hosts x 1 and 2 ranks per host: all-reduce (ring, tree, direct; 0, 1, 1000 and
  2^20 elements) of int64 against the closed form, int8-compressed float32 bitwise equal on every rank
  (each prints a digest) and near the exact sum, reduce_scatter, all_gather and broadcast;
- a rank lost on host 1 (``os._exit`` or SIGKILL mid-loop): every surviving rank of every other host
  raises PeerLostError within 10 s, the victim's own host's launcher stops the rest of that host, and
  every launcher exits non-zero well before any collective's deadline;
- the rendezvous guard over the network: with PYCOLL_SECRET on every node the job works; a node with
  another secret fails with the clear secret error; junk thrown at the store's port from a third
  namespace (random bytes, an oversized length, a flood of garbage connections, a connection that never
  speaks, clients with the wrong secret or none) is dropped while a job that keeps using the store runs on
  with correct results;
- the helper itself: namespaces reach each other through the bridge, links carry tbf both ways, and
  everything is removed when the block raises;
- two bugs of the TCP transport these tests found, fixed, and kept as regression tests (see RANK_HEADER's
  comment): a rank that finalizes right after its last collective must not leave a peer without its last
  message; a barrier right after a large collective must not wait for more bytes to reach a rank.

About 70 s on the 2-vCPU development VM. Needs root (network namespaces); skipped with the reason
otherwise. Every wait has a deadline; whatever is left when a test ends (launchers, ranks, namespaces,
veth pairs, the bridge) is killed or removed.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: netns.py
import netns  # noqa: E402

REASON = netns.why_no_netns()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"virtual hosts unavailable: {REASON}")

#: Every collective's deadline in these jobs: a job that hangs fails within it, not after 300 s.
JOB_TIMEOUT_S = 60
#: How long the tests wait for a job's launchers to exit.
WAIT_S = 240.0


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYCOLL_HOST_ID", "PYCOLL_SOCKET_IFNAME", "PYCOLL_TRANSPORT", "PYCOLL_SECRET"):
        env.pop(name, None)
    env["PYCOLL_TIMEOUT"] = str(JOB_TIMEOUT_S)
    env.update(extra)
    return env


def _logs(nodes: list[netns.PycollNode]) -> str:
    return "\n".join(
        f"--- node {n.node_rank} ({n.host.name}): exit {n.proc.returncode}\nstdout:\n{n.stdout()}\n"
        f"stderr:\n{n.stderr()}"
        for n in nodes
    )


def _run_job(
    hosts: list[netns.VirtualHost],
    per_host: int,
    program: list[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    host_env: dict[int, dict[str, str]] | None = None,
    timeout: float = WAIT_S,
) -> list[netns.PycollNode]:
    """A job on ``hosts`` waited for (at most ``timeout`` s; then killed and failed); its nodes."""
    nodes = netns.start_pycoll_job(hosts, per_host, program, log_dir, env=env or _env(), host_env=host_env)
    try:
        finished = netns.wait_job(nodes, timeout)
    finally:
        netns.stop_job(nodes)
    assert finished, f"the job did not finish within {timeout:g} s\n{_logs(nodes)}"
    return nodes


# What the rank scripts share: say() prints a line; finish() ends a job that went well.
#
# Two bugs of the TCP transport (csrc/transport/tcp.cc) were found by these jobs and are fixed; the
# regression tests below keep them fixed:
# 1. ~TcpTransport closed the sockets without sending the frames still queued, so a rank finalizing right
#    after its last collective could take a message a peer still waited for (PeerLostError). Now it
#    flushes, says BYE and closes with FIN (test_finalize_right_after_the_last_collective).
# 2. An empty DATA frame (a barrier message) whose header arrived while the receive ring was full was
#    only delivered when more bytes reached the socket (test_barrier_right_after_a_large_collective).
# The other jobs still meet in the store before finalizing and end with a small ring all-reduce; finish()
# fails after 30 s naming any rank that did not get past it.
RANK_HEADER = """
import os, sys, time
import numpy as np
import pycoll
from pycoll.bootstrap import TCPStoreClient
from pycoll.env import rendezvous_secret


def say(line):
    os.write(1, (line + "\\n").encode())  # one write: lines of ranks sharing the launcher's stdout stay whole


def finish(world):
    rank = int(os.environ["RANK"])
    z = np.ones(64 * world)  # the last collective has non-empty messages (bug 2)
    pycoll.allreduce(z, algorithm="ring")
    if not (z == world).all():
        raise SystemExit(f"rank {rank}: the final all-reduce is wrong")
    store = TCPStoreClient(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=30.0,
                           secret=rendezvous_secret())
    store.set(f"netns-test/finished/{rank}", b"1")
    keys = [f"netns-test/finished/{r}" for r in range(world)]
    deadline = time.monotonic() + 30
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([keys[r]])]
            raise SystemExit(f"rank {rank}: rank(s) {missing} did not finish their last collective "
                             "within 30 s of this one (see RANK_HEADER's comment in test_netns.py)")
        time.sleep(0.01)
    store.close()
    pycoll.finalize()
"""

# ---- collectives -------------------------------------------------------------------------------------------
COLLECTIVES_SCRIPT = (
    RANK_HEADER
    + """
import hashlib

comm = pycoll.init()
rank, world = comm.rank, comm.world_size
nnodes, per_node = int(os.environ["GROUP_WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
failures = []
layout = (comm.transport, comm.num_nodes, comm.node_rank, comm.local_rank, comm.local_world_size)
# shared memory to the ranks of one's own namespace, TCP to the others ("tcp" alone with one rank each)
if layout != ("mixed" if per_node > 1 else "tcp", nnodes, rank // per_node, rank % per_node, per_node):
    failures.append(f"layout (transport, nodes, node, local rank, local size) is {layout}")
if comm.hosts[rank] != os.environ["PYCOLL_HOST_ID"]:
    failures.append(f"host id {comm.hosts[rank]!r}")
digest = hashlib.sha256()
tri = world * (world + 1) // 2
for n in (0, 1, 1000, 1 << 20):
    exact = np.zeros(n)
    for r in range(world):
        exact += np.random.default_rng([r, n]).standard_normal(n).astype(np.float32)
    for algorithm in ("ring", "tree", "direct"):
        x = np.arange(n, dtype=np.int64) * (rank + 1)
        pycoll.allreduce(x, algorithm=algorithm)
        if not np.array_equal(x, np.arange(n, dtype=np.int64) * tri):
            failures.append(f"allreduce {algorithm} int64 n={n}: not the closed form")
        g = np.random.default_rng([rank, n]).standard_normal(n).astype(np.float32)
        pycoll.allreduce(g, algorithm=algorithm, compression="int8")
        digest.update(g.tobytes())
        if n and np.linalg.norm(g - exact) > 0.05 * np.linalg.norm(exact):
            failures.append(f"allreduce {algorithm} int8 n={n}: too far from the exact sum")
    m = n // world if n >= world else n
    chunk = np.full(m, rank, dtype=np.int32)
    for algorithm in ("ring", "direct"):
        out = np.full(world * m, -1, np.int32)
        pycoll.all_gather(chunk, out, algorithm=algorithm)
        if not np.array_equal(out, np.repeat(np.arange(world, dtype=np.int32), m)):
            failures.append(f"all_gather {algorithm} n={m}: wrong")
        out = np.full(m, -1, np.int32)
        pycoll.reduce_scatter(np.tile(chunk + 1, world), out, algorithm=algorithm)
        if not (out == tri).all():
            failures.append(f"reduce_scatter {algorithm} n={m}: wrong")
    for algorithm in ("ring", "tree"):
        y = np.full(n, rank, dtype=np.float64)
        pycoll.broadcast(y, world - 1, algorithm=algorithm)
        if not (y == world - 1).all():
            failures.append(f"broadcast {algorithm} n={n}: wrong")
pycoll.barrier()
status = "OK" if not failures else "FAILED " + "; ".join(failures)
say(f"rank {rank} of {world} on node {comm.node_rank}: {status} int8-digest {digest.hexdigest()}")
finish(world)
"""
)
_RESULT = re.compile(r"^rank (\d+) of (\d+) on node (\d+): (OK|FAILED.*?) int8-digest ([0-9a-f]+)$", re.M)


def _results(nodes: list[netns.PycollNode]) -> dict[int, tuple[int, str, str]]:
    """rank -> (node, status, digest) from what every rank printed."""
    out = {}
    for node in nodes:
        for m in _RESULT.finditer(node.stdout()):
            out[int(m.group(1))] = (int(m.group(3)), m.group(4), m.group(5))
    return out


@pytest.mark.parametrize("n_hosts,per_host", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_collectives_across_hosts(tmp_path: Path, n_hosts: int, per_host: int) -> None:
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES_SCRIPT)
    with netns.virtual_hosts(n_hosts) as hosts:
        nodes = _run_job(hosts, per_host, [str(script)], tmp_path)
    logs = _logs(nodes)
    assert all(n.proc.returncode == 0 for n in nodes), logs
    results = _results(nodes)
    world = n_hosts * per_host
    assert sorted(results) == list(range(world)), logs
    for rank, (node, status, _) in results.items():
        assert status == "OK", f"rank {rank}: {status}"
        assert node == rank // per_host, f"rank {rank} says it is on node {node}"
    assert len({digest for _, _, digest in results.values()}) == 1, f"int8 results differ: {results}"


# ---- rank loss ---------------------------------------------------------------------------------------------
LOSS_SCRIPT = (
    RANK_HEADER
    + """
import threading

victim, how, stamp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
comm = pycoll.init()
rank = comm.rank
x = np.ones(1 << 20, dtype=np.float32)  # 4 MiB: every all-reduce crosses the hosts' links for a while


def die():
    time.sleep(0.3)
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    os._exit(7)


iterations, t0 = 0, time.monotonic()
try:
    while time.monotonic() - t0 < 90:
        pycoll.allreduce(x, "max", algorithm="ring", timeout=60)
        iterations += 1
        if iterations == 3:
            say(f"rank {rank}: looping, pid {os.getpid()}")
            if rank == victim and how == "exit":
                threading.Thread(target=die, daemon=True).start()
    say(f"rank {rank}: no error after {iterations} iterations")
    sys.exit(3)
except pycoll.PycollError as exc:
    say(f"rank {rank}: {type(exc).__name__} at {time.time()!r}: {exc}")
    sys.exit(1)
"""
)
_LOOPING = re.compile(r"^rank (\d+): looping, pid (\d+)$", re.M)
_ERROR = re.compile(r"^rank (\d+): (\w+) at ([0-9.e+]+): (.*)$", re.M)


@pytest.mark.parametrize("how", ["exit", "kill"])
@pytest.mark.parametrize("n_hosts,per_host", [(2, 2), (4, 1)])
def test_rank_lost_on_host_1(tmp_path: Path, n_hosts: int, per_host: int, how: str) -> None:
    """The last rank of host 1 ends mid-loop (os._exit(7) from a thread of its own, or SIGKILL from
    here): everyone else stops within bounded time, with PeerLostError or its launcher's SIGTERM."""
    world = n_hosts * per_host
    victim = 2 * per_host - 1
    victim_host = set(range(per_host, 2 * per_host))
    stamp = tmp_path / "killed_at"
    script = tmp_path / "loss.py"
    script.write_text(LOSS_SCRIPT)
    with netns.virtual_hosts(n_hosts) as hosts:
        nodes = netns.start_pycoll_job(
            hosts, per_host, [str(script), str(victim), how, str(stamp)], tmp_path, env=_env()
        )
        try:
            if how == "kill":  # once every rank is in its loop (the victim kills itself in "exit")
                deadline = time.monotonic() + 120
                looping: dict[int, int] = {}
                while len(looping) < world:
                    assert time.monotonic() < deadline, f"the ranks did not all start looping\n{_logs(nodes)}"
                    assert all(n.proc.poll() is None for n in nodes), (
                        f"a launcher ended early\n{_logs(nodes)}"
                    )
                    for node in nodes:
                        looping.update((int(r), int(pid)) for r, pid in _LOOPING.findall(node.stdout()))
                    time.sleep(0.05)
                stamp.write_text(repr(time.time()))
                os.kill(looping[victim], signal.SIGKILL)
            finished = netns.wait_job(nodes, 45.0)  # far below the collectives' 60 s deadline
        finally:
            netns.stop_job(nodes)
    logs = _logs(nodes)
    assert finished, f"launchers still running 45 s after the rank was lost\n{logs}"
    assert stamp.exists(), logs
    looped = {int(r) for node in nodes for r, _ in _LOOPING.findall(node.stdout())}
    assert looped == set(range(world)), f"not every rank was in its loop when the victim went\n{logs}"
    t_lost = float(stamp.read_text())
    for node in nodes:
        assert node.proc.returncode != 0, f"node {node.node_rank}'s launcher exited 0\n{logs}"
    died = "exit code 7" if how == "exit" else "killed by SIGKILL"
    assert f"rank {victim} failed ({died})" in nodes[1].stderr(), logs
    errors = {int(m[0]): (m[1], float(m[2]), m[3]) for node in nodes for m in _ERROR.findall(node.stdout())}
    stopped = set()
    match = re.search(r"ranks stopped by the launcher: ([\d, ]+)", nodes[1].stderr())
    if match:
        stopped = {int(r) for r in match.group(1).split(",")}
    for rank in range(world):
        if rank == victim:
            continue
        if rank in victim_host and rank not in errors:
            assert rank in stopped, f"rank {rank} (host 1) neither failed nor was stopped\n{logs}"
            continue
        assert rank in errors, f"rank {rank} reported no error\n{logs}"
        kind, t_error, message = errors[rank]
        assert kind == "PeerLostError", f"rank {rank}: {kind}: {message}"
        assert any(f"rank {r}" in message for r in victim_host), f"rank {rank}: {message}"
        assert t_error - t_lost < 10, f"rank {rank} noticed the lost rank {t_error - t_lost:.1f} s late"


# ---- rendezvous guard --------------------------------------------------------------------------------------
SMALL_SCRIPT = (
    RANK_HEADER
    + """

comm = pycoll.init()
rank, world = comm.rank, comm.world_size
x = np.arange(1000, dtype=np.int64) * (rank + 1)
pycoll.allreduce(x)
ok = np.array_equal(x, np.arange(1000, dtype=np.int64) * (world * (world + 1) // 2))
status = "OK" if ok else "FAILED"
say(f"rank {rank} of {world}: {status} ({comm.transport}, {comm.num_nodes} hosts)")
finish(world)
"""
)


def test_secret_on_every_node(tmp_path: Path) -> None:
    script = tmp_path / "small.py"
    script.write_text(SMALL_SCRIPT)
    secret = secrets.token_hex(16)
    with netns.virtual_hosts(2) as hosts:
        nodes = _run_job(hosts, 2, [str(script)], tmp_path, env=_env(PYCOLL_SECRET=secret), timeout=120)
    logs = _logs(nodes)
    assert all(n.proc.returncode == 0 for n in nodes), logs
    for rank in range(4):
        assert f"rank {rank} of 4: OK (mixed, 2 hosts)" in nodes[rank // 2].stdout(), logs
    assert secret not in logs


def test_node_with_another_secret_fails_clearly(tmp_path: Path) -> None:
    """Node 1's ranks fail at once naming the secret; node 0's ranks, left waiting for them, fail at
    their set-up deadline (PYCOLL_TIMEOUT=6 here): both launchers exit non-zero."""
    script = tmp_path / "small.py"
    script.write_text(SMALL_SCRIPT)
    secret = secrets.token_hex(16)
    start = time.monotonic()
    with netns.virtual_hosts(2) as hosts:
        nodes = _run_job(
            hosts,
            1,
            [str(script)],
            tmp_path,
            env=_env(PYCOLL_SECRET=secret, PYCOLL_TIMEOUT="6"),
            host_env={1: {"PYCOLL_SECRET": secret + "-but-wrong"}},
            timeout=90,
        )
    logs = _logs(nodes)
    assert nodes[1].proc.returncode != 0 and "the rendezvous secret did not match" in nodes[1].stderr(), logs
    assert nodes[0].proc.returncode != 0, logs
    assert time.monotonic() - start < 75, logs
    assert secret not in logs


JOB_UNDER_ATTACK = (
    RANK_HEADER
    + """

comm = pycoll.init()
rank, world = comm.rank, comm.world_size
address, port, secret = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rendezvous_secret()
store = TCPStoreClient(address, port, timeout=30.0, secret=secret)
sizes = (0, 1, 1000, 70_001)
iterations = reconnects = 0
while True:
    n = sizes[iterations % len(sizes)]
    x = np.arange(n, dtype=np.float64) * (rank + 1) + iterations
    pycoll.allreduce(x)
    expected = np.arange(n, dtype=np.float64) * (world * (world + 1) // 2) + world * iterations
    assert np.array_equal(x, expected), f"rank {rank}, iteration {iterations}: wrong sum"
    store.add("guard/ops", 1)
    if iterations % 5 == rank % 5:  # a fresh connection, through the handshake, under attack
        store.close()
        store = TCPStoreClient(address, port, timeout=30.0, secret=secret)
        reconnects += 1
    iterations += 1
    flag = np.zeros(1)
    if rank == 0:
        flag[0] = 1.0 if store.check(["guard/attack_done"]) else 2.0 if iterations > 100_000 else 0.0
    pycoll.allreduce(flag, "max")
    if flag[0] == 2.0:
        raise SystemExit("the attack did not end")
    if flag[0] == 1.0:
        break
store.close()
say(f"rank {rank} of {world}: OK after {iterations} iterations, {reconnects} reconnects")
finish(world)
"""
)

ATTACKER = """
import random, socket, struct, sys, time
from pycoll.bootstrap import TCPStoreClient
from pycoll.env import rendezvous_secret
from pycoll.errors import InvalidUsageError

address, port, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secret = rendezvous_secret()
deadline = time.monotonic() + 60
notes = []


def legit():
    return TCPStoreClient(address, port, timeout=30.0, secret=secret)


def closed(sock, wait=None):
    sock.settimeout(max(0.01, (deadline - time.monotonic()) if wait is None else wait))
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except OSError:
        return False


try:
    with legit() as c:  # a live job: every rank in its loop
        while c.add("guard/ops", 0) < 2 * world:
            assert time.monotonic() < deadline, "the job never started its loop"
            time.sleep(0.01)
    silent = socket.create_connection((address, port), timeout=10)  # connects and never speaks
    silent_at = time.monotonic()
    with legit() as c:  # the store serves its own clients meanwhile
        c.set("guard/probe", b"1")
        assert c.get("guard/probe") == b"1"
    with socket.create_connection((address, port), timeout=10) as s:
        s.sendall(random.Random(1).randbytes(8192))
        assert closed(s), "random bytes were not dropped"
    with socket.create_connection((address, port), timeout=10) as s:
        s.sendall(struct.pack(">I", 0xFFFFFFF0) + b"x" * 64)
        assert closed(s), "an oversized length was not dropped"
    for _ in range(20):
        with socket.create_connection((address, port), timeout=10) as s:
            try:
                s.sendall(b"\\xff" * 16)
            except OSError:
                pass
            assert closed(s), "a garbage connection was not dropped"
    for bad in ((secret + b"-but-wrong", None) if secret else (b"not-the-job-secret",)):
        try:
            TCPStoreClient(address, port, timeout=10.0, secret=bad).close()
        except InvalidUsageError as exc:
            notes.append(str(exc).split(";")[0][:80])
        else:
            raise AssertionError(f"a client with secret {bad is not None} was let in")
    with silent:
        assert closed(silent), "the silent connection was not dropped"
    print(f"ATTACK DONE: silent connection dropped after {time.monotonic() - silent_at:.1f} s; {notes}")
finally:
    with legit() as c:
        c.set("guard/attack_done", b"1")
"""


@pytest.mark.parametrize("with_secret", [True, False], ids=["secret", "no_secret"])
def test_junk_at_the_store_from_another_host(tmp_path: Path, with_secret: bool) -> None:
    """Hosts 0 and 1 run a job that keeps using the store; host 2 throws junk at the store's port."""
    job, attacker = tmp_path / "job.py", tmp_path / "attacker.py"
    job.write_text(JOB_UNDER_ATTACK)
    attacker.write_text(ATTACKER)
    secret = secrets.token_hex(16) if with_secret else ""
    env = _env(PYCOLL_SECRET=secret) if secret else _env()
    env["PYTHONPATH"] = str(netns.ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with netns.virtual_hosts(3) as hosts:
        nodes = netns.start_pycoll_job(hosts[:2], 2, [str(job)], tmp_path, env=env)
        try:
            attack = hosts[2].run(
                [sys.executable, str(attacker), hosts[0].address, str(nodes[0].port), "4"],
                env=env,
                timeout=120,
            )
            finished = netns.wait_job(nodes, 60)
        finally:
            netns.stop_job(nodes)
    logs = _logs(nodes)
    assert attack.returncode == 0 and "ATTACK DONE" in attack.stdout, attack.stdout + attack.stderr + logs
    assert finished, f"the job did not finish after the attack\n{logs}"
    assert all(n.proc.returncode == 0 for n in nodes), logs
    counts = set()
    for rank in range(4):
        m = re.search(
            rf"^rank {rank} of 4: OK after (\d+) iterations, (\d+) reconnects$",
            nodes[rank // 2].stdout(),
            re.M,
        )
        assert m, logs
        counts.add(int(m.group(1)))
        assert int(m.group(2)) >= 1, logs
    assert len(counts) == 1 and counts.pop() >= 8, logs
    if secret:
        assert secret not in logs + attack.stdout + attack.stderr


FINALIZE_AT_ONCE = """
import numpy as np
import pycoll

pycoll.init()
x = np.ones(1 << 18, dtype=np.float32)
for _ in range(3):
    pycoll.allreduce(x)
pycoll.barrier()
pycoll.finalize()  # at once: no meeting in the store first
"""


def test_finalize_right_after_the_last_collective(tmp_path: Path) -> None:
    script = tmp_path / "finalize.py"
    script.write_text(FINALIZE_AT_ONCE)
    with netns.virtual_hosts(2) as hosts:
        for attempt in range(4):
            nodes = _run_job(hosts, 2, [str(script)], tmp_path / str(attempt), timeout=60)
            assert all(n.proc.returncode == 0 for n in nodes), _logs(nodes)


BARRIER_AFTER_BROADCAST = """
import os, time
import numpy as np
import pycoll

comm = pycoll.init()
rank, world = comm.rank, comm.world_size
worst = 0.0
for _ in range(10):
    y = np.full(1 << 20, rank, dtype=np.float64)
    pycoll.broadcast(y, world - 1, algorithm="tree")
    t = time.monotonic()
    pycoll.barrier()
    worst = max(worst, time.monotonic() - t)
    time.sleep(0.5)  # the ranks that left the barrier send nothing for a while
os.write(1, f"rank {rank}: slowest barrier {worst:.3f} s\\n".encode())
x = np.ones(64 * world)
pycoll.allreduce(x, algorithm="ring")
time.sleep(1.0)  # not bug 1 (see RANK_HEADER's comment)
pycoll.finalize()
"""


def test_barrier_right_after_a_large_collective(tmp_path: Path) -> None:
    script = tmp_path / "barrier.py"
    script.write_text(BARRIER_AFTER_BROADCAST)
    with netns.virtual_hosts(4) as hosts:
        nodes = _run_job(hosts, 2, [str(script)], tmp_path, timeout=120)
    logs = _logs(nodes)
    assert all(n.proc.returncode == 0 for n in nodes), logs
    times = [float(t) for n in nodes for t in re.findall(r"slowest barrier ([0-9.]+) s", n.stdout())]
    assert len(times) == 8, logs
    assert max(times) < 0.3, f"a barrier waited {max(times):.2f} s for the next collective's bytes\n{logs}"


# ---- the helper itself -------------------------------------------------------------------------------------
def _our_links(tag: str) -> list[str]:
    return [name for name in netns._link_names() if name.startswith(tag)]


def _our_namespaces(tag: str) -> list[str]:
    out = netns._cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag)]


ECHO_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("up", flush=True)
conn, peer = server.accept()
conn.sendall(peer[0].encode())  # tells the client which address it came from
"""
ECHO_CLIENT = """
import socket, sys
print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).recv(64).decode())
"""


def test_virtual_hosts_are_shaped_connected_and_removed_even_on_error() -> None:
    tag = None
    with pytest.raises(RuntimeError, match="boom"):
        with netns.virtual_hosts(3, rate="100mbit") as hosts:
            tag = hosts[0].name.split("-")[0]
            assert len(_our_namespaces(tag)) == 3 and len(_our_links(tag)) == 4  # 3 veth ends + bridge
            for host in hosts:
                qdisc = host.run(["tc", "qdisc", "show", "dev", host.ifname], timeout=30).stdout
                assert "tbf" in qdisc and "100Mbit" in qdisc, qdisc
                env = host.env({})
                assert env["PYCOLL_HOST_ID"] == host.name and env["PYCOLL_SOCKET_IFNAME"] == host.ifname
            port = str(hosts[2].free_port())
            server = hosts[2].popen(
                [sys.executable, "-c", ECHO_SERVER, hosts[2].address, port], stdout=subprocess.PIPE, text=True
            )
            try:
                assert server.stdout.readline().strip() == "up"
                client = hosts[0].run([sys.executable, "-c", ECHO_CLIENT, hosts[2].address, port], timeout=30)
                assert client.stdout.strip() == hosts[0].address, client.stderr  # through the bridge
            finally:
                server.kill()
                server.wait(timeout=10)
            raise RuntimeError("boom")
    assert tag is not None
    assert _our_namespaces(tag) == [] and _our_links(tag) == []
