"""What the reports of several ranks say (pycoll/flight/probe.py makes them): where each rank is relative to
one collective, its main thread's Python stack, and across the dumps of a whole job the first collective
at which the ranks diverged and who is missing.

A report's *records* are its flight recorder's (csrc/engine/flight_recorder.h), of every communicator of its
process; ``records_of`` keeps one communicator's, by its name (the fault plane's id and epoch).
A rank's *position* against collective #S of that communicator, as the error paragraph words it:

    waiting    its last collective is #S, the same call from the same line
    elsewhere  its #S is another call, or the same call from another line (a desync)
    behind     its last collective is before #S: inside it (stuck there), or done and the rank outside any
               collective (its stack says where)
    ahead      it completed #S, or entered a later one
    gone       no report: dead, left, or it did not answer
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

#: Frames of files under these path parts are pycoll's, torch's or the thread machinery's, not the user's
#: (skipped in a stack's summary). By path part, not by the recorder's registered directories
#: (recorder.internal_paths): a report may come from another host, where the packages live elsewhere.
_INTERNAL = (os.sep + "pycoll" + os.sep, os.sep + "torch" + os.sep, os.sep + "threading.py")
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def records_of(report: dict[str, Any], name: str) -> tuple[int, int, list[dict[str, Any]]]:
    """(this process's rank, the world size, its records) in the communicator named ``name``; rank -1 when
    the process has no such communicator."""
    for comm in report.get("comms", []):
        info = comm.get("info", {})
        if info.get("name") == name:
            recs = [r for r in report.get("records", []) if r.get("comm") == comm.get("id")]
            return int(info.get("rank", -1)), int(info.get("world", 0)), recs
    return -1, 0, []


def call_text(rec: dict[str, Any]) -> str:
    """e.g. "allreduce(1024 x float32, sum)" (a broadcast's root, a codec, where they apply)."""
    coll = rec.get("collective", "?")
    parts = [] if coll == "barrier" else [f"{rec.get('count')} x {rec.get('dtype')}"]
    if coll in ("allreduce", "reduce_scatter"):
        parts.append(str(rec.get("op")))
    if coll == "broadcast":
        parts.append(f"root={rec.get('root')}")
    if rec.get("codec"):
        parts.append(str(rec["codec"]))
    return f"{coll}({', '.join(parts)})"


def call_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(rec.get(k) for k in ("collective", "count", "dtype", "op", "algorithm", "root", "codec"))


def site_text(site: str | None) -> str:
    """A call site as a sentence names it: "train.py:31 in step" (the dump files keep the full path)."""
    if not site:
        return "an unknown line"
    where, _, func = site.rpartition(" in ")
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line} in {func}" if path else site


def ago(ns: int, now: int) -> str:
    return f"{max(0.0, (now - ns) / 1e9):.1f} s ago"


def main_stack(report: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The main thread's Python frames, innermost first: (file, line, function)."""
    main = report.get("main") or {}
    ident = int(main.get("ident", 0) or 0)
    frames: list[tuple[str, int, str]] = []
    current = None
    for line in str(report.get("stacks", "")).splitlines():
        head = _THREAD.match(line)
        if head:
            current = int(head.group(1), 16)
            continue
        m = _FRAME.match(line)
        if m and current == ident:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
    return frames


def stack_text(report: dict[str, Any], limit: int = 3) -> str:
    """Where the main thread is, outside pycoll: "load_batch (train.py:12) <- step (train.py:29)"."""
    frames = [f for f in main_stack(report) if not any(p in f[0] for p in _INTERNAL)]
    if not frames:
        return ""
    shown = [f"{func} ({os.path.basename(path)}:{line})" for path, line, func in frames[:limit]]
    return " <- ".join(shown) + (" <- ..." if len(frames) > limit else "")


def thread_text(report: dict[str, Any]) -> str:
    """The main thread's state from /proc: "sleeping (clock_nanosleep)", "running on a CPU (98%)"."""
    main = report.get("main") or {}
    state, syscall, busy = main.get("state"), main.get("syscall", ""), float(main.get("busy", 0.0))
    if state is None:
        return ""
    if state == "R" or busy >= 0.5:
        return f"running on a CPU ({min(busy, 1.0):.0%} of one over 0.1 s)"
    if state in ("S", "D"):
        how = "sleeping" if state == "S" else "in uninterruptible I/O"
        return f"{how} ({syscall})" if syscall and syscall != "running" else how
    return {"T": "stopped", "t": "stopped by a debugger", "Z": "a zombie", "gone": "gone"}.get(state, state)


@dataclass
class Position:
    rank: int
    kind: str  # waiting, elsewhere, behind, ahead, gone
    text: str  # the clause that says where it is
    site: str | None = None
    extra: list[str] = field(default_factory=list)


def position(rank: int, report: dict[str, Any] | str | None, name: str, mine: dict[str, Any]) -> Position:
    """Where ``rank`` is (its ``report``, or why there is none) against ``mine``: this rank's record of the
    collective that failed (its seq #S)."""
    if not isinstance(report, dict):
        return Position(rank, "gone", f"did not answer ({report})" if report else "did not answer")
    _, _, recs = records_of(report, name)
    seq, now = int(mine.get("seq", 0)), int(report.get("now", 0))
    started = [r for r in recs if int(r.get("seq", 0)) > 0]
    where = _where_main(report)
    if not started:
        return Position(rank, "behind", "has run no collective on this communicator yet" + where)
    last = max(started, key=lambda r: int(r["seq"]))
    k, state, site = int(last["seq"]), last.get("state"), last.get("site")
    at = f"{call_text(last)} at {site_text(site)}"
    if k > seq:
        return Position(rank, "ahead", f"is ahead, in #{k} ({at}, {state})", site)
    if k == seq:
        if state == "completed":
            return Position(rank, "ahead", f"completed #{k} ({at})", site)
        if call_key(last) != call_key(mine):
            return Position(rank, "elsewhere", f"called {at} as #{k}", site)
        if site != mine.get("site"):
            return Position(rank, "elsewhere", f"entered #{k} from another line: {site_text(site)}", site)
        return Position(rank, "waiting", f"waits in it at {site_text(site)}", site)
    if state == "started":
        return Position(rank, "behind", f"is behind, still inside #{k} ({at}) since "
                        f"{ago(int(last.get('started', now)), now)}{where}", site)  # fmt: skip
    return Position(rank, "behind", f"is behind, outside any collective: its last was #{k} ({at}), "
                    f"{state} {ago(int(last.get('ended', now)), now)}{where}", site)  # fmt: skip


def spans(ranks: list[int]) -> str:
    """Ranks as runs: [0, 1, 2, 3, 5, 7, 8] -> "0-3, 5, 7, 8" (a run of three or more as a range)."""
    out: list[str] = []
    ranks = sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.extend([f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else map(str, ranks[i : j + 1]))
        i = j + 1
    return ", ".join(out)


_PLURAL = {"is": "are", "waits": "wait", "has": "have"}


def _plural(text: str) -> str:
    """A clause said of one rank, said of several: "waits in it" -> "wait in it"."""
    verb, sep, rest = text.partition(" ")
    return _PLURAL.get(verb, verb) + sep + rest


def _where_main(report: dict[str, Any]) -> str:
    stack, thread = stack_text(report), thread_text(report)
    if not stack and not thread:
        return ""
    text = "; its main thread is " + (thread or "at")
    return text + (f", in {stack}" if stack else "")


def summary(positions: Iterable[Position], mine_rank: int, mine: dict[str, Any]) -> str:
    """The paragraph: ranks grouped by kind, each group's clause."""
    groups: dict[str, list[Position]] = {}
    for p in positions:
        groups.setdefault(p.kind, []).append(p)
    out = [f"Where the ranks are, against collective #{mine.get('seq')} (rank {mine_rank} called "
           f"{call_text(mine)} at {site_text(mine.get('site'))}):"]  # fmt: skip
    for kind in ("behind", "elsewhere", "gone", "ahead", "waiting"):
        members = groups.get(kind, [])
        same: dict[str, list[int]] = {}
        for p in members:
            same.setdefault(p.text, []).append(p.rank)
        for text, ranks in same.items():
            if len(ranks) == 1:
                out.append(f"rank {ranks[0]} {text}.")
            else:
                out.append(f"ranks {spans(ranks)} {_plural(text)}.")
    return " ".join(out)


# ---- a job's dump files ------------------------------------------------------------------------------


def load_dumps(directory: str | Path) -> list[dict[str, Any]]:
    """The dump files of a directory (``rank*.json``: an error's or ``pycoll trace dump``'s), each
    {"rank", "comm", "report", ...}."""
    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("report"), dict):
            data["file"] = str(path)
            found.append(data)
    return found


def analyze_dumps(directory: str | Path) -> str:
    """What the dumps in ``directory`` say, per communicator: the ranks that have no dump, each rank's last
    collective, the first collective the ranks called differently (by call or by line), and who is behind."""
    dumps = load_dumps(directory)
    if not dumps:
        return f"no dump files (rank*.json) in {directory}"
    names = sorted({str(c.get("info", {}).get("name")) for d in dumps for c in d["report"].get("comms", [])})
    return "\n\n".join(_analyze_comm(name, dumps) for name in names)


def _analyze_comm(name: str, dumps: list[dict[str, Any]]) -> str:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    world = 0
    for d in dumps:
        rank, w, recs = records_of(d["report"], name)
        if rank >= 0:
            by_rank[rank] = [r for r in recs if int(r.get("seq", 0)) > 0]
            world = max(world, w)
    lines = [f"communicator {name}: {world} ranks, dumps of {len(by_rank)}"]
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        lines.append(f"  missing: rank(s) {', '.join(map(str, missing))} (no dump: dead, or not reached)")
    last = {r: max(recs, key=lambda x: int(x["seq"])) for r, recs in by_rank.items() if recs}
    reports = {records_of(d["report"], name)[0]: d["report"] for d in dumps}
    for r in sorted(by_rank):
        rec, rep = last.get(r), reports.get(r, {})
        if rec is None:
            lines.append(f"  rank {r}: no collective recorded{_where_main(rep)}")
            continue
        state, now = rec.get("state"), int(rep.get("now", 0))
        when = int(rec.get("started" if state == "started" else "ended", 0) or 0)
        since = f" {ago(when, now)}" if when and now else ""
        lines.append(f"  rank {r}: last #{rec['seq']} {call_text(rec)} at {site_text(rec.get('site'))}, "
                     f"{state}{since}{_where_main(rep)}")  # fmt: skip
    lines.append("  " + _first_divergence(by_rank))
    if last:
        top = max(int(x["seq"]) for x in last.values())
        behind = sorted(r for r, x in last.items() if int(x["seq"]) < top)
        if behind:
            lines.append(f"  behind: rank(s) {', '.join(map(str, behind))} (the others reached #{top})")
    return "\n".join(lines)


def _first_divergence(by_rank: dict[int, list[dict[str, Any]]]) -> str:
    """The first collective number at which the ranks that recorded it called different collectives or
    called from different lines (records older than a rank's ring are not compared)."""
    table: dict[int, dict[int, dict[str, Any]]] = {}
    for r, recs in by_rank.items():
        for rec in recs:
            table.setdefault(int(rec["seq"]), {})[r] = rec
    for seq in sorted(table):
        calls: dict[tuple[Any, ...], list[int]] = {}
        for r, rec in sorted(table[seq].items()):
            calls.setdefault((*call_key(rec), rec.get("site")), []).append(r)
        if len(calls) > 1:
            parts = []
            for ranks in calls.values():
                rec = table[seq][ranks[0]]
                parts.append(f"rank(s) {', '.join(map(str, ranks))} called {call_text(rec)} at "
                             f"{site_text(rec.get('site'))}")  # fmt: skip
            return f"first divergence: collective #{seq}: " + "; ".join(parts)
    return "no divergence: every rank that recorded a collective number called the same, from the same line"
