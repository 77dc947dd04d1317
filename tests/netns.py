"""Virtual hosts on one Linux machine: network namespaces joined by veth pairs and a bridge.

    from netns import virtual_hosts, why_no_netns

    with virtual_hosts(4, rate="1gbit") as hosts:     # 4 "hosts", each link shaped to 1 Gbit/s both ways
        proc = hosts[1].popen([sys.executable, "worker.py"], env=hosts[1].env(os.environ))

Topology: one bridge in the root namespace; per host a namespace ``<tag>-h<i>`` holding one end of a
veth pair (``<tag>h<i>``, address 10.<x>.<y>.<i+1>/24 on a private /24 that no route or address of the
root namespace uses) whose other end (``<tag>o<i>``) is a port of the bridge; ``lo`` is up in every
namespace. The root namespace gets no address on the bridge, so nothing it routes changes. With
``rate`` (tc syntax: ``1gbit``, ``10gbit``) each host's link is shaped in both directions with
``tc qdisc add dev IF root tbf rate RATE burst 1mb latency 1ms``: on the veth end inside the namespace
(what the host sends) and on the bridge's end (what it receives). netem is not needed (nor available on
the development VM's kernel).

pycoll tells hosts apart by hostname + kernel boot id, which namespaces share, so ``VirtualHost.env()``
sets PYCOLL_HOST_ID to the namespace's name and PYCOLL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to its
veth, so that pycoll (and Gloo) bind to and advertise the host's own address.

Everything created is removed when the ``with`` block ends, however it ends (exception, KeyboardInterrupt,
SIGTERM or SIGHUP while the block runs in the main thread, interpreter exit): processes still running in
the namespaces are SIGKILLed (by pid), then the namespaces, veth pairs and the bridge are deleted. Names
start with ``pcn<pid>`` (this process's id) so that parallel users do not collide.

Needs root, iproute2's ``ip`` (and ``tc`` for ``rate``); ``why_no_netns()`` says why not, for a skip.
No pytest dependency: the tests and bench/netns_bench.py both import it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "NetnsError",
    "PycollNode",
    "VirtualHost",
    "rate_bits_per_s",
    "start_pycoll_job",
    "stop_job",
    "stop_processes",
    "virtual_hosts",
    "wait_job",
    "why_no_netns",
]

ROOT = Path(__file__).resolve().parents[1]
#: tbf parameters besides the rate (the issue's).
TBF_BURST = "1mb"
TBF_LATENCY = "1ms"
#: Seconds any one ip/tc command may take.
COMMAND_TIMEOUT_S = 30.0
_TAG_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_sequence = iter(range(1 << 30))
_sequence_lock = threading.Lock()
_live: dict[str, _Topology] = {}  # tag -> topology not yet destroyed (destroyed at exit at the latest)


class NetnsError(RuntimeError):
    """An ip/tc command failed (the message holds the command and its stderr)."""


def _ip() -> str:
    path = shutil.which("ip") or ("/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else None)
    if path is None:
        raise NetnsError("the `ip` command (iproute2) is not installed")
    return path


def _tc() -> str:
    path = shutil.which("tc") or ("/usr/sbin/tc" if os.path.exists("/usr/sbin/tc") else None)
    if path is None:
        raise NetnsError("the `tc` command (iproute2) is not installed; it shapes the links (rate=)")
    return path


def _cmd(argv: Sequence[str], *, check: bool = True, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Runs one command (no shell); its stdout. Raises NetnsError on failure when ``check``."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if check:
            raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
        return ""
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def rate_bits_per_s(rate: str) -> float:
    """tc's rate syntax in bits per second: ``1gbit`` -> 1e9, ``500mbit`` -> 5e8 (tc's units are
    decimal: 1kbit = 1000 bit/s; ``bps`` suffixes are bytes per second)."""
    text = rate.strip().lower()
    units = (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("tbps", 8e12), ("gbps", 8e9),
             ("mbps", 8e6), ("kbps", 8e3), ("bps", 8.0), ("bit", 1.0))  # fmt: skip
    for suffix, scale in units:
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)  # bare number: bits per second


@dataclass(frozen=True)
class VirtualHost:
    """One namespace ("host") of ``virtual_hosts``."""

    index: int
    #: the network namespace (``ip netns exec <name> ...``)
    name: str
    #: its IPv4 address (on ``ifname``)
    address: str
    #: the veth end inside the namespace
    ifname: str
    #: the veth end on the bridge, in the root namespace
    bridge_port: str
    #: the tbf rate of its link (each way), or None when unshaped
    rate: str | None = None

    def prefix(self) -> list[str]:
        """``["ip", "netns", "exec", name]``: put it before a command to run that command on this host."""
        return [_ip(), "netns", "exec", self.name]

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return [*self.prefix(), *argv]

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default: os.environ) plus what makes processes here a host of their own to pycoll and
        Gloo: PYCOLL_HOST_ID (the namespace's name), PYCOLL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (its
        veth); then ``extra``."""
        env = dict(os.environ if base is None else base)
        env.update(PYCOLL_HOST_ID=self.name, PYCOLL_SOCKET_IFNAME=self.ifname, GLOO_SOCKET_IFNAME=self.ifname)
        env.update(extra)
        return env

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
        """``subprocess.Popen`` of ``argv`` in this namespace, with ``self.env(env)``. ``ip netns exec``
        execs the command, so the Popen's pid is the command's own."""
        return subprocess.Popen(self.command(argv), env=self.env(env), **kwargs)

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``argv`` in this namespace (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv), env=self.env(env), timeout=timeout, **kwargs)

    def free_port(self, timeout: float = 30.0) -> int:
        """A TCP port nothing listens on at this host's address (bound to port 0 there, then released)."""
        code = (
            f"import socket\ns = socket.socket()\ns.bind(({self.address!r}, 0))\nprint(s.getsockname()[1])\n"
        )
        proc = self.run([sys.executable, "-c", code], timeout=timeout)
        if proc.returncode != 0:
            raise NetnsError(f"no free port on {self.name}: {proc.stderr.strip()}")
        return int(proc.stdout.strip())

    def pids(self) -> list[int]:
        """Processes running in this namespace."""
        out = _cmd([_ip(), "netns", "pids", self.name], check=False)
        return [int(p) for p in out.split() if p.isdigit()]


