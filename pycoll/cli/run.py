"""``pycoll run``: start N local ranks of a Python program, torchrun style.

    pycoll run -n 4 train.py --lr 0.1
    pycoll run -n 4 -m mypkg.train --lr 0.1
    python -m pycoll.run -n 4 train.py
    pycoll run -n 4 --nnodes 2 --node-rank K --master-addr node0 --master-port 29500 train.py  # on 2 nodes

One node (``-n N`` alone): the launcher hosts the rendezvous store itself, on 127.0.0.1 and a port the
kernel picks (no port race), and starts each rank with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK=NODE_RANK=0, GROUP_WORLD_SIZE=1, MASTER_ADDR=127.0.0.1, MASTER_PORT (the store's port) and
PYCOLL_LAUNCHER_STORE=1 (rank 0 connects to that store instead of hosting one).

Several nodes (``--nnodes M``, static rendezvous as torchrun's ``--rdzv-backend static``): one launcher
per node, each given the same -n, --nnodes, --master-addr and --master-port and its own --node-rank K.
Node K starts ranks K*N .. K*N+N-1 (WORLD_SIZE=M*N, LOCAL_RANK 0..N-1, LOCAL_WORLD_SIZE=N,
GROUP_RANK=NODE_RANK=K, GROUP_WORLD_SIZE=M, MASTER_ADDR/MASTER_PORT as given). Node 0's launcher hosts
the store on --master-port (which must then be given: the other nodes have to know it), bound to every
interface (0.0.0.0, or :: for an IPv6 --master-addr) or to the address of PYCOLL_SOCKET_IFNAME's
interface, and says so on stderr once it listens. The other launchers host nothing: their ranks connect
to MASTER_ADDR:MASTER_PORT, retrying until pycoll.init's deadline (PYCOLL_TIMEOUT), after which the
error names that address. Launchers may start in any order. After its ranks succeed, node 0's launcher
keeps the store up (at most 30 s) until the other nodes' ranks have disconnected from it.
With PYCOLL_SECRET in its environment the store requires that secret of every connection (the ranks
inherit the variable; every node's launcher must be given the same one).

Failure handling: SIGINT/SIGTERM/SIGHUP received by the launcher are forwarded to every rank (a second
one kills them). When a rank exits non-zero or is killed by a signal, the launcher sends the others
SIGTERM, then SIGKILL after ``--grace-period`` seconds, prints which rank failed and how, and exits
non-zero: with the failed rank's exit code, or 128 + the signal number (with ``--elastic`` the others go
on, for programs that shrink their communicator, and the launcher exits 0 if any rank does). Each rank
runs in its own process group (its subprocesses are signalled with it) with stdin from /dev/null, and dies
with the launcher (Linux parent-death signal) should the launcher itself be killed.

With several nodes this holds per node: a launcher stops only the ranks of its own node. The ranks of
the other nodes learn of it through pycoll itself: their next collective with a rank that is gone fails
(lost peer, or a timeout after its deadline), or their next use of the store fails once node 0's
launcher, whose store goes with it, has exited. They then exit non-zero and their launchers stop the
rest of their node. Nothing waits without a deadline.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from pycoll.bootstrap.env import LAUNCHER_STORE_VAR
from pycoll.bootstrap.net import listen_address
from pycoll.bootstrap.store import TCPStoreServer
from pycoll.env import Settings, rendezvous_secret
from pycoll.errors import InvalidUsageError

__all__ = ["add_parser", "build_parser", "launch", "main", "run_command"]

_PROG = "pycoll run"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_INTERVAL = 0.02
_PR_SET_PDEATHSIG = 1
_LOOPBACK = "127.0.0.1"
#: How long node 0's launcher keeps the store up, after its own ranks succeeded, for the other nodes'
#: ranks to finish with it (they disconnect when they finalize or exit).
_DRAIN_S = 30.0


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "-n",
        "--nproc",
        "--nproc-per-node",
        dest="nproc",
        type=int,
        required=True,
        metavar="N",
        help="number of ranks to start on this host",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=1,
        metavar="M",
        help="number of nodes, each running its own `pycoll run` with the same -n (default 1)",
    )
    parser.add_argument(
        "--node-rank",
        type=int,
        default=0,
        metavar="K",
        help="this node's index, 0..M-1: it runs ranks K*N .. K*N+N-1; node 0 hosts the store (default 0)",
    )
    parser.add_argument(
        "--master-addr",
        default=None,
        metavar="A",
        help="address of node 0, where the rendezvous store listens; required with --nnodes > 1 "
        "(default 127.0.0.1)",
    )
    parser.add_argument(
        "--master-port",
        type=int,
        default=0,
        metavar="P",
        help="port of the rendezvous store node 0's launcher hosts; required with --nnodes > 1 "
        "(default 0 on one node: a free port picked by the kernel)",
    )
    parser.add_argument(
        "--tag-output", action="store_true", help='prefix every line the ranks print with "[rank k] "'
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping ranks (default 5)",
    )
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="a rank that fails does not stop the others (for programs that shrink their communicator, "
        "e.g. with pycoll.elastic.run); exit 0 when at least one rank exits 0",
    )
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="run the program as a module (python -m MODULE) instead of a script",
    )
    parser.add_argument("program", metavar="script.py | module", help="the Python script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to every rank")
    return parser


def build_parser(prog: str = _PROG) -> argparse.ArgumentParser:
    """The stand-alone parser (``python -m pycoll.run``)."""
    return _configure(argparse.ArgumentParser(prog=prog, description="Start N local pycoll ranks."))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``run`` on the ``pycoll`` command's subparsers (see pycoll/cli/main.py)."""
    parser = subparsers.add_parser(
        "run", help="start N local ranks of a Python program", description="Start N local pycoll ranks."
    )
    _configure(parser)
    parser.set_defaults(func=run_command)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed ``run`` command line; returns the launcher's exit code."""
    if args.nproc < 1:
        print(f"{_PROG}: -n must be at least 1, got {args.nproc}", file=sys.stderr)
        return 2
    if not 0 <= args.master_port < 65536:
        print(f"{_PROG}: --master-port must be in 0..65535, got {args.master_port}", file=sys.stderr)
        return 2
    if args.nnodes < 1:
        print(f"{_PROG}: --nnodes must be at least 1, got {args.nnodes}", file=sys.stderr)
        return 2
    if not 0 <= args.node_rank < args.nnodes:
        print(
            f"{_PROG}: --node-rank must be in 0..{args.nnodes - 1} (--nnodes {args.nnodes}), "
            f"got {args.node_rank}",
            file=sys.stderr,
        )
        return 2
    if args.nnodes > 1 and (args.master_port == 0 or not args.master_addr):
        missing = " and ".join(
            name
            for name, unset in (
                ("--master-addr", not args.master_addr),
                ("--master-port", args.master_port == 0),
            )
            if unset
        )
        print(
            f"{_PROG}: --nnodes {args.nnodes} needs {missing}: node 0's launcher hosts the rendezvous store "
            "on that port and the ranks of every node connect to it there, so give the same --master-addr "
            "(node 0's address) and --master-port (a free port on node 0) to the launcher of every node",
            file=sys.stderr,
        )
        return 2
    if args.master_addr is not None and not args.master_addr.strip():
        print(f"{_PROG}: --master-addr must not be empty", file=sys.stderr)
        return 2
    if args.grace_period < 0:
        print(f"{_PROG}: --grace-period must be >= 0, got {args.grace_period}", file=sys.stderr)
        return 2
    if args.module:
        cmd = [sys.executable, "-m", args.program, *args.args]
    else:
        if not os.path.exists(args.program):
            print(f"{_PROG}: script not found: {args.program}", file=sys.stderr)
            return 2
        cmd = [sys.executable, args.program, *args.args]
    return launch(
        args.nproc,
        cmd,
        master_port=args.master_port,
        master_addr=args.master_addr,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        tag_output=args.tag_output,
        grace_period=args.grace_period,
        elastic=args.elastic,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pycoll.run``."""
    return run_command(build_parser().parse_args(argv))


# --------------------------------------------------------------------------------------------------


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _describe(returncode: int) -> str:
    """How a process ended: "exit code 3" or "killed by SIGKILL"."""
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)}"
    return f"exit code {returncode}"


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: a process group of its own; die with the launcher (Linux PR_SET_PDEATHSIG)."""
    libc: Any = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            libc = None

    def setup() -> None:
        os.setpgid(0, 0)  # own process group: the launcher signals a rank together with its children
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent_pid:  # the launcher died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return setup


class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.rank = rank
        self.proc = proc
        self.stopped_by_launcher = False
        self.pumps: list[threading.Thread] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        """Signal the rank's process group (the rank and what it started); only while unreaped."""
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.send_signal(signum)
            except (ProcessLookupError, OSError):
                pass


def _pump(src: IO[bytes], dst: IO[bytes], prefix: bytes, lock: threading.Lock) -> None:
    try:
        for line in iter(src.readline, b""):
            with lock:
                dst.write(prefix + line)
                dst.flush()
    except (OSError, ValueError):
        pass
    finally:
        src.close()


def _rank_env(
    base: Mapping[str, str],
    local_rank: int,
    nproc: int,
    port: int,
    tag_output: bool,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = _LOOPBACK,
) -> dict[str, str]:
    """The environment of local rank ``local_rank`` of node ``node_rank`` (torchrun's variables)."""
    env = dict(base)
    env.update(
        RANK=str(node_rank * nproc + local_rank),
        WORLD_SIZE=str(nnodes * nproc),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node_rank),
        GROUP_WORLD_SIZE=str(nnodes),
        NODE_RANK=str(node_rank),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
    )
    env[LAUNCHER_STORE_VAR] = "1"
    if tag_output:
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the terminal as they are printed
    return env


