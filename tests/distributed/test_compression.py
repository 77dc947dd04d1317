"""Compressed all-reduce on real ranks: every codec x algorithm x world size, with derived error bounds.

Inputs are Gaussian and rank-dependent (a pure function of rank, count and seed), so rank 0 rebuilds
every rank's input, computes the exact sum in float64 and checks its result against a bound derived
from the codec (pycoll/compression/bounds.py): an int8/int4 encode moves an element by at most half a
step (a whole one with stochastic rounding), step = block absmax / qmax; fp16/bf16 by half an ulp. The
parent checks that every rank ends bitwise identical to rank 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from _inputs import bf16_backend, digest
from harness import RankPool

import pycoll
from pycoll.compression import BF16, FP16, Codec, ErrorFeedback, Int4, Int8
from pycoll.compression.bounds import block_absmax, error_bound, quantization_bound

ALGORITHMS = ("direct", "ring", "tree")
CODECS: dict[str, Codec] = {
    "fp16": FP16(),
    "bf16": BF16(),
    "int8": Int8(),
    "int4": Int4(),
    "int8-b32-stochastic": Int8(block=32, rounding="stochastic", seed=7),
    "int4-b16": Int4(block=16),
}


def gaussian(rank: int, count: int, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng([seed, rank, count]).standard_normal(count) * scale).astype(np.float32)


def _counts(codec: Codec) -> list[int]:
    b = codec.block_elems
    return sorted({0, 1, max(b - 1, 1), b + 1, 1000, 20011})


def _check_case(label, codec, algorithm, rank, world, count, seed, op="sum", dtype="float32"):
    """Runs one compressed all-reduce; returns (failures, digest of the result). Rank 0 checks the bound;
    the other ranks' results must equal its bit for bit (the parent compares the digests)."""
    x = gaussian(rank, count, seed)
    if dtype != "float32":
        x = _to_dtype(x, dtype)
    out = pycoll.allreduce(x, op, algorithm=algorithm, compression=codec, timeout=30)
    assert out is x
    if rank != 0:
        return [], digest(x)
    inputs = [gaussian(r, count, seed) for r in range(world)]
    if dtype != "float32":
        inputs = [_from_dtype(_to_dtype(v, dtype)) for v in inputs]  # what the ranks really hold
    got = _from_dtype(x).astype(np.float64) if dtype != "float32" else x.astype(np.float64)
    exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
    scale = world if op == "avg" else 1
    bound = error_bound(codec, algorithm, inputs, (got * scale).astype(np.float32))
    if dtype != "float32":
        bound += (2.0**-11 if dtype == "float16" else 2.0**-8) * np.abs(got * scale)
    err = np.abs(got * scale - exact)
    bad = np.flatnonzero(~(err <= bound))
    failures = []
    if bad.size:
        i = bad[0]
        failures.append(f"{label}: {bad.size} of {count} elements outside the bound, first [{i}] got "
                        f"{got[i] * scale!r} exact {exact[i]!r} err {err[i]:.3g} > bound {bound[i]:.3g}")
    return failures, digest(x)


def _to_dtype(x: np.ndarray, dtype: str):
    if dtype == "float16":
        return x.astype(np.float16)
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16)


