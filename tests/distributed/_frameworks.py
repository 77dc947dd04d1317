"""Rank bodies of test_torch_frameworks.py: DDP, FSDP2, PyTorch Lightning and Hugging Face Accelerate
training on a torch.distributed backend given by name ("pycoll", or "gloo" as the reference).

Every body runs as ``fn(comm, rank, world, ...)`` on the fresh rank processes of a ``harness`` pool
(``run_ranks``: a pool of its own, so no process group, Lightning or Accelerate state outlives a test).
The pool's pycoll communicator is used only to hand rank 0's TCPStore port (port 0: kernel-chosen) to
the other ranks; torch.distributed meets through that store. Results (parameter bytes, losses) go back
to the test process, which compares them.

    python tests/distributed/_frameworks.py      # the DDP final-loss table (gloo, pycoll, int8 + EF)

No ``dist.destroy_process_group()``: torch 2.13's gloo teardown now and then aborts the process (see
examples/ddp_train.py); the pool's processes exit after the test and release everything.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from datetime import timedelta
from typing import Any

#: Deadline of every torch.distributed operation in the bodies (store, process groups).
PG_TIMEOUT_S = 60.0
#: Kept alive until the process exits: rank 0's TCPStore server must outlive every rank's use of it.
_KEEP: list[Any] = []


# ---- set-up ----------------------------------------------------------------------------------------
def _tcp_store(comm: Any, rank: int, world: int) -> tuple[Any, int]:
    """A torch TCPStore hosted by rank 0 on a kernel-chosen port; (store, port) on every rank."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import pycoll

    torch.set_num_threads(1)
    timeout = timedelta(seconds=PG_TIMEOUT_S)
    port = np.zeros(1, np.int64)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=timeout)
        port[0] = store.port
    pycoll.broadcast(port, 0, comm=comm, timeout=PG_TIMEOUT_S)
    if rank != 0:
        store = dist.TCPStore("127.0.0.1", int(port[0]), world, is_master=False, timeout=timeout)
    _KEEP.append(store)
    return store, int(port[0])


def _options(backend: str, spec: dict[str, Any] | None) -> Any:
    """``pycoll.torch.Options(**spec)``, or None for no options. gloo gets none (the bodies run with
    "gloo" in place of "pycoll" too, to validate the tests themselves)."""
    if spec is None or backend == "gloo":
        return None
    import pycoll.torch as pt

    return pt.Options(**spec)


def init_default_group(comm: Any, rank: int, world: int, backend: str,
                       options: dict[str, Any] | None = None) -> None:
    """``dist.init_process_group(backend, store=..., rank=..., world_size=...)`` over rank 0's TCPStore."""
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401 - registers the "pycoll" backend

    store, _port = _tcp_store(comm, rank, world)
    kwargs: dict[str, Any] = {}
    if options is not None:
        kwargs["pg_options"] = _options(backend, options)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=PG_TIMEOUT_S), **kwargs)


def _new_group(backend: str, options: dict[str, Any] | None = None) -> Any:
    import torch.distributed as dist

    return dist.new_group(backend=backend, pg_options=_options(backend, options),
                          timeout=timedelta(seconds=PG_TIMEOUT_S))


def _launcher_env(comm: Any, rank: int, world: int) -> None:
    """The environment torchrun gives a rank (env:// rendezvous), without torchrun and without a fixed
    port: MASTER_PORT is rank 0's TCPStore, which every rank (rank 0 too) joins as a client, as
    torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE)."""
    _store, port = _tcp_store(comm, rank, world)
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world), "NODE_RANK": "0", "GROUP_RANK": "0",
    })


def _flat(params: Any) -> bytes:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in params]).contiguous().numpy().tobytes()


def _mlp(features: int = 16, hidden: int = 64, out: int = 4, seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, out))


def _batch(rank: int, step: int, n: int = 32, features: int = 16, out: int = 4) -> tuple[Any, Any]:
    """Rank-dependent regression data."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, features, generator=g), torch.randn(n, out, generator=g)


# ---- a. plain DDP ------------------------------------------------------------------------------------
def _ddp_run(group: Any, rank: int, steps: int) -> tuple[bytes, list[float]]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(), process_group=group)  # DDP's default all-reduce, no comm hook
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = _train(model, opt, rank, steps)
    return _flat(model.module.parameters()), losses


def _train(model: Any, opt: Any, rank: int, steps: int) -> list[float]:
    """``steps`` steps of MSE regression on this rank's batches; the loss of each."""
    import torch.nn.functional as F

    losses = []
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def ddp_parity(comm: Any, rank: int, world: int, backend: str, steps: int = 5) -> dict[str, Any]:
    """DDP trained on a gloo group and on the default group (``backend``), same model and data; the
    flat parameters of both, and the backend the default group reports."""
    import torch.distributed as dist

    init_default_group(comm, rank, world, backend)
    gloo = _new_group("gloo")
    ref, ref_losses = _ddp_run(gloo, rank, steps)
    got, losses = _ddp_run(None, rank, steps)
    return {"gloo": ref, "backend": got, "gloo_losses": ref_losses, "losses": losses,
            "default_backend": str(dist.get_backend())}


