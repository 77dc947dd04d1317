"""pycoll's DDP communication hook against DDP's own all-reduce, on CPU ranks (gloo process group).

DDP's bookkeeping (buckets, autograd hooks) runs on a gloo process group made once per pool worker
(``_ddp.process_group``); the pycoll communicator comes from that group (``init_from_process_group``).
Each body returns what the parent compares: failures, and digests that must agree across ranks.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the DDP hook tests need torch (pip install torch==2.13.0)")

from _ddp import process_group, session_tag  # noqa: E402
from _inputs import digest  # noqa: E402

from pycoll.compression import get_codec  # noqa: E402
from pycoll.compression.bounds import CAST_ROUNDOFF, CAST_SUBNORMAL  # noqa: E402


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)


def _grads(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()])


def _backward(module: torch.nn.Module, rank: int, step: int) -> None:
    x, y = _batch(rank, step)
    module.zero_grad(set_to_none=False)
    torch.nn.functional.cross_entropy(module(x), y).backward()


def _ddp(module: torch.nn.Module, **kwargs) -> torch.nn.parallel.DistributedDataParallel:
    # small buckets, so a model of this size spreads over several of them
    return torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=0.05, **kwargs)


def _bound(name: str, local: list[torch.Tensor]) -> np.ndarray:
    """Per element, how far the averaged gradient may be from the exact average: every rank's share
    encoded once, the sum once (two-shot). Block scales are at most the largest magnitude of the whole
    gradient, so that stands in for the unknown bucket blocks (a looser, still derived, bound)."""
    world = len(local)
    g = [t.double().numpy() for t in local]
    total = np.sum(g, axis=0)
    total_abs = np.sum([np.abs(v) for v in g], axis=0)
    if name in CAST_ROUNDOFF:
        per_sum = CAST_ROUNDOFF[name] * (total_abs + np.abs(total)) + (world + 1) * CAST_SUBNORMAL[name]
    else:
        qmax = get_codec(name).qmax  # type: ignore[union-attr]
        per_sum = (sum(np.abs(v).max() for v in g) + np.abs(total).max() * 1.01) / (2 * qmax)
    return (per_sum + 8 * world * 2.0**-24 * total_abs) / world


def body_grads_match(comm, rank, world, tag, name):
    """Gradients of DDP + pycoll's hook against DDP's default hook (uncompressed) or the exact average
    (compressed, error feedback off), over a few batches and several buckets."""
    import torch.distributed as dist

    import pycoll.torch as pt

    process_group(rank, world, tag)
    hooked, default, plain = _ddp(_model()), _ddp(_model()), _model()
    compression = None if name == "none" else name
    state = pt.HookState(compression=compression, error_feedback=False, start_iter=0, min_numel=0)
    hooked.register_comm_hook(state, pt.allreduce_hook)
    failures, digests = [], []
    for step in range(4):
        _backward(hooked, rank, step)
        _backward(default, rank, step)
        _backward(plain, rank, step)
        got = _grads(hooked)
        digests.append(digest(got.numpy()))
        if name == "none":
            want = _grads(default)
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-7):
                failures.append(f"step {step}: max |diff| {float((got - want).abs().max()):.3g} from DDP's")
            continue
        local = [torch.empty_like(got) for _ in range(world)]
        dist.all_gather(local, _grads(plain))
        exact = np.mean([t.double().numpy() for t in local], axis=0)
        err = np.abs(got.double().numpy() - exact)
        bound = _bound(name, local)
        bad = np.flatnonzero(err > bound)
        if bad.size:
            failures.append(f"step {step}: {bad.size} of {err.size} gradients outside the {name} bound, "
                            f"first err {err[bad[0]]:.3g} > {bound[bad[0]]:.3g}")
    return failures, digests


def _check(results) -> None:
    failures = [f for res in results for f in res[0]]
    assert not failures, "\n".join(failures)
    for r, res in enumerate(results[1:], 1):
        assert res[1] == results[0][1], f"rank {r} differs from rank 0 (results must be bitwise identical)"


@pytest.mark.parametrize("world", (2, 4))
def test_uncompressed_hook_matches_ddp(rank_pool, world):
    _check(rank_pool(world).run(body_grads_match, session_tag(), "none", timeout=120))


@pytest.mark.parametrize("name", ("fp16", "bf16", "int8", "int4"))
def test_compressed_hooks_within_codec_bound(rank_pool, name):
    _check(rank_pool(2).run(body_grads_match, session_tag(), name, timeout=120))


def test_compressed_hook_four_ranks(rank_pool):
    _check(rank_pool(4).run(body_grads_match, session_tag(), "int8", timeout=120))


# ---- training: parameters identical on every rank after every step; checkpoints -----------------------
def _train(ddp, opt, rank: int, steps: range) -> list[str]:
    digests = []
    for step in steps:
        _backward(ddp, rank, step)
        opt.step()
        digests.append(digest(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).numpy()))
    return digests


def body_training_identical(comm, rank, world, tag, name, ddp_kwargs):
    import pycoll.torch as pt

    process_group(rank, world, tag)
    ddp = _ddp(_model(), **ddp_kwargs)
    state = pt.HookState(compression=name, start_iter=2, min_numel=1024)
    ddp.register_comm_hook(state, pt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    digests = _train(ddp, opt, rank, range(8))
    failures = []
    if state.iter != 8:
        failures.append(f"the hook counted {state.iter} iterations, expected 8")
    big = [i for i, r in state.residuals.items() if not torch.any(r != 0)]
    if not state.residuals or big:
        failures.append(f"error-feedback residuals missing or all zero: {sorted(state.residuals)}, "
                        f"zero: {big}")
    return failures, digests


@pytest.mark.parametrize("ddp_kwargs", [{}, {"gradient_as_bucket_view": True}, {"static_graph": True}],
                         ids=["default", "bucket-view", "static-graph"])
def test_parameters_identical_on_every_rank(rank_pool, ddp_kwargs):
    _check(rank_pool(2).run(body_training_identical, session_tag(), "int4", ddp_kwargs, timeout=120))


def body_checkpoint(comm, rank, world, tag):
    """Train 5 steps, checkpoint (model, optimizer, pickled hook state), train 5 more; roll back to the
    checkpoint (load it into the same DDP, optimizer and registered state) and train the same 5 steps:
    the parameters must match bit for bit. Then restore it into a fresh DDP as a restarted job would.

    The bitwise comparison uses the same DDP because a fresh DDP runs its first iteration on its
    initial bucket layout and only then rebuilds it in the order gradients became ready: in that first
    iteration the buckets differ from those of the run that saved the state, so the compressed result
    (its blocks and chunk owners) differs too, whatever the state holds (see HookState)."""
    import pycoll.torch as pt

    process_group(rank, world, tag)
    ddp = _ddp(_model())
    state = pt.HookState(compression="int8", start_iter=2)
    ddp.register_comm_hook(state, pt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    _train(ddp, opt, rank, range(5))
    saved = pickle.dumps((copy.deepcopy(ddp.module.state_dict()), copy.deepcopy(opt.state_dict()), state))
    first = _train(ddp, opt, rank, range(5, 10))

    weights, opt_state, restored = pickle.loads(saved)
    failures = []
    if restored.comm is not None:
        failures.append("the pickled hook state carried its communicator")
    if restored.iter != 5 or sorted(restored.residuals) != sorted(state.residuals):
        failures.append(f"restored state: iter {restored.iter}, buckets {sorted(restored.residuals)}")
    ddp.module.load_state_dict(weights)
    opt.load_state_dict(opt_state)
    live = state.communicator()
    state.__setstate__(restored.__getstate__())
    if state.comm is not live:
        failures.append("rolling back replaced the state's communicator")
    second = _train(ddp, opt, rank, range(5, 10))
    if first != second:
        at = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        failures.append(f"after rolling back to the checkpoint, training diverged at step {5 + at}")

    # a restarted job: fresh model, DDP and optimizer from the checkpoint
    weights, opt_state, restored = pickle.loads(saved)
    model = _model()
    model.load_state_dict(weights)
    fresh = _ddp(model)
    fresh.register_comm_hook(restored, pt.allreduce_hook)
    opt2 = torch.optim.SGD(fresh.parameters(), lr=0.05, momentum=0.9)
    opt2.load_state_dict(opt_state)
    saved_residuals = {k: v.clone() for k, v in restored.residuals.items()}
    _train(fresh, opt2, rank, range(5, 6))  # on DDP's initial buckets: the saved residuals wait
    kept = [k for k, v in saved_residuals.items()
            if k in restored.residuals and torch.equal(restored.residuals[k], v)]
    if len(kept) != len(saved_residuals):
        failures.append("a fresh DDP's first iteration lost or changed the saved residuals")
    third = _train(fresh, opt2, rank, range(6, 10))
    if restored.iter != 10:
        failures.append(f"the restored state counted to {restored.iter}, expected 10")
    if any(k not in restored.residuals for k in saved_residuals):
        failures.append("the saved residuals were not used once DDP rebuilt its buckets")
    return failures, first + third


def test_checkpoint_restores_hook_state(rank_pool):
    _check(rank_pool(2).run(body_checkpoint, session_tag(), timeout=120))


def body_state_rules(comm, rank, world, tag):
    """start_iter, min_numel and residuals re-created when a bucket's size changes."""
    import pycoll.torch as pt

    process_group(rank, world, tag)
    state = pt.HookState(compression="int8", start_iter=2, min_numel=100)
    failures = []
    big, small = torch.zeros(1000), torch.zeros(99)
    state.iter = 1
    if state.codec_for(big) is not None:
        failures.append("compressed before start_iter")
    state.iter = 2
    if state.codec_for(big) is None or state.codec_for(small) is not None:
        failures.append("min_numel not honoured")
    if state.codec_for(torch.zeros(1000, dtype=torch.float64)) is not None:
        failures.append("a float64 bucket was given a codec")
    r = state.residual_for(3, big)
    r += 1
    if state.residual_for(3, big) is not r:
        failures.append("the residual of an unchanged bucket was re-created")
    small_r = state.residual_for(3, torch.zeros(500))
    if small_r.numel() != 500 or torch.any(small_r != 0):
        failures.append("the residual of a resized bucket was not re-created as zeros")
    state.residual_for(4, big, ((10, 50), (500,)))[:] = 1
    if torch.any(state.residual_for(4, big, ((500,), (10, 50))) != 0):
        failures.append("the residual of a re-ordered bucket was not re-created as zeros")
    # a layout that comes back within an iteration finds its residual; unused ones are dropped after two
    state.end_iteration()
    if torch.any(state.residual_for(3, big) != 1):
        failures.append("a residual was lost when its bucket came back the next iteration")
    state.end_iteration()
    state.residual_for(3, big)
    state.end_iteration()
    if len(state.residuals) != 1:
        failures.append(f"unused residuals were not dropped: {len(state.residuals)} kept")
    return failures, []


