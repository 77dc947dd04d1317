"""Rank side of the training benchmarks: process groups per variant, FSDP2 sharding (or DDP), the timed
training loop, lossless held-out evaluation, the bytes each rank's link sent, and a probe of the
collectives FSDP2 issues.

Used by bench/fsdp_links.py and bench/time_to_loss.py (one rank process per rank of a ``pycoll run``
job). The caller puts bench/ on sys.path (at its end: bench/profile.py would shadow the standard
library's ``profile``, which torch imports).

    init_default_group(timeout_s)                        # gloo, from whichever launcher started us
    groups = make_groups(variants, timeout_s)            # one process group per distinct setting
    records = train_interleaved(variants, groups, corpus, cfg, turns=10)   # A B C, B C A, ... 10 times

A **variant** is how FSDP2's collectives travel: a gloo group, a pycoll group (lossless, or with
``pycoll.torch.Options(compression=..., all_gather_compression=...)``), optionally with
``pycoll.torch.fsdp.keep_error_feedback`` on the sharded model; or ``local``, no communication at all
(each rank trains its own unsharded copy on its own rows): the compute floor of a step. A variant with
``parallel="ddp"`` trains a ``DistributedDataParallel`` model over its group instead of sharding it
(gradients all-reduced, compressed as the group's Options say), optionally with pycoll's PowerSGD hook
(``powersgd_rank``). Every variant starts from the same weights (``TrainConfig.seed``) and sees the same
batches in the same order.
All variants are trained in the same processes, at once, taking turns of a few steps each (A B C, B C A,
...): the interleaving the machine's changes of speed ask for (shared/DESIGN.md, Measuring).

The default group is gloo and carries only the bookkeeping (barriers, the per-step losses and times,
the lossless all-gather of the trained weights for the held-out evaluation), never a variant's
training traffic: each variant trains over a group made for its setting (``new_group``; variants with
equal settings share one, taking turns), wrapped as a DeviceMesh for FSDP2.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Callable

import _textlm as lm
import torch
import torch.distributed as dist

#: Codec names a Variant takes, besides None: "int4-hadamard" is Int4(rotation="hadamard").
CODEC_SPECS = ("fp16", "bf16", "int8", "int4", "int4-hadamard")


@dataclass(frozen=True)
class Variant:
    """How one training run's collectives travel (module docstring).

    ``backend``: "gloo", "pycoll" or "local". ``compression``: the reduce-scatter's (gradients') codec,
    ``all_gather``: the all-gather's (weights') codec, names of CODEC_SPECS or None (lossless).
    ``fsdp_error_feedback``: ``pycoll.torch.fsdp.keep_error_feedback(model)`` after sharding.
    ``parallel``: "fsdp" (``fully_shard``) or "ddp" (``DistributedDataParallel`` over the group; the
    group's own error feedback, per bucket, with a codec). ``powersgd_rank`` > 0 (DDP on a pycoll group):
    pycoll's PowerSGD hook of that rank, with error feedback, its all-reduces on the group's
    communicator."""

    name: str
    backend: str
    compression: str | None = None
    all_gather: str | None = None
    fsdp_error_feedback: bool = False
    parallel: str = "fsdp"
    powersgd_rank: int = 0

    def group_key(self) -> tuple[Any, ...]:
        """Variants with equal keys share one process group (their Options are equal)."""
        return (self.backend, self.compression, self.all_gather)

    def options(self) -> Any:
        """The pycoll.torch.Options of this variant's group (None for gloo and local). Raises TypeError
        when pycoll lacks a codec option the variant needs (Int4's ``rotation``)."""
        if self.backend != "pycoll":
            return None
        import pycoll.torch as pt

        return pt.Options(
            compression=make_codec(self.compression), all_gather_compression=make_codec(self.all_gather)
        )

    def describe(self) -> str:
        """What travels how, in a few words."""
        if self.parallel == "ddp":
            return self._describe_ddp()
        if self.backend != "pycoll":
            return {"gloo": "gloo, lossless", "local": "no communication (compute floor)"}[self.backend]
        if self.compression is None and self.all_gather is None:
            return "pycoll, lossless"
        grads = {"int4-hadamard": "int4 rotated"}.get(self.compression or "", self.compression or "lossless")
        ef = " + EF" if self.fsdp_error_feedback else ""
        return f"grads {grads}{ef}, weights {self.all_gather or 'lossless'}"

    def _describe_ddp(self) -> str:
        if self.powersgd_rank:
            return f"DDP, {self.backend} PowerSGD r{self.powersgd_rank} + EF"
        if self.compression is None:
            return f"DDP, {self.backend}, lossless"
        return f"DDP, {self.backend} {self.compression} + EF"


def make_codec(spec: str | None) -> Any:
    """A pycoll codec from a CODEC_SPECS name (None stays None)."""
    if spec != "int4-hadamard":
        return spec
    from pycoll.compression import Int4

    return Int4(rotation="hadamard")  # type: ignore[call-arg]  # TypeError where pycoll lacks it


@dataclass(frozen=True)
class TrainConfig:
    """One training run (the same for every variant). Times are measured after ``timing_warmup``
    steps; ``last_k`` steps make the final training loss; ``eval_every`` > 0 adds held-out points to
    the curve (excluded from the step times); ``local_steps``: how many steps the compute floor runs."""

    model: lm.ModelConfig = field(default_factory=lm.ModelConfig)
    steps: int = 300
    batch: int = 2
    lr: float = 2e-3
    lr_warmup: int = 20
    weight_decay: float = 0.01
    seed: int = 0
    timing_warmup: int = 10
    last_k: int = 20
    eval_batches: int = 32
    eval_rows: int = 8
    eval_every: int = 0
    local_steps: int = 40
    probe_iters: int = 3
    timeout_s: float = 600.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        return cls(**{**d, "model": lm.ModelConfig(**d["model"])})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------
# Groups


def init_default_group(timeout_s: float) -> None:
    """The default group: gloo, over the store of whichever launcher started this process (pycoll run,
    torchrun, mpirun, srun: pycoll.torch.init_process_group)."""
    import pycoll.torch as pt

    pt.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))


