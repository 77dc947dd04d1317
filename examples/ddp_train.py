"""Train a small MLP with PyTorch DDP, gradients all-reduced (and compressed) by pycoll.

    pycoll run -n 2 examples/ddp_train.py --compression int8
    torchrun --nproc-per-node 2 examples/ddp_train.py --compression int4 --steps 500
    pycoll run -n 2 examples/ddp_train.py --compression powersgd --powersgd-rank 4
    pycoll run -n 2 examples/ddp_train.py --compression ddp        # DDP's own (gloo) all-reduce

The data set is synthetic and seeded (Gaussian clusters with overlapping classes), the model is built
from the same seed on every rank, and every step draws one global batch from a seeded generator; rank r
trains on slice r of it. Rank 0 prints the loss over the whole data set every ``--log-every`` steps
and at the end. The parameters are checked to be bitwise identical on every rank at the end.

``--compression``: ``ddp`` (no hook: DDP's default all-reduce over gloo), ``none`` (pycoll's
uncompressed ``allreduce_hook``), ``fp16``, ``bf16``, ``int8``, ``int4`` (``allreduce_hook`` with that
codec; error feedback unless ``--no-error-feedback``), ``powersgd`` (``powersgd_hook``, rank
``--powersgd-rank``).

Process group: gloo. Under torchrun, ``env://`` as usual. Under ``pycoll run``, MASTER_ADDR/MASTER_PORT
name the launcher's own (pycoll) rendezvous store, which torch cannot speak to; the ranks (one host) meet
through a torch FileStore named after the launcher's pid and port instead. Either way, pycoll's
communicator is then formed from the process group (``pycoll.torch.init_from_process_group``), through
torch's store.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll
import pycoll.torch as pt
from pycoll.bootstrap import launcher_hosts_store

COMPRESSIONS = ("ddp", "none", "fp16", "bf16", "int8", "int4", "powersgd")


def synthetic_classification(
    n: int = 8192, features: int = 32, classes: int = 8, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Overlapping Gaussian clusters: the same tensors for the same arguments, on every rank and run."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + 2.0 * torch.randn(n, features, generator=g)
    return x, y


def make_model(features: int = 32, classes: int = 8, hidden: int = 128, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def init_process_group(timeout: float = 120.0) -> None:
    """gloo process group from the launcher's environment (torchrun, ``pycoll run``, or none: 1 rank)."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    delta = timedelta(seconds=timeout)
    if "MASTER_PORT" not in os.environ:  # plain `python examples/ddp_train.py`: one rank
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=delta)
        return
    if not launcher_hosts_store():  # torchrun (or MASTER_* set by hand): torch's own rendezvous
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=delta)
        return
    # pycoll run: the store at MASTER_PORT is pycoll's own, which torch cannot talk to. The ranks share
    # one host, so they meet through a FileStore named after the launcher (our parent) and its port:
    # the same for every rank of this job, different for every job, and no server thread whose exit
    # could race the other ranks' (a torch TCPStore hosted by rank 0 sometimes aborts at exit).
    path = os.path.join(tempfile.gettempdir(), f"pycoll-ddp-train-{os.getppid()}-{os.environ['MASTER_PORT']}")
    store = dist.FileStore(path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=delta)


def register_hook(
    ddp: DDP,
    compression: str,
    comm: pycoll.Communicator,
    *,
    error_feedback: bool = True,
    powersgd_rank: int = 4,
) -> object:
    """Registers the communication hook ``compression`` names on ``ddp``; returns its state (or None)."""
    if compression == "ddp":
        return None
    if compression == "powersgd":
        state: object = pt.PowerSGDState(
            comm=comm, rank=powersgd_rank, start_iter=2, use_error_feedback=error_feedback
        )
        ddp.register_comm_hook(state, pt.powersgd_hook)
        return state
    state = pt.HookState(comm=comm, compression=compression, error_feedback=error_feedback)
    ddp.register_comm_hook(state, pt.allreduce_hook)
    return state


def full_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def params_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes: equal on two ranks only if their parameters are bitwise equal."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(
    compression: str,
    comm: pycoll.Communicator,
    *,
    steps: int = 300,
    error_feedback: bool = True,
    powersgd_rank: int = 4,
    batch_size: int = 64,
    lr: float = 0.05,
    seed: int = 0,
    log_every: int = 0,
) -> tuple[float, str]:
    """Trains the MLP with DDP on the default process group; returns (final loss over the whole data
    set, ``params_digest``). SGD with momentum 0.9 and a cosine learning-rate decay to 0, so the final
    loss is that of a settled model rather than of wherever the last noisy step left it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = synthetic_classification(seed=seed)
    model = DDP(make_model(seed=seed))
    register_hook(model, compression, comm, error_feedback=error_feedback, powersgd_rank=powersgd_rank)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    batches = torch.Generator().manual_seed(seed + 1)
    for step in range(1, steps + 1):
        # One global batch per step, the same on every rank; rank r trains on slice r of it.
        idx = torch.randint(0, x.shape[0], (world * batch_size,), generator=batches)
        mine = idx[rank * batch_size:(rank + 1) * batch_size]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
        sched.step()
        if rank == 0 and log_every > 0 and step % log_every == 0 and step != steps:
            print(f"step {step:5d}  loss {full_loss(model.module, x, y):.4f}", flush=True)
    return full_loss(model.module, x, y), params_digest(model.module)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compression", choices=COMPRESSIONS, default="int8")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--no-error-feedback", action="store_true", help="compress without error feedback")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64, help="samples per rank per step (default 64)")
    ap.add_argument("--lr", type=float, default=0.05, help="peak learning rate (cosine decay to 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50, help="steps between loss lines (0: none)")
    args = ap.parse_args(argv)

    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    comm = pt.init_from_process_group()  # pycoll's communicator, through the process group's store

    if rank == 0:
        ef = ""
        if args.compression not in ("ddp", "none"):
            ef = " without error feedback" if args.no_error_feedback else " with error feedback"
        x, y = synthetic_classification(seed=args.seed)
        print(f"ddp_train: {world} rank(s), compression {args.compression}{ef}, {args.steps} steps, "
              f"initial loss {full_loss(make_model(seed=args.seed), x, y):.4f}", flush=True)
    start = time.perf_counter()
    loss, digest = train(
        args.compression, comm, steps=args.steps, error_feedback=not args.no_error_feedback,
        powersgd_rank=args.powersgd_rank, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        log_every=args.log_every,
    )
    elapsed = time.perf_counter() - start

    # DDP keeps the ranks' parameters identical: check it bitwise by comparing digests.
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, digest)
    same = all(d == digest for d in digests)
    if rank == 0:
        ms = 1e3 * elapsed / max(args.steps, 1)
        print(f"final loss {loss:.4f}  ({args.steps} steps, {ms:.2f} ms/step, "
              f"parameters {'bitwise identical' if same else 'DIFFER'} on all ranks)", flush=True)
    pycoll.finalize(comm)
    # No dist.destroy_process_group(): torch 2.13's destroy_process_group() on a gloo group aborts the
    # process now and then (std::terminate in its shutdown, about one run in three on the development VM);
    # exiting without it releases the group just as well.
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
