"""What the baseline scripts share: one baseline (pycoll/bench/baselines.py) timed alone with its own
barrier and max-reduction, through ``pycoll.bench.report.run_and_report`` (the table on rank 0, --json
records)."""

from __future__ import annotations

import argparse
import platform

from pycoll.bench import baselines, options, report
from pycoll.bench.options import parse_datatypes, parse_ops
from pycoll.bench.worker import exit_rank


def main(name: str, doc: str | None, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_sweep_arguments(parser)
    parser.add_argument("-o", "--op", type=parse_ops, default=["sum"], help="sum prod min max avg, or all")
    parser.add_argument(
        "-d", "--datatype", type=parse_datatypes, default=["float32"], help="float half ... or all"
    )
    parser.add_argument(
        "--timeout", type=float, default=baselines.DEFAULT_TIMEOUT_S, help="collective timeout (s)"
    )
    args = parser.parse_args(argv)
    (baseline,) = baselines.connect([name], timeout_s=args.timeout)
    sweeps = []
    for dtype in args.datatype:
        for op in args.op:
            variant = baseline.variant(op, dtype)
            if variant is not None:
                sweeps.append((dtype, [variant]))
    if not sweeps:
        parser.error(f"{name} supports none of -o {','.join(args.op)} -d {','.join(args.datatype)}")
    title = f"{baseline.version}: {name} all-reduce, {baseline.world} ranks"
    meta = {"library_version": baseline.version, "host": platform.node()}
    report.run_and_report(
        None,
        baseline.barrier,
        baseline.reduce_max,
        baseline.rank,
        baseline.world,
        args,
        title=title,
        meta=meta,
        sweeps=sweeps,
    )
    # No torch.distributed.destroy_process_group(): see pycoll/bench/baselines.py and exit_rank.
    return exit_rank(0)
