"""``pycoll trace``: every rank's recent collectives from a live job, and what they say.

    pycoll trace dump                        # the job(s) of this host's pycoll processes
    pycoll trace dump 10.0.0.7:41234         # a job through any member's control address
    pycoll trace dump 12345 --stacks         # through a process id on this host; with Python stacks
    pycoll trace analyze DIR                 # the dumps of a directory (an error's, or dump's)

``dump`` asks one process of the job (a control address, a PID on this host, or by default each process
this host's pycoll processes noted in PYCOLL_TRACE_DIR/live) for its communicators' members, then asks every
member (side by side, each within ``--timeout`` seconds) for its last ``--records`` collectives, with
``--stacks`` also every thread's Python stack. The members answer on a native thread of their own, so a
rank that is stuck, busy in a long C call or waiting in a collective answers as well. One JSON file per
rank goes to ``--out`` (default PYCOLL_TRACE_DIR/dump-<time>), then the analysis is printed.

``analyze`` reads a directory of dumps (``rank*.json``: those ``dump`` writes, or those the ranks of a
failed collective wrote, whose error names the directory) and reports, per communicator, the ranks with no
dump, each rank's last collective, the first collective the ranks called differently (by call or by call
site), and who is behind. With PYCOLL_SECRET set, ``dump`` proves it holds it, as members do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pycoll.cli.main import add_command

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    def configure(parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", metavar="<action>")
        sub.required = True
        dump = sub.add_parser("dump", help="every rank's recent collectives from a live job")
        dump.add_argument("targets", nargs="*", metavar="ADDRESS|PID",
                          help="a member's control address (host:port) or a pycoll process id on this host "
                               "(default: every pycoll process this host noted)")  # fmt: skip
        dump.add_argument("--out", help="directory for the dumps (default PYCOLL_TRACE_DIR/dump-<time>)")
        dump.add_argument("--records", type=int, default=2048, help="records per rank (2048)")
        dump.add_argument("--stacks", action="store_true", help="also every thread's Python stack")
        dump.add_argument("--timeout", type=float, default=5.0, help="seconds each rank may take (5)")
        analyze = sub.add_parser("analyze", help="what a directory of dumps says")
        analyze.add_argument("directory")

    return add_command(
        subparsers,
        "trace",
        help="dump every rank's recent collectives from a live job, and analyze dumps",
        description="The flight recorder's records of a live job (dump), and what they say (analyze).",
        epilog=__doc__,
        configure=configure,
        func=main,
    )


def main(args: argparse.Namespace) -> int:
    from pycoll.flight.analysis import analyze_dumps

    if args.action == "analyze":
        print(analyze_dumps(args.directory))
        return 0
    return _dump(args)


def _seeds(targets: list[str], live: Path) -> list[str]:
    """Control addresses to start from: the targets (a PID is looked up in ``live``), else every live
    process noted there (notes of processes that are gone are removed)."""
    if targets:
        out = []
        for t in targets:
            if t.isdigit():
                note = live / f"{t}.json"
                if not note.exists():
                    raise SystemExit(f"pycoll trace: no pycoll process {t} noted in {live}")
                out.append(str(json.loads(note.read_text())["address"]))
            else:
                out.append(t)
        return out
    from pycoll.flight.recorder import live_notes

    return [str(note["address"]) for note in live_notes(live)]


def _dump(args: argparse.Namespace) -> int:
    from pycoll.env import Settings
    from pycoll.flight.analysis import analyze_dumps, records_of
    from pycoll.flight.probe import probe, probe_many
    from pycoll.flight.recorder import LIVE_DIR, trace_dir

    settings = Settings.from_environ()
    seeds = _seeds(args.targets, trace_dir(settings) / LIVE_DIR)
    if not seeds:
        print("pycoll trace: no pycoll process found on this host; give a member's control address",
              file=sys.stderr)  # fmt: skip
        return 1
    # Every communicator the seeds know (the newest of each process last), with its members' addresses.
    comms: dict[str, list[str]] = {}
    for seed in seeds:
        try:
            rep = probe(seed, records=0, members=True, secret=settings.secret, timeout=args.timeout)
        except Exception as exc:  # noqa: BLE001 - one unreachable seed: try the next
            print(f"pycoll trace: {seed}: {exc}", file=sys.stderr)
            continue
        for c in rep.get("comms", []):
            if c.get("members"):
                comms[str(c["info"]["name"])] = [str(a) for a in c["members"]]
    if not comms:
        print("pycoll trace: no communicator with a fault plane found", file=sys.stderr)
        return 1
    name, members = list(comms.items())[-1]  # the newest communicator's members (a shrink's survivors)
    out = Path(args.out or trace_dir(settings) / f"dump-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    addresses = dict(enumerate(members))
    stacks = set(addresses) if args.stacks else set()
    reports = probe_many(addresses, records=args.records, stacks=stacks, secret=settings.secret,
                         timeout=args.timeout)  # fmt: skip
    missing: list[str] = []
    for rank, answer in sorted(reports.items()):
        if not isinstance(answer, dict):
            missing.append(f"rank {rank} ({answer})")
            continue
        own, _, _ = records_of(answer, name)
        data = {"rank": own if own >= 0 else rank, "comm": name, "written": time.time(), "report": answer}
        (out / f"rank{rank}.json").write_text(json.dumps(data))
    print(f"pycoll trace: {len(reports) - len(missing)} of {len(members)} ranks of {name} dumped to {out}")
    for m in missing:
        print(f"pycoll trace: no answer from {m}")
    print(analyze_dumps(out))
    return 0
