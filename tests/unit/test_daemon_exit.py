"""A process whose daemon threads wait in pycoll's native code exits cleanly (status 0).

CPython ends a daemon thread that takes the GIL back after the interpreter began to finalize by unwinding
its stack (pthread_exit). Where native code took the GIL back in a destructor (pybind11's
gil_scoped_release), that unwinding called std::terminate and the process aborted at exit with status 134
("terminate called without an active exception"): every process whose fault plane was waiting for its
links' events, and the job's launcher with it, then reported a failure. csrc/python/gil.h has the fix.
Each script here keeps daemon threads going in and out of native code while the main thread ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Threads that wait in the control listener (as the fault plane's join thread does) and in the control
# links' event queue (as the plane's own thread does), for a moment each, over and over.
FAULT_PLANE = """
    import threading
    from pycoll.fault.listener import listener_for
    from pycoll.fault.plane import form
    listener = listener_for("127.0.0.1", "127.0.0.1", None)
    plane = form(listener, 0, 1, [{"address": listener.address, "host": "h", "pid": 0}], "p", "t", 5.0, 1e12)

    def join_waits():
        while True:
            listener.native.next_join(0.0005)

    def event_waits():
        while True:
            plane._native.take(0.0005)

    for target in (join_waits, event_waits) * 2:
        threading.Thread(target=target, daemon=True).start()
"""

# A thread that runs collectives one after the other (a user's background thread).
COLLECTIVES = """
    import threading
    import numpy as np
    import pycoll
    from pycoll.bootstrap import TCPStoreServer
    from pycoll.bootstrap.store import TCPStoreClient
    server = TCPStoreServer("127.0.0.1", 0)
    comm = pycoll.init(store=TCPStoreClient("127.0.0.1", server.port, timeout=60), rank=0, world_size=1)
    x = np.ones(16, np.float32)
    pycoll.allreduce(x, comm=comm)

    def collectives():
        while True:
            pycoll.allreduce(x, comm=comm)

    for _ in range(2):
        threading.Thread(target=collectives, daemon=True).start()
"""


@pytest.mark.parametrize("script", [FAULT_PLANE, COLLECTIVES], ids=["fault-plane", "collectives"])
def test_daemon_threads_in_native_code_do_not_abort_the_exit(script: str) -> None:
    for attempt in range(5):  # the old code aborted in most attempts
        command = [sys.executable, "-c", textwrap.dedent(script)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "terminate" not in done.stderr, (
            f"attempt {attempt}: exit status {done.returncode}\n{done.stderr[-2000:]}"
        )
