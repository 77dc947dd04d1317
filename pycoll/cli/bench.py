"""``pycoll bench``: an nccl-tests-style all-reduce benchmark of pycoll on N local ranks.

    pycoll bench --ranks 4                        # 4 KiB .. 64 MiB float32 sum, results checked
    pycoll bench --ranks 2 -b 1M -e 1M -n 50 --algorithm ring --json out.jsonl
    pycoll bench --ranks 2 -b 1M -e 64M -f 4 --compression none,fp16,bf16,int8,int4
    pycoll bench --ranks 2 -o all -d all -b 4K -e 64K       # every op on every type
    pycoll bench --ranks 4 --algorithm ring,tree,direct --baseline gloo,mpi --plot busbw.png

Flags (nccl-tests' all_reduce_perf names where it has them):

    -b/-e/-f SIZE     smallest / largest size, multiplier (4K, 64M, 2)
    -n/-w N           timed / warm-up iterations per size (auto: fewer for larger sizes)
    -c 0|1            check every result (1)
    -o OP             sum prod min max avg, a comma list, or all (sum)
    -d TYPE           float half bfloat16 double int32 int64 int8 uint8, a comma list, or all (float)
    --algorithm A     auto ring tree direct hierarchical, or a comma list (auto)
    --compression C   none fp16 bf16 int8 int4, or a comma list (none); float + sum/avg only
    --baseline B      gloo mpi nccl, or a comma list: the other library timed in the same ranks
    --json FILE       one JSON object per row (below)
    --plot FILE.png   busbw against size, one line per series (needs matplotlib)

Every (algorithm x codec) pair is a variant, and so is every baseline; all are timed interleaved, size
by size (A B C, A B C...), so their ratios come from the same minutes of a noisy machine. With several
ops or types, each (type, op) is one such sweep, one after the other (avg is skipped on integer types,
and a baseline skips what it cannot do: MPI has no bfloat16 and no avg).

Results are checked exactly: for each op and type the inputs are chosen so that the result is exact in
that type whatever order the ranks add in, and is compared bit for bit with a closed form
(pycoll/benchmark.py, ``exact_pattern``). With a codec the inputs are Gaussian (mean 0, std 1,
rank-dependent), ``error`` is the relative L2 error ||out - exact|| / ||exact|| against the float64
exact sum (worst iteration), ``#wrong`` counts elements outside the codec's derived error bound
(pycoll/compression/bounds.py), and algbw / busbw are *effective* (uncompressed bytes over the time).

JSON records (``--json``; one per row, what ``benchmark.result_to_dict`` writes): ``library`` (pycoll,
gloo, mpi, nccl), ``algorithm`` (an ``--algorithm`` name; "default" for a baseline), ``codec`` ("none"
or the codec), ``label`` (the series: ``pycoll/ring``, ``pycoll/direct/int8``, ``gloo``), ``bytes``,
``count``, ``dtype``, ``redop``, ``world``, ``time_us`` (median over iterations of the slowest rank's
time), ``times_us`` (those per-iteration slowest-rank times, in the order run), ``algbw_GBps``,
``busbw_GBps``, ``wrong``, ``rel_error``, ``iters``, ``warmup``, ``library_version``, ``host``;
compressed pycoll rows also ``codec_algorithm`` (the plan that ran) and ``codecs``.

Without ``--worker`` this process only launches: with ``pycoll run``'s launcher it starts ``--ranks``
local rank processes that each run ``python -m pycoll.cli.bench --worker ...`` (with ``--baseline mpi``
``mpirun [--allow-run-as-root] --oversubscribe -n N`` starts them instead), waits for them, and if one
fails exits non-zero naming it. A missing baseline library or matplotlib is reported in one line before
anything starts. With ``--worker`` the process is one rank of a job some launcher already started
(this one, ``pycoll run``, ``torchrun`` or ``mpirun``): it calls ``pycoll.init()``, runs the sweeps of
``pycoll.benchmark`` and rank 0 prints the table (and, on a terminal, a progress line on stderr).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pycoll import benchmark  # numpy-free at import time; numpy loads when the sweep runs
from pycoll.bootstrap.spawn import module_command

if TYPE_CHECKING:
    import numpy as np

    from pycoll.baselines import Baseline

__all__ = [
    "ALGORITHMS",
    "BASELINES",
    "COMPRESSIONS",
    "CodecInputs",
    "add_parser",
    "build_parser",
    "check_arguments",
    "configure_parser",
    "launch_command",
    "main",
    "make_variants",
    "parse_algorithms",
    "parse_baselines",
    "parse_compression",
    "parse_datatypes",
    "parse_ops",
    "run_worker",
    "worker_arguments",
]

ALGORITHMS = ("auto", "ring", "tree", "direct", "hierarchical")
#: ``--compression`` values: "none" and pycoll.compression.CODEC_NAMES (spelled out here so that
#: ``pycoll --help`` does not import numpy; a unit test keeps the two in step).
COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int4")
#: ``--baseline`` values (pycoll.baselines.BASELINES; a unit test keeps the two in step).
BASELINES = ("gloo", "mpi", "nccl")
#: ops a codec takes.
CODEC_OPS = ("sum", "avg")
DEFAULT_RANKS = 4
#: Seed of the Gaussian inputs of compressed runs.
INPUT_SEED = 0
#: Elements judged at a time in compressed runs (about; whole codec blocks).
_JUDGE_CHUNK = 1 << 16


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
    return _parse_list(text, benchmark.REDOPS, "op", all_=benchmark.REDOPS)


def parse_datatypes(text: str) -> list[str]:
    """nccl-tests' ``-d``: 'float', 'half,bfloat16' or 'all' -> numpy dtype names ('float32'...).

    nccl-tests' names (float half bfloat16 double int32 int64 int8 uint8) and numpy's (float32,
    float16, float64) are both taken."""
    aliases = {**benchmark.DATATYPES, **{v: v for v in benchmark.DATATYPES.values()}}
    names = _parse_list(text, tuple(aliases), "datatype", all_=tuple(benchmark.DATATYPES))
    return list(dict.fromkeys(aliases[name] for name in names))


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
        help="all-reduce benchmark on N local ranks",
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


def _preflight(args: argparse.Namespace, launcher: bool) -> str | None:
    """What this machine lacks for ``args`` (a baseline's library, matplotlib), in one line."""
    from pycoll import baselines, plotting

    for name in _listed(args, "baseline", []):
        if name == "mpi" and not launcher:
            problem = None if baselines._has_module("mpi4py") else baselines.unavailable("mpi")
        else:
            problem = baselines.unavailable(name, args.ranks if launcher else None)
        if problem:
            return problem
    if getattr(args, "plot", None) and not plotting.available():
        return plotting.MISSING
    if "bfloat16" in _listed(args, "datatype", []) and not baselines._has_module("ml_dtypes"):
        return "-d bfloat16 needs the ml_dtypes package: pip install ml_dtypes"
    return None


def launch_command(args: argparse.Namespace) -> list[str]:
    """The command that starts the ranks: ``pycoll.cli.bench --worker ...`` of the pycoll running this
    (``module_command``: never a source tree in the current directory), under ``mpirun`` with
    ``--baseline mpi``, else started ``--ranks`` times by ``pycoll run``'s launcher."""
    argv = module_command("pycoll.cli.bench", ["--worker", *worker_arguments(args)])
    if "mpi" in _listed(args, "baseline", []):
        from pycoll.baselines import mpirun_command

        return mpirun_command(args.ranks, argv)
    return argv


def main(args: argparse.Namespace) -> int:
    """Run ``pycoll bench`` with parsed ``args``; returns the process exit code."""
    if getattr(args, "calibrate", False) and not args.worker:
        return _calibrate(args)
    problem = check_arguments(args)
    if problem:
        print(f"pycoll bench: error: {problem}", file=sys.stderr)
        return 2
    problem = _preflight(args, launcher=not args.worker)
    if problem:
        print(f"pycoll bench: {problem}", file=sys.stderr)
        return 2
    if args.worker:
        return exit_rank(run_worker(args))
    if getattr(args, "progress", "auto") == "auto":
        args.progress = "on" if _isatty(sys.stderr) else "off"  # the ranks' stderr may be a pipe
    cmd = launch_command(args)
    if "mpi" in _listed(args, "baseline", []):
        import subprocess

        try:
            return subprocess.call(cmd)
        except KeyboardInterrupt:  # mpirun got the terminal's SIGINT too and stops the ranks
            return 130
    from pycoll.cli.run import launch

    return launch(args.ranks, cmd)


def _calibrate(args: argparse.Namespace) -> int:
    """``--calibrate``: pycoll.tuning.calibrate on world sizes 2..--ranks, saved to this host's file."""
    from pycoll.tuning import calibrate

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
    print(f"saved to {calibrate.save_model(model, report)} (PYCOLL_TUNING_FILE overrides; =none ignores it)")
    return 0


def exit_rank(code: int) -> int:
    """Return ``code``, or, in a rank that formed a torch process group (the gloo and nccl baselines),
    end the process with it at once: torch 2.13's gloo threads sometimes abort the interpreter's
    teardown ("terminate called without an active exception", SIGABRT) after everything is done, which
    the launcher would report as a failed rank. Called after pycoll is finalized and the output written;
    stdout and stderr are flushed first, and MPI is finalized (mpirun counts a rank that exits without
    MPI_Finalize as failed; mpi4py would otherwise do it at exit)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return code
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# Variants


def make_variants(
    algorithms: Sequence[str] = ("auto",),
    codecs: Sequence[str] = ("none",),
    baselines: Sequence[str | Baseline] = (),
    *,
    op: str = "sum",
    dtype: Any = "float32",
) -> list[benchmark.Variant]:
    """The variants one sweep of ``pycoll bench`` times, interleaved: pycoll's all-reduce for every
    (algorithm x codec), algorithm-major, then each baseline that can reduce ``op`` on ``dtype``.

    Each ``Variant`` names its series: ``library`` ("pycoll" or the baseline), ``algorithm`` (the
    pycoll algorithm as given, "default" for a baseline), ``codec`` ("none" or the codec), ``op``;
    ``label`` joins them (``pycoll/ring``, ``pycoll/direct/int8``, ``gloo``). ``baselines`` are
    ``pycoll.baselines.Baseline`` objects (``pycoll.baselines.connect``) or names, connected here
    (then every rank must call this alike). A codec on a type or op it does not take raises ValueError.
    Creating pycoll's variants needs no communicator; running them does (``pycoll.init()``)."""
    dt_name = benchmark.resolve_dtype(dtype).name
    if op not in benchmark.REDOPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(benchmark.REDOPS)}")
    for algorithm in algorithms:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    variants = [_variant(codec, algorithm, op) for algorithm in algorithms for codec in codecs]
    if any(codec != "none" for codec in codecs) and (dt_name != "float32" or op not in CODEC_OPS):
        raise ValueError(f"compression works on float32 with op sum or avg, not {dt_name} {op}")
    names = [b for b in baselines if isinstance(b, str)]
    connected = iter(_connect(names) if names else [])
    for b in baselines:
        baseline = next(connected) if isinstance(b, str) else b
        variant = baseline.variant(op, dt_name)
        if variant is not None:
            variants.append(variant)
    return variants


