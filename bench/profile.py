"""Where an all-reduce's time goes, per call: the Python layer, waiting for peers, work, and system calls.

    python bench/profile.py                                   # 4 ranks, shared memory, 4 KiB 1 MiB 64 MiB
    python bench/profile.py --ranks 2 --sizes 4K,64K --algorithms direct,ring
    python bench/profile.py --transport tcp --syscalls        # TCP loopback; strace counts rank 0's calls
    python bench/profile.py --json profile.jsonl
    python bench/profile.py --sizes 64M --algorithms direct,direct/unfused --rounds 5   # A/B, interleaved
    pycoll run -n 4 bench/profile.py                          # the same, launched by hand

Every rank (``--ranks``, started with ``pycoll run``; ``--transport`` sets PYCOLL_TRANSPORT) runs, size by
size (``--sizes``, float32 sum, in place) and algorithm by algorithm (``--algorithms``), a few untimed
all-reduces, a barrier, and ``--iters`` timed ``pycoll.allreduce`` calls (default: about ``--burst-ms``
of them); ``--rounds`` repeats the algorithms in turn, size by size, so that what is compared runs
interleaved. An algorithm written ``NAME/unfused`` runs NAME with the executor's chains switched off
(``NativeCommunicator.fuse``, csrc/engine/plan_fusion.h): each receive-reduce on its own. Around the timed
calls it reads:

- the wall time per call (``call``),
- the native executor's own account (``NativeCommunicator.wait_stats``, engine/waiter.h): the time inside
  the native collective (``native``), of which waiting for peers (``wait``: from a pass over the plan
  that moved nothing to the next that moved something, spinning, yielding or asleep) and the rest, work
  (``work``: copies, reductions, the transport's own calls); the yields and sleeps (futex or
  condition-variable waits) of those waits;
- ``api`` = call - native: what the Python layer costs (validation, plan lookup, the binding);
- the process's context switches (getrusage: voluntary, involuntary), every thread included (TCP's I/O
  thread too);
- with ``--syscalls``, rank 0 runs ``strace -c -f`` on itself for the timed calls (every thread), and the
  table gives its system calls per all-reduce, the most frequent first. strace slows every call down:
  its counts are right, its times are not (the other columns come from the run without it).

The table has one line per size and algorithm: ``call`` is the slowest rank's (the median over rounds),
the other columns the mean over ranks and rounds. Read it as: api large -> the call path; wait large with
work small -> the ranks wait for each other (scheduling, wake-ups, a slow link); work close to native ->
copies and reductions, compare with the memory bandwidth (bench/compare.py prints it) or the link's rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))

from pycoll.bench import jobs, options, report  # noqa: E402

DEFAULT_SIZES = "4K,1M,64M"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4, help="ranks (4)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"sizes, a comma list ({DEFAULT_SIZES})")
    p.add_argument("--algorithms", default="auto", help="all-reduce algorithms, a comma list (auto)")
    p.add_argument("--transport", choices=("auto", "shm", "tcp"), default="auto", help="PYCOLL_TRANSPORT")
    p.add_argument("--iters", type=int, default=None, help="timed calls per size (about --burst-ms of them)")
    p.add_argument("--burst-ms", type=float, default=300.0, help="time of the timed calls per size (300)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the algorithms in turn, per size (1)")
    p.add_argument("--syscalls", action="store_true", help="count rank 0's system calls with strace")
    p.add_argument("--json", default=None, metavar="FILE", help="also write one JSON line per row")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds the whole job may take (600)")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)  # rank side: where to write results
    return p


# ---- rank side (under ``pycoll run``) ------------------------------------------------------------------
def _strace_start(pid: int, path: str) -> subprocess.Popen[bytes] | None:
    try:
        proc = subprocess.Popen(
            ["strace", "-c", "-f", "-p", str(pid), "-o", path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return None
    time.sleep(0.5)  # strace attaches to every thread
    return proc


def _strace_stop(proc: subprocess.Popen[bytes] | None, path: str) -> dict[str, int]:
    """{syscall: calls} from strace -c's summary."""
    if proc is None:
        return {}
    proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    counts: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m and m.group(2) != "total":
                counts[m.group(2)] = int(m.group(1))
    return counts


def _measure(comm: Any, x: Any, algorithm: str, iters: int, syscalls: bool) -> dict[str, Any]:
    import pycoll

    native = comm.native()
    trace = None
    path = ""
    if syscalls and comm.rank == 0:
        fd, path = tempfile.mkstemp(prefix="pycoll-strace-")
        os.close(fd)
        trace = _strace_start(os.getpid(), path)
    pycoll.barrier(comm=comm)
    before, usage = native.wait_stats(), resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(iters):
        pycoll.allreduce(x, algorithm=algorithm, comm=comm)
    seconds = time.perf_counter() - t0
    after, usage2 = native.wait_stats(), resource.getrusage(resource.RUSAGE_SELF)
    counts = _strace_stop(trace, path) if trace is not None or path else {}
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
    d = {k: after[k] - before[k] for k in after}
    n = max(1, d["collectives"])
    return {
        "call_us": seconds / iters * 1e6,
        "native_us": d["run_ns"] / n / 1e3,
        "wait_us": d["wait_ns"] / n / 1e3,
        "waits": d["waits"] / n,
        "yields": d["yields"] / n,
        "sleeps": d["sleeps"] / n,
        "vcsw": (usage2.ru_nvcsw - usage.ru_nvcsw) / iters,
        "ivcsw": (usage2.ru_nivcsw - usage.ru_nivcsw) / iters,
        "syscalls": {k: v / iters for k, v in counts.items()},
    }