def launch(
    nproc: int,
    cmd: Sequence[str],
    *,
    master_port: int = 0,
    master_addr: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    tag_output: bool = False,
    grace_period: float = 5.0,
    elastic: bool = False,
    env: Mapping[str, str] | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
) -> int:
    """Start ``nproc`` copies of ``cmd`` as the ranks of node ``node_rank`` of ``nnodes`` and supervise
    them (see module docstring); node 0 hosts the rendezvous store.

    Returns 0 when every rank exits 0; otherwise the failed rank's exit code (128 + signal number when
    it was killed), or 128 + the signal number when the launcher itself was signalled. ``stdout`` and
    ``stderr`` (binary streams) receive the ranks' output when ``tag_output`` is set. With ``elastic`` a
    failed rank is reported and the others go on; the result is 0 when at least one rank exits 0.
    """
    base_env = os.environ if env is None else env
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr.buffer
    prog = _PROG if nnodes == 1 else f"{_PROG} (node {node_rank} of {nnodes})"
    if nnodes > 1 and (master_port == 0 or not master_addr):
        print(f"{prog}: several nodes need master_addr and master_port", file=sys.stderr)
        return 2
    addr = master_addr or _LOOPBACK
    server: TCPStoreServer | None = None
    port = master_port
    if node_rank == 0:
        try:
            if nnodes == 1 and addr in (_LOOPBACK, "localhost"):
                bind = _LOOPBACK  # one node: nothing but its own ranks needs to reach the store
            else:
                bind = listen_address(addr, Settings.from_environ(base_env).socket_ifname)
            # The ranks inherit PYCOLL_SECRET from the same environment, so they and this store agree.
            server = TCPStoreServer(bind, master_port, secret=rendezvous_secret(base_env))
        except (InvalidUsageError, OSError) as exc:  # report and exit like a CLI
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        port = server.port
        if nnodes > 1:
            print(
                f"{prog}: rendezvous store listening on {server.address} for {nnodes * nproc} ranks; start "
                f"the other nodes with --nnodes {nnodes} --master-addr {addr} --master-port {port}",
                file=sys.stderr,
                flush=True,
            )
    ranks: list[_Rank] = []
    received: list[int] = []
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        forward = signal.SIGKILL if len(received) > 1 else signum
        for r in ranks:
            r.signal(forward)

    try:
        if in_main_thread:
            for sig in _FORWARDED:
                previous[sig] = signal.signal(sig, on_signal)
        lock = threading.Lock()
        setup = _child_setup(os.getpid())
        for local in range(nproc):
            pipe = subprocess.PIPE if tag_output else None
            rank_env = _rank_env(
                base_env, local, nproc, port, tag_output, nnodes=nnodes, node_rank=node_rank, master_addr=addr
            )
            proc = subprocess.Popen(
                list(cmd),
                env=rank_env,
                stdin=subprocess.DEVNULL,
                stdout=pipe,
                stderr=pipe,
                preexec_fn=setup,
            )
            r = _Rank(node_rank * nproc + local, proc)
            ranks.append(r)
            if received:
                r.signal(received[0])  # a signal arrived while we were still starting ranks
        # Pump threads start only after the last fork: preexec_fn must not run beside other threads.
        # Until then the ranks' output waits in the pipes.
        for r in ranks if tag_output else ():
            prefix = f"[rank {r.rank}] ".encode()
            assert r.proc.stdout is not None and r.proc.stderr is not None
            for src, dst in ((r.proc.stdout, out), (r.proc.stderr, err)):
                t = threading.Thread(target=_pump, args=(src, dst, prefix, lock), daemon=True)
                t.start()
                r.pumps.append(t)
        code = _supervise(ranks, received, grace_period, cmd, prog, elastic)
        if server is not None and nnodes > 1 and code == 0:
            _drain(server, received, prog)
        return code
    finally:
        # Nothing may outlive the launcher, whatever happened above.
        for r in ranks:
            if r.proc.poll() is None:
                r.signal(signal.SIGKILL)
                try:
                    r.proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    pass
        for r in ranks:
            for t in r.pumps:
                t.join(timeout=2.0)
        if server is not None:
            server.close()
        if in_main_thread:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _drain(server: TCPStoreServer, received: list[int], prog: str) -> None:
    """Node 0, its ranks done: keep the store up while other nodes' ranks are still connected to it
    (at most ``_DRAIN_S``; a signal to the launcher ends the wait)."""
    start = time.monotonic()
    said = False
    while server.num_clients and not received and time.monotonic() < start + _DRAIN_S:
        if not said and time.monotonic() > start + 1.0:  # not for this node's own ranks' last goodbyes
            _say(
                f"waiting up to {_DRAIN_S:g} s for the other nodes' ranks to leave the rendezvous store", prog
            )
            said = True
        server.wait_for_clients_to_leave(0.1)


