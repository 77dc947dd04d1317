"""``pycoll bench``: an nccl-tests-style all-reduce benchmark of pycoll on N local ranks.

    pycoll bench --ranks 4                        # 4 KiB .. 64 MiB float32, results checked
    pycoll bench --ranks 2 -b 1M -e 1M -n 50 --algorithm ring --json out.jsonl
    pycoll bench --ranks 2 -b 1M -e 64M -f 4 --compression none,fp16,bf16,int8,int4

``--compression`` (none, fp16, bf16, int8, int4, or a comma list of them) times the compressed
all-reduce (``auto`` then means direct, two-shot); with a list the variants are timed interleaved,
size by size. algbw and busbw are *effective*: the uncompressed bytes over the time. With a codec the
inputs are Gaussian (mean 0, std 1, rank-dependent), the ``error`` column is the relative L2 error
||out - exact|| / ||exact|| against the float64 exact sum (worst iteration), and ``#wrong`` counts the
elements outside the codec's derived error bound (pycoll/compression/bounds.py); uncompressed rows
keep the exact integer inputs and exact comparison.

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
import math
import os
import platform
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pycoll import benchmark  # numpy-free at import time; numpy loads when the sweep runs

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "CodecInputs",
    "add_parser",
    "build_parser",
    "configure_parser",
    "main",
    "parse_compression",
    "run_worker",
    "worker_arguments",
]

ALGORITHMS = ("auto", "ring", "tree", "direct")
#: ``--compression`` values: "none" and pycoll.compression.CODEC_NAMES (spelled out here so that
#: ``pycoll --help`` does not import numpy; a unit test keeps the two in step).
COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int4")
DEFAULT_RANKS = 4
#: Seed of the Gaussian inputs of compressed runs.
INPUT_SEED = 0
#: Elements judged at a time in compressed runs (about; whole codec blocks).
_JUDGE_CHUNK = 1 << 16


def parse_compression(text: str) -> list[str]:
    """'int8' or 'none,int8,int4' -> the codec names, in order, without repeats."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in COMPRESSIONS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"compression must be one of {', '.join(COMPRESSIONS)} or a comma list of them, got {text!r}"
        )
    return list(dict.fromkeys(names))


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
        "--compression",
        type=parse_compression,
        default=["none"],
        metavar="CODEC[,CODEC...]",
        help=f"codec of the all-reduce: {', '.join(COMPRESSIONS)}, or a comma list timed interleaved "
        "(none); busbw/algbw then count uncompressed bytes and an error column is added",
    )
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
        names = list(getattr(args, "compression", None) or ["none"])
        variants = [_variant(name, algorithm) for name in names]

        def reduce_max(a: np.ndarray) -> np.ndarray:
            pycoll.allreduce(a, op="max")
            return a

        version = pycoll.__version__
        title = f"pycoll {version}: pycoll.allreduce(algorithm={algorithm}), {world} ranks"
        meta: dict[str, Any] = {
            "library": "pycoll",
            "library_version": f"pycoll {version}",
            "algorithm": algorithm,
            "host": platform.node(),
        }
        if names != ["none"]:
            from pycoll.algorithms.compressed import DEFAULT_COMPRESSED_ALGORITHM
            from pycoll.compression import get_codec

            title = (
                f"pycoll {version}: pycoll.allreduce(algorithm={algorithm}, compression={','.join(names)}), "
                f"{world} ranks; algbw/busbw effective (uncompressed bytes / time), error = relative L2 error"
            )
            if algorithm == "auto":
                meta["codec_algorithm"] = DEFAULT_COMPRESSED_ALGORITHM
            meta["codecs"] = {name: repr(get_codec(name)) for name in names if name != "none"}
        benchmark.run_and_report(
            None, pycoll.barrier, reduce_max, rank, world, args, title=title, meta=meta, variants=variants
        )
    finally:
        pycoll.finalize(comm)
    return 0


