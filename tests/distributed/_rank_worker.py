"""One rank process of ``harness.RankPool`` (started as ``python _rank_worker.py``; not a test module).

The worker connects back to the test process over a ``multiprocessing.connection`` socket (an
authenticated, pickling channel), forms the communicator when told to, then runs test bodies
``fn(comm, rank, world, *args, **kwargs)`` one after another, answering each with its result or with the
exception and its full traceback. ``faulthandler`` dumps every thread's Python stack to the per-worker
stack file on SIGUSR1 (the pool does that before it kills a worker that missed its deadline; from a
Python-level handler, and on SIGUSR2 from faulthandler's own, for a rank stuck in native code) and to
stderr (the per-worker log file) on a fatal signal.

Protocol (tuples, parent <-> worker)::

    worker: ("hello", rank, pid)
    parent: ("setup", {"sys_path": [...], "store_port": int, "comm_timeout": float | None,
                       "init_kwargs": {...}})
    worker: ("imported",)                      after importing pycoll (slow on a loaded machine)
    parent: ("init",)                          once every rank has imported: set-up starts together
    worker: ("ready", info) | ("err", ...)     info: {"segment_bytes": ..., "pid": ...}
    parent: ("run", module, qualname, file, args, kwargs)
    worker: ("ok", result, broken) | ("err", type_name, message, traceback, broken)
    parent: ("exit",)
    worker: ("bye",)
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Client


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this worker when the test process dies, so no rank outlives a killed pytest."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _resolve(module: str, qualname: str, file: str | None):
    try:
        mod = importlib.import_module(module)
    except ImportError:
        if not file:
            raise
        # The test process imported the module some other way (pytest --import-mode=importlib):
        # load it from its file under the same name.
        mod = sys.modules.get(module)
        if mod is None:
            spec = importlib.util.spec_from_file_location(module, file)
            if spec is None or spec.loader is None:
                raise
            mod = importlib.util.module_from_spec(spec)
            sys.modules[module] = mod
            spec.loader.exec_module(mod)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _error_reply(exc: BaseException, broken: bool) -> tuple:
    return ("err", type(exc).__name__, str(exc), traceback.format_exc(), broken)


def _is_broken(comm) -> bool:
    if comm is None:
        return True
    try:
        comm.check_usable()
    except Exception:  # noqa: BLE001 - CommunicatorBrokenError, or finalized by the test body
        return True
    return False


def main() -> int:
    rank, world, ctl_port, parent_pid = (int(a) for a in sys.argv[1:5])
    stack_file = sys.argv[5]
    _die_with_parent(parent_pid)
    stacks = open(stack_file, "w")  # noqa: SIM115 - kept open for the life of the process
    # SIGUSR1: every thread's Python stack, written by a Python-level handler. It runs in the main thread
    # holding the GIL, so no other thread's frames change while they are read; faulthandler's C-level
    # handler reads them while those threads run, and on Python 3.11 that can crash the process instead
    # (CPython issue #116008; seen once in this suite, a rank sleeping in a test body). A rank stuck in native
    # code that never checks for signals cannot run it: SIGUSR2 is the C-level dump for that case, which
    # the pool sends when SIGUSR1 brought nothing.
    signal.signal(signal.SIGUSR1, lambda *_: faulthandler.dump_traceback(file=stacks, all_threads=True))
    faulthandler.register(signal.SIGUSR2, file=stacks, all_threads=True, chain=False)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    authkey = bytes.fromhex(os.environ.pop("PYCOLL_TEST_AUTHKEY"))
    conn = Client(("127.0.0.1", ctl_port), authkey=authkey)
    conn.send(("hello", rank, os.getpid()))

    kind, setup = conn.recv()
    assert kind == "setup", kind
    sys.path[:] = setup["sys_path"]
    comm = None
    store = None
    try:
        import numpy  # noqa: F401

        import pycoll
        import pycoll.api  # noqa: F401 - the native module loads here, before set-up starts
        from pycoll.bootstrap import TCPStoreClient
        from pycoll.env import rendezvous_secret

        for name in setup.get("preimport", ()):
            importlib.import_module(name)
        conn.send(("imported",))
        (kind,) = conn.recv()
        assert kind == "init", kind
        comm_timeout = setup["comm_timeout"]
        per_host = int(os.environ.get("PYCOLL_TEST_RANKS_PER_HOST", "0"))
        if per_host:  # pretend that every `per_host` consecutive ranks are a host of their own
            os.environ["PYCOLL_HOST_ID"] = f"test-host-{rank // per_host}"
        store = TCPStoreClient(
            "127.0.0.1", setup["store_port"], timeout=comm_timeout or 60.0, secret=rendezvous_secret()
        )
        comm = pycoll.init(rank=rank, world_size=world, store=store, timeout=comm_timeout,
                           **setup.get("init_kwargs", {}))
        conn.send(("ready", {"segment_bytes": comm.segment_bytes, "pid": os.getpid()}))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the test process
        conn.send(_error_reply(exc, True))
        return 1

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 1  # the test process went away
        if msg[0] == "exit":
            try:
                pycoll.finalize(comm)
                store.close()
            finally:
                conn.send(("bye",))
            return 0
        _, module, qualname, file, args, kwargs = msg
        try:
            fn = _resolve(module, qualname, file)
            result = fn(comm, rank, world, *args, **kwargs)
            reply = ("ok", result, _is_broken(comm))
            try:
                conn.send(reply)
                continue
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                raise TypeError(f"the result of {qualname} cannot be pickled: {exc}") from exc
        except BaseException as exc:  # noqa: BLE001
            reply = _error_reply(exc, _is_broken(comm))
        conn.send(reply)


if __name__ == "__main__":
    sys.exit(main())
