"""Compressed all-gather on real ranks: each rank's chunk encoded once, every rank decoding the same
bytes, its owner too, so every rank's output is bitwise identical (pycoll/algorithms/compressed.py).

With round-to-nearest the expected output is known bit for bit: chunk r is the reference codec's
decoding of rank r's input (pycoll.compression.reference, the same bits as the native codecs). With
stochastic rounding (whose bits depend on the call's number) each chunk is held to the codec's bound
and every rank must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
from _inputs import refusals
from harness import RankPool
from test_compression import CODECS, gaussian  # the all-reduce tests' codecs and Gaussian inputs

import pycoll
from pycoll.compression import reference as codec_ref
from pycoll.compression.bounds import quantization_bound


def _chunk_sizes(codec) -> list[int]:
    b = codec.block_elems
    return sorted({0, 1, max(b - 1, 1), b + 1, 1000, 4099})


def body_every_codec(comm, rank, world, seed):
    out = {}
    for name, codec in CODECS.items():
        for m in _chunk_sizes(codec):
            x = gaussian(rank, m, seed)
            before = x.copy()
            got = np.full(world * m, np.nan, dtype=np.float32)
            assert pycoll.all_gather(x, got, compression=codec, timeout=30) is got
            assert np.array_equal(x, before), "all_gather modified its input"
            own = np.full(world * m, np.nan, dtype=np.float32)
            pycoll.all_gather(x, own, compression=codec, exact_own=True, timeout=30)
            out[(name, m)] = (got.tobytes(), own)
    return out


@pytest.mark.parametrize("world", (2, 3, 4))
def test_every_rank_decodes_the_same_bytes(rank_pool, world):
    seed = 30 + world
    results = rank_pool(world).run(body_every_codec, seed, timeout=300)
    failures = []
    for (name, m), (got0, _) in results[0].items():
        codec = CODECS[name]
        differ = [r for r, res in enumerate(results) if res[(name, m)][0] != got0]
        if differ:
            failures.append(f"{name} m={m}: ranks {differ} differ from rank 0 (must be bitwise identical)")
        got = np.frombuffer(got0, dtype=np.float32)
        for r in range(world):
            x = gaussian(r, m, seed)
            chunk = got[r * m:(r + 1) * m]
            if codec.rounding == "nearest":
                _, expected = codec_ref.encode(codec, x)
                if not np.array_equal(chunk, expected):
                    failures.append(f"{name} m={m}: chunk {r} is not the decoding of rank {r}'s encoding")
            elif not (np.abs(chunk.astype(np.float64) - x) <= quantization_bound(codec, x)).all():
                failures.append(f"{name} m={m}: chunk {r} outside the codec's bound")
            # exact_own: the owner's own chunk is its input; the others decode the same bytes (with stochastic
            # rounding another call's: its bits follow the call's number, so they agree among themselves)
            decoded = [results[k][(name, m)][1][r * m:(r + 1) * m] for k in range(world) if k != r]
            if not np.array_equal(results[r][(name, m)][1][r * m:(r + 1) * m], x):
                failures.append(f"{name} m={m} exact_own: rank {r}'s own chunk is not its input")
            want = chunk if codec.rounding == "nearest" else decoded[0]
            if not all(np.array_equal(d, want) for d in decoded):
                failures.append(f"{name} m={m} exact_own: the other ranks' chunk {r} differs")
    assert not failures, "\n".join(failures[:20])


def body_large_and_half(comm, rank, world, seed):
    """Chunks of several messages with a short last block, through both CPU executors; float16 data."""
    codec = CODECS["int8"]
    m = 3 * (comm.segment_bytes // codec.block_bytes) * codec.block_elems + 5
    x = gaussian(rank, m, seed)
    fragment = np.empty(world * m, dtype=np.float32)
    pycoll.all_gather(x, fragment, compression=codec, timeout=60)
    comm.grouped_on_cpu = True  # the grouped programs the GPU path runs, on the CPU's kernels
    try:
        grouped = np.empty(world * m, dtype=np.float32)
        pycoll.all_gather(x, grouped, compression=codec, timeout=60)
    finally:
        comm.grouped_on_cpu = False
    h = x[:3000].astype(np.float16)
    half = np.empty(world * 3000, dtype=np.float16)
    pycoll.all_gather(h, half, compression=codec, timeout=60)
    wide = np.empty(world * 3000, dtype=np.float32)
    pycoll.all_gather(h.astype(np.float32), wide, compression=codec, timeout=60)
    return fragment, grouped, np.array_equal(half, wide.astype(np.float16))


def test_several_messages_both_executors_and_half_precision():
    world, seed = 3, 6
    with RankPool(world, env={"PYCOLL_SHM_SLOT_BYTES": "16384"}) as pool:
        results = pool.run(body_large_and_half, seed, timeout=300)
    fragment0 = results[0][0]
    m = fragment0.size // world
    for r, (fragment, grouped, half) in enumerate(results):
        assert np.array_equal(fragment, fragment0), f"rank {r} differs from rank 0"
        assert np.array_equal(grouped, fragment0), f"rank {r}: the grouped executor differs"
        assert half, f"rank {r}: float16 data is not the float32 all-gather rounded back once"
    for r in range(world):
        _, expected = codec_ref.encode(CODECS["int8"], gaussian(r, m, seed))
        assert np.array_equal(fragment0[r * m:(r + 1) * m], expected), f"chunk {r}"


def body_bad_input(comm, rank, world):
    """Refused on every rank before anything is sent, out left untouched."""
    x = gaussian(rank, 10, 1)
    out = np.zeros(world * 10, np.float32)
    errors = refusals(lambda *a, **kw: pycoll.all_gather(*a, timeout=30, **kw), [
        ((x.astype(np.int32), np.zeros(world * 10, np.int32)), {"compression": "int8"},
         r"needs float32, float16, bfloat16 data, got int32"),
        ((x.astype(np.float64), np.zeros(world * 10)), {"compression": "int8"}, r"got float64"),
        ((x, out), {"compression": "int8", "algorithm": "ring"}, r"runs algorithm='direct'"),
        ((x, out), {"exact_own": True}, r"exact_own= applies to a compressed"),
        ((x, np.zeros(world * 10 - 1, np.float32)), {"compression": "int8"}, r"out must hold world_size"),
    ])  # fmt: skip
    good = np.empty(world * 10, dtype=np.float32)
    pycoll.all_gather(x, good, compression="int8", timeout=30)  # the ranks are still in step
    auto = np.empty(world * 10, dtype=np.float32)  # "auto": too small to compress on shared memory
    pycoll.all_gather(x, auto, compression="auto", exact_own=True, timeout=30)
    pycoll.all_gather(x, good, timeout=30)
    if not np.array_equal(auto, good):
        errors.append('compression="auto" compressed a 40-byte all-gather')
    return errors


def test_bad_input_is_refused_on_every_rank(rank_pool):
    for errors in rank_pool(3).run(body_bad_input, timeout=120):
        assert not errors, errors