def test_state_rules(rank_pool):
    _check(rank_pool(2).run(body_state_rules, session_tag(), timeout=60))


def body_communicators_per_group(comm, rank, world, tag):
    """Communicators from several process groups, made by some ranks only, do not confuse each other."""
    import torch.distributed as dist

    import pycoll
    import pycoll.torch as pt

    process_group(rank, world, tag)
    solo = dist.new_group([0])  # every rank must create the group; only rank 0 is in it
    if rank == 0:
        alone = pt.init_from_process_group(solo, timeout=20)
        x = np.ones(5)
        pycoll.allreduce(x, comm=alone)
        pycoll.finalize(alone)
    both = pt.init_from_process_group(timeout=20)
    y = np.full(7, rank + 1.0)
    pycoll.allreduce(y, comm=both)
    pycoll.finalize(both)
    return ([] if np.all(y == world * (world + 1) / 2) else [f"wrong sum {y}"]), []


def test_communicators_of_several_groups(rank_pool):
    _check(rank_pool(2).run(body_communicators_per_group, session_tag(), timeout=60))


def body_small_gradients_exact(comm, rank, world, tag):
    """With min_numel above the biases' sizes, biases are averaged uncompressed (as DDP does) while the
    weights go through int4."""
    import pycoll.torch as pt

    process_group(rank, world, tag)
    hooked, default = _ddp(_model()), _ddp(_model())
    state = pt.HookState(compression="int4", error_feedback=False, start_iter=0, min_numel=1024)
    hooked.register_comm_hook(state, pt.allreduce_hook)
    failures, digests = [], []
    for step in range(3):
        _backward(hooked, rank, step)
        _backward(default, rank, step)
        for (name, p), q in zip(hooked.module.named_parameters(), default.module.parameters()):
            exact = torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-8)
            if p.numel() < 1024 and not exact:
                failures.append(f"step {step}: {name} ({p.numel()} elements) was not averaged exactly")
            if p.numel() >= 1024 and exact:
                failures.append(f"step {step}: {name} ({p.numel()} elements) shows no int4 rounding")
        digests.append(digest(_grads(hooked).numpy()))
    return failures, digests