def make_groups(variants: list[Variant], timeout_s: float) -> dict[tuple[Any, ...], Any]:
    """One process group per distinct ``Variant.group_key`` (in the variants' order, the same on every
    rank); ``local`` gets None."""
    groups: dict[tuple[Any, ...], Any] = {}
    for v in variants:
        key = v.group_key()
        if key in groups:
            continue
        if v.backend == "local":
            groups[key] = None
        else:
            groups[key] = dist.new_group(
                backend=v.backend, pg_options=v.options(), timeout=timedelta(seconds=timeout_s)
            )
    return groups


# ---------------------------------------------------------------------------------------------------------
# Model, sharded


def sharded_model(cfg: lm.ModelConfig, seed: int, group: Any, error_feedback: bool) -> torch.nn.Module:
    """``lm.build_model(cfg, seed)`` with ``fully_shard`` on each block and on the whole, over ``group``
    (a DeviceMesh of it); unsharded when ``group`` is None."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = lm.build_model(cfg, seed)
    if group is None:
        return model
    mesh = DeviceMesh.from_group(group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if error_feedback:
        import pycoll.torch as pt

        pt.fsdp.keep_error_feedback(model)
    return model


def ddp_model(cfg: lm.ModelConfig, seed: int, group: Any, powersgd_rank: int) -> torch.nn.Module:
    """``lm.build_model(cfg, seed)`` in a ``DistributedDataParallel`` over ``group``; with
    ``powersgd_rank`` > 0, pycoll's PowerSGD hook (``pycoll.torch.powersgd_hook``, error feedback on)
    whose all-reduces go through ``group``'s pycoll communicator (a communicator formed over the group's
    ranks when the group is not a pycoll one)."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(lm.build_model(cfg, seed), process_group=group)
    if powersgd_rank:
        import pycoll.torch as pt

        state = pt.PowerSGDState(comm=pt.init_from_process_group(group), rank=powersgd_rank)
        model.register_comm_hook(state, pt.powersgd_hook)
    return model


