"""What a communicator costs as the world grows: init, the first call, idle CPU, fds and memory per rank,
pycoll beside Gloo in the same run (issue 51).

    python bench/scale.py                                   # 8, 16, 32, 64 ranks; shm, tcp and gloo
    python bench/scale.py --ranks 8,16,32,64,128 --rounds 2 --json scale.jsonl
    python bench/scale.py --ranks 16,64 --libs pycoll-shm,gloo --idle 5
    python bench/scale.py --before /venv-old/bin/python --libs pycoll-shm,before-shm,gloo

Every point starts ``--ranks`` fresh processes on this machine with the torchrun variables (RANK,
WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT, LOCAL_RANK...): rank 0 hosts the rendezvous store
(pycoll's own, or Gloo's TCPStore), as under torchrun. Each rank imports its library first (the modules
init runs: ``pycoll.api``, ``torch.distributed``) and says so; only when every rank has, this script sends
the phases' start signals through the ranks' standard input, so that no phase counts another process's
interpreter start-up or imports:

    init        go -> ``pycoll.init()`` (``PYCOLL_TRANSPORT`` shm or tcp) or
                ``dist.init_process_group("gloo")`` returned; the slowest rank's time from the signal
    first call  (every rank done with init) go -> its first 4 KiB float32 all-reduce returned, the
                slowest rank's; its result is checked (rank + 1 summed over the ranks, exactly)
    later call  the median of 20 more such all-reduces on rank 0 (after the first)
    idle CPU    the processes' CPU time (every thread) over ``--idle`` seconds of doing nothing after
                them, summed over the ranks: cores the job burns while the user computes
    fds         open file descriptors per rank, after the calls: the median rank's, and the most (rank 0's
                counts its store's connections to every rank)
    memory      resident (RSS) and proportional (PSS: shared pages divided among their users) memory per
                rank, mean, in MiB

Libraries (``--libs``): ``pycoll-shm``, ``pycoll-tcp`` (over loopback) and ``gloo`` (CPU torch: over
loopback TCP); ``before-shm`` and ``before-tcp`` are pycoll as another install of it has it (``--before``:
that install's interpreter), to compare two versions in the same run. Points run in rounds
(``--rounds``), every library at one size one after the other with the order rotated each round, sizes
from small to large; the table gives each figure's median over the rounds,
and the growth exponent of init between two sizes (``--exponent 16,64``: log(t64 / t16) / log(64 / 16)),
with the ratio pycoll / Gloo where both ran. A point that fails (a rank's error, or ``--deadline`` seconds
without an answer: its processes are killed) is shown as such with the first error line. On this machine
(2 vCPUs) 64 ranks are 32 processes per core: every figure is inflated, but alike for every library, so
the ratios and the shape of the curves are what to read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIBS = ("pycoll-shm", "pycoll-tcp", "gloo", "before-shm", "before-tcp")
ELEMENTS = 1024  # 4 KiB of float32
LATER_CALLS = 20


# ---- the rank ------------------------------------------------------------------------------------------
def _memory_mib() -> tuple[float, float]:
    rss = pss = 0.0
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
    return rss, pss


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def rank_main(lib: str, idle_s: float) -> int:
    """One rank: import, say so, and run each phase when this script's signal arrives on stdin."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import numpy as np

    if lib == "gloo":
        import torch
        import torch.distributed as dist
    else:
        import pycoll
        import pycoll.api  # noqa: F401 - what init runs (pycoll imports it at first use)
    out: dict[str, Any] = {"rank": rank}

    def phase() -> float:
        """Reports the previous phase's figures (or "ready"), then waits for the next signal: its time."""
        print(json.dumps(out), flush=True)
        out.clear()
        line = sys.stdin.readline()
        if not line:
            raise SystemExit(0)
        return float(line)

    go = phase()
    if lib == "gloo":
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method="env://")
    else:
        pycoll.init()
    out["init_s"] = time.time() - go
    go = phase()
    x = np.full(ELEMENTS, rank + 1, dtype=np.float32)
    if lib == "gloo":
        t = torch.from_numpy(x)
        dist.all_reduce(t)
    else:
        pycoll.allreduce(x)
    out["first_s"] = time.time() - go
    expected = world * (world + 1) / 2
    out["wrong"] = int(np.count_nonzero(x != expected))
    later = []
    for _ in range(LATER_CALLS):
        x[:] = rank + 1
        start = time.perf_counter()
        if lib == "gloo":
            dist.all_reduce(t)
        else:
            pycoll.allreduce(x)
        later.append(time.perf_counter() - start)
        out["wrong"] += int(np.count_nonzero(x != expected))
    out["later_s"] = statistics.median(later)
    phase()
    before = _cpu_s()
    time.sleep(idle_s)
    out["idle_cores"] = (_cpu_s() - before) / idle_s
    out["fds"] = len(os.listdir("/proc/self/fd"))
    out["rss_mib"], out["pss_mib"] = _memory_mib()
    phase()
    if lib == "gloo":
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)  # torch's gloo threads may abort the interpreter's teardown (pycoll/bench/worker.py)
    pycoll.finalize()
    return 0


