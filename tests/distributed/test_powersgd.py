"""The PowerSGD DDP hook (pycoll.torch.powersgd_hook) under real DDP on CPU ranks (gloo process group,
pycoll communicator formed from it).

Every rank trains a small conv + MLP model on data that is a pure function of (rank, step), so every
rank can rebuild every rank's batch and compute the exact averaged gradient itself. The parent checks
that parameter digests agree across ranks after every step.
"""

from __future__ import annotations

import copy
import hashlib
import pickle

import pytest

torch = pytest.importorskip("torch", reason="the DDP hooks need torch")

from _ddp import process_group, session_tag  # noqa: E402

import pycoll.torch as pt  # noqa: E402

TIMEOUT = 60


# ---- model, data, training loop (run on the ranks) ------------------------------------------------------
def make_model(dtype=torch.float32):
    """conv weight 16 x (4*5) and fc1 32 x 192 are compressed at rank 4; fc2 (4 x 32) and the biases
    are not (their rank-4 form would not be 2x smaller)."""
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Conv1d(4, 16, 5),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 12, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )
    return model.to(dtype)


def batch(rank, step, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(8, 4, 16, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (8,), generator=g)
    return x.to(dtype), y


def loss_of(model, rank, step, dtype=torch.float32):
    x, y = batch(rank, step, dtype)
    return torch.nn.functional.cross_entropy(model(x), y)


def ddp_of(model, pcomm, state=None, hook=None, **kwargs):
    ddp = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return ddp


def digest(module):
    h = hashlib.blake2b(digest_size=16)
    for p in module.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(ddp, rank, steps, first_step=0, opt=None):
    """``steps`` SGD steps; the parameter digest after each."""
    opt = opt or torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    digests = []
    for step in range(first_step, first_step + steps):
        opt.zero_grad(set_to_none=True)
        loss_of(ddp, rank, step).backward()
        opt.step()
        digests.append(digest(ddp.module))
    return digests


def recording_hook(state, bucket):
    """powersgd_hook, recording which parameters each bucket holds (in ``bucket.gradients()`` order)."""
    ps, layout = state
    layout[bucket.index()] = [id(p) for p in bucket.parameters()]
    return pt.powersgd_hook(ps, bucket)


# ---- rank bodies -------------------------------------------------------------------------------------
def body_matches_default_before_start(comm, rank, world, tag):
    """Before start_iter the hook is a plain averaged all-reduce: DDP's default gradients within 1e-5."""
    pcomm = process_group(rank, world, tag)
    ref = ddp_of(make_model(), pcomm)
    state = pt.PowerSGDState(comm=pcomm, start_iter=3)
    got = ddp_of(make_model(), pcomm, state, pt.powersgd_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, got)]
    failures = []
    for step in range(3):
        for m, opt in zip((ref, got), opts):
            opt.zero_grad(set_to_none=True)
            loss_of(m, rank, step).backward()
        for (name, a), b in zip(ref.module.named_parameters(), got.module.parameters()):
            if not torch.allclose(b.grad, a.grad, rtol=1e-5, atol=1e-7):
                failures.append(f"step {step} {name}: max diff {(b.grad - a.grad).abs().max().item():.3g}")
        for opt in opts:
            opt.step()
    if state.iter != 3 or state.buckets:
        failures.append(f"iter {state.iter}, {len(state.buckets)} bucket states before start_iter")
    return failures


def body_identical_across_ranks(comm, rank, world, tag, steps):
    """Trains with compression from step 2; the digests after every step (compared by the parent)."""
    pcomm = process_group(rank, world, tag)
    state = pt.PowerSGDState(comm=pcomm, rank=2)
    ddp = ddp_of(make_model(), pcomm, state, pt.powersgd_hook)
    digests = train(ddp, rank, steps)
    compressed = sorted(len(b.compressed) for b in state.buckets.values())
    return digests, state.iter, compressed


def body_full_rank(comm, rank, world, tag, options):
    """rank >= min(n, m) and every 2-D tensor compressed: P Q^T is the exact average (float64, within
    rounding), also with error feedback on, without warm start and with Gram-Schmidt."""
    pcomm = process_group(rank, world, tag)
    dtype = torch.float64
    failures = []
    state = pt.PowerSGDState(comm=pcomm, rank=1000, start_iter=0, min_compression_rate=0, **options)
    model = make_model(dtype)
    ref = copy.deepcopy(model)
    ddp = ddp_of(model, pcomm, state, pt.powersgd_hook)
    for step in range(3):
        ddp.zero_grad(set_to_none=True)
        loss_of(ddp, rank, step, dtype).backward()
        exact = _average_grads(ref, world, step, dtype)
        for (name, p), want in zip(ddp.module.named_parameters(), exact):
            err = (p.grad - want).abs().max().item()
            if not err <= 1e-10 * want.abs().max().item():
                failures.append(f"{options} step {step} {name}: max error {err:.3g}")
    n_compressed = sum(len(b.compressed) for b in state.buckets.values())
    if n_compressed != 3:
        failures.append(f"{options}: {n_compressed} tensors compressed, expected 3 (every matrix)")
    return failures