class CodecInputs(benchmark.Inputs):
    """Inputs of a compressed run: Gaussian, rank-dependent (``benchmark.gaussian_input``); a result is
    judged against the float64 exact sum, every rank rebuilding every rank's input: elements outside
    the codec's derived bound (``pycoll.compression.bounds.SumBound``) are wrong, and the relative L2
    error is reported."""

    def __init__(self, codec: Any, algorithm: str, seed: int = INPUT_SEED) -> None:
        self.codec = codec
        self.algorithm = algorithm
        self.seed = seed

    def input(self, rank: int, world: int, count: int, dtype: Any) -> np.ndarray:
        return benchmark.gaussian_input(rank, count, self.seed, dtype)

    def judge(self, rank: int, world: int, count: int, dtype: Any) -> benchmark.JudgeFn:
        import numpy as np

        from pycoll.compression.bounds import SumBound

        if np.dtype(dtype) != np.float32:
            raise ValueError(f"compressed runs are checked for float32 data, got {np.dtype(dtype)}")
        # Chunks of whole codec blocks, so that judging allocates only small temporaries. No BLAS here
        # (np.dot, np.linalg.norm): OpenBLAS's worker threads keep spinning for a while after a call
        # and take the cores from the ranks, which slowed the next all-reduces 5-10x on two vCPUs.
        block = max(1, int(self.codec.block_elems))
        step = block * max(1, _JUDGE_CHUNK // block)
        chunks = [(start, min(start + step, count)) for start in range(0, count, step)]
        exact = np.zeros(count)
        bounds = [SumBound(self.codec, self.algorithm, hi - lo) for lo, hi in chunks]
        for r in range(world):
            x = benchmark.gaussian_input(r, count, self.seed)
            exact += x
            for (lo, hi), sum_bound in zip(chunks, bounds):
                sum_bound.add(x[lo:hi])
            del x
        norm = _l2(exact)
        # The last result judged, and its verdict. Nearest rounding gives the same bits every iteration,
        # and a bitwise comparison costs what the exact check of an uncompressed run costs, so the
        # timed iterations are not spaced out by milliseconds of checking.
        last = np.empty(count, dtype=np.float32)
        verdict: list[tuple[int, float] | None] = [None]

        def judge(out: np.ndarray) -> tuple[int, float | None]:
            if verdict[0] is not None and np.array_equal(out, last):
                return verdict[0]
            wrong, squares = 0, 0.0
            for (lo, hi), sum_bound in zip(chunks, bounds):
                part = out[lo:hi]
                err = np.abs(part.astype(np.float64) - exact[lo:hi])
                wrong += int(np.count_nonzero(~(err <= sum_bound.bound(part))))  # NaN is wrong
                squares += _l2(err) ** 2
            diff = math.sqrt(squares)
            rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
            np.copyto(last, out)
            verdict[0] = (wrong, rel)
            return wrong, rel

        return judge


def _l2(a: np.ndarray) -> float:
    """||a||_2 without BLAS (see CodecInputs.judge)."""
    import numpy as np

    return math.sqrt(float(np.sum(np.square(a, dtype=np.float64))))


def _variant(name: str, algorithm: str) -> benchmark.Variant:
    """The all-reduce of one ``--compression`` value, with its inputs."""
    import pycoll
    from pycoll.algorithms.compressed import DEFAULT_COMPRESSED_ALGORITHM
    from pycoll.compression import get_codec

    codec = get_codec(name)
    if codec is None:

        def plain(x: np.ndarray) -> None:
            pycoll.allreduce(x, algorithm=algorithm)

        return benchmark.Variant("none", plain)

    def compressed(x: np.ndarray) -> None:
        pycoll.allreduce(x, algorithm=algorithm, compression=codec)

    plan = DEFAULT_COMPRESSED_ALGORITHM if algorithm == "auto" else algorithm
    return benchmark.Variant(name, compressed, CodecInputs(codec, plan))


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
    compression = getattr(args, "compression", None)
    if compression and list(compression) != ["none"]:
        argv += ["--compression", ",".join(compression)]
    return argv


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pycoll.cli.bench``."""
    return main(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