# ---- the launcher --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Point:
    lib: str
    ranks: int
    ok: bool = True
    error: str = ""
    figures: dict[str, float] = field(default_factory=dict)


class Job:
    """The ranks of one point, their pipes, and the phases' answers."""

    def __init__(self, lib: str, ranks: int, idle_s: float, timeout_s: float, before: str | None) -> None:
        port = _free_port()
        base = dict(os.environ)
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ranks),
                    LOCAL_WORLD_SIZE=str(ranks), PYCOLL_TIMEOUT=str(timeout_s), OMP_NUM_THREADS="1")
        if lib != "gloo":
            base["PYCOLL_TRANSPORT"] = lib.split("-")[1]
        python = before if lib.startswith("before") and before else sys.executable
        self.procs = []
        for r in range(ranks):
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            cmd = [python, str(Path(__file__).resolve()), "--rank", lib, "--idle", str(idle_s)]
            self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True, start_new_session=True))
        self.sel = selectors.DefaultSelector()
        self.partial: dict[int, str] = {}
        self.errors: list[str] = []
        for r, p in enumerate(self.procs):
            assert p.stdout is not None and p.stderr is not None
            os.set_blocking(p.stdout.fileno(), False)
            os.set_blocking(p.stderr.fileno(), False)
            self.sel.register(p.stdout, selectors.EVENT_READ, (r, "out"))
            self.sel.register(p.stderr, selectors.EVENT_READ, (r, "err"))

    def collect(self, deadline: float) -> list[dict[str, Any]] | None:
        """One JSON line from every rank (None: a rank failed or the deadline passed)."""
        got: dict[int, dict[str, Any]] = {}
        while len(got) < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                silent = sorted(set(range(len(self.procs))) - set(got))
                self.errors.append(f"no answer from ranks {silent[:8]}")
                return None
            for key, _ in self.sel.select(min(left, 1.0)):
                r, kind = key.data
                chunk = key.fileobj.read()  # type: ignore[union-attr]
                if not chunk:
                    if kind == "out" and r not in got:
                        self.sel.unregister(key.fileobj)
                        code = self.procs[r].wait()
                        self.errors.append(f"rank {r} exited ({code}) early")
                        return None
                    with contextlib.suppress(KeyError, ValueError):
                        self.sel.unregister(key.fileobj)
                    continue
                if kind == "err":
                    for line in chunk.splitlines():
                        if line.strip() and ("Error" in line or "error" in line):
                            self.errors.append(f"rank {r}: {line.strip()}")
                    continue
                text = self.partial.get(r, "") + chunk
                *lines, self.partial[r] = text.split("\n")
                for line in lines:
                    if line.startswith("{"):
                        got[r] = json.loads(line)
            for r, p in enumerate(self.procs):
                if r not in got and p.poll() not in (None, 0):
                    self.errors.append(f"rank {r} exited ({p.returncode})")
                    return None
        return [got[r] for r in range(len(self.procs))]

    def signal_all(self) -> None:
        stamp = f"{time.time():.6f}\n"
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(stamp)
            p.stdin.flush()

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.close()
        end = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.sel.close()


def run_point(lib: str, ranks: int, idle_s: float, deadline_s: float, before: str | None) -> Point:
    point = Point(lib, ranks)
    job = Job(lib, ranks, idle_s, deadline_s, before)
    try:
        ready = job.collect(time.monotonic() + deadline_s + ranks)  # imports: seconds per rank here
        phases: list[list[dict[str, Any]]] = []
        for _ in range(3):  # init, calls, idle
            if ready is None:
                break
            job.signal_all()
            ready = job.collect(time.monotonic() + deadline_s + (idle_s if len(phases) == 2 else 0))
            if ready is not None:
                phases.append(ready)
        if len(phases) < 3:
            point.ok = False
            point.error = job.errors[0] if job.errors else "failed"
            return point
        job.signal_all()  # finalize
        init, calls, idle = phases
        point.figures = {
            "init_s": max(r["init_s"] for r in init),
            "first_s": max(r["first_s"] for r in calls),
            "later_s": calls[0]["later_s"],
            "wrong": sum(r["wrong"] for r in calls),
            "idle_cores": sum(r["idle_cores"] for r in idle),
            "fds": statistics.median(r["fds"] for r in idle),
            "fds_max": max(r["fds"] for r in idle),
            "rss_mib": statistics.mean(r["rss_mib"] for r in idle),
            "pss_mib": statistics.mean(r["pss_mib"] for r in idle),
        }
        if point.figures["wrong"]:
            point.ok, point.error = False, f"{point.figures['wrong']:.0f} wrong elements"
        return point
    finally:
        job.close()


