"""Compressed reduce-scatter on real ranks: each element quantized once, by its sender, and summed in
float32 by its owner (pycoll/algorithms/compressed.py).

Inputs are Gaussian and rank-dependent, so rank 0 rebuilds every rank's input and checks *every* rank's
chunk against the derived bound (pycoll/compression/bounds.py reduce_scatter_bound: the sum over the
other ranks of half a quantization step of their share, plus float32 rounding) element by element, at
2 to 8 ranks. The RMS error over the world size is compared with a reference that re-quantizes the
partial sum at every hop of a ring (what pycoll.compression.reference gives for a ring's reduce-scatter):
the one-quantization error must not grow with the world size as the ring's does.
"""

from __future__ import annotations

import numpy as np
import pytest
from _inputs import refusals
from harness import RankPool
from test_compression import CODECS, gaussian  # the all-reduce tests' codecs and Gaussian inputs

import pycoll
from pycoll.compression import Codec, ErrorFeedback
from pycoll.compression import reference as codec_ref
from pycoll.compression.bounds import reduce_scatter_bound


def _chunk_sizes(codec: Codec) -> list[int]:
    b = codec.block_elems
    return sorted({0, 1, max(b - 1, 1), b + 1, 1000, 4099})


def body_every_codec(comm, rank, world, seed, op):
    """Every codec and chunk size: this rank's chunk, returned for rank 0's check in the parent."""
    out = {}
    for name, codec in CODECS.items():
        for m in _chunk_sizes(codec):
            x = gaussian(rank, world * m, seed)
            before = x.copy()
            got = np.full(m, np.nan, dtype=np.float32)
            assert pycoll.reduce_scatter(x, got, op, compression=codec, timeout=30) is got
            assert np.array_equal(x, before), "reduce_scatter modified its input"
            out[(name, m)] = got
    return out


def _check_within_bound(results, world, seed, op):
    failures = []
    for (name, m), _ in results[0].items():
        codec = CODECS[name]
        inputs = [gaussian(r, world * m, seed) for r in range(world)]
        exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
        scale = world if op == "avg" else 1
        for owner in range(world):
            got = results[owner][(name, m)].astype(np.float64) * scale
            err = np.abs(got - exact[owner * m:(owner + 1) * m])
            bound = reduce_scatter_bound(codec, inputs, owner)
            bad = np.flatnonzero(~(err <= bound))
            if bad.size:
                i = bad[0]
                failures.append(f"{name} m={m} world={world} {op} rank {owner}: {bad.size} of {m} elements "
                                f"outside the bound, first [{i}] err {err[i]:.3g} > {bound[i]:.3g}")
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("world,op", [(2, "sum"), (3, "avg"), (4, "sum")])
def test_every_codec_within_the_per_element_bound(rank_pool, world, op):
    results = rank_pool(world).run(body_every_codec, 20 + world, op, timeout=300)
    _check_within_bound(results, world, 20 + world, op)


def body_rms(comm, rank, world, codec_name, m, seed):
    codec = CODECS[codec_name]
    x = gaussian(rank, world * m, seed)
    out = np.empty(m, dtype=np.float32)
    pycoll.reduce_scatter(x, out, compression=codec, timeout=60)
    return out


def _ring_requantizing(codec: Codec, inputs: list[np.ndarray], owner: int, m: int) -> np.ndarray:
    """The owner's chunk as a ring reduce-scatter that re-encodes the partial sum at every hop computes
    it: the partial starts at rank owner+1, and each next rank adds its share to the decoded partial."""
    world = len(inputs)
    order = [(owner + k) % world for k in range(1, world + 1)]  # the owner adds last, exactly
    partial = inputs[order[0]][owner * m:(owner + 1) * m].copy()
    for r in order[1:]:
        _, decoded = codec_ref.encode(codec, partial, None, 1.0, index=0, key=0)
        partial = decoded + inputs[r][owner * m:(owner + 1) * m]
    return partial


def test_rms_error_does_not_grow_with_the_world_size():
    """int8: the one-quantization RMS error stays within 1.6x of its 2-rank value from 2 to 8 ranks (each
    element has world - 1 independent rounding errors, but the exact sum's spread grows as fast); the ring
    reference's grows past it."""
    m, seed = 8192, 5
    rows = []
    for world in (2, 4, 8):
        with RankPool(world) as pool:
            results = pool.run(body_rms, "int8", m, seed, timeout=300)
        inputs = [gaussian(r, world * m, seed) for r in range(world)]
        exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
        got = np.concatenate(results).astype(np.float64)
        ring = np.concatenate([_ring_requantizing(CODECS["int8"], inputs, o, m) for o in range(world)])
        norm = np.sqrt(np.mean(exact**2))
        rows.append((world, np.sqrt(np.mean((got - exact) ** 2)) / norm,
                     np.sqrt(np.mean((ring - exact) ** 2)) / norm))
    one = [r[1] for r in rows]
    ring = [r[2] for r in rows]
    assert max(one) <= 1.6 * one[0], f"relative RMS error by world (2, 4, 8): {one}"
    assert all(o < r for o, r in zip(one[1:], ring[1:])), f"one quantization {one} vs ring {ring}"
    assert ring[-1] > 1.5 * one[-1], f"at 8 ranks the ring's error {ring[-1]:.3g} vs {one[-1]:.3g}"