def _connect(names: Sequence[str]) -> list[Baseline]:
    from pycoll import baselines

    return baselines.connect(names)


def _variant(name: str, algorithm: str, op: str = "sum") -> benchmark.Variant:
    """pycoll's all-reduce with one ``--compression`` value and ``algorithm``, with its inputs."""
    import pycoll
    from pycoll.algorithms.compressed import DEFAULT_COMPRESSED_ALGORITHM
    from pycoll.api import auto_compressed_algorithm
    from pycoll.compression import get_codec

    codec = get_codec(name)
    if codec is None:

        def plain(x: np.ndarray) -> None:
            pycoll.allreduce(x, op, algorithm=algorithm)

        return benchmark.Variant("none", plain, library="pycoll", algorithm=algorithm, op=op)

    def compressed(x: np.ndarray) -> None:
        pycoll.allreduce(x, op, algorithm=algorithm, compression=codec)

    plan = algorithm
    if algorithm == "auto":  # the plan that runs decides the error bound
        initialized = pycoll.is_initialized()
        plan = auto_compressed_algorithm(pycoll.get_comm()) if initialized else DEFAULT_COMPRESSED_ALGORITHM
    inputs = CodecInputs(codec, plan, op=op)
    return benchmark.Variant(name, compressed, inputs, library="pycoll", algorithm=algorithm, op=op)