@dataclass
class _Topology:
    n: int
    rate: str | None
    tag: str = ""
    subnet: ipaddress.IPv4Network | None = None
    hosts: list[VirtualHost] = field(default_factory=list)
    bridge: str | None = None
    namespaces: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    destroyed: bool = False

    def create(self) -> None:
        ip = _ip()
        tc = _tc() if self.rate else None
        with _sequence_lock:
            seq = next(_sequence)
        self.tag = f"pcn{os.getpid()}{_TAG_LETTERS[seq % len(_TAG_LETTERS)]}"
        _live[self.tag] = self
        self.subnet = _pick_subnet()
        bridge = f"{self.tag}br"
        _cmd([ip, "link", "add", bridge, "type", "bridge"])
        self.bridge = bridge
        _cmd([ip, "link", "set", bridge, "up"])
        addresses = list(self.subnet.hosts())
        for i in range(self.n):
            ns, inner, outer = f"{self.tag}-h{i}", f"{self.tag}h{i}", f"{self.tag}o{i}"
            _cmd([ip, "netns", "add", ns])
            self.namespaces.append(ns)
            _cmd([ip, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns])
            self.ports.append(outer)
            _cmd([ip, "link", "set", outer, "master", bridge])
            _cmd([ip, "link", "set", outer, "up"])
            _cmd([ip, "-n", ns, "link", "set", "lo", "up"])
            _cmd([ip, "-n", ns, "addr", "add", f"{addresses[i]}/{self.subnet.prefixlen}", "dev", inner])
            _cmd([ip, "-n", ns, "link", "set", inner, "up"])
            if tc is not None:
                shape = ["root", "tbf", "rate", str(self.rate), "burst", TBF_BURST, "latency", TBF_LATENCY]
                _cmd([tc, "-n", ns, "qdisc", "add", "dev", inner, *shape])  # what the host sends
                _cmd([tc, "qdisc", "add", "dev", outer, *shape])  # what it receives
            self.hosts.append(VirtualHost(i, ns, str(addresses[i]), inner, outer, self.rate))

    def destroy(self) -> list[str]:
        """Removes everything created (idempotent); what could not be removed, one line each."""
        if self.destroyed:
            return []
        self.destroyed = True
        problems: list[str] = []
        try:
            ip = _ip()
        except NetnsError as exc:
            return [str(exc)]
        for ns in self.namespaces:
            stop_processes(VirtualHost(0, ns, "", "", "").pids())
        # Each veth pair goes with its bridge-side end, at once (a namespace's deletion would take its
        # devices with it only once the kernel gets round to it).
        for port in self.ports:
            if port in _link_names():
                try:
                    _cmd([ip, "link", "del", port])
                except NetnsError as exc:
                    problems.append(str(exc))
        for ns in self.namespaces:
            try:
                _cmd([ip, "netns", "del", ns])
            except NetnsError as exc:
                problems.append(str(exc))
        if self.bridge is not None:
            try:
                _cmd([ip, "link", "del", self.bridge])
            except NetnsError as exc:
                problems.append(str(exc))
        deadline = time.monotonic() + 10.0
        left = [name for name in _link_names() if name.startswith(self.tag)]
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [name for name in _link_names() if name.startswith(self.tag)]
        if left:
            problems.append(f"network devices still there: {', '.join(left)}")
        _live.pop(self.tag, None)
        return problems


