"""Junk on every listening port while a job forms and runs (issue 52): a thread of the test finds the rank
processes' listening TCP sockets (the store, each rank's fault-plane listener and TCP data listener, as
they appear) and keeps throwing at each of them: random bytes, a length past any frame's, half a frame,
a connection that says nothing, JSON that is no request. The job (PYCOLL_TRANSPORT=tcp) forms, all-reduces
rank-dependent data (checked exactly), agrees, and finalizes; no rank is found dead, nothing is left in
/dev/shm, and no process outlives its deadline. 16 ranks here; 64 with PYCOLL_TEST_JUNK_RANKS=64."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 240.0

CHILD = r"""
import json, sys, time
import numpy as np
import pycoll
comm = pycoll.init(timeout=120)
rank, world = comm.rank, comm.world_size
ok = True
for i in range(20):
    x = np.arange(1000, dtype=np.float64) * (rank + 1) + i
    y = pycoll.allreduce(x, comm=comm, timeout=60)
    ok &= bool(np.array_equal(y, np.arange(1000, dtype=np.float64) * world * (world + 1) / 2 + i * world))
time.sleep(1.0)  # the thrower keeps at it while the job sits idle
flag, lost = comm.agree(ok, timeout=60)
plane = comm.plane_required()
print("RESULT " + json.dumps({"rank": rank, "ok": ok and flag and not lost, "dead": sorted(plane.dead),
                              "evicted": plane.evicted}), flush=True)
pycoll.finalize()
"""


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes against /proc/net/tcp's LISTEN rows)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        ports = set()
        with open(f"/proc/{pid}/net/tcp") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].split(":")[1], 16))
        return ports
    except OSError:
        return set()


def _throw(port: int, rng: random.Random, held: list[socket.socket]) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    except OSError:
        return
    kind = rng.randrange(5)
    try:
        if kind == 0:
            s.sendall(os.urandom(rng.randrange(1, 300)))
        elif kind == 1:
            s.sendall(struct.pack(">I", 0xFFFFFFF0) + b"x" * 16)
        elif kind == 2:
            s.sendall(struct.pack(">I", 1000) + b"{")  # half a frame, then nothing
        elif kind == 3:
            body = json.dumps({"t": "lost", "rank": 0, "why": "junk"}).encode()
            s.sendall(struct.pack(">I", len(body)) + body)
        if kind in (2, 4) and len(held) < 64:  # kept open, saying nothing more
            held.append(s)
            return
    except OSError:
        pass
    s.close()


def test_junk_on_every_listening_port_while_the_job_forms_and_runs():
    world = int(os.environ.get("PYCOLL_TEST_JUNK_RANKS", "16"))
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    master = port.getsockname()[1]
    port.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master), WORLD_SIZE=str(world),
               PYCOLL_TRANSPORT="tcp", OMP_NUM_THREADS="1")
    env.pop("PYCOLL_SECRET", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        for r in range(world)
    ]
    stop = threading.Event()
    thrown = [0]
    held: list[socket.socket] = []

    def thrower() -> None:
        rng = random.Random(52)
        while not stop.is_set():
            ports = set()
            for p in procs:
                ports |= _listening_ports(p.pid)
            for prt in sorted(ports):
                _throw(prt, rng, held)
                thrown[0] += 1
            time.sleep(0.05)

    t = threading.Thread(target=thrower, daemon=True)
    t.start()
    outputs = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
        for s in held:
            s.close()
    assert thrown[0] > world, f"the thrower found only {thrown[0]} listening sockets to throw at"
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{out[-3000:]}"
        res = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        assert res and res[0]["ok"] and res[0]["dead"] == [] and res[0]["evicted"] is None, out[-3000:]
    leftovers = [n for n in os.listdir("/dev/shm") if n.startswith("pycoll")]
    assert not leftovers, leftovers