# ---- b. FSDP2 ----------------------------------------------------------------------------------------
def _sharded_mlp(group: Any) -> Any:
    """_mlp with fully_shard (FSDP2) applied to each Linear layer and to the whole, over ``group``."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    model = _mlp(hidden=96)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_run(group: Any, rank: int, steps: int) -> tuple[list[float], bytes]:
    import torch

    model = _sharded_mlp(group)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = _train(model, opt, rank, steps)
    full = [p.full_tensor() for p in model.parameters()]  # an all-gather over the group
    return losses, _flat(full)


def fsdp2_parity(comm: Any, rank: int, world: int, backend: str, steps: int = 5) -> dict[str, Any]:
    """fully_shard (FSDP2, CPU) trained on a gloo group and on the default group (``backend``)."""
    import torch.distributed as dist

    init_default_group(comm, rank, world, backend)
    gloo = _new_group("gloo")
    ref_losses, ref = _fsdp_run(gloo, rank, steps)
    losses, got = _fsdp_run(dist.group.WORLD, rank, steps)
    return {"gloo_losses": ref_losses, "losses": losses, "gloo": ref, "backend": got}


def fsdp2_error_feedback(comm: Any, rank: int, world: int, steps: int = 6) -> dict[str, Any]:
    """FSDP2 on a compressed ("int4") pycoll group, with pycoll.torch.fsdp.keep_error_feedback: each FSDP
    module's reduce-scatter keeps one residual across steps (FSDP2's own buffers are new every step)."""
    import torch
    import torch.distributed as dist

    import pycoll
    import pycoll.torch as pt

    init_default_group(comm, rank, world, "gloo")
    group = _new_group("pycoll", {"compression": "int4", "min_numel": 0})
    pg = group  # a "pycoll" group is its own backend
    model = _sharded_mlp(group)
    modules = pt.fsdp.keep_error_feedback(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    owned, norms, ids, losses = [], [], [], []
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        entries = [(k, r) for k, (_, r) in pg._residuals._by_key.items() if k[0] == "owner"]
        owned.append(len(entries))
        norms.append([float(r.norm()) for _, r in entries])
        ids.append(sorted(id(r) for _, r in entries))
    gloo_losses, _ = _fsdp_run(dist.group.WORLD, rank, steps)  # the same model and batches, lossless
    try:  # more modules than the group keeps residuals: refused, not silently evicted every step
        pt.fsdp.ReduceScatter(modules=10_000)(torch.empty(4), torch.ones(4 * world), group, dist.ReduceOp.SUM)
        too_many = "no error"
    except pycoll.InvalidUsageError as e:
        too_many = str(e)
    return {"modules": modules, "owned": owned, "norms": norms, "same": all(i == ids[0] for i in ids),
            "losses": losses, "gloo_losses": gloo_losses, "too_many": too_many}


# ---- c. PyTorch Lightning ----------------------------------------------------------------------------
def lightning_train(comm: Any, rank: int, world: int, backend: str, steps: int = 4) -> dict[str, Any]:
    """``Trainer(accelerator="cpu", devices=world, strategy=DDPStrategy(process_group_backend=backend))``
    fits a tiny LightningModule; Lightning initializes the process group itself (env://) and does not
    spawn (LOCAL_RANK is set: the processes are created externally)."""
    _launcher_env(comm, rank, world)
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    import pycoll.torch  # noqa: F401 - registers the "pycoll" backend

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, _idx: int) -> Any:
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(7)
    data = TensorDataset(torch.randn(16 * world * steps, 16, generator=g), torch.randn(16 * world * steps, 4,
                                                                                      generator=g))
    module = Tiny()
    before = _flat(module.parameters())
    root = tempfile.mkdtemp(prefix=f"pycoll-pl{rank}-")
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, num_nodes=1,
        strategy=DDPStrategy(process_group_backend=backend, timeout=timedelta(seconds=PG_TIMEOUT_S)),
        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root,
        # named, so that Lightning does not probe for the others: its MPI probe (with mpi4py installed)
        # calls MPI_Init as a singleton, and a rank that ends without MPI_Finalize leaves Open MPI's
        # shared-memory segment (sm_segment.*) in /dev/shm
        plugins=[LightningEnvironment()],
    )
    try:
        trainer.fit(module, DataLoader(data, batch_size=16))  # the DistributedSampler: rank-dependent data
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"params": _flat(module.parameters()), "before": before, "global_step": trainer.global_step,
            "world": trainer.world_size, "rank": trainer.global_rank, "backend": str(dist.get_backend()),
            "strategy_backend": trainer.strategy._get_process_group_backend()}


# ---- d. Hugging Face Accelerate ----------------------------------------------------------------------
def accelerate_train(comm: Any, rank: int, world: int, backend: str, steps: int = 4,
                     via_kwargs: bool | None = None) -> dict[str, Any]:
    """A few Accelerate training steps under torchrun's environment.

    accelerate 1.x on a CPU-only machine picks the backend itself: with ``cpu=True`` (multi-CPU) it is
    gloo (or mpi) whatever ``InitProcessGroupKwargs(backend=...)`` says (another one raises "Your
    assigned backend ... is not available"), and with ``cpu=False`` it initializes the given backend but
    treats the run as not distributed (no DDP wrapping). So for any backend but gloo the process group is
    initialized first (env://, as Accelerate would) and Accelerate adopts it; for gloo (``via_kwargs``,
    the default for gloo) the documented ``InitProcessGroupKwargs(backend=...)`` route is taken."""
    _launcher_env(comm, rank, world)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    import pycoll.torch  # noqa: F401 - registers the "pycoll" backend

    if via_kwargs is None:
        via_kwargs = backend == "gloo"
    timeout = timedelta(seconds=PG_TIMEOUT_S)
    if via_kwargs:
        handler = InitProcessGroupKwargs(backend=backend, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        handler = InitProcessGroupKwargs(timeout=timeout)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    g = torch.Generator().manual_seed(11)
    data = TensorDataset(torch.randn(16 * world * steps, 16, generator=g), torch.randn(16 * world * steps, 4,
                                                                                      generator=g))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=16, shuffle=False))
    wrapped = isinstance(model, DDP)
    done = 0
    first = None
    for x, y in loader:  # each rank gets its own batches
        if first is None:
            first = x.numpy().tobytes()
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        done += 1
    params = _flat(accelerator.unwrap_model(model).parameters())
    return {"params": params, "steps": done, "wrapped": wrapped, "num_processes": accelerator.num_processes,
            "process_index": accelerator.process_index, "distributed_type": str(accelerator.distributed_type),
            "backend": str(dist.get_backend()), "first_batch": first}


# ---- e. DDP with compression, 300 steps -------------------------------------------------------------
def _classification(n: int = 4096, features: int = 32, classes: int = 8, seed: int = 0) -> tuple[Any, Any]:
    """Overlapping Gaussian clusters (as examples/ddp_train.py)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return centers[y] + 2.0 * torch.randn(n, features, generator=g), y


def _train_classifier(group: Any, rank: int, world: int, steps: int, batch: int = 64) -> tuple[float, bytes]:
    """300 steps of SGD (momentum, cosine decay) with DDP on ``group``; (loss over the data set, params).
    The model has 32*64 + 64*64 + 64*8 + biases = 6792 parameters: one DDP bucket, above min_numel."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = _classification()
    model = DDP(_mlp(features=32, hidden=64, out=8), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    batches = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (world * batch,), generator=batches)
        mine = idx[rank * batch:(rank + 1) * batch]  # one global batch per step; rank r: slice r
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        loss = float(F.cross_entropy(model.module(x), y))
    return loss, _flat(model.module.parameters())


INT8_EF = {"compression": "int8", "error_feedback": True}


def ddp_losses(comm: Any, rank: int, world: int, default: tuple[str, dict[str, Any] | None],
               others: list[tuple[str, str, dict[str, Any] | None]], steps: int = 300) -> dict[str, Any]:
    """The default group is ``init_process_group(default[0], pg_options=Options(**default[1]))``; it trains
    as "default", then each of ``others`` (name, backend, options) as a ``new_group``.
    {name: (final loss, parameter bytes)}."""
    backend, options = default
    init_default_group(comm, rank, world, backend, options)
    groups = {name: _new_group(b, opts) for name, b, opts in others}  # every rank in the same order
    out = {"default": _train_classifier(None, rank, world, steps)}
    for name, group in groups.items():
        out[name] = _train_classifier(group, rank, world, steps)
    return out


def loss_table(world: int = 2, steps: int = 300, backend: str = "pycoll") -> str:
    """The DDP final-loss table: gloo, ``backend`` uncompressed, ``backend`` with int8 + error feedback
    (the default group, as ``pg_options``). Runs in the test process (it starts the ranks)."""
    from harness import run_ranks

    out = run_ranks(world, ddp_losses, (backend, INT8_EF),
                    [("gloo", "gloo", None), ("plain", backend, None)], steps, timeout=120)
    for name in out[0]:
        assert len({r[name][1] for r in out}) == 1, f"{name}: parameters differ between ranks"
    base = out[0]["gloo"][0]
    rows = [("DDP default (gloo)", "gloo"), (f"{backend}, uncompressed", "plain"),
            (f"{backend}, int8 + EF", "default")]
    lines = [f"| DDP, no comm hook ({world} ranks, {steps} steps) | final loss | vs gloo |",
             "|---|---:|---:|"]
    for label, key in rows:
        loss = out[0][key][0]
        lines.append(f"| {label} | {loss:.5f} | {100 * (loss - base) / base:+.3f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import _frameworks  # the ranks import the module by name, not __main__

    print(_frameworks.loss_table(backend=sys.argv[1] if len(sys.argv) > 1 else "pycoll"))