def body_bitwise(comm, rank, world, seed):
    """Deterministic: two calls with the same inputs give the same bits; float16 and bfloat16 data are
    reduced as float32 and rounded back once."""
    m = 3000
    x = gaussian(rank, world * m, seed)
    a = np.empty(m, dtype=np.float32)
    b = np.empty(m, dtype=np.float32)
    pycoll.reduce_scatter(x, a, compression="int8", timeout=30)
    pycoll.reduce_scatter(x, b, compression="int8", timeout=30)
    h = np.empty(m, dtype=np.float16)
    pycoll.reduce_scatter(x.astype(np.float16), h, compression="int8", timeout=30)
    wide = np.empty(m, dtype=np.float32)
    pycoll.reduce_scatter(x.astype(np.float16).astype(np.float32), wide, compression="int8", timeout=30)
    return np.array_equal(a, b), np.array_equal(h, wide.astype(np.float16))


def test_repeatable_and_half_precision(rank_pool):
    for same, half in rank_pool(3).run(body_bitwise, 9, timeout=120):
        assert same, "two compressed reduce-scatters of the same inputs differ"
        assert half, "float16 data is not the float32 reduce-scatter rounded back once"


def body_large(comm, rank, world, seed):
    """Chunks of several messages each and a short last block, through both CPU executors."""
    codec = CODECS["int4"]
    m = 3 * (comm.segment_bytes // codec.block_bytes) * codec.block_elems + 5
    x = gaussian(rank, world * m, seed)
    fragment = np.empty(m, dtype=np.float32)
    pycoll.reduce_scatter(x, fragment, "avg", compression=codec, timeout=60)
    comm.grouped_on_cpu = True  # the grouped programs the GPU path runs, on the CPU's kernels
    try:
        grouped = np.empty(m, dtype=np.float32)
        pycoll.reduce_scatter(x, grouped, "avg", compression=codec, timeout=60)
    finally:
        comm.grouped_on_cpu = False
    return fragment, grouped


def test_several_messages_per_chunk_and_the_grouped_executor():
    world, seed = 3, 4
    with RankPool(world, env={"PYCOLL_SHM_SLOT_BYTES": "16384"}) as pool:
        results = pool.run(body_large, seed, timeout=300)
    m = results[0][0].size
    inputs = [gaussian(r, world * m, seed) for r in range(world)]
    exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
    for owner, (fragment, grouped) in enumerate(results):
        assert np.array_equal(fragment, grouped), f"rank {owner}: the two executors differ"
        err = np.abs(fragment.astype(np.float64) * world - exact[owner * m:(owner + 1) * m])
        bound = reduce_scatter_bound(CODECS["int4"], inputs, owner)
        assert (err <= bound).all(), f"rank {owner}: {(err > bound).sum()} elements outside the bound"


def body_error_feedback(comm, rank, world, steps, m):
    """``steps`` reduce-scatters of fresh inputs with error feedback: the running sum of the results stays
    within one step's error of the exact running sum (the residual carries the rest), and the identity
    sum(results) = sum(exact) - (the residuals' share of this chunk) holds."""
    state = ErrorFeedback()
    run_ef = np.zeros(m)
    run_plain = np.zeros(m)
    run_exact = np.zeros(m)
    errors = []
    for step in range(steps):
        inputs = [gaussian(r, world * m, 500 + step) for r in range(world)]
        exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)[rank * m:(rank + 1) * m]
        out = np.empty(m, dtype=np.float32)
        pycoll.reduce_scatter(inputs[rank], out, compression="int4", residual=state, timeout=30)
        plain = np.empty(m, dtype=np.float32)
        pycoll.reduce_scatter(inputs[rank], plain, compression="int4", timeout=30)
        run_ef += out
        run_plain += plain
        run_exact += exact
        errors.append(float(np.abs(run_ef - run_exact).max()))
    res = state.residual.astype(np.float64)
    pycoll.allreduce(res, timeout=30)  # every rank's residual for every chunk, summed
    identity = float(np.abs(run_ef - (run_exact - res[rank * m:(rank + 1) * m])).max())
    plain_error = float(np.abs(run_plain - run_exact).max())
    return max(errors[:10]), max(errors[-10:]), plain_error, identity / np.abs(run_exact).max()


