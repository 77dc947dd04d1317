"""What recording skew (issue 19, pycoll/skew/) costs per collective: the same all-reduces with it on and off.

    python bench/skew_overhead.py                      # 4 ranks, shared memory, 4 KiB and 1 MiB, 21 rounds
    python bench/skew_overhead.py --ranks 2 --rounds 15
    python bench/skew_overhead.py --transport tcp      # over TCP loopback
    python bench/skew_overhead.py --sizes 4K,64K,1M --json out.jsonl
    python bench/skew_overhead.py --quick              # smoke run: 3 rounds, short bursts (seconds)
    python bench/skew_overhead.py --example            # a scripted straggler and the report it gives
    python bench/skew_overhead.py --feature trace      # the flight recorder (issue 53) instead of skew
    pycoll run -n 4 bench/skew_overhead.py             # the same, launched by hand

Overhead. Every rank process (``--ranks``, started with ``pycoll run``) forms a communicator
(``Communicator(store, rank, world, settings=...)`` with the environment's settings, ``--transport`` and
a collective deadline of ``--timeout`` seconds, on the store of a first communicator -- ``pycoll.init``,
no fault plane -- which serves only for set-up and for collecting the times) and switches its
recording off and on between bursts (``NativeCommunicator.skew_set_recording``, on every rank before the
burst's warm-up). ``--two-comms`` compares two communicators instead, one made with ``skew=False`` (what
PYCOLL_SKEW=0 gives): two communicators' rings and buffers can differ in speed by more than what is
measured (the A/A control shows it). Then, for ``--rounds`` rounds, size by size (``--sizes``,
float32 sum all-reduces, in place, of zeros), each communicator in turn -- off then on in even rounds, on
then off in odd ones -- runs a few untimed all-reduces, a barrier, and a *burst* of M timed all-reduces.
M is chosen once per size (``--burst-ms`` of all-reduces, from a calibration on the communicator without
recording; ``--iters`` fixes it). A burst's time is the slowest rank's (each rank times its own burst;
the bursts start together, after the barrier), and its per-collective time the burst time / M. Rounds
interleave the two communicators so that both see the same drifts of a shared, noisy machine; only
figures from the same round are compared. The table gives per size the median over rounds of the
per-collective time without (``off_us``) and with (``on_us``) recording, the median over rounds of the
per-round difference (``diff_us``, on - off) and ratio (``ratio``, on / off), the range of the per-round
ratios, a distribution-free 95% confidence interval of the median difference (order statistics; how far
the median is to be trusted), and issue 19's target: <= 1% of the time of a 1 MiB all-reduce, <= 0.2 us
per collective at 4 KiB -- "met" / "MISSED" when the whole interval lies on one side of it, "unresolved"
when the machine's noise is larger than the target (more rounds narrow the interval as 1 / sqrt(rounds);
with more ranks than cores the ranks' scheduling makes bursts differ by tens of percent). ``--json``
keeps every round's figures.

``--feature trace``: the same comparison for the flight recorder (pycoll/flight/, issue 53), switched off
and on between bursts (``_C.trace_set_on``; skew recording stays as the environment sets it on both), against
issue 53's target: <= 1% of the all-reduce's time at every size.

Example (``--example``): 4 ranks (``--ranks``) on one communicator with recording on run 400 all-reduces
of 1 MiB; rank 2 sleeps 5 ms before every 4th, rank 1 sleeps 1 ms before every 10th. Rank 0 prints
``str(comm.skew())`` and the JSON of ``comm.skew().to_dict()["ranks"]``. ``--aa`` (A/A control): the
overhead run with neither communicator recording, to show what the method reads as overhead where there
is none.

Every run has a deadline: each collective ``--timeout`` seconds, the whole launcher ``--deadline`` seconds
(then its ranks are stopped, SIGTERM then SIGKILL, and the exit status is 124). Shared memory is anonymous
memfd segments (nothing in /dev/shm); the script checks that /dev/shm holds no new entry afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pycoll.bench import jobs
from pycoll.bench.options import parse_size
from pycoll.bench.report import format_size

HERE = Path(__file__).resolve()
#: Issue 19's targets: recording's cost, as a share of a 1 MiB all-reduce and in us at 4 KiB.
TARGET_SHARE = {1 << 20: 0.01}
TARGET_US = {4 << 10: 0.2}
#: Issue 53's target for the flight recorder: its cost as a share of the all-reduce's time.
TRACE_SHARE = 0.01
#: Untimed all-reduces before each burst (a share of M, at least MIN_WARMUP); the first round: more.
WARMUP_SHARE = 0.05
MIN_WARMUP = 3
#: Bounds of the burst length M.
MIN_ITERS, MAX_ITERS = 5, 50_000


# =========================================================================================================
# Rank side (under ``pycoll run``)


def _sizes(text: str) -> list[int]:
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    for s in sizes:
        if s % 4:
            raise argparse.ArgumentTypeError(f"size {s} is not a whole number of float32 elements")
    return sizes


def _allreduce_max(comm: Any, values: Any) -> Any:
    import numpy as np

    import pycoll

    a = np.ascontiguousarray(values, dtype=np.float64)
    pycoll.allreduce(a, "max", comm=comm)
    return a


def _burst(comm: Any, x: Any, iters: int, warmup: int) -> float:
    import pycoll

    for _ in range(warmup):
        pycoll.allreduce(x, comm=comm)
    pycoll.barrier(comm=comm)
    t0 = time.perf_counter()
    for _ in range(iters):
        pycoll.allreduce(x, comm=comm)
    return time.perf_counter() - t0


def _settings(base: Any, args: argparse.Namespace, skew: bool) -> Any:
    transport = {"shm": "shm", "tcp": "tcp"}[args.transport]
    return dataclasses.replace(base, transport=transport, skew=skew)


def _make(base_comm: Any, settings: Any, timeout: float) -> Any:
    from pycoll.comm import Communicator

    return Communicator(
        base_comm.store, base_comm.rank, base_comm.world_size, timeout=timeout, settings=settings
    )


def _choose_iters(comm: Any, x: Any, args: argparse.Namespace) -> int:
    """M for one size: ``--iters``, else enough all-reduces for ``--burst-ms`` (slowest rank's estimate)."""
    if args.iters:
        return int(args.iters)
    probe = 5 if x.nbytes >= 256 << 10 else 50
    best = float("inf")
    for attempt in range(4):  # the first bursts are slow (first touch, caches): keep the fastest estimate
        t = float(_allreduce_max(comm, [_burst(comm, x, probe, 2) / probe])[0])
        best = min(best, t)
        if attempt >= 1 and t * probe >= 0.02:  # long enough to be timed
            break
        probe = min(MAX_ITERS, max(probe, int(0.02 / max(best, 1e-7))))
    return int(min(MAX_ITERS, max(MIN_ITERS, round(args.burst_ms * 1e-3 / best))))


def _worker_overhead(args: argparse.Namespace) -> int:
    import numpy as np

    import pycoll
    from pycoll import _C

    base = pycoll.init(timeout=args.timeout, fault_tolerance=False)
    rank, world = base.rank, base.world_size
    if args.two_comms:
        comms = {
            "off": _make(base, _settings(base.settings, args, False), args.timeout),
            "on": _make(base, _settings(base.settings, args, not args.aa), args.timeout),
        }
    else:  # one communicator, recording switched off and on between bursts (the same rings, the same pages)
        one = _make(base, _settings(base.settings, args, True), args.timeout)
        comms = {"off": one, "on": one}
    sizes = args.sizes
    bufs = [np.zeros(s // 4, np.float32) for s in sizes]
    iters = [_choose_iters(comms["off"], x, args) for x in bufs]
    if rank == 0:
        c = comms["on"]
        aa = " -- A/A CONTROL: neither communicator records, 'on' is a second 'off'" if args.aa else ""
        print(
            f"# skew overhead{aa}: {world} ranks on one host, transport {c.transport}, {os.cpu_count()} CPUs "
            f"(spin/yield by pycoll's wait policy), float32 sum all-reduce in place; "
            f"{args.rounds} rounds, off/on interleaved (order swapped every round)",
            flush=True,
        )
        print("# bursts: " + ", ".join(f"{format_size(s)} x {m}" for s, m in zip(sizes, iters)), flush=True)
    # t[round][size][0: off, 1: on] = this rank's burst time, s
    t = np.zeros((args.rounds, len(sizes), 2), np.float64)
    start = time.monotonic()
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for k, (x, m) in enumerate(zip(bufs, iters)):
            warm = max(MIN_WARMUP, int(m * WARMUP_SHARE)) * (3 if r == 0 else 1)
            for name in order:
                if args.feature == "trace":
                    _C.trace_set_on(name == "on" and not args.aa)
                elif not args.two_comms:
                    comms[name].native().skew_set_recording(name == "on" and not args.aa)
                t[r, k, 0 if name == "off" else 1] = _burst(comms[name], x, m, warm)
        if rank == 0 and args.progress:
            print(f"#   round {r + 1}/{args.rounds} done, {time.monotonic() - start:.1f} s", flush=True)
    slowest = _allreduce_max(base, t.reshape(-1)).reshape(t.shape)
    # Every rank recorded on the "on" communicator: its report says what it saw (and that it worked).
    _C.trace_set_on(True)
    if not args.two_comms:
        comms["on"].native().skew_set_recording(True)
    rep = comms["on"].skew()
    recorded = rep.run.collectives
    expected = 0 if args.aa else args.rounds * sum(iters)
    for c in set(comms.values()):
        c.finalize()
    if rank == 0:
        rows = [_row(s, m, slowest[:, k, :] / m, args.feature) for k, (s, m) in enumerate(zip(sizes, iters))]
        print(_table(rows), flush=True)
        print(
            f"# the recording communicator's report covers {recorded} collectives "
            f"(expected >= {expected}); unmatched {rep.unmatched}",
            flush=True,
        )
        if args.json:
            with open(args.json, "a", encoding="utf-8") as f:
                for row in rows:
                    f.write(
                        json.dumps({"world": world, "transport": comms["on"].transport, "aa": args.aa, **row})
                        + "\n"
                    )
    pycoll.finalize(base)
    return 0


def _row(size: int, iters: int, per: Any, feature: str = "skew") -> dict[str, Any]:
    """Per round per-collective times (s) [round][0: off, 1: on] -> the table's figures (us)."""
    off = [float(v) * 1e6 for v in per[:, 0]]
    on = [float(v) * 1e6 for v in per[:, 1]]
    diffs = [b - a for a, b in zip(off, on)]
    ratios = [b / a for a, b in zip(off, on)]
    q = statistics.quantiles(diffs, n=4) if len(diffs) >= 2 else [diffs[0]] * 3
    lo, hi = _median_ci(diffs)
    off_med = statistics.median(off)
    diff_med = statistics.median(diffs)
    target = None
    if feature == "trace":
        target = TRACE_SHARE * off_med
    elif size in TARGET_US:
        target = TARGET_US[size]
    elif size in TARGET_SHARE:
        target = TARGET_SHARE[size] * off_med
    return {
        "bytes": size, "iters": iters, "rounds": len(off), "off_us": off_med, "on_us": statistics.median(on),
        "diff_us": diff_med, "ratio": statistics.median(ratios), "ratio_min": min(ratios),
        "ratio_max": max(ratios), "diff_q1_us": q[0], "diff_q3_us": q[2], "diff_ci_lo_us": lo,
        "diff_ci_hi_us": hi, "target_us": target, "off_rounds_us": off, "on_rounds_us": on,
    }  # fmt: skip


def _median_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free ~95% confidence interval of the median: the order statistics n/2 -+ z sqrt(n)/2
    (the whole range below 6 values)."""
    v = sorted(values)
    n = len(v)
    if n < 6:
        return v[0], v[-1]
    half = z * math.sqrt(n) / 2
    return v[max(0, math.floor(n / 2 - half))], v[min(n - 1, math.ceil(n / 2 + half) - 1)]


def _verdict(row: dict[str, Any]) -> str:
    """Against the target: met / missed when the whole confidence interval of the median difference is
    on one side of it, else unresolved (the noise of this machine is larger than the target)."""
    target = row["target_us"]
    if target is None:
        return "-"
    if row["diff_ci_hi_us"] <= target:
        return f"met (<= {target:.2f})"
    if row["diff_ci_lo_us"] > target:
        return f"MISSED (> {target:.2f})"
    side = "<=" if row["diff_us"] <= target else ">"
    return f"unresolved (median {side} {target:.2f}, CI across)"


def _table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        f"# {'size':>8} {'iters':>6} {'off_us':>10} {'on_us':>10} {'diff_us':>9} {'ratio':>7} "
        f"{'ratio_spread(min..max)':>23} {'diff_CI95_us':>17} {'rounds':>6}  target(diff_us)"
    )
    lines = [head]
    for r in rows:
        spread = f"{r['ratio_min']:.4f}..{r['ratio_max']:.4f}"
        ci = f"{r['diff_ci_lo_us']:+.2f}..{r['diff_ci_hi_us']:+.2f}"
        lines.append(
            f"  {format_size(r['bytes']):>8} {r['iters']:>6} {r['off_us']:>10.2f} {r['on_us']:>10.2f} "
            f"{r['diff_us']:>+9.3f} {r['ratio']:>7.4f} {spread:>23} {ci:>17} {r['rounds']:>6}  {_verdict(r)}"
        )
    return "\n".join(lines)


def _worker_example(args: argparse.Namespace) -> int:
    import numpy as np

    import pycoll

    base = pycoll.init(timeout=args.timeout, fault_tolerance=False)
    rank = base.rank
    comm = _make(base, _settings(base.settings, args, True), args.timeout)
    x = np.zeros((1 << 20) // 4, np.float32)
    for i in range(args.example_iters):
        if rank == 2 and i % 4 == 0:
            time.sleep(0.005)
        if rank == 1 and i % 10 == 0:
            time.sleep(0.001)
        pycoll.allreduce(x, comm=comm)
    rep = comm.skew()
    if rank == 0:
        print(
            f"# scripted straggler: {comm.world_size} ranks, transport {comm.transport}, "
            f"{args.example_iters} all-reduces of 1 MiB; rank 2 sleeps 5 ms before every 4th, "
            f"rank 1 1 ms before every 10th",
            flush=True,
        )
        print(str(rep), flush=True)
        print("# to_dict()['ranks']:", flush=True)
        print(json.dumps(rep.to_dict()["ranks"], indent=1), flush=True)
    comm.finalize()
    pycoll.finalize(base)
    return 0


# =========================================================================================================
# Launcher side


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ap.add_argument("--ranks", type=int, default=4, help="ranks to start (without a launcher; 4)")
    ap.add_argument(
        "--transport", choices=("shm", "tcp"), default="shm", help="shm (default) or tcp loopback"
    )
    ap.add_argument("--sizes", type=_sizes, default=None, help="all-reduce sizes, bytes (4K,1M)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (21; --quick: 3)")
    ap.add_argument("--burst-ms", type=float, default=None, help="length of a burst, ms (100; --quick: 10)")
    ap.add_argument(
        "--iters", type=int, default=0, help="all-reduces per burst at every size (0: --burst-ms)"
    )
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="deadline of set-up and each collective, s (60)"
    )
    ap.add_argument(
        "--deadline", type=float, default=None, help="deadline of the whole run, s (900; --quick 120)"
    )
    ap.add_argument("--json", default=None, metavar="FILE", help="append the rows as JSON lines (rank 0)")
    ap.add_argument("--progress", action="store_true", help="a line per round")
    ap.add_argument(
        "--aa",
        action="store_true",
        help="A/A control: the 'on' bursts record nothing either (what the method reads as overhead "
        "where there is none)",
    )
    ap.add_argument(
        "--two-comms",
        action="store_true",
        help="compare two communicators (one made with skew=False) instead of switching recording off and "
        "on between bursts of one; a pair of communicators can differ by more than the overhead",
    )
    ap.add_argument(
        "--feature", choices=("skew", "trace"), default="skew",
        help="what is switched off and on: skew recording (default) or the flight recorder",
    )  # fmt: skip
    ap.add_argument("--example", action="store_true", help="the scripted straggler's report instead")
    ap.add_argument("--example-iters", type=int, default=400, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 rounds of 10 ms bursts")
    return ap


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    if args.sizes is None:
        args.sizes = [4 << 10, 1 << 20]
    if args.rounds is None:
        args.rounds = 3 if args.quick else 21
    if args.burst_ms is None:
        args.burst_ms = 10.0 if args.quick else 100.0
    if args.deadline is None:
        args.deadline = 120.0 if args.quick else 900.0
    if args.quick and args.example:
        args.example_iters = min(args.example_iters, 40)
    return args


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _launch(argv: list[str], args: argparse.Namespace) -> int:
    """Not under a launcher: ``pycoll run -n ranks`` of this script, with a deadline."""
    ranks = args.ranks
    if args.example and ranks < 3:
        print("skew_overhead: --example needs >= 3 ranks (rank 2 is the straggler)", file=sys.stderr)
        return 2
    before = _shm_entries()
    cmd = jobs.script_command(ranks, str(HERE), argv)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=args.deadline)
    except subprocess.TimeoutExpired:
        print(
            f"skew_overhead: {ranks} ranks did not finish in {args.deadline:g} s; stopping them",
            file=sys.stderr,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # `pycoll run` stops its ranks (SIGTERM, then SIGKILL)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        code = 124
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
        return 130
    left = sorted(_shm_entries() - before)
    print(f"# {time.monotonic() - t0:.1f} s; new entries in /dev/shm: {', '.join(left) if left else 'none'}")
    if left and code == 0:
        code = 1
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _resolve(_parser().parse_args(argv))
    if "RANK" not in os.environ:
        return _launch(argv, args)
    return _worker_example(args) if args.example else _worker_overhead(args)


if __name__ == "__main__":
    sys.exit(main())