def _worker(args: argparse.Namespace) -> int:
    import numpy as np

    import pycoll

    comm = pycoll.init(timeout=120)
    rows = []
    x = np.ones(0, dtype=np.float32)
    for nbytes, round_, variant in ((b, r, v) for b in args.size_list for r in range(args.rounds)
                                    for v in args.algorithm_list):
        if x.nbytes != nbytes // 4 * 4:
            x = np.ones(nbytes // 4, dtype=np.float32)
        algorithm, _, unfused = variant.partition("/")
        comm.native().fuse = unfused != "unfused"
        for _ in range(3):
            pycoll.allreduce(x, algorithm=algorithm, comm=comm)
        iters = args.iters
        if iters is None:  # about burst_ms of calls, the same number on every rank (rank 0's estimate)
            t0 = time.perf_counter()
            for _ in range(3):
                pycoll.allreduce(x, algorithm=algorithm, comm=comm)
            guess = np.array([max(3, int(args.burst_ms / 1e3 / ((time.perf_counter() - t0) / 3)))])
            pycoll.broadcast(guess, root=0, comm=comm)
            iters = int(min(guess[0], 100_000))
        row = _measure(comm, x, algorithm, iters, False)
        if args.syscalls:
            row["syscalls"] = _measure(comm, x, algorithm, max(3, iters // 10), True)["syscalls"]
        rows.append({"rank": comm.rank, "world": comm.world_size, "bytes": nbytes, "algorithm": variant,
                     "round": round_, "transport": comm.transport, "iters": iters, **row})
    Path(args.out, f"rank{comm.rank}.json").write_text(json.dumps(rows))
    pycoll.finalize()
    return 0


# ---- launcher side ---------------------------------------------------------------------------------------
def _table(rows: list[dict[str, Any]], syscalls: bool) -> list[str]:
    keys = sorted({(r["bytes"], r["algorithm"]) for r in rows}, key=lambda k: (k[0], k[1]))
    head = (f"# {'size':>9} {'algorithm':>12} {'call us':>10} {'api us':>9} {'native us':>10} {'wait us':>9} "
            f"{'wait %':>7} {'work us':>9} {'yields':>7} {'sleeps':>7} {'csw vol':>8} {'csw inv':>8}")
    lines = [head + ("  syscalls per call (rank 0)" if syscalls else "")]
    for nbytes, algorithm in keys:
        mine = [r for r in rows if (r["bytes"], r["algorithm"]) == (nbytes, algorithm)]

        def mean(k: str, m: list[dict[str, Any]] = mine) -> float:
            return statistics.fmean(r[k] for r in m)

        rounds = sorted({r.get("round", 0) for r in mine})
        call = statistics.median(max(r["call_us"] for r in mine if r.get("round", 0) == k) for k in rounds)
        native, wait = mean("native_us"), mean("wait_us")
        share = 100 * wait / native if native else 0.0
        api, work = mean("call_us") - native, native - wait
        line = (f"  {report.format_size(nbytes):>9} {algorithm:>12} {call:10.2f} "
                f"{api:9.2f} {native:10.2f} {wait:9.2f} {share:6.1f}% {work:9.2f} "
                f"{mean('yields'):7.2f} {mean('sleeps'):7.2f} {mean('vcsw'):8.2f} {mean('ivcsw'):8.2f}")
        if syscalls:
            calls = next((r["syscalls"] for r in mine if r["rank"] == 0), {})
            top = sorted(calls.items(), key=lambda kv: -kv[1])[:5]
            line += "  " + (", ".join(f"{k} {v:.1f}" for k, v in top) if top else "(strace not available)")
        lines.append(line)
    return lines


def _launch(argv: list[str], args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="pycoll-profile-") as out:
        cmd = jobs.script_command(args.ranks, str(HERE), [*argv, "--out", out])
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if args.transport != "auto":
            env["PYCOLL_TRANSPORT"] = args.transport
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=args.deadline)
        except subprocess.TimeoutExpired:
            print(f"profile: the ranks did not finish in {args.deadline:g} s; stopping them", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # `pycoll run` stops its ranks
            proc.wait(timeout=30)
            return 124
        if code != 0:
            return code
        rows = [row for f in sorted(Path(out).glob("rank*.json")) for row in json.loads(f.read_text())]
    transport = rows[0]["transport"] if rows else args.transport
    print(f"# pycoll all-reduce profile: {args.ranks} ranks, transport {transport}, float32 sum, in place; "
          f"call = slowest rank, other columns = mean over ranks, per call")
    print("\n".join(_table(rows, args.syscalls)))
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    args.size_list = [options.parse_size(s) for s in args.sizes.split(",") if s]
    args.algorithm_list = [a for a in args.algorithms.split(",") if a]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _resolve(_parser().parse_args(argv))
    if "RANK" not in os.environ:
        return _launch(argv, args)
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="pycoll-profile-")
        print(f"profile: results in {args.out}", file=sys.stderr)
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main())