def _average_grads(model, world, step, dtype):
    """The exact average over the ranks of the gradients at ``step`` (every rank's batch rebuilt here)."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for r in range(world):
        grads = torch.autograd.grad(loss_of(model, r, step, dtype), list(model.parameters()))
        for t, g in zip(total, grads):
            t += g
    return [t / world for t in total]


def body_error_feedback(comm, rank, world, tag, steps):
    """A fixed model (no optimizer step), rank 1, float64: over the compressed steps (from start_iter),
    applied gradients plus the final residual sum to this rank's own gradients, sum_t applied + e_rank =
    sum_t g_rank; so averaged over the ranks, sum_t applied + mean(e) = sum_t mean(g) over all steps.
    Returns, per parameter: applied + residual, the sum of the averaged gradients, the sum of this
    rank's own gradients (the averaged ones before start_iter), the applied gradients; and how many
    residuals were found."""
    pcomm = process_group(rank, world, tag)
    dtype = torch.float64
    state = pt.PowerSGDState(comm=pcomm, rank=1, start_iter=2)
    layout = {}
    model = make_model(dtype)
    ref = copy.deepcopy(model)
    ddp = ddp_of(model, pcomm, (state, layout), recording_hook)
    params = list(model.parameters())
    applied = [torch.zeros_like(p) for p in params]
    true_avg = [torch.zeros_like(p) for p in params]
    own = [torch.zeros_like(p) for p in params]
    for step in range(steps):
        ddp.zero_grad(set_to_none=True)
        loss_of(ddp, rank, step, dtype).backward()
        for a, p in zip(applied, params):
            a += p.grad
        average = _average_grads(ref, world, step, dtype)
        for t, g in zip(true_avg, average):
            t += g
        # Before start_iter every rank applies the exact average and keeps no residual.
        mine = torch.autograd.grad(loss_of(ref, rank, step, dtype), list(ref.parameters()))
        for o, g in zip(own, mine if step >= state.start_iter else average):
            o += g
    position = {id(p): i for i, p in enumerate(params)}
    with_residual = [a.clone() for a in applied]
    compressed = [False] * len(params)
    for index, ids in layout.items():
        for pid, res in zip(ids, state.residuals(index)):
            if res is not None:
                with_residual[position[pid]] += res.view_as(params[position[pid]])
                compressed[position[pid]] = True
    to_np = lambda ts: [t.numpy() for t in ts]  # noqa: E731
    return to_np(with_residual), to_np(true_avg), to_np(own), to_np(applied), compressed


def holder_hook(holder, bucket):
    """powersgd_hook on whichever state ``holder[0]`` is now (a test swaps it to roll back)."""
    return pt.powersgd_hook(holder[0], bucket)


def body_checkpoint(comm, rank, world, tag, before, after):
    """Pickles the state (with model and optimizer) after ``before`` steps and goes on ``after`` steps.
    Rolled back to the pickle on the same DDP, it takes bitwise the same steps again. Restored into a
    fresh DDP (whose first iteration runs on DDP's initial buckets, before they are rebuilt into the
    saved layout), the saved residuals and Q come through that first iteration untouched and training
    goes on identical across ranks. Returns (failures, digests of the fresh-DDP run)."""
    pcomm = process_group(rank, world, tag)
    holder = [pt.PowerSGDState(comm=pcomm, rank=2)]
    ddp = ddp_of(make_model(), pcomm, holder, holder_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    train(ddp, rank, before, opt=opt)
    blob = pickle.dumps({"hook": holder[0], "model": ddp.module.state_dict(), "opt": opt.state_dict()})
    straight = train(ddp, rank, after, first_step=before, opt=opt)

    failures = []
    saved = pickle.loads(blob)
    restored = saved["hook"]
    if restored.comm is not None:
        failures.append("the pickled state kept its communicator")
    if restored.iter != before or len(restored.buckets) != 1:
        failures.append(f"restored iter {restored.iter}, {len(restored.buckets)} bucket states")
    restored.comm = pcomm
    holder[0] = restored
    ddp.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    again = train(ddp, rank, after, first_step=before, opt=opt)
    if again != straight:
        bad = [i for i, (a, b) in enumerate(zip(straight, again)) if a != b]
        failures.append(f"rolled back: differs from the straight run at steps {bad}")

    saved = pickle.loads(blob)
    restored = saved["hook"]
    kept = copy.deepcopy(restored.buckets[0])
    restored.comm = pcomm
    model = make_model()
    model.load_state_dict(saved["model"])
    ddp2 = ddp_of(model, pcomm, restored, pt.powersgd_hook)
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(saved["opt"])
    fresh = train(ddp2, rank, 1, first_step=before, opt=opt2)
    now = restored.buckets[0]
    if now.signature != kept.signature or not (torch.equal(now.residual, kept.residual)
                                               and torch.equal(now.q, kept.q)):
        failures.append("fresh DDP: the saved bucket state did not survive its first iteration")
    fresh += train(ddp2, rank, after - 1, first_step=before + 1, opt=opt2)
    if restored.iter != before + after:
        failures.append(f"fresh DDP: iter {restored.iter}, expected {before + after}")
    if torch.equal(restored.buckets[0].residual, kept.residual):
        failures.append("fresh DDP: the residual never changed after the first iteration")
    return failures, fresh


def body_bucket_view(comm, rank, world, tag, steps):
    """gradient_as_bucket_view=True (and static_graph=True) train bitwise like the default DDP settings."""
    pcomm = process_group(rank, world, tag)
    runs = {}
    for label, kwargs in {"plain": {}, "bucket_view": {"gradient_as_bucket_view": True},
                          "static_graph": {"gradient_as_bucket_view": True, "static_graph": True}}.items():
        state = pt.PowerSGDState(comm=pcomm, rank=2)
        ddp = ddp_of(make_model(), pcomm, state, pt.powersgd_hook, **kwargs)
        runs[label] = train(ddp, rank, steps)
    return runs


# ---- tests -------------------------------------------------------------------------------------------
def _no_failures(results):
    failures = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not failures, "\n".join(failures[:20])


def test_plain_average_before_start_iter(rank_pool):
    _no_failures(rank_pool(2).run(body_matches_default_before_start, session_tag(), timeout=TIMEOUT))


@pytest.mark.parametrize("world", [2, 4])
def test_parameters_bitwise_identical_across_ranks(rank_pool, world):
    steps = 6
    results = rank_pool(world).run(body_identical_across_ranks, session_tag(), steps, timeout=TIMEOUT)
    digests = [d for d, _iter, _c in results]
    for step in range(steps):
        assert len({d[step] for d in digests}) == 1, f"ranks differ after step {step}"
    assert len(set(digests[0])) == steps, "the parameters did not change every step"
    for _digests, iters, compressed in results:
        assert iters == steps
        assert sum(compressed) == 2  # conv and fc1; fc2 and the biases go uncompressed


def test_full_rank_recovers_the_average(rank_pool):
    options = [{}, {"warm_start": False, "orthogonalization_epsilon": 1e-300}, {"use_error_feedback": False}]
    pool = rank_pool(2)
    for opt in options:
        _no_failures(pool.run(body_full_rank, session_tag(), opt, timeout=TIMEOUT))


def test_error_feedback_identity(rank_pool):
    world, steps = 2, 6
    results = rank_pool(world).run(body_error_feedback, session_tag(), steps, timeout=TIMEOUT)
    import numpy as np

    n_params = len(results[0][0])
    compressed = results[0][4]
    # rank 1: every weight (conv, fc1, fc2) is compressed, no bias.
    assert compressed == [True, False, True, False, True, False]
    for i in range(n_params):
        for rank, (with_res, avg, own, applied, _c) in enumerate(results):
            assert np.array_equal(applied[i], results[0][3][i]), f"param {i}: applied gradients differ"
            # A compressed tensor: this rank's residual closes the gap to its own gradients. An
            # uncompressed one: the exact average was applied.
            want = own[i] if compressed[i] else avg[i]
            np.testing.assert_allclose(with_res[i], want, rtol=1e-9, atol=1e-12,
                                       err_msg=f"rank {rank} param {i}: applied + residual")
        mean = np.mean([r[0][i] for r in results], axis=0)
        np.testing.assert_allclose(mean, results[0][1][i], rtol=1e-9, atol=1e-12,
                                   err_msg=f"param {i}: applied + mean residual != averaged gradients")
    # rank 1 really was lossy: applied gradients alone miss the average on the compressed tensors.
    gap = max(np.abs(results[0][3][i] - results[0][1][i]).max() for i in range(n_params))
    assert gap > 1e-6


def test_checkpoint_continues_identically(rank_pool):
    results = rank_pool(2).run(body_checkpoint, session_tag(), 3, 3, timeout=TIMEOUT)
    _no_failures([f for f, _ in results])
    assert results[0][1] == results[1][1], "fresh DDP: ranks differ"


def test_gradient_as_bucket_view(rank_pool):
    steps = 4
    results = rank_pool(2).run(body_bucket_view, session_tag(), steps, timeout=TIMEOUT)
    for rank, runs in enumerate(results):
        assert runs["bucket_view"] == runs["plain"], f"rank {rank}: gradient_as_bucket_view differs"
        assert runs["static_graph"] == runs["plain"], f"rank {rank}: static_graph differs"
    assert results[0] == results[1]


def test_state_validates_and_pickles_without_communicator():
    from pycoll.errors import InvalidUsageError

    for bad in ({"rank": 0}, {"start_iter": -1}, {"min_compression_rate": -1.0},
                {"orthogonalization_epsilon": -1e-8}, {"random_seed": -1}):
        with pytest.raises(InvalidUsageError):
            pt.PowerSGDState(**bad)
    state = pt.PowerSGDState(comm=object())  # type: ignore[arg-type]
    state.iter = 5
    restored = pickle.loads(pickle.dumps(state))
    assert restored.comm is None and restored.iter == 5 and restored.rank == 4
    assert state.should_compress((64, 32)) and not state.should_compress((64,))
    assert not state.should_compress((4, 32))  # (4 + 32) * 4 * 2 > 4 * 32