def _from_dtype(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def body_codecs_algorithms(comm, rank, world, names, seed):
    failures, digests = [], {}
    for name in names:
        codec = CODECS[name]
        for algorithm in ALGORITHMS:
            for count in _counts(codec):
                label = f"{name}/{algorithm}/world {world}/count {count}"
                f, d = _check_case(label, codec, algorithm, rank, world, count, seed)
                failures += f
                digests[label] = d
    return failures, digests


def _assert_ranks_agree(results):
    failures = [f for res in results for f in res[0]]
    assert not failures, "\n".join(failures[:20])
    for label, d in results[0][1].items():
        others = [r for r, res in enumerate(results) if res[1][label] != d]
        assert not others, f"{label}: ranks {others} differ from rank 0 (results must be bitwise identical)"


@pytest.mark.parametrize("world", (2, 3, 4))
def test_every_codec_and_algorithm_within_bound_and_identical(rank_pool, world):
    results = rank_pool(world).run(body_codecs_algorithms, list(CODECS), 11 + world, timeout=300)
    _assert_ranks_agree(results)


def body_multi_segment(comm, rank, world, seed):
    """Messages of many fragments and several pipeline segments, avg, and the auto algorithm."""
    failures, digests = [], {}
    for name in ("int8", "int4", "fp16"):
        codec = CODECS[name]
        # three and a bit pipeline segments per chunk, cut at a partial last block
        count = 3 * world * (comm.segment_bytes // codec.block_bytes) * codec.block_elems + 5
        for algorithm in ("direct", "ring", "tree"):
            for op in ("sum", "avg"):
                label = f"{name}/{algorithm}/{op}/count {count}"
                f, d = _check_case(label, codec, algorithm, rank, world, count, seed, op=op)
                failures += f
                digests[label] = d
    x = gaussian(rank, 5000, seed)
    pycoll.allreduce(x, algorithm="auto", compression="int8", timeout=30)  # auto with a codec: direct
    y = gaussian(rank, 5000, seed)
    pycoll.allreduce(y, algorithm="direct", compression="int8", timeout=30)
    if not np.array_equal(x, y):
        failures.append("algorithm='auto' with a codec is not the direct (two-shot) plan")
    return failures, digests


@pytest.mark.parametrize("world", (2, 4))
def test_large_messages_and_avg(world):
    # 16 KiB slots: several segments per chunk in a quarter of the elements the default slots need
    # (the bound's numpy work on rank 0, not the all-reduces, is what takes the time here).
    with RankPool(world, env={"PYCOLL_SHM_SLOT_BYTES": "16384"}) as pool:
        results = pool.run(body_multi_segment, 5, timeout=300)
    _assert_ranks_agree(results)


def body_half_inputs(comm, rank, world, seed):
    failures, digests = [], {}
    dtypes = ["float16"] + (["bfloat16"] if bf16_backend()[0] == "ml_dtypes" else [])
    for dtype in dtypes:
        for name in ("fp16", "bf16", "int8", "int4"):
            for algorithm in ALGORITHMS:
                for count in (0, 1, 1000, 70001):
                    label = f"{dtype} input/{name}/{algorithm}/count {count}"
                    f, d = _check_case(label, CODECS[name], algorithm, rank, world, count, seed, dtype=dtype)
                    failures += f
                    digests[label] = d
    try:
        import torch
    except ImportError:
        return failures, digests
    for tdtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.from_numpy(gaussian(rank, 3001, seed)).to(tdtype)
        n = torch.from_numpy(gaussian(rank, 3001, seed)).to(tdtype)
        pycoll.allreduce(t, compression="int8", timeout=30)
        want = _to_numpy_via(n, tdtype, torch)
        pycoll.allreduce(want, compression="int8", timeout=30)
        if not np.array_equal(t.to(torch.float32).numpy(), _from_dtype(want)):
            failures.append(f"torch {tdtype}: differs from the same numpy all-reduce")
        digests[f"torch {tdtype}"] = digest(t.to(torch.float32).numpy())
    return failures, digests


def _to_numpy_via(t, tdtype, torch):
    """The same values as a numpy array of the same precision (bfloat16 through ml_dtypes)."""
    if tdtype == torch.bfloat16:
        import ml_dtypes

        return t.to(torch.float32).numpy().astype(ml_dtypes.bfloat16)
    return t.numpy().copy()


def test_half_precision_inputs(rank_pool):
    results = rank_pool(3).run(body_half_inputs, 23, timeout=300)
    _assert_ranks_agree(results)


# ---- edge cases -----------------------------------------------------------------------------------------
def body_edge_cases(comm, rank, world):
    failures = []
    for name in ("int8", "int4", "int4-b16", "int8-b32-stochastic", "fp16", "bf16"):
        codec = CODECS[name]
        b = codec.block_elems if codec.block_elems > 1 else 64
        for algorithm in ALGORITHMS:
            label = f"{name}/{algorithm}"
            # constant blocks (small integers, so the float32 sum is exact) reduce exactly
            blocks = 7
            x = np.repeat(np.arange(blocks, dtype=np.float32) - 3 + rank, b)[: blocks * b - 3]
            exact = np.repeat(world * (np.arange(blocks, dtype=np.float64) - 3) + world * (world - 1) / 2, b)
            pycoll.allreduce(x, algorithm=algorithm, compression=codec, timeout=30)
            if not np.array_equal(x, exact[: x.size].astype(np.float32)):
                failures.append(f"{label}: constant blocks did not reduce exactly: {x[::b]}")
            # all-zero blocks stay exactly zero next to busy ones
            x = gaussian(rank, 4 * b, 3)
            x[b : 2 * b] = 0
            pycoll.allreduce(x, algorithm=algorithm, compression=codec, timeout=30)
            if np.any(x[b : 2 * b] != 0) or np.signbit(x[b : 2 * b]).any():
                failures.append(f"{label}: an all-zero block came back as {x[b:2 * b][x[b:2 * b] != 0][:4]}")
            # NaN or Inf on one rank: the block's result is not finite, never silently finite
            for bad in (np.nan, np.inf, -np.inf):
                x = gaussian(rank, 4 * b, 4)
                if rank == world - 1:
                    x[2 * b + 1] = bad
                pycoll.allreduce(x, algorithm=algorithm, compression=codec, timeout=30)
                region = x[2 * b + 1] if codec.block_elems == 1 else x[2 * b : 3 * b]
                if np.isfinite(region).any():
                    failures.append(f"{label}: a {bad} input decoded to finite values")
                if not np.isfinite(np.delete(x, np.arange(2 * b, 3 * b))).all():
                    failures.append(f"{label}: a {bad} input poisoned other blocks")
            # empty
            e = np.zeros(0, np.float32)
            pycoll.allreduce(e, algorithm=algorithm, compression=codec, timeout=30)
    return failures


@pytest.mark.parametrize("world", (2, 3))
def test_edge_cases(rank_pool, world):
    results = rank_pool(world).run(body_edge_cases, timeout=300)
    failures = [f for res in results for f in res]
    assert not failures, "\n".join(failures[:20])


# ---- error feedback ----------------------------------------------------------------------------------------
def body_error_feedback(comm, rank, world, name, op, steps, count):
    """``steps`` compressed all-reduces of fresh inputs with and without error feedback.

    Returns per step the worst element of |running sum of results - exact running sum|, with and without
    feedback, and how far the feedback identity is from holding exactly (see ErrorFeedback)."""
    codec = CODECS[name]
    state = ErrorFeedback()
    scale = world if op == "avg" else 1
    run_ef = np.zeros(count)
    run_plain = np.zeros(count)
    run_exact = np.zeros(count)
    err_ef, err_plain, identity = [], [], []
    for step in range(steps):
        inputs = [gaussian(r, count, 1000 + step) for r in range(world)]
        exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
        x = inputs[rank].copy()
        pycoll.allreduce(x, op, compression=codec, residual=state, timeout=30)
        y = inputs[rank].copy()
        pycoll.allreduce(y, op, compression=codec, timeout=30)
        run_ef += x.astype(np.float64) * scale
        run_plain += y.astype(np.float64) * scale
        run_exact += exact
        err_ef.append(float(np.abs(run_ef - run_exact).max()))
        err_plain.append(float(np.abs(run_plain - run_exact).max()))
        # sum over ranks of the residuals: the running sum must equal exact - that (residuals start at 0)
        res = state.residual.astype(np.float64)
        pycoll.allreduce(res, timeout=30)
        identity.append(float(np.abs(run_ef - (run_exact - res)).max() / max(np.abs(run_exact).max(), 1)))
    return err_ef, err_plain, identity


@pytest.mark.parametrize("world,name,op", [(2, "int4", "sum"), (4, "int8", "avg"), (4, "int4", "sum")])
def test_error_feedback_keeps_the_running_sum_on_track(rank_pool, world, name, op):
    steps = 100
    results = rank_pool(world).run(body_error_feedback, name, op, steps, 4099, timeout=300)
    err_ef, err_plain, identity = results[0]
    assert all(res == results[0] for res in results[1:]), "ranks disagree on the running sums"
    # the identity sum(results) = sum(exact) - sum(residuals) holds up to float rounding of the sums
    assert max(identity) < 1e-5, f"feedback identity off by {max(identity):.3g} (relative)"
    # bounded: the last ten steps are no worse than a small multiple of the first ten ...
    early, late = max(err_ef[:10]), max(err_ef[-10:])
    assert late <= 2.5 * early, f"with error feedback the error grew from {early:.3g} to {late:.3g}"
    # ... while without feedback it random-walks upwards (about sqrt(steps) times the first step's)
    assert err_plain[-1] > 3 * late, (f"without feedback the error ({err_plain[-1]:.3g}) should far exceed "
                                      f"the feedback run's ({late:.3g})")


def body_feedback_to_tensor(comm, rank, world):
    """residual= also takes a plain float32 array (or tensor) the caller keeps."""
    r = np.zeros(1000, np.float32)
    x = gaussian(rank, 1000, 9)
    pycoll.allreduce(x, compression="int4", residual=r, timeout=30)
    moved = bool(np.any(r != 0))
    # what one encode lost: half a step of the block that was encoded (this rank's input, or for the chunk
    # it owns the sum of its input and the others' decoded inputs, each within half an int4 step, 1/14 of
    # their absmax, of the input)
    total_abs = np.sum([np.abs(gaussian(q, 1000, 9)) for q in range(world)], axis=0) * (1 + 1 / 14)
    total_abs = block_absmax(total_abs.astype(np.float32), CODECS["int4"].block_elems).astype(np.float32)
    bound = quantization_bound(CODECS["int4"], total_abs)
    return moved, bool(np.all(np.abs(r) <= bound))


def test_residual_array(rank_pool):
    results = rank_pool(2).run(body_feedback_to_tensor, timeout=60)
    assert all(moved for moved, _ in results), "the residual was never written"
    assert all(ok for _, ok in results), "a residual is larger than what one encode can lose"


# ---- the native executor against the plan simulator --------------------------------------------------------
def body_against_simulator(comm, rank, world, seed):
    """Every rank runs compressed all-reduces (with error feedback) and replays all ranks' plans in the
    simulator with the numpy reference codec: results and residuals must match bit for bit."""
    from pycoll.algorithms.compressed import build_compressed_plan
    from pycoll.algorithms.simulate import simulate

    failures = []
    cases = [("int8", "direct", "sum", 5000), ("int4", "ring", "avg", 3001), ("fp16", "tree", "sum", 777),
             ("bf16", "direct", "avg", 64), ("int8-b32-stochastic", "tree", "sum", 4099),
             ("int4-b16", "direct", "sum", 70001)]
    for name, algorithm, op, count in cases:
        codec = CODECS[name]
        inputs = [gaussian(r, count, seed) for r in range(world)]
        residuals = [gaussian(r, count, seed + 1, scale=0.01) for r in range(world)]
        x, res = inputs[rank].copy(), residuals[rank].copy()
        seq = comm.native().seq + 1  # the number this call gets: it keys stochastic rounding
        pycoll.allreduce(x, op, algorithm=algorithm, compression=codec, residual=res, timeout=30)
        segment_blocks = max(1, comm.segment_bytes // codec.block_bytes)
        plans = [build_compressed_plan(algorithm, r, world, count, codec.block_elems, segment_blocks)
                 for r in range(world)]
        sim_res = [r.copy() for r in residuals]
        sim = simulate(plans, [v.copy() for v in inputs], op, codec=codec, residuals=sim_res, seq=seq)
        label = f"{name}/{algorithm}/{op}/count {count}"
        if not np.array_equal(x.view(np.uint32), sim.outputs[rank].view(np.uint32)):
            failures.append(f"{label}: result differs from the simulator's")
        if not np.array_equal(res.view(np.uint32), sim_res[rank].view(np.uint32)):
            failures.append(f"{label}: residual differs from the simulator's")
    return failures


@pytest.mark.parametrize("world", (2, 3))
def test_native_matches_simulator_bitwise(rank_pool, world):
    results = rank_pool(world).run(body_against_simulator, 31, timeout=300)
    failures = [f for res in results for f in res]
    assert not failures, "\n".join(failures)