def test_error_feedback_keeps_the_running_sum_on_track(rank_pool):
    for first, last, plain, identity in rank_pool(4).run(body_error_feedback, 60, 2053, timeout=300):
        assert identity < 1e-5, f"feedback identity off by {identity:.3g} (relative)"
        assert last <= 2.5 * first, f"with error feedback the error grew from {first:.3g} to {last:.3g}"
        assert plain > 3 * last, f"without feedback {plain:.3g}, with {last:.3g}"


def body_bad_input(comm, rank, world):
    """Refused on every rank, before anything is sent, and out left untouched."""
    x = gaussian(rank, world * 10, 1)
    out = np.zeros(10, np.float32)
    errors = refusals(lambda *a, **kw: pycoll.reduce_scatter(*a, compression="int8", timeout=30, **kw), [
        ((x.astype(np.int32), np.zeros(10, np.int32), "sum"), {}, r"needs float32, float16, bfloat16 data"),
        ((x.astype(np.float64), np.zeros(10), "sum"), {}, r"got float64"),
        ((x, out, "max"), {}, r"supports op 'sum' or 'avg', got 'max'"),
        ((x, out, "sum"), {"algorithm": "ring"}, r"runs algorithm='direct'"),
        ((x, out, "sum"), {"residual": np.zeros(7, np.float32)},
         rf"residual must be float32 with as many elements as x \({world * 10}\)"),
        ((x, np.zeros(9, np.float32), "sum"), {}, r"x must hold world_size \* out.size"),
        ((x, out, "sum"), {"error_budget": 0.01}, r'error_budget= applies to compression="auto"'),
    ])  # fmt: skip
    good = np.empty(10, dtype=np.float32)
    pycoll.reduce_scatter(x, good, compression="int8", timeout=30)  # the ranks are still in step
    # compression="auto": at 40 bytes on shared memory the cost model compresses nothing (exact)
    auto, plain = np.empty(10, dtype=np.float32), np.empty(10, dtype=np.float32)
    pycoll.reduce_scatter(x, auto, compression="auto", error_budget=0.05, timeout=30)
    pycoll.reduce_scatter(x, plain, timeout=30)
    if not np.array_equal(auto, plain):
        errors.append('compression="auto" compressed a 40-byte reduce-scatter')
    return errors


def test_bad_input_is_refused_on_every_rank(rank_pool):
    for errors in rank_pool(3).run(body_bad_input, timeout=120):
        assert not errors, errors


def body_mismatch(comm, rank, world):
    """Ranks that pass different codecs: CollectiveMismatchError on every rank, long before the deadline."""
    x = gaussian(rank, world * 100, 2)
    out = np.empty(100, dtype=np.float32)
    try:
        pycoll.reduce_scatter(x, out, compression="int8" if rank == 0 else "int4", timeout=20)
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)
    return "no error", ""


def test_different_codecs_on_different_ranks_raise_a_mismatch(rank_pool):
    for name, message in rank_pool(3).run(body_mismatch, timeout=60):
        assert name == "CollectiveMismatchError", (name, message)


def body_special_values(comm, rank, world):
    """A NaN or Inf in one block of one rank's share: that block of the owner's result is not finite, the
    other blocks are; all-zero blocks stay exactly zero."""
    b, m = 64, 256
    failures = []
    for bad in (np.nan, np.inf):
        x = gaussian(rank, world * m, 3)
        x[m : m + b] = 0  # chunk 1's first block, on every rank
        if rank == world - 1:
            x[0 * m + 2 * b + 1] = bad  # chunk 0, its third block
        out = np.empty(m, dtype=np.float32)
        pycoll.reduce_scatter(x, out, compression="int8", timeout=30)
        if rank == 0:
            if np.isfinite(out[2 * b : 3 * b]).any():
                failures.append(f"{bad}: the poisoned block decoded to finite values")
            if not np.isfinite(np.delete(out, np.arange(2 * b, 3 * b))).all():
                failures.append(f"{bad}: other blocks were poisoned")
        if rank == 1 and (np.any(out[:b] != 0) or np.signbit(out[:b]).any()):
            failures.append(f"{bad}: an all-zero block came back as {out[:b][out[:b] != 0][:4]}")
    return failures


def test_special_values(rank_pool):
    failures = [f for res in rank_pool(2).run(body_special_values, timeout=60) for f in res]
    assert not failures, failures