def stop_processes(pids: Sequence[int], wait_s: float = 5.0) -> None:
    """SIGKILLs each of ``pids`` (processes this program started, e.g. those left in its namespaces) and
    waits (at most ``wait_s``) until they are gone."""
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    for pid in pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)


def _link_names() -> list[str]:
    """Names of the root namespace's network devices."""
    out = _cmd([_ip(), "-o", "link", "show"], check=False)
    return [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, awaiting its parent
    except (OSError, IndexError):
        return False


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of the root namespace's addresses and routes (every table)."""
    ip = _ip()
    out: list[ipaddress.IPv4Network] = []
    text = _cmd([ip, "-4", "-o", "addr", "show"], check=False)
    text += "\n" + _cmd([ip, "-4", "route", "show", "table", "all"], check=False)
    for word in text.split():
        if word[0].isdigit() and ("/" in word or word.count(".") == 3):
            try:
                out.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                pass
    return [n for n in out if isinstance(n, ipaddress.IPv4Network)]


def _pick_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps no address or route of the root namespace, nor another live
    topology of this process (random, so parallel users rarely pick the same; they would not collide
    anyway: each topology is its own layer-2 segment and the root namespace routes none of them)."""
    used = _used_networks() + [t.subnet for t in _live.values() if t.subnet is not None]
    rng = random.Random(os.getpid() * 1_000_003 + time.monotonic_ns())
    for _ in range(1000):
        candidate = ipaddress.IPv4Network(f"10.{rng.randrange(64, 250)}.{rng.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(n) for n in used if n.prefixlen > 0):
            return candidate
    raise NetnsError("no free 10.x.y.0/24 subnet found")


def _destroy_all_at_exit() -> None:
    for topology in list(_live.values()):
        for problem in topology.destroy():
            print(f"netns: cleanup: {problem}", file=sys.stderr)


atexit.register(_destroy_all_at_exit)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """In the main thread: SIGTERM and SIGHUP (if nothing handles them) raise KeyboardInterrupt while the
    block runs, so that the ``finally`` clauses remove the namespaces instead of the process dying."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"{signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def virtual_hosts(n: int, rate: str | None = None) -> Iterator[list[VirtualHost]]:
    """``n`` virtual hosts (network namespaces on one bridge), each link shaped to ``rate`` both ways
    when given (tc syntax, e.g. ``1gbit``); see the module doc. Removes all of it on the way out."""
    if not 1 <= n <= 250:
        raise ValueError(f"n must be in 1..250, got {n}")
    topology = _Topology(n, rate)
    with _signals_interrupt():
        try:
            topology.create()
            yield list(topology.hosts)
        finally:
            problems = topology.destroy()
            for problem in problems:
                print(f"netns: cleanup: {problem}", file=sys.stderr)


@functools.cache
def why_no_netns(rate: str | None = None) -> str | None:
    """Why ``virtual_hosts`` (with ``rate``, when given) cannot work here, in one line for a skip
    reason; None when it can (checked by creating two hosts and running a command in one)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are a Linux feature (this is {sys.platform})"
    if os.geteuid() != 0:
        return (
            f"creating network namespaces, veth pairs and a bridge needs root (running as uid {os.geteuid()})"
        )
    try:
        _ip()
        if rate is not None:
            _tc()
        with virtual_hosts(2, rate) as hosts:
            proc = hosts[0].run(["true"], timeout=COMMAND_TIMEOUT_S)
            if proc.returncode != 0:
                return f"`ip netns exec` does not work here: {proc.stderr.strip()}"
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create network namespaces here: {exc}"
    return None


# ---------------------------------------------------------------------------------------------------------
# A multi-node pycoll job over virtual hosts: one `pycoll run --nnodes H` launcher per host.


@dataclass
class PycollNode:
    """One host's launcher of a job ``start_pycoll_job`` started, and where its output goes."""

    host: VirtualHost
    node_rank: int
    proc: Any  # subprocess.Popen
    out: Path
    err: Path
    #: the rendezvous store's port (on host 0's address)
    port: int = 0

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""


def _launch_one(
    host: VirtualHost,
    node_rank: int,
    nnodes: int,
    nproc: int,
    master: VirtualHost,
    port: int,
    program: Sequence[str],
    env: Mapping[str, str],
    log_dir: Path,
    tag: str,
) -> PycollNode:
    out, err = log_dir / f"{tag}node{node_rank}.out", log_dir / f"{tag}node{node_rank}.err"
    cmd = [sys.executable, "-m", "pycoll.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
           "--master-addr", master.address, "--master-port", str(port), "-n", str(nproc),
           *program]  # fmt: skip
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = host.popen(cmd, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=str(ROOT))
    return PycollNode(host, node_rank, proc, out, err, port)


def start_pycoll_job(
    hosts: Sequence[VirtualHost],
    nproc: int,
    program: Sequence[str],
    log_dir: Path | str,
    *,
    env: Mapping[str, str] | None = None,
    host_env: Mapping[int, Mapping[str, str]] | None = None,
    tag: str = "",
    timeout: float = 60.0,
) -> list[PycollNode]:
    """Starts ``python -m pycoll.run --nnodes len(hosts) --node-rank k --master-addr <host 0> --master-port
    P -n nproc PROGRAM...`` in each host's namespace, node 0 first (its launcher hosts the rendezvous
    store on P, a port found free on host 0; should another process take it first, another is tried),
    the others once node 0 says it listens. ``env``: the launchers' environment (default os.environ;
    PYTHONPATH gets this checkout first; each host adds its own ``VirtualHost.env``); ``host_env[k]``:
    more variables for host k. stdout / stderr of node k go to ``log_dir/<tag>node<k>.out`` / ``.err``.
    Returns the nodes; the caller waits for them (``wait_job``) and must stop them (``stop_job``)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = str(ROOT) + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
    host_env = host_env or {}

    def env_of(k: int) -> dict[str, str]:
        return {**base, **host_env.get(k, {})}

    deadline = time.monotonic() + timeout
    nodes: list[PycollNode] = []
    try:
        for _attempt in range(5):
            port = hosts[0].free_port()
            node0 = _launch_one(
                hosts[0], 0, len(hosts), nproc, hosts[0], port, program, env_of(0), log_dir, tag
            )
            while "listening on" not in node0.stderr() and node0.proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"node 0's launcher did not listen within {timeout:g} s: {node0.stderr()}"
                    )
                time.sleep(0.02)
            if node0.proc.poll() is not None and "cannot listen" in node0.stderr():
                continue  # the port was taken meanwhile: try another
            nodes.append(node0)
            break
        if not nodes:
            raise RuntimeError("node 0's launcher could not listen on a free port in 5 tries")
        for k in range(1, len(hosts)):
            nodes.append(
                _launch_one(hosts[k], k, len(hosts), nproc, hosts[0], port, program, env_of(k), log_dir, tag)
            )
    except BaseException:
        stop_job(nodes)
        raise
    return nodes


def wait_job(nodes: Sequence[PycollNode], timeout: float) -> bool:
    """Waits for every launcher until ``timeout`` seconds from now; True when all have exited."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            node.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def stop_job(nodes: Sequence[PycollNode]) -> None:
    """Kills what is left of a job: each launcher still running, and every process left in the hosts'
    namespaces (ranks of a killed launcher)."""
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.kill()
    for node in nodes:
        try:
            node.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    seen = {node.host.name: node.host for node in nodes}
    for host in seen.values():
        stop_processes(host.pids())
