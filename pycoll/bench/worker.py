"""The rank side of a benchmark job: what one launched rank runs (``run_worker(job)``).

A rank started by ``run_job`` (``python pycoll/bootstrap/spawn.py pycoll.bench.worker --job JSON``),
or by ``pycoll bench --worker`` under a launcher of the user's (``pycoll run``, ``torchrun``,
``mpirun``), calls ``pycoll.init()``, connects the baselines, builds the variants of the job's
collective for every (type, op) sweep, times them interleaved (``report.run_and_report``; with
``Job.link_iters``, counting the bytes its network interface sends per call, ``pycoll.bench.link``),
and rank 0 prints the table (with ``Job.table``; and, on a terminal, a progress line on stderr),
writes the JSON records and the plot.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pycoll.bench.collectives import get_collective
from pycoll.bench.jobs import Job
from pycoll.bench.report import ProgressLine, run_and_report
from pycoll.bench.timing import Result, Variant
from pycoll.bench.variants import auto_variant, make_variants

if TYPE_CHECKING:
    import numpy as np

    from pycoll.bench.baselines import Baseline
    from pycoll.bench.link import LinkCounter
    from pycoll.skew import SkewReport

__all__ = ["exit_rank", "main", "run_worker"]


def _sweeps(job: Job, connected: Sequence[Baseline]) -> tuple[list[tuple[str, list[Variant]]], list[str]]:
    """(dtype, variants) for every type and op of ``job`` (one op, "none", for the all-gather), and notes
    on what was left out. A ``compression`` of "auto" adds ``compression="auto"``
    (``variants.auto_variant``) to each all-reduce sweep."""
    coll = get_collective(job.collective)
    algorithms = list(job.algorithm)
    codecs = [codec for codec in job.compression if codec != "auto"]
    ops = list(job.op) if coll.reduces else ["none"]
    dtypes = list(job.datatype)
    sweeps: list[tuple[str, list[Variant]]] = []
    no_avg = []
    for dtype in dtypes:
        for op in ops:
            if op == "avg" and dtype not in ("float32", "float64", "float16", "bfloat16"):
                no_avg.append(dtype)
                continue
            variants = make_variants(algorithms, codecs, connected, op=op, dtype=dtype, collective=coll.name)
            if "auto" in job.compression:
                variants.append(auto_variant(job.error_budget))
            sweeps.append((dtype, variants))
    notes = []
    if no_avg:
        notes.append(f"avg skipped on {', '.join(no_avg)} (floating types only)")
    skipped = [a for a in algorithms if a not in coll.codec_algorithms]
    if any(c != "none" for c in codecs) and skipped:
        notes.append(
            f"a compressed {coll.name} runs algorithm {coll.codec_plans} only: "
            f"no codec with {', '.join(skipped)}"
        )
    for b in connected:
        missing = b.unsupported(ops, dtypes, coll.name)
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


def _connect_baselines(job: Job, rank: int) -> tuple[list[Baseline], str | None]:
    """The baselines ``job`` names, connected (and the rendezvous file of gloo / nccl, if any)."""
    import pycoll

    wanted = list(job.baseline)
    if not wanted:
        return [], None
    from pycoll.bench import baselines

    # Every rank is past pycoll.init() before a baseline starts: the rank that hosts the rendezvous
    # store serves it from a thread of its own process, and mpi4py's MPI_Init holds the GIL while it
    # waits for every rank, so a rank whose last set-up request (the cost model) was not answered yet
    # would never reach MPI_Init (a hang until the store's timeout).
    pycoll.barrier()
    store_file = _rendezvous_file(rank) if any(name in ("gloo", "nccl") for name in wanted) else None
    return baselines.connect(wanted, rendezvous_file=store_file), store_file


def _title(job: Job, world: int, connected: Sequence[Baseline]) -> str:
    """The table's title: what is timed, on how many ranks, against what."""
    import pycoll

    coll = get_collective(job.collective)
    names = list(job.compression)
    title = f"pycoll {pycoll.__version__}: pycoll.{coll.name}(algorithm={','.join(job.algorithm)}"
    if names != ["none"]:
        title += f", compression={','.join(names)}"
    title += f"), {world} ranks"
    if coll.name != "allreduce":
        title += f"; size = the whole buffer, busbw = algbw * (n-1)/n ({coll.perf})"
    if connected:
        title += "; baselines: " + ", ".join(f"{b.name} ({b.version})" for b in connected)
    if names != ["none"]:
        title += "; algbw/busbw effective (uncompressed bytes / time), error = relative L2 error"
    return title