class _ExitOrder:
    """The ranks in the order to look at them: those whose exit woke the launcher first, in the order the
    kernel reported them, then the others in rank order. A rank that fails because another exited (its
    peer is lost) exits only after it found out, so the one whose exit came first is the one reported,
    however close together they end. Waits on the ranks' pidfds (Linux 5.3+); elsewhere it sleeps, and
    the order is rank order."""

    def __init__(self, ranks: list[_Rank]) -> None:
        self._ranks = ranks
        self._ready: list[_Rank] = []
        self._selector: selectors.BaseSelector | None = None
        try:
            selector = selectors.DefaultSelector()
            for r in ranks:
                selector.register(os.pidfd_open(r.pid), selectors.EVENT_READ, r)
            self._selector = selector
        except (AttributeError, OSError):  # no pidfd_open (or a rank reaped already): poll in rank order
            self._selector = None

    def order(self) -> list[_Rank]:
        ready, self._ready = self._ready, []
        return ready + [r for r in self._ranks if r not in ready]

    def wait(self, timeout: float) -> None:
        if self._selector is None:
            time.sleep(timeout)
            return
        for key, _ in self._selector.select(timeout):
            self._ready.append(key.data)
            self._selector.unregister(key.fileobj)
            os.close(key.fd)

    def close(self) -> None:
        if self._selector is not None:
            for key in list(self._selector.get_map().values()):
                os.close(key.fd)
            self._selector.close()


