"""Runs test bodies on N rank processes that share one pycoll communicator.

    pool = RankPool(4)                       # 4 fresh interpreters form a communicator once
    results = pool.run(body, 7, timeout=60)  # body(comm, rank, world, 7) on every rank -> [r0, r1, r2, r3]
    pool.close()

    run_ranks(3, body, timeout=30)           # a one-off pool of fresh processes (failure tests)

* Workers are fresh interpreters (``subprocess`` + exec of ``_rank_worker.py``: never a fork of the
  pytest process). They form the communicator over a ``TCPStoreServer`` this process hosts on port 0
  (``pool.store``; with ``PYCOLL_SECRET`` in ``env`` it requires that secret, as a rank-0 store would;
  ``store_kwargs`` go to its constructor), and talk to this process over an authenticated socket, also
  on a kernel-chosen port: no fixed ports.
* ``fn`` must be a module-level function (sent as module + qualname, imported by the worker with the
  test process's ``sys.path``); args, kwargs and results travel pickled.
* An exception in any rank fails the run with every failing rank's full traceback (``RankError``).
  After the first failure the other ranks get ``ERROR_GRACE_S`` to answer (they are often blocked in a
  collective that the failed rank never joined), then they are treated as past their deadline.
* Past the deadline every worker's Python stacks are dumped (SIGUSR1, then faulthandler's own on
  SIGUSR2 for a worker that did not answer it; to a per-worker file), every worker is killed, and
  ``RankTimeout`` names the ranks that did not answer and shows the stacks. Nothing waits without a
  deadline, so a run never hangs.
* A pool whose communicator broke (a failure test), or whose run failed, is closed; ``PoolCache`` (the
  ``rank_pool`` fixture) makes a fresh one on the next request.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.connection import Listener, wait
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_rank_worker.py"

#: Seconds the other ranks get to answer once one rank has failed.
ERROR_GRACE_S = 5.0
#: Deadline for starting the workers and forming the communicator.
START_TIMEOUT_S = 60.0
#: Default deadline of every collective in a pool (init(timeout=)): a body that leaves ranks out of
#: step fails in this time instead of pycoll's 300 s default.
DEFAULT_COMM_TIMEOUT_S = 30.0
_LOG_TAIL = 3000


class RankError(AssertionError):
    """One or more ranks raised (or died); the message has every rank's traceback."""

    def __init__(self, message: str, failures: dict[int, RankFailure]) -> None:
        super().__init__(message)
        self.failures = failures


class RankTimeout(RankError):
    """Ranks did not answer before the deadline; the message names them and has every worker's stacks."""

    def __init__(self, message: str, failures: dict[int, RankFailure], missing: list[int]) -> None:
        super().__init__(message, failures)
        self.missing = missing


@dataclass
class RankFailure:
    rank: int
    type_name: str
    message: str
    traceback: str


@dataclass(frozen=True)
class RankExited:
    """What ``run(..., allow_exit=True)`` returns for a rank whose process ended during the run."""

    rank: int
    returncode: int | None

    @property
    def signal(self) -> int | None:
        rc = self.returncode
        return -rc if rc is not None and rc < 0 else None


def _tail(path: Path, limit: int = _LOG_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-limit:].decode("utf-8", "replace")
    return ("..." if len(data) > limit else "") + text


def _describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


