"""Smallest pycoll program: every rank contributes its rank number, everyone gets the sum.

    pycoll run -n 4 examples/allreduce.py
    torchrun --nproc-per-node 4 examples/allreduce.py
    mpirun -n 4 python examples/allreduce.py
"""

import numpy as np

import pycoll

comm = pycoll.init()
rank, world = comm.rank, comm.world_size
x = np.full(1 << 20, rank, dtype=np.float32)
pycoll.allreduce(x)
expected = world * (world - 1) / 2
assert np.all(x == expected), f"rank {rank}: got {x[:4]}, expected {expected}"
pycoll.barrier()
print(f"rank {rank} of {world}: allreduce ok ({expected:g})", flush=True)
pycoll.finalize()
