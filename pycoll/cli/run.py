"""``pycoll run``: start N local ranks of a Python program, torchrun style.

    pycoll run -n 4 train.py --lr 0.1
    pycoll run -n 4 -m mypkg.train --lr 0.1
    python -m pycoll.run -n 4 train.py

The launcher hosts the rendezvous store itself, on a port the kernel picks (no port race), and starts
each rank with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (the
store's port) and PYCOLL_LAUNCHER_STORE=1 (rank 0 connects to that store instead of hosting one).
With PYCOLL_SECRET in its environment the store requires that secret of every connection (the ranks
inherit the variable).

Failure handling: SIGINT/SIGTERM/SIGHUP received by the launcher are forwarded to every rank (a second
one kills them). When a rank exits non-zero or is killed by a signal, the launcher sends the others
SIGTERM, then SIGKILL after ``--grace-period`` seconds, prints which rank failed and how, and exits
non-zero: with the failed rank's exit code, or 128 + the signal number. Each rank runs in its own
process group (its subprocesses are signalled with it) with stdin from /dev/null, and dies with the
launcher (Linux parent-death signal) should the launcher itself be killed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from pycoll.bootstrap.env import LAUNCHER_STORE_VAR
from pycoll.bootstrap.store import TCPStoreServer
from pycoll.env import rendezvous_secret

__all__ = ["add_parser", "build_parser", "launch", "main", "run_command"]

_PROG = "pycoll run"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_INTERVAL = 0.02
_PR_SET_PDEATHSIG = 1


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
        "--master-port",
        type=int,
        default=0,
        metavar="P",
        help="port of the rendezvous store the launcher hosts (default 0: a free port picked by the kernel)",
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
        tag_output=args.tag_output,
        grace_period=args.grace_period,
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


def _rank_env(base: Mapping[str, str], rank: int, nproc: int, port: int, tag_output: bool) -> dict[str, str]:
    env = dict(base)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
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
    tag_output: bool = False,
    grace_period: float = 5.0,
    env: Mapping[str, str] | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
) -> int:
    """Start ``nproc`` copies of ``cmd`` as ranks 0..nproc-1 and supervise them (see module docstring).

    Returns 0 when every rank exits 0; otherwise the failed rank's exit code (128 + signal number when
    it was killed), or 128 + the signal number when the launcher itself was signalled. ``stdout`` and
    ``stderr`` (binary streams) receive the ranks' output when ``tag_output`` is set.
    """
    base_env = os.environ if env is None else env
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr.buffer
    try:
        # The ranks inherit PYCOLL_SECRET from the same environment, so they and this store agree.
        server = TCPStoreServer("127.0.0.1", master_port, secret=rendezvous_secret(base_env))
    except Exception as exc:  # noqa: BLE001 - report and exit like a CLI
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
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
        for rank in range(nproc):
            pipe = subprocess.PIPE if tag_output else None
            proc = subprocess.Popen(
                list(cmd),
                env=_rank_env(base_env, rank, nproc, server.port, tag_output),
                stdin=subprocess.DEVNULL,
                stdout=pipe,
                stderr=pipe,
                preexec_fn=setup,
            )
            r = _Rank(rank, proc)
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
        return _supervise(ranks, received, grace_period, cmd)
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
        server.close()
        if in_main_thread:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _supervise(ranks: list[_Rank], received: list[int], grace_period: float, cmd: Sequence[str]) -> int:
    failed: list[_Rank] = []  # ranks that failed on their own, in the order noticed
    kill_at: float | None = None
    signals_seen = 0
    while True:
        alive = 0
        for r in ranks:
            was_running = r.proc.returncode is None
            rc = r.proc.poll()
            if rc is None:
                alive += 1
            elif was_running and rc != 0 and not r.stopped_by_launcher and not received:
                failed.append(r)
                if len(failed) == 1:
                    others = [o for o in ranks if o.proc.poll() is None]
                    what = f"rank {r.rank} (pid {r.pid}) failed: {_describe(rc)}"
                    _say(f"{what}; stopping the other {len(others)} rank(s)" if others else what)
                    for o in others:
                        o.stopped_by_launcher = True
                        o.signal(signal.SIGTERM)
                    kill_at = time.monotonic() + grace_period
        if len(received) > signals_seen:
            if signals_seen == 0:
                _say(f"received {_signal_name(received[0])}; forwarded it to the ranks")
                kill_at = time.monotonic() + grace_period
            signals_seen = len(received)
        if alive == 0:
            break
        if kill_at is not None and time.monotonic() >= kill_at:
            for r in ranks:
                if r.proc.poll() is None:
                    _say(
                        f"rank {r.rank} (pid {r.pid}) still running {grace_period:g} s after it was "
                        "told to stop; sending SIGKILL"
                    )
                    r.stopped_by_launcher = True
                    r.signal(signal.SIGKILL)
            kill_at = None
        time.sleep(_POLL_INTERVAL)

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
            _say(line)
        return rc if rc > 0 else 128 + (-rc)
    if received:
        _say(
            f"stopped by {_signal_name(received[0])}; ranks: "
            + ", ".join(f"rank {r.rank} {_describe(r.proc.returncode or 0)}" for r in ranks)
        )
        return 128 + received[0]
    return 0


def _say(message: str) -> None:
    print(f"{_PROG}: {message}", file=sys.stderr, flush=True)
