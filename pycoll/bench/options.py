"""The flags every benchmark program takes (``pycoll bench``, the baseline scripts, calibration's):
nccl-tests' -b/-e/-f sizes, -n/-w iterations, -c check, --json, and ``pycoll bench``'s --collective and
the lists of its -o / -d / --algorithm / --compression / --baseline."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from pycoll.bench.collectives import COLLECTIVES
from pycoll.bench.inputs import DATATYPES, REDOPS

__all__ = [
    "ALGORITHMS",
    "BASELINES",
    "COMPRESSIONS",
    "add_sweep_arguments",
    "nonnegative_int",
    "parse_algorithms",
    "parse_baselines",
    "parse_collective",
    "parse_compression",
    "parse_datatypes",
    "parse_ops",
    "parse_size",
    "sweep_kwargs",
]

ALGORITHMS = ("auto", "ring", "tree", "direct", "hierarchical")
#: ``--compression`` values: "none" and pycoll.compression.CODEC_NAMES (spelled out here so that
#: ``pycoll --help`` does not import numpy; a unit test keeps the two in step).
COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int4")
#: ``--baseline`` values (pycoll.bench.baselines.BASELINES; a unit test keeps the two in step).
BASELINES = ("gloo", "mpi", "nccl")

_SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'4096', '4K', '64M', '1G' (binary multiples, as nccl-tests) -> bytes."""
    s = text.strip().upper()
    if s.endswith("IB"):
        s = s[:-2]
    elif len(s) > 1 and s.endswith("B") and s[-2] in "KMG":
        s = s[:-1]
    unit = s[-1] if s and s[-1] in _SUFFIXES else ""
    number = s[: len(s) - len(unit)] if unit else s
    try:
        value = float(number) * _SUFFIXES[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 4K, 64M)") from None
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"size must be a positive whole number of bytes: {text!r}")
    return int(value)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add nccl-tests-like flags: -b/-e/-f sizes, -n iters, -w warm-up, -c check, --json FILE."""
    parser.add_argument(
        "-b", "--minbytes", type=parse_size, default=4096, metavar="SIZE", help="smallest size (4K)"
    )
    parser.add_argument(
        "-e", "--maxbytes", type=parse_size, default=64 << 20, metavar="SIZE", help="largest size (64M)"
    )
    parser.add_argument("-f", "--stepfactor", type=float, default=2, metavar="F", help="size multiplier (2)")
    parser.add_argument(
        "-n",
        "--iters",
        type=_positive_int,
        default=None,
        metavar="N",
        help="timed iterations per size (auto)",
    )
    parser.add_argument(
        "-w",
        "--warmup_iters",
        type=nonnegative_int,
        default=None,
        metavar="N",
        help="warm-up iterations (auto)",
    )
    parser.add_argument(
        "-c", "--check", type=int, choices=(0, 1), default=1, help="check results (1) or not (0)"
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="also write JSON lines to FILE")


def sweep_kwargs(args: Any) -> dict[str, Any]:
    """The keyword arguments of ``run_allreduce_sweep`` from flags added by ``add_sweep_arguments``."""
    factor = args.stepfactor
    return {
        "min_bytes": args.minbytes,
        "max_bytes": args.maxbytes,
        "factor": int(factor) if float(factor).is_integer() else factor,
        "iters": args.iters,
        "warmup": args.warmup_iters,
        "check": bool(args.check),
    }


def _parse_list(
    text: str, choices: Sequence[str], what: str, *, all_: Sequence[str] | None = None
) -> list[str]:
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if all_ is not None and names == ["all"]:
        return list(all_)
    bad = [name for name in names if name not in choices]
    if not names or bad:
        extra = ", or all" if all_ is not None else ""
        raise argparse.ArgumentTypeError(
            f"{what} must be one of {', '.join(choices)} or a comma list of them{extra}, got {text!r}"
        )
    return list(dict.fromkeys(names))


def parse_collective(text: str) -> str:
    """'allreduce', 'reduce_scatter' or 'all_gather' (also spelled with '-' or without a separator, as
    nccl-tests' all_reduce_perf, reduce_scatter_perf, all_gather_perf) -> the name."""
    key = text.strip().lower().replace("-", "").replace("_", "")
    for name in COLLECTIVES:
        if name.replace("_", "") == key:
            return name
    raise argparse.ArgumentTypeError(f"collective must be one of {', '.join(COLLECTIVES)}, got {text!r}")


def parse_compression(text: str) -> list[str]:
    """'int8' or 'none,int8,int4' -> the codec names, in order, without repeats."""
    return _parse_list(text, COMPRESSIONS, "compression")


def parse_algorithms(text: str) -> list[str]:
    """'ring' or 'ring,tree,direct' -> the algorithm names, in order, without repeats."""
    return _parse_list(text, ALGORITHMS, "algorithm")


def parse_baselines(text: str) -> list[str]:
    """'gloo' or 'gloo,mpi' -> the baseline names, in order, without repeats."""
    return _parse_list(text, BASELINES, "baseline")


def parse_ops(text: str) -> list[str]:
    """nccl-tests' ``-o``: 'sum', 'min,max' or 'all' (sum prod max min avg) -> op names."""
    return _parse_list(text, REDOPS, "op", all_=REDOPS)


def parse_datatypes(text: str) -> list[str]:
    """nccl-tests' ``-d``: 'float', 'half,bfloat16' or 'all' -> numpy dtype names ('float32'...).

    nccl-tests' names (float half bfloat16 double int32 int64 int8 uint8) and numpy's (float32,
    float16, float64) are both taken."""
    aliases = {**DATATYPES, **{v: v for v in DATATYPES.values()}}
    names = _parse_list(text, tuple(aliases), "datatype", all_=tuple(DATATYPES))
    return list(dict.fromkeys(aliases[name] for name in names))
