"""``pycoll doctor``: what to check on a machine before blaming the library.

    pycoll doctor                    # readable report: CPU, NUMA, /dev/shm, GPUs, GPU links, InfiniBand,
                                     # network, PCI/IOMMU, environment, then a summary of the hazards
    pycoll doctor --json report.json # also write the report as JSON (--json - : JSON on stdout only)

Exit status: 0 when no finding is an error (warnings included), 1 when one is: pycoll's native module
does not load, a PYCOLL_* variable has a value pycoll.init() rejects, or NCCL_LIBRARY names a library
that cannot be loaded. The checks themselves are in pycoll/doctor/.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["DESCRIPTION", "add_parser", "configure_parser", "main"]

DESCRIPTION = (
    "Check this machine (CPU/NUMA, /dev/shm, GPUs and their links, InfiniBand, NICs, PCI ACS, IOMMU)."
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the report as JSON to FILE; '-' writes the JSON to stdout instead of the text",
    )
    # Roots of the probes, for tests and for inspecting a copy of another machine's /sys and /proc.
    parser.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)
    parser.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    parser.add_argument("--dev-shm", default="/dev/shm", help=argparse.SUPPRESS)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on the ``subparsers`` of the ``pycoll`` command; ``func`` is set to ``main``."""
    from pycoll.cli.main import add_command

    return add_command(
        subparsers,
        "doctor",
        help="check this machine before blaming the library",
        description=DESCRIPTION,
        epilog=__doc__,
        configure=configure_parser,
        func=main,
    )


def main(args: argparse.Namespace) -> int:
    """Run ``pycoll doctor`` with parsed ``args``; returns the exit status (1 when a finding is an error)."""
    import platform

    import pycoll
    from pycoll.doctor import collect, render

    report = collect(sys_root=args.sys_root, proc_root=args.proc_root, dev_shm=args.dev_shm)
    if args.json is not None:
        text = json.dumps(report.to_dict(), indent=2) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
            return report.exit_code()
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            print(f"pycoll doctor: cannot write {args.json}: {exc}", file=sys.stderr)
            return 2
    print(
        f"pycoll doctor: pycoll {pycoll.__version__}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()} ({platform.machine()})\n"
    )
    sys.stdout.write(render(report))
    return report.exit_code()