def _supervise(
    ranks: list[_Rank],
    received: list[int],
    grace_period: float,
    cmd: Sequence[str],
    prog: str = _PROG,
    elastic: bool = False,
) -> int:
    failed: list[_Rank] = []  # ranks that failed on their own, in the order noticed
    kill_at: float | None = None
    signals_seen = 0
    exits = _ExitOrder(ranks)
    while True:
        alive = 0
        for r in exits.order():
            was_running = r.proc.returncode is None
            rc = r.proc.poll()
            if rc is None:
                alive += 1
            elif was_running and rc != 0 and not r.stopped_by_launcher and not received:
                failed.append(r)
                if elastic:
                    _say(
                        f"rank {r.rank} (pid {r.pid}) failed: {_describe(rc)}; the others go on (--elastic)",
                        prog,
                    )
                elif len(failed) == 1:
                    others = [o for o in ranks if o.proc.poll() is None]
                    what = f"rank {r.rank} (pid {r.pid}) failed: {_describe(rc)}"
                    _say(f"{what}; stopping the other {len(others)} rank(s)" if others else what, prog)
                    for o in others:
                        o.stopped_by_launcher = True
                        o.signal(signal.SIGTERM)
                    kill_at = time.monotonic() + grace_period
        if len(received) > signals_seen:
            if signals_seen == 0:
                _say(f"received {_signal_name(received[0])}; forwarded it to the ranks", prog)
                kill_at = time.monotonic() + grace_period
            signals_seen = len(received)
        if alive == 0:
            break
        if kill_at is not None and time.monotonic() >= kill_at:
            for r in ranks:
                if r.proc.poll() is None:
                    _say(
                        f"rank {r.rank} (pid {r.pid}) still running {grace_period:g} s after it was "
                        "told to stop; sending SIGKILL",
                        prog,
                    )
                    r.stopped_by_launcher = True
                    r.signal(signal.SIGKILL)
            kill_at = None
        exits.wait(_POLL_INTERVAL)
    exits.close()

    if failed and elastic and any(r.proc.returncode == 0 for r in ranks):
        return 0
    if failed:
        first = failed[0]
        rc = first.proc.returncode or 0
        lines = [f"rank {first.rank} failed ({_describe(rc)}); command: {shlex.join(cmd)}"]
        for r in failed[1:]:
            lines.append(f"rank {r.rank} also failed ({_describe(r.proc.returncode or 0)})")
        stopped = [r.rank for r in ranks if r.stopped_by_launcher]
        if stopped:
            lines.append("ranks stopped by the launcher: " + ", ".join(str(s) for s in stopped))
        for line in lines:
            _say(line, prog)
        return rc if rc > 0 else 128 + (-rc)
    if received:
        _say(
            f"stopped by {_signal_name(received[0])}; ranks: "
            + ", ".join(f"rank {r.rank} {_describe(r.proc.returncode or 0)}" for r in ranks),
            prog,
        )
        return 128 + received[0]
    return 0


def _say(message: str, prog: str = _PROG) -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
