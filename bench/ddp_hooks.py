"""Time per DDP training step with each communication hook, against DDP's default (gloo) all-reduce.

    python bench/ddp_hooks.py                        # 2 ranks (started with `pycoll run`), 5 rounds
    python bench/ddp_hooks.py --ranks 4 --rounds 7 --hidden 2048
    pycoll run -n 2 bench/ddp_hooks.py               # the same, launched by hand (or with torchrun)

The model is an MLP big enough that the gradient all-reduce matters (default: 3 hidden layers of 1024,
about 2.6M parameters, 10.5 MB of float32 gradients per step), trained with SGD on a fixed random batch.
Every hook gets its own DDP model and optimizer, all made up front; then in each round every hook runs
``--warmup`` steps and ``--steps`` timed steps, one hook after the other, the order rotated from round
to round (these VMs change speed every few minutes: only figures from the same round compare). A step
is zero_grad + forward + backward (with the hook's all-reduce, which DDP overlaps with backward) +
optimizer step; its time is the slowest rank's. The table gives each hook's median step time over all
rounds and the median over rounds of its per-round ratio to the default DDP hook. ``no_sync`` (no
communication at all) is the floor: what the step costs without any all-reduce.

Hooks: ``ddp`` (none registered: DDP's allreduce over gloo), ``none`` (pycoll ``allreduce_hook``
uncompressed), ``fp16``, ``bf16`` (without error feedback), ``int8``, ``int4`` (with error feedback),
``powersgd`` (rank ``--powersgd-rank``, error feedback), ``no_sync``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pycoll.bench import jobs

HOOKS = ("ddp", "none", "fp16", "bf16", "int8", "int4", "powersgd", "no_sync")
LABELS = {
    "ddp": "DDP default (gloo allreduce)",
    "none": "pycoll allreduce_hook, uncompressed",
    "fp16": "pycoll fp16",
    "bf16": "pycoll bf16",
    "int8": "pycoll int8 + EF",
    "int4": "pycoll int4 + EF",
    "powersgd": "pycoll PowerSGD r{r} + EF",
    "no_sync": "no communication (no_sync)",
}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"


def _example() -> Any:
    """examples/ddp_train.py (its process-group set-up under either launcher, and register_hook)."""
    spec = importlib.util.spec_from_file_location("_pycoll_example_ddp_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def mlp(features: int, hidden: int, layers: int) -> Any:
    """The benchmark's model (seeded, so every rank and every variant starts from the same weights):
    ``features`` -> ``layers`` hidden layers of ``hidden`` (ReLU) -> 10. bench/torch_backend.py uses it."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    parts: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        parts += [nn.Linear(hidden, hidden), nn.ReLU()]
    parts.append(nn.Linear(hidden, 10))
    return nn.Sequential(*parts)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="ranks to start (without a launcher)")
    ap.add_argument("--hooks", default=",".join(HOOKS), help=f"comma-separated, of {', '.join(HOOKS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per hook per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them (first round: +5)")
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=3, help="hidden layers")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / local ranks)")
    return ap


def _launch(argv: list[str], ranks: int) -> int:
    """Not under a launcher: start ``ranks`` copies of this script with ``pycoll run``."""
    cmd = jobs.script_command(ranks, str(Path(__file__).resolve()), argv)
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
    unknown = [h for h in hooks if h not in HOOKS]
    if unknown:
        _parser().error(f"unknown hook(s) {', '.join(unknown)}; choose from {', '.join(HOOKS)}")
    if "ddp" not in hooks:
        hooks.insert(0, "ddp")  # the reference every ratio is taken against
    if "RANK" not in os.environ:
        return _launch(argv, args.ranks)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pycoll
    import pycoll.torch as pt

    ex = _example()
    ex.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    comm = pt.init_from_process_group()

    def make_model() -> nn.Module:
        return mlp(args.features, args.hidden, args.layers)

    runs: dict[str, tuple[DDP, torch.optim.Optimizer]] = {}
    for name in hooks:
        model = DDP(make_model())
        if name != "no_sync":
            ex.register_hook(model, name, comm, error_feedback=name in ("int8", "int4", "powersgd"),
                             powersgd_rank=args.powersgd_rank)
        runs[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    n_params = sum(p.numel() for p in runs[hooks[0]][0].parameters())
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch_size, args.features, generator=g)
    y = torch.randint(0, 10, (args.batch_size,), generator=g)

    def step(name: str) -> float:
        model, opt = runs[name]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        if name == "no_sync":
            with model.no_sync():
                F.cross_entropy(model(x), y).backward()
        else:
            F.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - t0

    # times[name][round] = this rank's step times
    times: dict[str, list[list[float]]] = {name: [] for name in hooks}
    for r in range(args.rounds):
        order = hooks[r % len(hooks):] + hooks[: r % len(hooks)]
        for name in order:
            for _ in range(args.warmup + (5 if r == 0 else 0)):
                step(name)
            dist.barrier()
            times[name].append([step(name) for _ in range(args.steps)])

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        # Per round and hook: the median over steps of the slowest rank's step time.
        med = {
            name: [
                statistics.median(max(t[name][r][s] for t in gathered) for s in range(args.steps))
                for r in range(args.rounds)
            ]
            for name in hooks
        }
        print(f"# DDP step time, {world} ranks on one host (pycoll: shared memory; gloo: TCP loopback), "
              f"{torch.get_num_threads()} torch thread(s) per rank, "
              f"{args.rounds} rounds x {args.steps} steps")
        print(f"# MLP {args.features}-{'-'.join([str(args.hidden)] * args.layers)}-10: {n_params / 1e6:.2f}M "
              f"parameters, {4 * n_params / 1e6:.1f} MB of float32 gradients per step; batch "
              f"{args.batch_size} per rank; SGD")
        print()
        print("| hook | ms / step (median) | × default DDP (median of per-round ratios) | range of ratios |")
        print("|---|---:|---:|---:|")
        for name in hooks:
            ratios = [m / d for m, d in zip(med[name], med["ddp"])]
            label = LABELS[name].format(r=args.powersgd_rank)
            all_steps = statistics.median(med[name])
            print(f"| {label} | {1e3 * all_steps:.1f} | {statistics.median(ratios):.2f}× | "
                  f"{min(ratios):.2f}–{max(ratios):.2f} |")
    dist.barrier()
    runs.clear()
    pycoll.finalize(comm)
    # No dist.destroy_process_group(): torch 2.13's destroy_process_group() on a gloo group aborts the
    # process now and then (std::terminate in its shutdown, about one run in three on the development VM);
    # exiting without it releases the group just as well.
    return 0


if __name__ == "__main__":
    sys.exit(main())