def _median(points: list[Point], key: str) -> float | None:
    values = [p.figures[key] for p in points if p.ok]
    return statistics.median(values) if values else None


def table(results: dict[tuple[str, int], list[Point]], libs: list[str], sizes: list[int],
          exponent: tuple[int, int]) -> str:
    rows = ["| library | ranks | init (s) | first call (s) | later call (ms) | idle CPU (cores) "
            "| fds per rank (max) | RSS / PSS per rank (MiB) | failed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for lib in libs:
        for n in sizes:
            points = results.get((lib, n), [])
            ok = [p for p in points if p.ok]
            failed = [p for p in points if not p.ok]
            def f(key: str, fmt: str, scale: float = 1.0, points: list[Point] = points) -> str:
                v = _median(points, key)
                return "—" if v is None else format(v * scale, fmt)
            fail = f"{len(failed)}/{len(points)}: {failed[0].error[:80]}" if failed else ""
            rows.append(f"| {lib} | {n} | {f('init_s', '.2f')} | {f('first_s', '.3f')} | "
                        f"{f('later_s', '.2f', 1e3)} | {f('idle_cores', '.3f')} | {f('fds', '.0f')} "
                        f"({f('fds_max', '.0f')}) | "
                        f"{f('rss_mib', '.0f')} / {f('pss_mib', '.0f')} | {fail if ok or failed else ''} |")
    lo, hi = exponent
    lines = ["", f"init growth exponent {lo} -> {hi} ranks (log(t{hi} / t{lo}) / log({hi} / {lo})):"]
    for lib in libs:
        a, b = _median(results.get((lib, lo), []), "init_s"), _median(results.get((lib, hi), []), "init_s")
        text = "—" if a is None or b is None else f"{math.log(b / a) / math.log(hi / lo):.2f}"
        lines.append(f"  {lib}: {text}")
    if "gloo" in libs:
        lines.append("")
        lines.append("pycoll / gloo, same run (medians): init | first call")
        for lib in libs:
            if lib == "gloo":
                continue
            for n in sizes:
                parts = []
                for key in ("init_s", "first_s"):
                    a, b = _median(results.get((lib, n), []), key), _median(results.get(("gloo", n), []), key)
                    parts.append("—" if a is None or b is None else f"{a / b:.2f}")
                lines.append(f"  {lib} at {n}: {' | '.join(parts)}")
    return "\n".join(rows + lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", default="8,16,32,64", help="world sizes, comma-separated")
    parser.add_argument("--libs", default=",".join(LIBS), help=f"of {', '.join(LIBS)}")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (the order of libraries rotated)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds a phase may take")
    parser.add_argument("--exponent", default="16,64", help="two sizes for init's growth exponent")
    parser.add_argument("--json", help="append one JSON line per point here")
    parser.add_argument("--before", metavar="PYTHON", help="another pycoll install's interpreter (before-*)")
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        return rank_main(args.rank, args.idle)
    sizes = [int(s) for s in args.ranks.split(",")]
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    for lib in libs:
        if lib not in LIBS:
            parser.error(f"unknown library {lib!r} (of {', '.join(LIBS)})")
        if lib.startswith("before") and not args.before:
            parser.error(f"{lib} needs --before PYTHON")
    lo, hi = (int(s) for s in args.exponent.split(","))
    results: dict[tuple[str, int], list[Point]] = {}
    for rnd in range(args.rounds):
        for n in sizes:
            order = libs[rnd % len(libs):] + libs[: rnd % len(libs)]
            for lib in order:
                point = run_point(lib, n, args.idle, args.deadline, args.before)
                results.setdefault((lib, n), []).append(point)
                shown = {k: round(v, 4) for k, v in point.figures.items()}
                print(f"# round {rnd + 1} {lib} {n} ranks: {'ok' if point.ok else 'FAILED ' + point.error} "
                      f"{shown}", flush=True)
                if args.json:
                    with open(args.json, "a", encoding="utf-8") as f:
                        f.write(json.dumps({"lib": lib, "ranks": n, "round": rnd, "ok": point.ok,
                                            "error": point.error, **point.figures}) + "\n")
    print(table(results, libs, sizes, (lo, hi)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
