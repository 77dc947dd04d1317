"""A busy rank is not a dead one; a stopped one is (issue 51). Real rank processes, default settings
(PYCOLL_HEARTBEAT_TIMEOUT 5 s), shared memory or TCP over loopback.

    python bench/liveness.py                          # busy 10 s and 60 s, 2 and 4 ranks, shm and tcp; stop
    python bench/liveness.py --hold 10 --ranks 2 --transports shm --how sort

busy     rank 1 holds the GIL for ``--hold`` seconds in one C call that never releases it, while the
         others wait for it in an all-reduce: ``--how native`` (a sleep with the GIL held, exactly that
         long) or ``sort`` (``list.sort()`` of enough random floats to take about that long, the case the
         issue was filed with). Then two more all-reduces. Every rank reports its results (checked
         exactly: sum of rank + 1), how long it waited, and what its fault plane holds: dead ranks,
         eviction.
stop     rank 1 of 4 is stopped (SIGSTOP) for ``--stop`` seconds while the others wait for it in an
         all-reduce, then continued. Every rank reports what it got and when (seconds after the stop):
         the others a PeerLostError naming rank 1 once its silence passed the heartbeat timeout, and a
         shrink to 3 ranks that then all-reduces exactly; rank 1 an EvictedError once continued.

The ranks are started by ``pycoll run``; each prints one JSON line, which this script reads back and
tabulates.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_SCRIPT = r'''
import json, os, random, signal, sys, time
import numpy as np
import pycoll
from pycoll import _C

mode, hold, how, stop_s = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
comm = pycoll.init()
rank, world = comm.rank, comm.world_size
out = {"rank": rank}

def exact(c, n):
    x = np.full(n, c.rank + 1.0, dtype=np.float32)
    pycoll.allreduce(x, comm=c)
    return bool(np.all(x == c.world_size * (c.world_size + 1) / 2))

if mode == "busy":
    ok = [exact(comm, 1000)]
    if rank == 1:
        t = time.monotonic()
        if how == "native":
            _C.testing.hold_gil(hold)
        else:
            values = [random.random() for _ in range(int(hold * 1.2e6))]  # ~hold seconds to sort on this VM
            t = time.monotonic()
            values.sort()
        out["held_s"] = time.monotonic() - t
    t = time.monotonic()
    ok.append(exact(comm, 1 << 16))
    out["waited_s"] = time.monotonic() - t
    ok += [exact(comm, 1 << 20), exact(comm, 1000)]
    out.update(ok=ok, dead=sorted(comm.plane.dead), evicted=comm.plane.evicted)
else:
    ok = [exact(comm, 1000)]
    if rank == 0:
        with open(os.environ["LIVENESS_PID_FILE"], "w") as f:
            f.write(str(comm.plane.members[1]["pid"]))
    time.sleep(0.5)
    try:
        ok.append(exact(comm, 1 << 16))
        out["first"] = "ok"
    except pycoll.PycollError as exc:
        out["first"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        out["first_rank"] = getattr(exc, "rank", None)
    out["first_at"] = time.time()
    if rank != 1:
        new = comm.shrink()
        out["shrunk_at"] = time.time()
        out["shrunk_world"] = new.world_size
        ok.append(exact(new, 1 << 20))
    else:
        try:
            exact(comm, 1000)
            out["after_continue"] = "ok"
        except pycoll.PycollError as exc:
            out["after_continue"] = type(exc).__name__
    out["ok"] = ok
# one write: the ranks share the launcher's pipe, unbuffered
sys.stdout.write("RESULT " + json.dumps(out) + "\n")
sys.stdout.flush()
'''


def run(mode: str, ranks: int, transport: str, hold: float, how: str, stop_s: float) -> list[dict]:
    env = dict(os.environ)
    env.pop("PYCOLL_HEARTBEAT_TIMEOUT", None)
    if transport == "tcp":
        env["PYCOLL_TRANSPORT"] = "tcp"
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK_SCRIPT)
        pid_file = Path(tmp) / "pid"
        env["LIVENESS_PID_FILE"] = str(pid_file)
        cmd = [sys.executable, "-m", "pycoll.run", "-n", str(ranks)]
        if mode == "stop":
            cmd.append("--elastic")  # the stopped rank's error must not stop the others
        cmd += [str(script), mode, str(hold), how, str(stop_s)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stopped_at = None
        if mode == "stop":
            deadline = time.monotonic() + 60
            while not pid_file.exists() or not pid_file.read_text():
                if time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError("rank 0 never wrote rank 1's pid")
                time.sleep(0.05)
            time.sleep(0.2)  # the others are in their all-reduce
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGSTOP)
            stopped_at = time.time()
            time.sleep(stop_s)
            os.kill(pid, signal.SIGCONT)
        text, _ = proc.communicate(timeout=600)
    results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    if len(results) != ranks:
        print(text[-3000:])
    for res in results:
        for key in ("first_at", "shrunk_at"):
            if key in res and stopped_at is not None:
                res[key] = round(res[key] - stopped_at, 2)
    return sorted(results, key=lambda r: r["rank"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hold", type=float, nargs="+", default=[10.0, 60.0], help="seconds rank 1 is busy")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--transports", default="shm,tcp")
    parser.add_argument("--how", default="native", choices=["native", "sort"])
    parser.add_argument("--stop", type=float, default=12.0, help="seconds rank 1 is stopped (0: none)")
    args = parser.parse_args()
    print("| part | transport | ranks | rank 1 busy | results exact | dead / evicted | others waited |")
    print("|---|---|---:|---:|---|---|---:|")
    for hold in args.hold:
        for transport in args.transports.split(","):
            for ranks in args.ranks:
                res = run("busy", ranks, transport, hold, args.how, 0.0)
                exact = len(res) == ranks and all(all(r["ok"]) for r in res)
                bad = [(r["rank"], r["dead"], r["evicted"]) for r in res if r["dead"] or r["evicted"]]
                waited = max((r["waited_s"] for r in res if r["rank"] != 1), default=float("nan"))
                held = next((r.get("held_s") for r in res if r["rank"] == 1), float("nan"))
                verdict = "yes" if exact else "NO"
                print(f"| busy ({args.how}) | {transport} | {ranks} | {held:.1f} s | {verdict} "
                      f"| {bad or 'none'} | {waited:.1f} s |", flush=True)
    if args.stop > 0:
        for transport in args.transports.split(","):
            res = run("stop", 4, transport, 0.0, args.how, args.stop)
            print(f"\nstop, {transport}, rank 1 of 4 stopped for {args.stop:g} s (times after SIGSTOP):")
            for r in res:
                print("  " + json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
