"""``pycoll bench``: an nccl-tests-style benchmark of pycoll's all-reduce, reduce-scatter or all-gather on
N local ranks.

    pycoll bench --ranks 4                        # all-reduce, 4 KiB .. 64 MiB float32 sum, checked
    pycoll bench --ranks 2 -b 1M -e 1M -n 50 --algorithm ring --json out.jsonl
    pycoll bench --ranks 2 -b 1M -e 64M -f 4 --compression none,fp16,bf16,int8,int4
    pycoll bench --ranks 2 -o all -d all -b 4K -e 64K       # every op on every type
    pycoll bench --ranks 4 --algorithm ring,tree,direct --baseline gloo,mpi --plot busbw.png
    pycoll bench --ranks 4 --collective reduce_scatter --algorithm ring,direct --compression none,int8
    pycoll bench --ranks 4 --collective all_gather --baseline gloo,mpi

Flags (nccl-tests' all_reduce_perf names where it has them):

    --collective C    allreduce, reduce_scatter or all_gather (allreduce): nccl-tests' all_reduce_perf,
                      reduce_scatter_perf, all_gather_perf. Size is the whole buffer (the all-reduce's,
                      the reduce-scatter's input, the all-gather's output); busbw = algbw * 2(n-1)/n for
                      all-reduce, algbw * (n-1)/n for the other two
    -b/-e/-f SIZE     smallest / largest size, multiplier (4K, 64M, 2)
    -n/-w N           timed / warm-up iterations per size (auto: fewer for larger sizes)
    -c 0|1            check every result (1)
    -o OP             sum prod min max avg, a comma list, or all (sum)
    -d TYPE           float half bfloat16 double int32 int64 int8 uint8, a comma list, or all (float)
    --algorithm A     auto ring tree direct hierarchical, or a comma list (auto); reduce-scatter and
                      all-gather: auto ring direct hierarchical
    --compression C   none fp16 bf16 int8 int4, or a comma list (none); float + sum/avg only; a
                      compressed reduce-scatter or all-gather runs direct or hierarchical (or auto)
                      only
    --baseline B      gloo mpi nccl, or a comma list: the other library timed in the same ranks
    --link-bytes N    after each size and variant, N more calls whose bytes on the network interface
                      (--link-iface, else PYCOLL_SOCKET_IFNAME) are counted: JSON link_tx_bytes
    --json FILE       one JSON object per row (below)
    --plot FILE.png   busbw against size, one line per series (needs matplotlib)

Every (algorithm x codec) pair is a variant, and so is every baseline; all are timed interleaved, size
by size (A B C, A B C...), so their ratios come from the same minutes of a noisy machine. With several
ops or types, each (type, op) is one such sweep, one after the other (avg is skipped on integer types,
and a baseline skips what it cannot do: MPI has no bfloat16 and no avg).

Results are checked exactly: for each op and type the inputs are chosen so that the result is exact in
that type whatever order the ranks add in, and is compared bit for bit with a closed form
(pycoll/bench/inputs.py, ``exact_pattern``). With a codec the inputs are Gaussian (mean 0, std 1,
rank-dependent), ``error`` is the relative L2 error ||out - exact|| / ||exact|| against the float64
exact sum (worst iteration), ``#wrong`` counts elements outside the codec's derived error bound
(pycoll/compression/bounds.py), and algbw / busbw are *effective* (uncompressed bytes over the time).
A reduce-scatter is held to its chunk of the all-reduce's result; an all-gather's rank r gives
``r + 1 + (i % 7)`` and every rank must end with all of them in rank order (compressed: each chunk
within one quantization of the codec).

JSON records (``--json``; one per row, what ``pycoll.bench.report.result_to_dict`` writes): ``library``
(pycoll, gloo, mpi, nccl), ``algorithm`` (an ``--algorithm`` name; "default" for a baseline), ``codec``
("none" or the codec), ``label`` (the series: ``pycoll/ring``, ``pycoll/direct/int8``, ``gloo``),
``collective``, ``bytes``, ``count``, ``dtype``, ``redop`` ("none" for the all-gather), ``world``,
``time_us`` (median over iterations of the slowest rank's time), ``times_us`` (those per-iteration
slowest-rank times, in the order run), ``algbw_GBps``, ``busbw_GBps``, ``wrong``, ``rel_error``,
``iters``, ``warmup``, ``library_version``, ``host``; pycoll rows also ``fragment_bytes``, compressed ones
``codec_algorithm`` (the plan that ran) and ``codecs``; with ``--link-bytes`` ``link_tx_bytes`` /
``link_tx_packets`` (per rank, per call) and ``link_iface``.

Without ``--worker`` this process only launches: the flags become a ``pycoll.bench.jobs.Job`` and
``run_job`` starts ``--ranks`` local rank processes with ``pycoll run``'s launcher, each running
``pycoll.bench.worker`` (with ``--baseline mpi`` ``mpirun [--allow-run-as-root] --oversubscribe -n N``
starts them instead), waits for them, and if one fails exits non-zero naming it. A missing baseline
library or matplotlib is reported in one line before anything starts. With ``--worker`` the process is
one rank of a job some launcher already started (``pycoll run``, ``torchrun`` or ``mpirun``): it runs
``pycoll.bench.worker.run_worker`` on the job its flags describe, which calls ``pycoll.init()``, runs
the sweeps and has rank 0 print the table (and, on a terminal, a progress line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from pycoll.bench.collectives import COLLECTIVES, get_collective
from pycoll.bench.inputs import CODEC_OPS
from pycoll.bench.jobs import Job, run_job
from pycoll.bench.options import (
    ALGORITHMS,
    COMPRESSIONS,
    add_sweep_arguments,
    nonnegative_int,
    parse_algorithms,
    parse_baselines,
    parse_collective,
    parse_compression,
    parse_datatypes,
    parse_ops,
)

__all__ = [
    "add_parser",
    "build_parser",
    "check_arguments",
    "configure_parser",
    "job_from_args",
    "main",
]

DEFAULT_RANKS = 4


DESCRIPTION = (
    "All-reduce, reduce-scatter or all-gather benchmark (nccl-tests style table) of pycoll on N local ranks."
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``pycoll bench``'s arguments to ``parser``."""
    parser.add_argument(
        "--ranks",
        type=int,
        default=DEFAULT_RANKS,
        metavar="N",
        help=f"number of local ranks to start ({DEFAULT_RANKS})",
    )
    parser.add_argument(
        "--collective",
        type=parse_collective,
        default="allreduce",
        metavar="C",
        help=f"the collective timed: {', '.join(COLLECTIVES)} (allreduce), as nccl-tests' "
        "all_reduce_perf, reduce_scatter_perf, all_gather_perf",
    )
    add_sweep_arguments(parser)
    parser.add_argument(
        "-o",
        "--op",
        type=parse_ops,
        default=["sum"],
        metavar="OP[,OP...]",
        help="reduction op: sum, prod, min, max, avg, a comma list, or all (sum)",
    )
    parser.add_argument(
        "-d",
        "--datatype",
        type=parse_datatypes,
        default=["float32"],
        metavar="TYPE[,TYPE...]",
        help="element type: float, half, bfloat16, double, int32, int64, int8, uint8, a comma list, "
        "or all (float)",
    )
    parser.add_argument(
        "--algorithm",
        type=parse_algorithms,
        default=["auto"],
        metavar="ALG[,ALG...]",
        help=f"all-reduce algorithm: {', '.join(ALGORITHMS)}, or a comma list timed interleaved (auto)",
    )
    parser.add_argument(
        "--compression",
        type=parse_compression,
        default=["none"],
        metavar="CODEC[,CODEC...]",
        help=f"codec of the all-reduce: {', '.join(COMPRESSIONS)}, or a comma list timed interleaved "
        "(none); busbw/algbw then count uncompressed bytes and an error column is added",
    )
    parser.add_argument(
        "--baseline",
        type=parse_baselines,
        default=[],
        metavar="LIB[,LIB...]",
        help="also time gloo (torch), mpi (mpi4py under mpirun) or nccl (CUDA torch) in the same ranks, "
        "interleaved with pycoll",
    )
    parser.add_argument(
        "--link-bytes",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="after each size and variant, N more calls whose bytes on the network interface are counted "
        "(JSON link_tx_bytes / link_tx_packets, per rank and call; 0: off)",
    )
    parser.add_argument(
        "--link-iface",
        default=None,
        metavar="IF",
        help="the interface --link-bytes reads (/sys/class/net/IF/statistics) (PYCOLL_SOCKET_IFNAME)",
    )
    parser.add_argument(
        "--plot", metavar="FILE.png", default=None, help="draw busbw against size into FILE (matplotlib)"
    )
    parser.add_argument(
        "--plot-yscale",
        choices=("linear", "log"),
        default="linear",
        help="y axis of --plot (linear)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress line on stderr: auto = when stderr is a terminal (auto)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="instead of a table: time ring, direct and tree (uncompressed and int8) on 2..N ranks, fit "
        "the cost model's shared-memory parameters to them and save them for algorithm/compression "
        "auto (pycoll.tuning; -b/-e set the sizes)",
    )
    parser.add_argument(
        "--calibrate-from",
        metavar="FILE",
        default=None,
        help="with --calibrate: fit these measured points (JSON lines) instead of measuring",
    )
    parser.add_argument(
        "--calibrate-measurements",
        metavar="FILE",
        default=None,
        help="with --calibrate: also write the measured points (JSON lines) to FILE",
    )
    parser.add_argument(
        "--worker",
        action="store_true",
        help="run as one rank of a job already started by a launcher (pycoll run, torchrun, mpirun) "
        "instead of starting --ranks processes",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``subparsers`` of the ``pycoll`` command; ``func`` is set to ``main``."""
    from pycoll.cli.main import add_command

    return add_command(
        subparsers,
        "bench",
        help="all-reduce / reduce-scatter / all-gather benchmark on N local ranks",
        description=DESCRIPTION,
        epilog=__doc__,
        configure=configure_parser,
        func=main,
    )


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


def _listed(args: argparse.Namespace, name: str, default: list[str]) -> list[str]:
    """A list-valued flag of ``args`` (a plain string from an older caller counts as one item)."""
    value = getattr(args, name, None)
    if value is None:
        return list(default)
    if isinstance(value, str):
        return [value]
    return list(value)


def check_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of flags, in one line; None when nothing is."""
    codecs = [c for c in _listed(args, "compression", ["none"]) if c != "none"]
    ops = _listed(args, "op", ["sum"])
    dtypes = _listed(args, "datatype", ["float32"])
    problem = _check_collective(args, codecs, ops)
    if problem:
        return problem
    if codecs:
        bad_ops = [op for op in ops if op not in CODEC_OPS]
        bad_types = [d for d in dtypes if d != "float32"]
        if bad_ops or bad_types:
            what = ", ".join([f"-o {op}" for op in bad_ops] + [f"-d {d}" for d in bad_types])
            return (
                f"--compression {','.join(codecs)} works on -d float with -o sum or avg only, not {what} "
                "(run the other types and ops without --compression)"
            )
    if ops == ["avg"] and not any(d in ("float32", "float64", "float16", "bfloat16") for d in dtypes):
        return f"-o avg needs a floating-point -d (float, half, bfloat16, double), got {','.join(dtypes)}"
    if getattr(args, "ranks", 1) < 1:
        return f"--ranks must be >= 1, got {args.ranks}"
    return None


def _check_collective(args: argparse.Namespace, codecs: list[str], ops: list[str]) -> str | None:
    """What ``--collective`` rules out among the other flags, in one line; None when nothing."""
    coll = get_collective(getattr(args, "collective", "allreduce"))
    if coll.name == "allreduce":
        return None
    what = f"--collective {coll.name}"
    algorithms = _listed(args, "algorithm", ["auto"])
    bad = [a for a in algorithms if a != "auto" and a not in coll.algorithms]
    if bad:
        return f"{what} runs --algorithm auto, {', '.join(coll.algorithms)}; not {', '.join(bad)}"
    if codecs and not any(a in coll.codec_algorithms for a in algorithms):
        return (
            f"a compressed {coll.name} runs algorithm {coll.codec_plans} (each element quantized once): "
            f"add one to --algorithm for --compression {','.join(codecs)}"
        )
    if not coll.reduces and ops != ["sum"]:
        return f"{what} reduces nothing: -o {','.join(ops)} does not apply"
    if getattr(args, "calibrate", False):
        return f"--calibrate fits the all-reduce's cost model; not {what}"
    return None


def _preflight(args: argparse.Namespace, launcher: bool) -> str | None:
    """What this machine lacks for ``args`` (a baseline's library, matplotlib), in one line."""
    from pycoll.bench import baselines, plots

    for name in _listed(args, "baseline", []):
        if name == "mpi" and not launcher:
            problem = None if baselines._has_module("mpi4py") else baselines.unavailable("mpi")
        else:
            problem = baselines.unavailable(name, args.ranks if launcher else None)
        if problem:
            return problem
    if getattr(args, "plot", None) and not plots.available():
        return plots.MISSING
    if "bfloat16" in _listed(args, "datatype", []) and not baselines._has_module("ml_dtypes"):
        return "-d bfloat16 needs the ml_dtypes package: pip install ml_dtypes"
    return None


def job_from_args(args: argparse.Namespace) -> Job:
    """The ``Job`` that ``args`` (``pycoll bench``'s flags) describe; ``--json`` and ``--plot`` made
    absolute (the ranks may start elsewhere)."""
    return Job(
        ranks=getattr(args, "ranks", DEFAULT_RANKS),
        collective=getattr(args, "collective", "allreduce"),
        minbytes=args.minbytes,
        maxbytes=args.maxbytes,
        stepfactor=args.stepfactor,
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        check=args.check,
        op=tuple(_listed(args, "op", ["sum"])),
        datatype=tuple(_listed(args, "datatype", ["float32"])),
        algorithm=tuple(_listed(args, "algorithm", ["auto"])),
        compression=tuple(_listed(args, "compression", ["none"])),
        baseline=tuple(_listed(args, "baseline", [])),
        json=os.path.abspath(args.json) if args.json else None,
        plot=os.path.abspath(args.plot) if getattr(args, "plot", None) else None,
        plot_yscale=getattr(args, "plot_yscale", "linear"),
        progress=getattr(args, "progress", "auto"),
        link_iters=getattr(args, "link_bytes", 0),
        link_iface=getattr(args, "link_iface", None),
    )


def main(args: argparse.Namespace) -> int:
    """Run ``pycoll bench`` with parsed ``args``; returns the process exit code."""
    problem = check_arguments(args)
    if problem:
        print(f"pycoll bench: error: {problem}", file=sys.stderr)
        return 2
    if getattr(args, "calibrate", False) and not args.worker:
        return _calibrate(args)
    problem = _preflight(args, launcher=not args.worker)
    if problem:
        print(f"pycoll bench: {problem}", file=sys.stderr)
        return 2
    if args.worker:
        from pycoll.bench.worker import exit_rank, run_worker

        return exit_rank(run_worker(job_from_args(args)))
    if getattr(args, "progress", "auto") == "auto":
        args.progress = "on" if _isatty(sys.stderr) else "off"  # the ranks' stderr may be a pipe
    return run_job(job_from_args(args)).returncode


def _calibrate(args: argparse.Namespace) -> int:
    """``--calibrate``: pycoll.tuning.calibrate on world sizes 2..--ranks, saved to this host's file."""
    from pycoll.tuning import calibrate
    from pycoll.tuning.persist import save_model

    if args.ranks < 2:
        print(f"pycoll bench: --calibrate needs --ranks >= 2, got {args.ranks}", file=sys.stderr)
        return 2
    try:
        if args.calibrate_from:
            points = calibrate.read_measurements(args.calibrate_from)
        else:
            points = calibrate.measure(
                range(2, args.ranks + 1),
                min_bytes=args.minbytes,
                max_bytes=args.maxbytes,
                log=lambda line: print(f"pycoll bench --calibrate: {line}", file=sys.stderr, flush=True),
            )
        if args.calibrate_measurements:
            calibrate.write_measurements(args.calibrate_measurements, points)
        model, report = calibrate.fit(points)
    except (RuntimeError, OSError, ValueError, ImportError) as exc:
        print(f"pycoll bench: {exc}", file=sys.stderr)
        return 1
    print(calibrate.format_fit(report))
    print(f"saved to {save_model(model, report)} (PYCOLL_TUNING_FILE overrides; =none ignores it)")
    return 0


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pycoll.cli.bench``."""
    return main(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