def _link_counter(job: Job, comm: Any) -> LinkCounter | None:
    """The counters ``job.link_iters`` asks for, on ``job.link_iface`` or the interface pycoll sends
    through (PYCOLL_SOCKET_IFNAME); RuntimeError when they cannot be read."""
    if job.link_iters <= 0:
        return None
    from pycoll.bench import link

    iface = job.link_iface or comm.settings.socket_ifname
    problem = link.why_not(iface)
    if problem:
        raise RuntimeError(f"--link-bytes: {problem}")
    return link.LinkCounter(iface, job.link_iters, share=comm.local_world_size)


def _record_meta(job: Job, comm: Any, versions: Mapping[str, str], link: LinkCounter | None) -> Any:
    """``run_and_report``'s ``record_meta``: what a JSON record carries besides its ``Result``."""
    codec_reprs: dict[str, str] = {}
    if list(job.compression) != ["none"]:
        from pycoll.compression import get_codec

        codec_reprs = {n: repr(get_codec(n)) for n in job.compression if n not in ("none", "auto")}
    coll = get_collective(job.collective)

    def record_meta(result: Result) -> Mapping[str, Any]:
        extra: dict[str, Any] = {"library_version": versions.get(result.library, result.library)}
        if link is not None:
            extra.update(link_iface=link.iface, link_mss=link.mss)
        if result.library == "pycoll":
            extra["fragment_bytes"] = comm.fragment_bytes  # what one transport frame carries at most
        if result.library == "pycoll" and result.codec in codec_reprs:
            extra["codec_algorithm"] = coll.compressed_plan(result.algorithm)
            extra["codecs"] = codec_reprs
        return extra

    return record_meta


def run_worker(job: Job) -> int:
    """One rank of ``job``: form the communicator (and the baselines'), run the sweeps, print (rank 0,
    with ``job.table``), write JSON and the plot (rank 0)."""
    import pycoll

    comm = pycoll.init()
    store_file = None
    try:
        rank, world = comm.rank, comm.world_size
        link = _link_counter(job, comm)
        connected, store_file = _connect_baselines(job, rank)
        sweeps, notes = _sweeps(job, connected)

        def reduce_max(a: np.ndarray) -> np.ndarray:
            pycoll.allreduce(a, op="max")
            return a

        versions = {"pycoll": f"pycoll {pycoll.__version__}", **{b.name: b.version for b in connected}}
        progress = None
        if rank == 0:
            mode = job.progress if job.table else "off"
            progress = ProgressLine(enabled=None if mode == "auto" else mode == "on")
        results = run_and_report(
            None,
            pycoll.barrier,
            reduce_max,
            rank,
            world,
            job,
            title=_title(job, world, connected),
            print_fn=None if job.table else _no_print,
            meta={"host": platform.node()},
            sweeps=sweeps,
            record_meta=_record_meta(job, comm, versions, link),
            progress=progress,
            link=link,
        )
        skew = comm.skew()  # every rank: it is a collective
        if rank == 0 and job.table:
            _print_after_table(job, results, notes, skew, world)
        pycoll.barrier()
    finally:
        if store_file is not None and comm.rank == 0:
            try:
                os.remove(store_file)
            except OSError:
                pass
        pycoll.finalize(comm)
    return 0


def _print_after_table(
    job: Job, results: Sequence[Result], notes: Sequence[str], skew: Any, world: int
) -> None:
    """Rank 0, after the table: the notes, the skew report and the plot."""
    for note in notes:
        print(f"# {note}", flush=True)
    print_skew(skew)
    if job.plot:
        from pycoll.bench import plots

        plots.plot_results(
            results,
            job.plot,
            title=f"{get_collective(job.collective).label} busbw: {world} ranks on {platform.node()}",
            yscale=job.plot_yscale,
        )
        print(f"# plot: {job.plot}", flush=True)


def print_skew(report: SkewReport) -> None:
    """The skew table after the busbw table, every line a comment (``#``), as nccl-tests' parsers expect
    of anything that is not a result row."""
    print("#", flush=True)
    for line in str(report).splitlines():
        print(line if line.startswith("#") else "#" + line[1:], flush=True)


def _no_print(line: str) -> None:
    """``Job.table`` off: rank 0 prints nothing."""


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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pycoll.bench.worker --job JSON`` (what ``jobs.rank_command`` starts): one rank."""
    parser = argparse.ArgumentParser(prog="python -m pycoll.bench.worker")
    parser.add_argument("--job", required=True, help="the job, as Job.to_json() wrote it")
    job = Job.from_json(parser.parse_args(argv).job)
    return exit_rank(run_worker(job))


if __name__ == "__main__":
    sys.exit(main())
