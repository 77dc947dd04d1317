"""Compressed collectives with a rotation (``Int4(rotation="hadamard")``, csrc/kernels/rotation.h) on real
ranks: every collective runs on rotated copies of its buffers and rotates its output back.

Inputs are Gaussian with an outlier in every 17th element (what the rotation is for) and rank-dependent,
so the parent rebuilds every rank's input and checks each result: a reduce-scatter's and all-reduce's
element by element against the derived bounds (pycoll/compression/bounds.py, rotation included); an
all-gather's and all-to-all's bit for bit against the reference (pycoll.compression.reference.roundtrip:
rotate, encode, decode, rotate back, in the numpy twin of the native loops).
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import RankPool
from test_all_to_all import column, parts_of, sent_part, split_matrix

import pycoll
from pycoll.compression import ErrorFeedback, Int4, Int8
from pycoll.compression import reference as codec_ref
from pycoll.compression.bounds import error_bound, reduce_scatter_bound

CODECS = {
    "int4-rot": Int4(rotation="hadamard"),
    "int8-rot": Int8(rotation="hadamard"),
    "int4-b24-rot": Int4(block=24, rotation="hadamard"),
    "int4-rot-stochastic": Int4(rounding="stochastic", seed=3, rotation="hadamard"),
}


def spiky(rank: int, n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng([seed, rank, n]).standard_normal(n).astype(np.float32)
    x[rank % 17::17] *= 40
    return x


def _sizes(codec) -> list[int]:
    b = codec.block_elems
    return sorted({0, 1, b - 1, b + 1, 1000, 4099})


def body_every_collective(comm, rank, world, seed):
    out = {}
    for name, codec in CODECS.items():
        for m in _sizes(codec):
            x = spiky(rank, world * m, seed)
            rs = np.full(m, np.nan, dtype=np.float32)
            pycoll.reduce_scatter(x, rs, compression=codec, timeout=30)
            ag = np.full(world * m, np.nan, dtype=np.float32)
            pycoll.all_gather(x[:m], ag, compression=codec, timeout=30)
            own = np.full(world * m, np.nan, dtype=np.float32)
            pycoll.all_gather(x[:m], own, compression=codec, exact_own=True, timeout=30)
            assert np.array_equal(own[rank * m:(rank + 1) * m], x[:m]), "exact_own with a rotation"
            ar = x.copy()
            pycoll.allreduce(ar, compression=codec, algorithm="ring" if m % 2 else "direct", timeout=30)
            out[(name, m)] = (rs, ag.tobytes(), ar.tobytes())
    return out


@pytest.mark.parametrize("world", (2, 3, 4))
def test_reduce_scatter_all_gather_and_all_reduce_with_a_rotation(rank_pool, world):
    seed = 60 + world
    results = rank_pool(world).run(body_every_collective, seed, timeout=300)
    failures = []
    for (name, m), (_, ag0, ar0) in results[0].items():
        codec = CODECS[name]
        inputs = [spiky(r, world * m, seed) for r in range(world)]
        exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
        ar = np.frombuffer(ar0, dtype=np.float32)
        ag = np.frombuffer(ag0, dtype=np.float32)
        for r, res in enumerate(results):
            rs, ag_r, ar_r = res[(name, m)]
            if ag_r != ag0 or ar_r != ar0:
                failures.append(f"{name} m={m}: rank {r}'s all-gather or all-reduce differs from rank 0's")
            err = np.abs(rs.astype(np.float64) - exact[r * m:(r + 1) * m])
            if not (err <= reduce_scatter_bound(codec, inputs, r)).all():
                failures.append(f"{name} m={m}: rank {r}'s reduce-scatter outside the bound")
            if codec.rounding == "nearest":
                want = codec_ref.roundtrip(codec, inputs[r][:m])
                if not np.array_equal(ag[r * m:(r + 1) * m], want):
                    failures.append(f"{name} m={m}: chunk {r} is not its owner's rotated encoding decoded")
        algorithm = "ring" if m % 2 else "direct"
        if not (np.abs(ar.astype(np.float64) - exact) <= error_bound(codec, algorithm, inputs, ar)).all():
            failures.append(f"{name} m={m}: the {algorithm} all-reduce is outside the bound")
    assert not failures, "\n".join(failures[:20])


def body_all_to_all(comm, rank, world, seed):
    codec = CODECS["int4-rot"]
    split = split_matrix(world, seed, 3 * codec.block_elems + 5)
    x = spiky(rank, sum(split[rank]), seed)
    got = np.empty(sum(column(split, rank)), dtype=np.float32)
    pycoll.all_to_all(x, got, split[rank], column(split, rank), compression=codec, timeout=30)
    return got


def test_all_to_all_parts_are_rotated_each_from_its_start(rank_pool):
    world, seed = 3, 8
    codec = CODECS["int4-rot"]
    split = split_matrix(world, seed, 3 * codec.block_elems + 5)
    for r, got in enumerate(rank_pool(world).run(body_all_to_all, seed, timeout=120)):
        for q, part in enumerate(parts_of(got, split, r)):
            sent = sent_part(spiky(q, sum(split[q]), seed), split, q, r)
            if q == r:  # never quantized, and copied back bit for bit (not rotated there and back)
                assert np.array_equal(part, sent), f"rank {r}'s own part"
            else:
                assert np.array_equal(part, codec_ref.roundtrip(codec, sent)), f"rank {r}'s part from {q}"


def body_half_grouped_feedback(comm, rank, world, seed):
    """float16 data (widened, then rotated); the grouped executor's result; 40 steps of error feedback."""
    codec = CODECS["int4-rot"]
    m = 3000
    x = spiky(rank, world * m, seed)
    wide = np.empty(m, dtype=np.float32)
    pycoll.reduce_scatter(x.astype(np.float16).astype(np.float32), wide, compression=codec, timeout=30)
    half = np.empty(m, dtype=np.float16)
    pycoll.reduce_scatter(x.astype(np.float16), half, compression=codec, timeout=30)
    fragment = np.empty(world * m, dtype=np.float32)
    pycoll.all_gather(x[:m], fragment, compression=codec, timeout=30)
    comm.grouped_on_cpu = True
    try:
        grouped = np.empty(world * m, dtype=np.float32)
        pycoll.all_gather(x[:m], grouped, compression=codec, timeout=30)
    finally:
        comm.grouped_on_cpu = False
    state, run_ef, run_exact = ErrorFeedback(), np.zeros(m), np.zeros(m)
    errors = []
    for step in range(40):
        inputs = [spiky(r, world * m, 900 + step) for r in range(world)]
        out = np.empty(m, dtype=np.float32)
        pycoll.reduce_scatter(inputs[rank], out, compression=codec, residual=state, timeout=30)
        run_ef += out
        run_exact += np.sum([v.astype(np.float64) for v in inputs], axis=0)[rank * m:(rank + 1) * m]
        errors.append(float(np.abs(run_ef - run_exact).max()))
    return (np.array_equal(half, wide.astype(np.float16)), np.array_equal(fragment, grouped),
            max(errors[:5]), max(errors[-5:]))


def test_half_precision_the_grouped_executor_and_error_feedback(rank_pool):
    for half, grouped, first, last in rank_pool(3).run(body_half_grouped_feedback, 4, timeout=300):
        assert half, "float16 data is not the float32 reduce-scatter rounded back once"
        assert grouped, "the grouped executor differs from the fragment executor"
        assert last <= 2.5 * first, f"with error feedback the error grew from {first:.3g} to {last:.3g}"


def body_mismatch(comm, rank, world):
    x = spiky(rank, world * 100, 2)
    out = np.empty(100, dtype=np.float32)
    codec = Int4(rotation="hadamard") if rank == 0 else Int4()
    try:
        pycoll.reduce_scatter(x, out, compression=codec, timeout=20)
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)
    return "no error", ""


def test_a_rotation_on_one_rank_only_is_a_mismatch():
    with RankPool(3) as pool:
        for name, message in pool.run(body_mismatch, timeout=60):
            assert name == "CollectiveMismatchError", (name, message)
            assert "hadamard" in message or "reported by" in message, message