# ---------------------------------------------------------------------------------------------------
# The rank side.


def _sweeps(
    args: argparse.Namespace, connected: Sequence[Baseline]
) -> tuple[list[tuple[str, list[benchmark.Variant]]], list[str]]:
    """(dtype, variants) for every type and op of ``args``, and notes on what was left out."""
    algorithms = _listed(args, "algorithm", ["auto"])
    codecs = _listed(args, "compression", ["none"])
    ops = _listed(args, "op", ["sum"])
    dtypes = _listed(args, "datatype", ["float32"])
    sweeps: list[tuple[str, list[benchmark.Variant]]] = []
    no_avg = []
    for dtype in dtypes:
        for op in ops:
            if op == "avg" and dtype not in ("float32", "float64", "float16", "bfloat16"):
                no_avg.append(dtype)
                continue
            sweeps.append((dtype, make_variants(algorithms, codecs, connected, op=op, dtype=dtype)))
    notes = []
    if no_avg:
        notes.append(f"avg skipped on {', '.join(no_avg)} (floating types only)")
    for b in connected:
        missing = b.unsupported(ops, dtypes)
        if missing:
            notes.append(f"{b.name} skipped {', '.join(missing)} (not supported)")
    return sweeps, notes


def _rendezvous_file(rank: int) -> str:
    """A fresh file name for the baselines' torch FileStore, picked by rank 0 and broadcast over
    pycoll, so every rank meets in it whatever launcher started them."""
    import tempfile
    import uuid

    import numpy as np

    import pycoll

    buf = np.zeros(512, dtype=np.uint8)
    if rank == 0:
        path = os.path.join(tempfile.gettempdir(), f"pycoll-bench-{uuid.uuid4().hex}").encode()
        buf[: len(path)] = np.frombuffer(path, dtype=np.uint8)
    pycoll.broadcast(buf, 0)
    return bytes(buf).rstrip(b"\0").decode()


