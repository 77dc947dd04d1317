"""Training that goes on through killed ranks and admits replacements: pycoll.elastic.run.

    pycoll run --elastic -n 4 examples/elastic_train.py --kill 2@30 --kill 1@55 --join 70

Every step takes one global batch (the same on every rank, drawn from the step number), and each rank
works on its share of the rows (rank r of W takes rows r, r+W, ...); gradients are summed with one
pycoll all-reduce, so the step's result does not depend on how many ranks share it. ``--kill R@S``: the
rank started as R kills itself (SIGKILL) at step S; the survivors shrink, roll back to the last commit
and go on. ``--join S``: at step S rank 0 starts a new process, which asks to join; at the next commit the
members grow and hand it the model. Every rank prints the same checksum of the final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time

import torch

import pycoll
import pycoll.elastic

D_IN, D_HIDDEN, BATCH = 32, 64, 256


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = torch.sin(x[:, :1] * 2) + 0.1 * x[:, 1:2]
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=30, help="compute time each step pretends to take")
    parser.add_argument("--kill", action="append", default=[], metavar="RANK@STEP")
    parser.add_argument("--join", type=int, action="append", default=[], metavar="STEP")
    parser.add_argument("--join-address", default=None, help=argparse.SUPPRESS)  # set for a replacement
    args = parser.parse_args()
    kills = {int(s): int(r) for r, s in (k.split("@") for k in args.kill)}

    torch.manual_seed(0)  # the same initial model everywhere (a replacement's is overwritten anyway)
    model = torch.nn.Sequential(
        torch.nn.Linear(D_IN, D_HIDDEN), torch.nn.Tanh(), torch.nn.Linear(D_HIDDEN, 1)
    )
    momentum = {f"momentum.{n}": torch.zeros_like(p) for n, p in model.named_parameters()}
    state = {**model.state_dict(), **momentum}  # the tensors themselves: restored and received in place
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))

    if args.join_address is not None:
        comm = pycoll.init(join=args.join_address, timeout=30)
        started_as = -1
    else:
        comm = pycoll.init()
        started_as = comm.rank
    joiners: list[subprocess.Popen] = []

    def step(ctx: pycoll.elastic.StepContext) -> None:
        if kills.get(ctx.step) == started_as:  # a scripted failure
            os.kill(os.getpid(), signal.SIGKILL)
        if (
            ctx.step in args.join
            and ctx.rank == 0
            and started_as >= 0
            and len(joiners) < args.join.count(ctx.step)
        ):
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
            cmd = [sys.executable, __file__, "--join-address", ctx.comm.join_address, *sys.argv[1:]]
            joiners.append(subprocess.Popen(cmd, env=env))
        time.sleep(args.step_ms / 1e3)
        x, y = batch(ctx.step)
        rows = slice(ctx.rank, None, ctx.world_size)
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows], reduction="sum") / BATCH
        loss.backward()
        torch.cat([p.grad.reshape(-1) for p in params], out=flat)
        pycoll.allreduce(flat, comm=ctx.comm)  # the whole batch's gradient, on every rank
        with torch.no_grad():
            offset = 0
            for name, p in model.named_parameters():
                g = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
                m = momentum[f"momentum.{name}"]
                m.mul_(0.9).add_(g)
                p.sub_(0.05 * m)

    def on_change(ctx: pycoll.elastic.StepContext, change: pycoll.elastic.Change) -> None:
        if ctx.rank == 0:
            print(
                f"step {change.step}: {change.kind} {change.world_before} -> {change.world_after} ranks "
                f"in {change.seconds * 1e3:.0f} ms",
                flush=True,
            )

    result = pycoll.elastic.run(
        step, state, steps=args.steps, commit_every=args.commit_every, comm=comm, on_change=on_change
    )
    x, y = batch(args.steps)
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y).item()
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values()))
    c = result.comm
    line = (
        f"rank {c.rank}/{c.world_size} (epoch {c.epoch}): loss {final:.5f}, "
        f"weights {digest.hexdigest()[:16]}, steps redone {result.redone}\n"
    )
    sys.stdout.write(line)  # one write: the ranks share the terminal, lines must not interleave
    sys.stdout.flush()
    for p in joiners:  # a replacement that came too late to be admitted gives up with its join timeout
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    pycoll.finalize()


if __name__ == "__main__":
    main()
