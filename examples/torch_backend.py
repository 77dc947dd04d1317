"""torch.distributed on the pycoll backend: every rank all-reduces, all-gathers and broadcasts tensors.

    torchrun --nproc-per-node 4 examples/torch_backend.py
    pycoll run -n 4 examples/torch_backend.py
    mpirun -n 4 python examples/torch_backend.py
    srun -n 4 python examples/torch_backend.py
    pycoll run -n 4 examples/torch_backend.py --compression int8   # compressed all-reduce, error feedback
"""

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist

import pycoll.torch

ap = argparse.ArgumentParser()
ap.add_argument("--compression", default=None, help="fp16, bf16, int8 or int4 (default: none)")
args = ap.parse_args()
# dist.init_process_group("pycoll") does it under torchrun; this also works under the other launchers
pycoll.torch.init_process_group(
    "pycoll", timeout=timedelta(seconds=60), pg_options=pycoll.torch.Options(args.compression)
)
rank, world = dist.get_rank(), dist.get_world_size()

x = torch.full((1 << 20,), float(rank))
dist.all_reduce(x)
expected = world * (world - 1) / 2
tolerance = 0.0 if args.compression is None else 1e-2 * max(1.0, expected)
assert float((x - expected).abs().max()) <= tolerance, f"rank {rank}: got {x[:4]}, expected {expected}"
ranks = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
dist.all_gather(ranks, torch.tensor([rank]))
assert [int(r) for r in ranks] == list(range(world)), ranks
word = torch.tensor([7 * world]) if rank == world - 1 else torch.zeros(1, dtype=torch.int64)
dist.broadcast(word, src=world - 1)
assert int(word) == 7 * world
dist.barrier()
print(f"rank {rank} of {world}: torch backend ok ({dist.get_backend()})", flush=True)
dist.destroy_process_group()