def run_worker(args: argparse.Namespace) -> int:
    """One rank: form the communicator (and the baselines'), run the sweeps, print (rank 0), write
    JSON and the plot (rank 0)."""
    import pycoll

    comm = pycoll.init()
    store_file = None
    try:
        rank, world = comm.rank, comm.world_size
        algorithms = _listed(args, "algorithm", ["auto"])
        names = _listed(args, "compression", ["none"])
        wanted = _listed(args, "baseline", [])
        connected: list[Baseline] = []
        if wanted:
            from pycoll import baselines

            if any(name in ("gloo", "nccl") for name in wanted):
                store_file = _rendezvous_file(rank)
            connected = baselines.connect(wanted, rendezvous_file=store_file)
        sweeps, notes = _sweeps(args, connected)

        def reduce_max(a: np.ndarray) -> np.ndarray:
            pycoll.allreduce(a, op="max")
            return a

        version = pycoll.__version__
        versions = {"pycoll": f"pycoll {version}", **{b.name: b.version for b in connected}}
        title = f"pycoll {version}: pycoll.allreduce(algorithm={','.join(algorithms)}"
        if names != ["none"]:
            title += f", compression={','.join(names)}"
        title += f"), {world} ranks"
        if connected:
            title += "; baselines: " + ", ".join(f"{b.name} ({b.version})" for b in connected)
        if names != ["none"]:
            title += "; algbw/busbw effective (uncompressed bytes / time), error = relative L2 error"
        meta: dict[str, Any] = {"host": platform.node()}
        codec_reprs: dict[str, str] = {}
        if names != ["none"]:
            from pycoll.compression import get_codec

            codec_reprs = {name: repr(get_codec(name)) for name in names if name != "none"}

        def record_meta(result: benchmark.Result) -> Mapping[str, Any]:
            extra: dict[str, Any] = {"library_version": versions.get(result.library, result.library)}
            if result.library == "pycoll" and result.codec != "none":
                from pycoll.api import auto_compressed_algorithm

                auto = result.algorithm == "auto"
                extra["codec_algorithm"] = auto_compressed_algorithm(comm) if auto else result.algorithm
                extra["codecs"] = codec_reprs
            return extra

        progress = None
        if rank == 0:
            mode = getattr(args, "progress", "auto")
            progress = benchmark.ProgressLine(enabled=None if mode == "auto" else mode == "on")
        results = benchmark.run_and_report(
            None,
            pycoll.barrier,
            reduce_max,
            rank,
            world,
            args,
            title=title,
            meta=meta,
            sweeps=sweeps,
            record_meta=record_meta,
            progress=progress,
        )
        if rank == 0:
            for note in notes:
                print(f"# {note}", flush=True)
            if getattr(args, "plot", None):
                from pycoll import plotting

                plotting.plot_results(
                    results,
                    args.plot,
                    title=f"all-reduce busbw: {world} ranks on {platform.node()}",
                    yscale=getattr(args, "plot_yscale", "linear"),
                )
                print(f"# plot: {args.plot}", flush=True)
        pycoll.barrier()
    finally:
        if store_file is not None and comm.rank == 0:
            try:
                os.remove(store_file)
            except OSError:
                pass
        pycoll.finalize(comm)
    return 0