def body_hook_skew(comm, rank, world, tag, delayed, delay_s, steps):
    """The hook state's skew report over the steady state: rank ``delayed`` sleeps before every backward
    pass. Two undelayed steps first (DDP rebuilds its buckets after the first; plans are built in the
    first calls), left out of the report's window."""
    import time

    import pycoll.torch as pt

    process_group(rank, world, tag)
    ddp = _ddp(_model())
    state = pt.HookState()
    ddp.register_comm_hook(state, pt.allreduce_hook)
    for step in range(2):
        _backward(ddp, rank, step)
    before = state.communicator().skew_local().run.collectives
    for step in range(steps):
        if rank == delayed:
            time.sleep(delay_s)
        _backward(ddp, rank, 2 + step)
    measured = state.communicator().skew_local().run.collectives - before
    report = state.skew(window=measured).to_dict()
    return report, measured


def test_hook_state_reports_the_rank_that_arrives_late(rank_pool):
    delayed, delay_ms, steps = 1, 25.0, 8
    got = rank_pool(2).run(body_hook_skew, session_tag(), delayed, delay_ms / 1000, steps, timeout=60)
    reports = [r for r, _ in got]
    assert all(r == reports[0] for r in reports)  # the same on every rank
    measured = got[0][1]
    assert measured >= steps  # at least one bucket per backward pass
    window = reports[0]["window"]
    assert window["collectives"] == measured
    ranks = window["ranks"]
    # The first bucket of every backward pass waits for the delayed rank: about delay_ms, less what the
    # other rank's own compute before that bucket and its scheduling on a shared core took. What the
    # other rank inflicts is scheduling noise on later buckets.
    assert ranks[delayed]["wait_inflicted_ms"] >= 0.6 * delay_ms * steps
    assert ranks[delayed]["wait_inflicted_ms"] > 3 * ranks[1 - delayed]["wait_inflicted_ms"]


def test_small_gradients_go_uncompressed(rank_pool):
    _check(rank_pool(2).run(body_small_gradients_exact, session_tag(), timeout=60))
