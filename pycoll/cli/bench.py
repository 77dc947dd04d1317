"""``pycoll bench``: an nccl-tests-style all-reduce benchmark of pycoll on N local ranks.

    pycoll bench --ranks 4                        # 4 KiB .. 64 MiB float32, results checked
    pycoll bench --ranks 2 -b 1M -e 1M -n 50 --algorithm ring --json out.jsonl

Without ``--worker`` this process only launches: with ``pycoll run``'s launcher it starts ``--ranks``
local rank processes that each run ``python -m pycoll.cli.bench --worker ...``, waits for them, and if
one fails stops the others and exits non-zero naming it. With ``--worker`` the process is one rank of a
job some launcher already started (this one, ``pycoll run``, ``torchrun`` or ``mpirun``): it calls
``pycoll.init()``, runs the sweep of ``pycoll.benchmark`` and rank 0 prints the table.

The timing loop (pycoll/benchmark.py) is the one the Open MPI and Gloo baselines in bench/baselines use,
so their tables compare like for like (bench/compare.py runs all three interleaved).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pycoll import benchmark  # numpy-free at import time; numpy loads when the sweep runs

if TYPE_CHECKING:
    import numpy as np

__all__ = ["add_parser", "build_parser", "configure_parser", "main", "run_worker", "worker_arguments"]

ALGORITHMS = ("auto", "ring", "tree", "direct")
DEFAULT_RANKS = 4

DESCRIPTION = "All-reduce benchmark (nccl-tests style table) of pycoll on N local ranks."


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``pycoll bench``'s arguments to ``parser``."""
    parser.add_argument(
        "--ranks",
        type=int,
        default=DEFAULT_RANKS,
        metavar="N",
        help=f"number of local ranks to start ({DEFAULT_RANKS})",
    )
    benchmark.add_sweep_arguments(parser)
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="auto", help="all-reduce algorithm (auto)")
    parser.add_argument(
        "--worker",
        action="store_true",
        help="run as one rank of a job already started by a launcher (pycoll run, torchrun, mpirun) "
        "instead of starting --ranks processes",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``subparsers`` of the ``pycoll`` command; ``func`` is set to ``main``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="all-reduce benchmark on N local ranks",
        description=DESCRIPTION,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(parser)
    parser.set_defaults(func=main)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser, for ``python -m pycoll.cli.bench``."""
    parser = argparse.ArgumentParser(
        prog="pycoll bench",
        description=DESCRIPTION,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run ``pycoll bench`` with parsed ``args``; returns the process exit code."""
    if args.worker:
        return run_worker(args)
    if args.ranks < 1:
        print(f"pycoll bench: --ranks must be >= 1, got {args.ranks}", file=sys.stderr)
        return 2
    from pycoll.cli.run import launch

    argv = [sys.executable, "-m", "pycoll.cli.bench", "--worker", *worker_arguments(args)]
    return launch(args.ranks, argv)


# ---------------------------------------------------------------------------------------------------
# The rank side.


def run_worker(args: argparse.Namespace) -> int:
    """One rank: form the communicator, run the sweep, print (rank 0) and write JSON (rank 0)."""
    import pycoll

    comm = pycoll.init()
    try:
        rank, world = comm.rank, comm.world_size
        algorithm = args.algorithm

        def allreduce(x: np.ndarray) -> None:
            pycoll.allreduce(x, algorithm=algorithm)

        def reduce_max(a: np.ndarray) -> np.ndarray:
            pycoll.allreduce(a, op="max")
            return a

        version = pycoll.__version__
        title = f"pycoll {version}: pycoll.allreduce(algorithm={algorithm}), {world} ranks"
        meta = {
            "library": "pycoll",
            "library_version": f"pycoll {version}",
            "algorithm": algorithm,
            "host": platform.node(),
        }
        benchmark.run_and_report(
            allreduce, pycoll.barrier, reduce_max, rank, world, args, title=title, meta=meta
        )
    finally:
        pycoll.finalize(comm)
    return 0


def worker_arguments(args: argparse.Namespace) -> list[str]:
    """The command-line flags that make a worker run the sweep ``args`` describes."""
    argv = [
        "-b",
        str(args.minbytes),
        "-e",
        str(args.maxbytes),
        "-f",
        repr(args.stepfactor),
        "-c",
        str(args.check),
        "--algorithm",
        args.algorithm,
    ]
    if args.iters is not None:
        argv += ["-n", str(args.iters)]
    if args.warmup_iters is not None:
        argv += ["-w", str(args.warmup_iters)]
    if args.json:
        argv += ["--json", os.path.abspath(args.json)]
    return argv


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pycoll.cli.bench``."""
    return main(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