class CodecInputs(benchmark.Inputs):
    """Inputs of a compressed run: Gaussian, rank-dependent (``benchmark.gaussian_input``); a result is
    judged against the float64 exact sum, every rank rebuilding every rank's input: elements outside
    the codec's derived bound (``pycoll.compression.bounds.SumBound``) are wrong, and the relative L2
    error is reported. With ``op="avg"`` the result times the world size is judged as the sum."""

    def __init__(self, codec: Any, algorithm: str, seed: int = INPUT_SEED, *, op: str = "sum") -> None:
        if op not in CODEC_OPS:
            raise ValueError(f"a codec takes op sum or avg, got {op!r}")
        self.codec = codec
        self.algorithm = algorithm
        self.seed = seed
        self.op = op

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
        scale = world if self.op == "avg" else 1

        def judge(out: np.ndarray) -> tuple[int, float | None]:
            if verdict[0] is not None and np.array_equal(out, last):
                return verdict[0]
            wrong, squares = 0, 0.0
            for (lo, hi), sum_bound in zip(chunks, bounds):
                part = out[lo:hi].astype(np.float64) * scale  # as the sum
                err = np.abs(part - exact[lo:hi])
                bound = sum_bound.bound(part.astype(np.float32))
                wrong += int(np.count_nonzero(~(err <= bound)))  # NaN is wrong
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
        ",".join(_listed(args, "algorithm", ["auto"])),
    ]
    if args.iters is not None:
        argv += ["-n", str(args.iters)]
    if args.warmup_iters is not None:
        argv += ["-w", str(args.warmup_iters)]
    if args.json:
        argv += ["--json", os.path.abspath(args.json)]
    ops = _listed(args, "op", ["sum"])
    if ops != ["sum"]:
        argv += ["-o", ",".join(ops)]
    dtypes = _listed(args, "datatype", ["float32"])
    if dtypes != ["float32"]:
        argv += ["-d", ",".join(dtypes)]
    baselines = _listed(args, "baseline", [])
    if baselines:
        argv += ["--baseline", ",".join(baselines)]
    if getattr(args, "plot", None):
        argv += ["--plot", os.path.abspath(args.plot), "--plot-yscale", args.plot_yscale]
    progress = getattr(args, "progress", "auto")
    if progress != "auto":
        argv += ["--progress", progress]
    compression = _listed(args, "compression", ["none"])
    if compression != ["none"]:
        argv += ["--compression", ",".join(compression)]
    return argv


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pycoll.cli.bench``."""
    return main(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
