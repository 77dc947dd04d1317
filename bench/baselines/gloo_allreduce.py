"""Gloo baseline: ``torch.distributed.all_reduce`` (gloo backend, sum) on CPU float32 tensors that share
memory with the numpy arrays timed by the same loop as ``pycoll bench`` (pycoll/benchmark.py).

Run with any launcher that sets the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)::

    torchrun --standalone --nproc-per-node 4 bench/baselines/gloo_allreduce.py --json gloo.jsonl
    pycoll run -n 4 bench/baselines/gloo_allreduce.py --json gloo.jsonl

Flags are those of ``pycoll bench`` (-b -e -f -n -w -c --json). Needs CPU torch (torch==2.13.0).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from datetime import timedelta

import numpy as np
from _common import load_benchmark

bm = load_benchmark()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    bm.add_sweep_arguments(parser)
    parser.add_argument("--timeout", type=float, default=300.0, help="gloo timeout per collective (s)")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=args.timeout)
    if os.environ.get("PYCOLL_LAUNCHER_STORE") == "1":
        # `pycoll run` itself listens on MASTER_PORT with pycoll's own store protocol, so torch cannot
        # host its TCPStore there: meet through a file instead, named after the launcher (our parent)
        # and its port, which are the same for every rank of this job and differ between jobs.
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        path = os.path.join(
            tempfile.gettempdir(), f"pycoll-gloo-baseline-{os.getppid()}-{os.environ['MASTER_PORT']}"
        )
        store = dist.FileStore(path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    # The sweep hands allreduce the same array for every iteration of a size: wrap it once, so the
    # timed region holds the collective only, not torch.from_numpy.
    cached: list[tuple[np.ndarray, torch.Tensor]] = []

    def allreduce(x: np.ndarray) -> None:
        if not cached or cached[0][0] is not x:
            cached[:] = [(x, torch.from_numpy(x))]
        dist.all_reduce(cached[0][1], op=dist.ReduceOp.SUM)

    def reduce_max(a: np.ndarray) -> np.ndarray:
        dist.all_reduce(torch.from_numpy(a), op=dist.ReduceOp.MAX)
        return a

    def barrier() -> None:
        dist.barrier()

    title = f"Gloo (torch {torch.__version__}): torch.distributed.all_reduce, {world} ranks"
    meta = {
        "library": "gloo",
        "library_version": f"torch {torch.__version__}",
        "algorithm": "default",
        "host": platform.node(),
    }
    bm.run_and_report(allreduce, barrier, reduce_max, rank, world, args, title=title, meta=meta)
    # No dist.destroy_process_group(): torch 2.13's destroy_process_group() on a gloo group aborts the
    # process now and then (std::terminate in its shutdown, about one run in three on the development VM);
    # exiting without it releases the group just as well.
    return 0


if __name__ == "__main__":
    sys.exit(main())