def variant_model(variant: Variant, cfg: lm.ModelConfig, seed: int, group: Any) -> torch.nn.Module:
    """The model ``variant`` trains: DDP (``ddp_model``) or FSDP2-sharded (``sharded_model``; unsharded for
    ``local``), from ``seed``'s weights."""
    if variant.parallel == "ddp":
        return ddp_model(cfg, seed, group, variant.powersgd_rank)
    return sharded_model(cfg, seed, group, variant.fsdp_error_feedback)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module a DistributedDataParallel wraps (``model`` itself otherwise)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def full_copy(model: torch.nn.Module, cfg: lm.ModelConfig) -> lm.TinyGPT:
    """An unsharded ``TinyGPT`` holding ``model``'s weights, gathered losslessly over the default (gloo)
    group whatever group ``model`` was sharded over (FSDP2 shards dim 0 as torch.chunk does); a DDP
    model's weights (the same on every rank) are copied."""
    model = unwrapped(model)
    copy = lm.TinyGPT(cfg)
    world = dist.get_world_size()
    targets = dict(copy.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not hasattr(p, "to_local"):  # unsharded (the local variant)
                targets[name].copy_(p)
                continue
            rows = p.shape[0]
            chunk = math.ceil(rows / world)
            local = p.to_local().detach()
            padded = torch.zeros((chunk, *p.shape[1:]), dtype=p.dtype)
            padded[: local.shape[0]] = local
            parts = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(parts, padded)
            targets[name].copy_(torch.cat(parts)[:rows])
    return copy


def heldout_loss(model: torch.nn.Module, cfg: lm.ModelConfig, batches: list[Any]) -> float:
    """Mean held-out loss of ``model``'s full-precision weights: each rank evaluates every world-th batch,
    the sums meet over the default group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = full_copy(model, cfg)
    mine = batches[rank::world]
    total = torch.tensor([0.0, 0.0], dtype=torch.float64)
    for x, y in mine:
        total[0] += lm.evaluate(full, [(x, y)]) * y.numel()
        total[1] += y.numel()
    dist.all_reduce(total)
    return float(total[0] / total[1])


# ---------------------------------------------------------------------------------------------------------
# Training


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer step on (x, y); its loss."""
    opt.zero_grad(set_to_none=True)
    loss = lm.lm_loss(model, x, y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _reduce_lists(losses: list[float], times: list[float]) -> tuple[list[float], list[float]]:
    """Per step: the ranks' mean loss and the slowest rank's time (over the default group)."""
    world = dist.get_world_size()
    loss = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(loss)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return (loss / world).tolist(), slowest.tolist()


def _mean_cpu(cpu: list[float], warmup: int) -> float:
    """CPU seconds per step after the warm-up (this process's, every thread), averaged over the steps and
    the ranks (default group)."""
    mine = cpu[warmup:] or cpu
    total = torch.tensor([sum(mine) / max(1, len(mine))], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total[0]) / dist.get_world_size()


class LinkMeter:
    """The bytes this rank's host sent on its link during spans of training steps: the transmit counters
    (``pycoll.bench.link``) of the interface pycoll sends through (PYCOLL_SOCKET_IFNAME: a tests/netns.py
    host's veth). ``start`` and ``stop`` each read them between two barriers of the default group (no rank
    sends while another of its host reads), so a span holds its steps' traffic and one barrier's few
    hundred bytes. Each rank is credited 1/``share`` of its host's bytes (the ranks of a host send
    through one interface). Counted are whole frames: headers, and the ACKs for what the host received,
    included."""

    def __init__(self, iface: str, share: int) -> None:
        from pycoll.bench import link

        self.counter = link.LinkCounter(iface, 1, share=max(1, share))
        self.sent = 0.0  # bytes, this rank's share, over every span so far
        self._before = 0

    @classmethod
    def from_env(cls) -> LinkMeter | None:
        """A meter on pycoll's interface, shared by LOCAL_WORLD_SIZE ranks; None where no interface is
        named or its counters cannot be read (one host, no namespaces)."""
        from pycoll.bench import link
        from pycoll.env import Settings

        iface = Settings.from_environ().socket_ifname
        if iface is None or link.why_not(iface) is not None:
            return None
        return cls(iface, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

    def start(self) -> None:
        dist.barrier()
        self._before = self.counter.read().tx_bytes
        dist.barrier()

    def stop(self) -> None:
        dist.barrier()
        self.sent += (self.counter.read().tx_bytes - self._before) / self.counter.share
        dist.barrier()


class Run:
    """One variant's training in progress: its model (sharded over the variant's group, or DDP), its
    optimizer, and what its steps measured so far. ``advance`` trains it on, turn by turn; with a
    ``meter``, the bytes its link sent during its steps (held-out evaluations left out) are counted."""

    def __init__(
        self, variant: Variant, group: Any, cfg: TrainConfig, corpus: lm.Corpus, meter: LinkMeter | None
    ) -> None:
        self.variant, self.cfg, self.corpus = variant, cfg, corpus
        self.steps = cfg.local_steps if variant.backend == "local" else cfg.steps
        self.model = variant_model(variant, cfg.model, cfg.seed, group)
        self.meter = meter
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
        )
        self.losses: list[float] = []
        self.times: list[float] = []
        self.cpu: list[float] = []  # CPU seconds of this process (every thread) per step
        self.turns: list[tuple[int, int]] = []  # (first step, last step + 1) of each turn
        self.curve: list[list[float]] = []  # [step, held-out loss]
        self.wall = 0.0

    def advance(self, to_step: int, evals: list[Any]) -> None:
        """Trains the steps from where it is up to ``to_step`` (at most ``self.steps``); a held-out point
        after each step that ``cfg.eval_every`` asks for (not timed)."""
        rank, world, cfg = dist.get_rank(), dist.get_world_size(), self.cfg
        first, started = len(self.losses), time.perf_counter()
        self._count(True)
        for step in range(first, min(to_step, self.steps)):
            for g in self.opt.param_groups:
                g["lr"] = lm.learning_rate(step, cfg.steps, cfg.lr, cfg.lr_warmup)
            x, y = lm.rank_batch(self.corpus.train, step, cfg.seed, cfg.batch, cfg.model.context, rank, world)
            t0, c0 = time.perf_counter(), time.process_time()
            self.losses.append(_step(self.model, self.opt, x, y))
            self.times.append(time.perf_counter() - t0)
            self.cpu.append(time.process_time() - c0)
            if self._eval_due(step):
                self._count(False)
                self.curve.append([step + 1, heldout_loss(self.model, cfg.model, evals)])
                self._count(True)
        self._count(False)
        self.turns.append((first, len(self.losses)))
        self.wall += time.perf_counter() - started

    def _count(self, on: bool) -> None:
        """Starts (``on``) or stops counting the link's bytes, where there is a meter."""
        if self.meter is not None:
            (self.meter.start if on else self.meter.stop)()

    def _eval_due(self, step: int) -> bool:
        """Every ``eval_every`` steps, except after the last (the final evaluation comes anyway)."""
        every = self.cfg.eval_every
        due = every > 0 and (step + 1) % every == 0 and step + 1 < self.steps
        return due and self.variant.backend != "local"

    def finish(self, evals: list[Any]) -> dict[str, Any]:
        """The record (the same on every rank; collectives over the default group): per-step mean losses
        and slowest times, their summary, and the held-out loss of the full-precision weights."""
        losses, times = _reduce_lists(self.losses, self.times)
        record = {"variant": self.variant.name, "describe": self.variant.describe()}
        record.update(_summary(losses, times, self.turns, self.cfg, self.wall))
        record["cpu_s_per_step"] = _mean_cpu(self.cpu, self.cfg.timing_warmup)
        if self.meter is not None:
            sent = torch.tensor([self.meter.sent], dtype=torch.float64)
            dist.all_reduce(sent)
            record["bytes_sent"] = float(sent[0]) / dist.get_world_size()  # per rank, mean over ranks
        if self.variant.backend != "local":
            record["heldout_loss"] = heldout_loss(self.model, self.cfg.model, evals)
            record["heldout_curve"] = [*self.curve, [len(losses), record["heldout_loss"]]]
        return record


def train_interleaved(
    variants: list[Variant],
    groups: dict[tuple[Any, ...], Any],
    corpus: lm.Corpus,
    cfg: TrainConfig,
    turns: int,
    progress: Callable[[int, list[Run]], None] | None = None,
    count_link_bytes: bool = False,
) -> list[dict[str, Any]]:
    """Trains every variant, all in memory at once, taking turns: in turn t each variant trains its next
    1/``turns`` of its steps, the order rotated by one each turn (A B C, B C A, ...), so that a change of
    machine speed falls on every variant alike. First the probe of each FSDP variant's collectives
    (none with ``cfg.probe_iters`` 0). ``count_link_bytes``: count each variant's bytes on the link
    (``LinkMeter.from_env``, where the counters can be read). Returns a record per variant
    (``Run.finish``, plus ``probe``)."""
    evals = lm.eval_batches(corpus.heldout, cfg.eval_batches, cfg.eval_rows, cfg.model.context, cfg.seed)
    probes = {
        v.name: probe_collectives(v, groups[v.group_key()], cfg.model, cfg.probe_iters)
        for v in variants
        if groups[v.group_key()] is not None and v.parallel == "fsdp" and cfg.probe_iters > 0
    }
    runs = [
        Run(v, groups[v.group_key()], cfg, corpus, LinkMeter.from_env() if count_link_bytes else None)
        for v in variants
    ]
    for t in range(turns):
        shift = t % len(runs)
        for run in runs[shift:] + runs[:shift]:
            dist.barrier()
            run.advance(math.ceil((t + 1) * run.steps / turns), evals)
        if progress is not None:
            progress(t, runs)
    records = [dict(run.finish(evals), probe=probes.get(run.variant.name)) for run in runs]
    del runs
    gc.collect()
    return records


def _summary(
    losses: list[float], times: list[float], turns: list[tuple[int, int]], cfg: TrainConfig, wall: float
) -> dict[str, Any]:
    """Step-time statistics over the timed steps (after the warm-up, and not the first step of a turn,
    which runs on caches the other variants filled), per turn too; the final training loss; the curves."""
    firsts = {a for a, _ in turns}
    timed = [i for i in range(len(times)) if i >= cfg.timing_warmup and i not in firsts]
    chosen = sorted(times[i] for i in timed) or sorted(times)
    per_turn = []
    for a, b in turns:
        mine = [times[i] for i in timed if a <= i < b]
        per_turn.append(statistics.median(mine) if mine else None)
    k = min(cfg.last_k, len(losses))
    return {
        "steps": len(losses),
        "step_s_median": statistics.median(chosen),
        "step_s_p10": chosen[int(0.1 * (len(chosen) - 1))],
        "step_s_p90": chosen[int(0.9 * (len(chosen) - 1))],
        "turn_medians_s": per_turn,
        "train_s": sum(times),
        "wall_s": wall,
        "final_train_loss": sum(losses[-k:]) / k,
        "loss_curve": losses,
        "step_times_s": times,
    }


# ---------------------------------------------------------------------------------------------------------
# The probe: FSDP2's collectives alone


def fsdp_units(cfg: lm.ModelConfig, world: int) -> list[tuple[str, int, int]]:
    """(unit, elements per rank, all-gathers per step) of each FSDP unit of ``sharded_model``: a block's
    parameters are all-gathered before its forward and again before its backward (resharded after
    forward), the root's (embeddings, final norm, head) once (FSDP2 keeps the root unsharded after
    forward); every unit is reduce-scattered once. Each parameter's dim 0 is padded to a multiple of
    the world size, as FSDP2 pads it."""
    model = lm.TinyGPT(cfg)

    def per_rank(params: Any) -> int:
        return sum(math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0]) for p in params)

    in_blocks = {id(p) for p in model.blocks.parameters()}
    root = per_rank(p for p in model.parameters() if id(p) not in in_blocks)
    return [("block", per_rank(model.blocks[0].parameters()), 2)] * cfg.depth + [("root", root, 1)]