class RankPool:
    """``world_size`` long-lived rank processes with one communicator; see the module docstring."""

    def __init__(
        self,
        world_size: int,
        *,
        comm_timeout: float | None = DEFAULT_COMM_TIMEOUT_S,
        env: dict[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_S,
        preimport: tuple[str, ...] = (),
        init_kwargs: dict[str, Any] | None = None,
        store_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from pycoll.bootstrap import TCPStoreServer
        from pycoll.env import rendezvous_secret

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.closed = False
        self.broken = False  # the communicator failed, or a run failed: do not reuse
        self.info: list[dict[str, Any]] = []
        self._dir = Path(tempfile.mkdtemp(prefix=f"pycoll-pool{world_size}-"))
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Any] = [None] * world_size
        self._logs: list[Any] = []
        # The workers read PYCOLL_SECRET from the environment they get; the store must require the same.
        secret = rendezvous_secret({**os.environ, **(env or {})})
        self._store = TCPStoreServer("127.0.0.1", 0, secret=secret, **(store_kwargs or {}))
        authkey = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey, backlog=max(16, world_size))
        port = self._listener.address[1]
        try:
            child_env = dict(os.environ)
            # 64 KiB ring slots (256 KiB segments) instead of the default 256 KiB keep the "several
            # segments" cases of the sweeps small enough for CI; the default size is exercised by the
            # launcher and benchmark tests, which start ranks without this harness.
            child_env.setdefault("PYCOLL_SHM_SLOT_BYTES", "65536")
            child_env.update(env or {})
            child_env.update({
                "PYCOLL_TEST_AUTHKEY": authkey.hex(),
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "OMP_NUM_THREADS": child_env.get("OMP_NUM_THREADS", "1"),
            })
            for r in range(world_size):
                log = open(self._dir / f"rank{r}.log", "wb")  # noqa: SIM115 - closed in close()
                self._logs.append(log)
                self._procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), str(r), str(world_size), str(port), str(os.getpid()),
                     str(self._stack_file(r))],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                    cwd=os.getcwd(), close_fds=True,
                ))
            self._start(start_timeout, {
                "sys_path": list(sys.path),
                "store_port": self._store.port,
                "comm_timeout": comm_timeout,
                "preimport": tuple(preimport),
                "init_kwargs": dict(init_kwargs or {}),
            })
        except BaseException:
            self._kill_all()
            self.close()
            raise

    # ---- start -------------------------------------------------------------------------------------
    def _stack_file(self, rank: int) -> Path:
        return self._dir / f"rank{rank}.stacks"

    def _start(self, timeout: float, setup: dict[str, Any]) -> None:
        deadline = time.monotonic() + timeout
        # Accept the workers' connections; each says which rank it is.
        sock = self._listener._listener._socket  # the listening socket, to give accept() a deadline
        for _ in range(self.world_size):
            remaining = deadline - time.monotonic()
            sock.settimeout(max(remaining, 0.001))
            try:
                conn = self._listener.accept()
            except (TimeoutError, OSError) as exc:
                missing = [r for r in range(self.world_size) if self._conns[r] is None]
                self._fail_deadline("start", missing, {}, f"workers did not connect ({exc})")
            kind, rank, _pid = conn.recv()
            assert kind == "hello"
            self._conns[rank] = conn
        for conn in self._conns:
            conn.send(("setup", setup))
        self._collect("import", ("imported",), deadline)
        for conn in self._conns:
            conn.send(("init",))
        replies = self._collect("pycoll.init", ("ready",), deadline)
        self.info = [payload for _kind, payload in replies]

    def _collect(self, what: str, kinds: tuple[str, ...], deadline: float) -> list[tuple]:
        """One reply of a set-up phase from every rank; raise (and kill) on an error or the deadline."""
        replies: dict[int, tuple] = {}
        failures: dict[int, RankFailure] = {}
        pending = set(range(self.world_size))
        while pending:
            remaining = deadline - time.monotonic()
            ready = wait([self._conns[r] for r in pending], timeout=remaining) if remaining > 0 else []
            if not ready:
                self._fail_deadline(what, sorted(pending), failures, "")
            for conn in ready:
                r = self._conns.index(conn)
                pending.discard(r)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    failures[r] = self._exit_failure(r)
                    continue
                if msg[0] in kinds:
                    replies[r] = msg
                else:
                    failures[r] = RankFailure(r, msg[1], msg[2], msg[3])
            if failures:
                self._kill_all()
                self.close()
                raise RankError(self._format(f"{self.world_size}-rank pool failed during {what}", failures),
                                failures)
        return [replies[r] for r in range(self.world_size)]

    # ---- running -----------------------------------------------------------------------------------
    @property
    def segment_bytes(self) -> int:
        return int(self.info[0]["segment_bytes"])

    @property
    def store(self) -> Any:
        """The ``TCPStoreServer`` the ranks' communicator was formed over (it lives as long as the pool)."""
        return self._store

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        return not self.closed and not self.broken

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float = 60.0,
        allow_exit: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """``fn(comm, rank, world, *args, **kwargs)`` on every rank; the results in rank order.

        ``allow_exit``: a rank whose process ends during the run gives a ``RankExited`` instead of
        failing the run (tests that SIGKILL a rank). The pool is closed afterwards.
        """
        if self.closed:
            raise RuntimeError("this RankPool is closed")
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        if not module or module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
            raise ValueError(f"fn must be a module-level function of an importable module, got {fn!r}")
        file = getattr(sys.modules.get(module), "__file__", None)
        msg = ("run", module, qualname, file, args, kwargs)
        for r, conn in enumerate(self._conns):
            try:
                conn.send(msg)
            except OSError as exc:  # the worker died between runs
                failure = self._exit_failure(r)
                self._kill_all()
                self.broken = True
                self.close()
                raise RankError(self._format(f"{qualname}: could not reach rank {r} ({exc})", {r: failure}),
                                {r: failure}) from None

        what = f"{qualname}{args!r}" if len(repr(args)) < 200 else qualname
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        pending = set(range(self.world_size))
        any_broken = False
        exited = False
        first_failure = 0.0
        while pending:
            now = time.monotonic()
            limit = deadline if not failures else min(deadline, first_failure + ERROR_GRACE_S)
            remaining = limit - now
            ready = wait([self._conns[r] for r in pending], timeout=remaining) if remaining > 0 else []
            if not ready:
                self._fail_deadline(what, sorted(pending), failures,
                                    "" if not failures else
                                    f"(given {ERROR_GRACE_S:.0f} s after the first failure)")
            for conn in ready:
                r = self._conns.index(conn)
                pending.discard(r)
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    exited = True
                    if allow_exit:
                        self._procs[r].wait(timeout=10)
                        results[r] = RankExited(r, self._procs[r].returncode)
                    else:
                        failures[r] = self._exit_failure(r)
                        if len(failures) == 1:
                            first_failure = time.monotonic()
                    continue
                if reply[0] == "ok":
                    results[r] = reply[1]
                    any_broken |= bool(reply[2])
                else:
                    failures[r] = RankFailure(r, reply[1], reply[2], reply[3])
                    any_broken |= bool(reply[4])
                    if len(failures) == 1:
                        first_failure = time.monotonic()
        if failures:
            self.broken = True
            self.close()
            raise RankError(self._format(f"{what} failed", failures), failures)
        if any_broken or exited:
            self.broken = True
            self.close()
        return [results[r] for r in range(self.world_size)]

    # ---- failures ----------------------------------------------------------------------------------
    def _exit_failure(self, r: int) -> RankFailure:
        try:
            self._procs[r].wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        rc = self._procs[r].returncode
        return RankFailure(r, "RankExited", f"rank {r} (pid {self._procs[r].pid}) {_describe_exit(rc)}",
                           f"last output of rank {r}:\n{_tail(self._dir / f'rank{r}.log')}")

    def dump_stacks(self, wait_s: float = 1.5) -> dict[int, str]:
        """Every live worker's Python stacks (all threads): SIGUSR1 asks for them (a Python-level handler,
        which a rank stuck in native code without checking for signals never runs); a worker that wrote
        nothing in half of ``wait_s`` gets SIGUSR2, faulthandler's own dump (_rank_worker.py)."""
        sizes = {}
        for r, p in enumerate(self._procs):
            if p.poll() is None:
                path = self._stack_file(r)
                sizes[r] = path.stat().st_size if path.exists() else 0
                self._signal(r, signal.SIGUSR1)
        out: dict[int, str] = {}
        end = time.monotonic() + wait_s
        second = time.monotonic() + wait_s / 2
        while time.monotonic() < end and len(out) < len(sizes):
            if second is not None and time.monotonic() >= second:
                second = None
                for r, start in sizes.items():
                    path = self._stack_file(r)
                    if r not in out and (not path.exists() or path.stat().st_size == start):
                        self._signal(r, signal.SIGUSR2)
            for r, start in sizes.items():
                if r in out:
                    continue
                path = self._stack_file(r)
                data = path.read_bytes()[start:] if path.exists() else b""
                # faulthandler writes one block per thread, the current one last; wait for it to settle
                if data and data.endswith(b"\n"):
                    time.sleep(0.05)
                    data2 = path.read_bytes()[start:]
                    if data2 == data:
                        out[r] = data.decode("utf-8", "replace")
            time.sleep(0.02)
        for r in sizes:
            out.setdefault(r, "(no stack dump arrived)")
        return out

    def _signal(self, r: int, sig: signal.Signals) -> None:
        try:
            os.kill(self._procs[r].pid, sig)
        except ProcessLookupError:
            pass

    def _fail_deadline(self, what: str, missing: list[int], failures: dict[int, RankFailure],
                       note: str) -> None:
        stacks = self.dump_stacks()
        exits = {r: p.poll() for r, p in enumerate(self._procs)}
        self._kill_all()
        lines = [f"{what}: rank(s) {', '.join(map(str, missing))} of {self.world_size} did not answer "
                 f"before the deadline {note}".rstrip(), ""]
        for r in range(self.world_size):
            state = "answered" if r not in missing else ("no answer" if exits[r] is None else
                                                          _describe_exit(exits[r]))
            lines.append(f"---- rank {r} ({state}) Python stacks:")
            lines.append(stacks.get(r, f"(process {_describe_exit(exits[r])})").rstrip())
            tail = _tail(self._dir / f"rank{r}.log", 1500).strip()
            if tail:
                lines.append(f"---- rank {r} output (tail):\n{tail}")
        if failures:
            lines.append("")
            lines.append(self._format("failures before the deadline", failures))
        self.broken = True
        self.close()
        raise RankTimeout("\n".join(lines), failures, missing)

    def _format(self, title: str, failures: dict[int, RankFailure]) -> str:
        parts = [f"{title}: rank(s) {', '.join(map(str, sorted(failures)))} of {self.world_size}"]
        for r in sorted(failures):
            f = failures[r]
            parts.append(f"==== rank {r}: {f.type_name}: {f.message}\n{f.traceback.rstrip()}")
        return "\n".join(parts)

    # ---- teardown ----------------------------------------------------------------------------------
    def _kill_all(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self, timeout: float = 10.0) -> None:
        """Asks every worker to finalize and exit; kills those that do not within ``timeout``."""
        if self.closed:
            return
        self.closed = True
        for r, conn in enumerate(self._conns):
            if conn is not None and self._procs[r].poll() is None:
                try:
                    conn.send(("exit",))
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self._procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        self._kill_all()
        for conn in self._conns:
            if conn is not None:
                conn.close()
        self._listener.close()
        self._store.close()
        for log in self._logs:
            log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_ranks(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0, allow_exit: bool = False,
              comm_timeout: float | None = DEFAULT_COMM_TIMEOUT_S, env: dict[str, str] | None = None,
              **kwargs: Any) -> list[Any]:
    """``fn`` on ``world`` fresh rank processes (a pool of its own, closed afterwards)."""
    with RankPool(world, comm_timeout=comm_timeout, env=env) as pool:
        return pool.run(fn, *args, timeout=timeout, allow_exit=allow_exit, **kwargs)


class PoolCache:
    """Reuses one pool per world size, keeping at most ``max_alive`` alive (least recently used closed)."""

    def __init__(self, max_alive: int = 2, **pool_kwargs: Any) -> None:
        self.max_alive = max_alive
        self.pool_kwargs = pool_kwargs
        self._pools: OrderedDict[int, RankPool] = OrderedDict()
        self.created = 0

    def get(self, world: int) -> RankPool:
        pool = self._pools.pop(world, None)
        if pool is not None and not pool.alive:
            pool.close()
            pool = None
        if pool is None:
            while len(self._pools) >= self.max_alive:
                _, old = self._pools.popitem(last=False)
                old.close()
            pool = RankPool(world, **self.pool_kwargs)
            self.created += 1
        self._pools[world] = pool
        return pool

    def close(self) -> None:
        while self._pools:
            _, pool = self._pools.popitem()
            pool.close()
