"""Where the whole machine's CPU time went while a benchmark ran: idle, the socket calls (the kernel's
TCP stack), poll, sleeping and waking, yielding, user-space copies, the rest.

    sudo python bench/cpu_split.py -- python bench/netns_bench.py --hosts 2 --rate none --sizes 64 \\
        --algorithms auto --codecs none --no-gloo -n 200        # the whole run
    python bench/cpu_split.py --delay 15 --seconds 8 -- COMMAND   # 8 s of it, 15 s in (past set-up)

``perf record -a -g`` samples every CPU (every process, the kernel's network stack and idle time
included) while COMMAND runs, or for ``--seconds`` after ``--delay``; the table gives each bucket's
share of all samples, with the kernel's call graph deciding what a sample belongs to (a sample inside
``sendto()`` counts as send, whatever the kernel did there). Buckets do not nest, except that user
copies are counted where the copy itself runs (self time of libc's memmove/memcpy).

How to read it (what found the causes named in docs/performance.md):
- idle high while the run is short of its rate: every thread was asleep at once, waiting for a
  wake-up (a hand-over between threads, a timer), not for the CPU: fewer hand-overs per byte help
  (larger fragments) more than faster copies;
- sched_yield large on an oversubscribed machine: waiting ranks give their core to each other instead
  of to the threads that move the data;
- send/recv dominate: the kernel's TCP stack is the bound; on veth a send also runs the receiver's
  side of the stack (softirq), so both ends' work lands in the sender's system calls.

Needs ``perf`` and permission to sample every CPU (root, or kernel.perf_event_paranoid <= 0).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

#: (bucket, kernel symbols whose inclusive share is the bucket's): system calls' entry points (x86-64
#: names) and the idle loop, which do not nest within each other.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle (every thread asleep)", ("do_idle",)),
    ("send / sendmsg (TCP stack)", ("__x64_sys_sendto", "__x64_sys_sendmsg")),
    ("recv / recvmsg (TCP stack)", ("__x64_sys_recvfrom", "__x64_sys_recvmsg")),
    ("poll / epoll", ("__x64_sys_poll", "__x64_sys_ppoll", "__x64_sys_epoll_wait", "__x64_sys_epoll_pwait")),
    ("futex (sleep and wake-up)", ("__x64_sys_futex",)),
    ("sched_yield", ("__x64_sys_sched_yield",)),
    ("write (eventfd wake-ups)", ("ksys_write",)),
    ("page faults", ("asm_exc_page_fault",)),
)
#: Self time of these (prefixes) is the user-space copies bucket.
COPY_PREFIXES = ("__memmove_", "__memcpy_", "__memcpy", "memcpy", "memmove")
_ROW = re.compile(r"^\s*([\d.]+)%\s+([\d.]+)%\s+\[[.k]\]\s+(\S+)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay", type=float, default=0.0, help="seconds after the start before sampling (0)")
    p.add_argument("--seconds", type=float, default=None, help="sample this long (default: the whole run)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the shares as one JSON line")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def shares(report_text: str) -> dict[str, float]:
    """{bucket: percent of all samples} from ``perf report --children --sort sym -g none --stdio``."""
    children: dict[str, float] = {}
    copies = 0.0
    for line in report_text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        total, own, symbol = float(m.group(1)), float(m.group(2)), m.group(3)
        children[symbol] = max(children.get(symbol, 0.0), total)
        if symbol.startswith(COPY_PREFIXES):
            copies += own
    out = {name: sum(children.get(s, 0.0) for s in symbols) for name, symbols in BUCKETS}
    out["user-space copies (memmove/memcpy)"] = copies
    out["the rest (reductions, Python, other kernel work)"] = max(0.0, 100.0 - sum(out.values()))
    return out


def _record(command: Sequence[str], delay: float, seconds: float | None, data: str) -> int:
    """Runs ``command`` under (or beside) ``perf record -a -g``; the command's exit status."""
    if seconds is None and delay == 0:
        return subprocess.run(["perf", "record", "-a", "-g", "-q", "-o", data, "--", *command]).returncode
    proc = subprocess.Popen(command)
    try:
        time.sleep(delay)
        window = seconds if seconds is not None else 3600.0
        perf = subprocess.Popen(["perf", "record", "-a", "-g", "-q", "-o", data, "--", "sleep", str(window)])
        if seconds is None:
            proc.wait()
            perf.send_signal(2)  # SIGINT: perf writes what it has
        perf.wait()
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("cpu_split: give the command to run after --", file=sys.stderr)
        return 2
    if shutil.which("perf") is None:
        print("cpu_split: `perf` is not installed (linux-perf / linux-tools)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pycoll-cpu-split-") as tmp:
        data = str(Path(tmp) / "perf.data")
        code = _record(command, args.delay, args.seconds, data)
        if not Path(data).exists():
            print(
                "cpu_split: perf recorded nothing (permission? see kernel.perf_event_paranoid)",
                file=sys.stderr,
            )
            return 1
        report = subprocess.run(
            ["perf", "report", "-i", data, "--children", "--sort", "sym", "-g", "none", "--stdio"],
            capture_output=True,
            text=True,
        ).stdout
    split = shares(report)
    window = "the whole run" if args.seconds is None else f"{args.seconds:g} s from {args.delay:g} s in"
    print(f"# where every CPU's time went ({window}; command exit status {code}), % of all samples")
    for name, pct in split.items():
        print(f"  {name:<50} {pct:6.1f}%")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"command": command, "window": window, "shares": split}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