def _time(fn: Any, iters: int) -> float:
    """Seconds per call of ``fn`` (one untimed call first), the slowest rank's (default group)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took[0])


def probe_collectives(variant: Variant, group: Any, cfg: lm.ModelConfig, iters: int) -> dict[str, Any]:
    """Times, alone and synchronously on ``group``, the all-gather and the reduce-scatter of each distinct
    FSDP unit size (random data; the reduce-scatter through pycoll.torch.fsdp.ReduceScatter when the
    variant keeps error feedback); the milliseconds per training step they add up to, serialized."""
    world = dist.get_world_size()
    gen = torch.Generator().manual_seed(dist.get_rank())
    units = fsdp_units(cfg, world)
    reduce_scatter: Any = dist.reduce_scatter_tensor
    if variant.fsdp_error_feedback:
        import pycoll.torch as pt

        owner = pt.fsdp.ReduceScatter()
        reduce_scatter = lambda out, inp, group: owner(out, inp, group, dist.ReduceOp.SUM)  # noqa: E731
    cost: dict[int, tuple[float, float]] = {}
    for _, numel, _ in units:
        if numel in cost:
            continue
        shard = torch.randn(numel, generator=gen) * 0.02
        full = torch.randn(numel * world, generator=gen) * 0.02
        ag = _time(lambda: dist.all_gather_into_tensor(full, shard, group=group), iters)  # noqa: B023
        rs = _time(lambda: reduce_scatter(shard, full, group=group), iters)  # noqa: B023
        cost[numel] = (ag, rs)
    ag_s = sum(cost[n][0] * gathers for _, n, gathers in units)
    rs_s = sum(cost[n][1] for _, n, _ in units)
    return {"all_gather_ms": ag_s * 1e3, "reduce_scatter_ms": rs_s * 1e3, "per_step_ms": (ag_s + rs_s) * 1e3}
