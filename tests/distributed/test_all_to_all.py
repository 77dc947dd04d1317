"""All-to-all on real ranks: even and uneven parts (MoE dispatch), compressed or not
(pycoll/algorithms/direct.py, compressed.py).

The parts rank r sends form row r of a split matrix S (``S[r][p]`` elements for rank p, some of them
empty); rank r receives column r. Every rank's input is a pure function of its rank, so the parent
rebuilds what each part must hold: exactly the sender's elements uncompressed; compressed, bit for bit
the reference codec's decoding of the sender's part (encoded in blocks from the part's start, round to
nearest), the receiver's own part exact; with stochastic rounding, within the codec's bound.
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


def split_matrix(world: int, seed: int, scale: int) -> list[list[int]]:
    """S[r][p]: elements rank r sends rank p; about a quarter of the parts are empty."""
    rng = np.random.default_rng([seed, world])
    sizes = rng.integers(1, scale + 1, size=(world, world))
    sizes[rng.random((world, world)) < 0.25] = 0
    return sizes.tolist()


def column(split: list[list[int]], r: int) -> list[int]:
    return [row[r] for row in split]


def sent_part(x: np.ndarray, split: list[list[int]], sender: int, receiver: int) -> np.ndarray:
    start = sum(split[sender][:receiver])
    return x[start:start + split[sender][receiver]]


def parts_of(out: np.ndarray, split: list[list[int]], receiver: int) -> list[np.ndarray]:
    counts = column(split, receiver)
    return [out[sum(counts[:q]):sum(counts[:q + 1])] for q in range(len(counts))]


def inputs(rank: int, split: list[list[int]], dtype: str, seed: int) -> np.ndarray:
    """Rank-dependent values that every dtype holds exactly: 1000 * rank + position (mod 100 for int8)."""
    n = sum(split[rank])
    values = (1000 * rank + seed + np.arange(n)) % (100 if dtype in ("int8", "uint8") else 1 << 20)
    if dtype == "bfloat16":
        from _inputs import bf16_from_bits, f64_to_bf16_bits

        return bf16_from_bits(f64_to_bf16_bits((values % 256).astype(np.float64)))
    return values.astype(dtype)


# ---- uncompressed: exact, every dtype ---------------------------------------------------------------------
def body_exact(comm, rank, world, seed):
    out = {}
    for dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8"):
        split = split_matrix(world, seed, 300)
        x = inputs(rank, split, dtype, seed)
        before = x.copy()
        got = np.zeros(sum(column(split, rank)), dtype=x.dtype)
        assert pycoll.all_to_all(x, got, split[rank], column(split, rank), timeout=30) is got
        assert np.array_equal(x, before), "all_to_all modified its input"
        out[dtype] = got
    even = np.arange(7 * world, dtype=np.float32) + 100 * rank
    got = np.zeros_like(even)
    pycoll.all_to_all(even, got, timeout=30)
    explicit = np.zeros_like(even)
    pycoll.all_to_all(even, explicit, [7] * world, [7] * world, timeout=30)
    out["even"] = (got, explicit)
    return out


@pytest.mark.parametrize("world", (1, 2, 3, 4))
def test_every_part_arrives_exactly(rank_pool, world):
    seed = 3 + world
    results = rank_pool(world).run(body_exact, seed, timeout=120)
    split = split_matrix(world, seed, 300)
    for r, res in enumerate(results):
        for dtype, got in res.items():
            if dtype == "even":
                continue
            for q, part in enumerate(parts_of(got, split, r)):
                want = sent_part(inputs(q, split, dtype, seed), split, q, r)
                same = np.array_equal(part.view(np.uint8), want.view(np.uint8))
                assert same, f"{dtype}: rank {r}'s part from {q}"
        got, explicit = res["even"]
        want = np.concatenate([np.arange(7 * r, 7 * r + 7, dtype=np.float32) + 100 * q for q in range(world)])
        assert np.array_equal(got, want) and np.array_equal(explicit, want), f"rank {r}: even parts"


# ---- compressed -----------------------------------------------------------------------------------------
def _part_scale(codec) -> int:
    return 3 * codec.block_elems + 5  # parts of 1 .. 3 blocks and a short one, empty ones too


def body_compressed(comm, rank, world, seed):
    out = {}
    for name, codec in CODECS.items():
        split = split_matrix(world, seed, _part_scale(codec))
        x = gaussian(rank, sum(split[rank]), seed)
        got = np.full(sum(column(split, rank)), np.nan, dtype=np.float32)
        pycoll.all_to_all(x, got, split[rank], column(split, rank), compression=codec, timeout=30)
        out[name] = got
    split = split_matrix(world, seed, 1000)
    x = gaussian(rank, sum(split[rank]), seed)
    half = np.empty(sum(column(split, rank)), dtype=np.float16)
    pycoll.all_to_all(x.astype(np.float16), half, split[rank], column(split, rank), compression="int8",
                      timeout=30)  # fmt: skip
    wide = np.empty(half.size, dtype=np.float32)
    pycoll.all_to_all(x.astype(np.float16).astype(np.float32), wide, split[rank], column(split, rank),
                      compression="int8", timeout=30)  # fmt: skip
    out["float16"] = np.array_equal(half, wide.astype(np.float16))
    return out


@pytest.mark.parametrize("world", (2, 3, 4))
def test_each_part_is_its_senders_encoding_decoded(rank_pool, world):
    seed = 40 + world
    results = rank_pool(world).run(body_compressed, seed, timeout=300)
    failures = []
    for r, res in enumerate(results):
        if not res.pop("float16"):
            failures.append(f"rank {r}: float16 data is not the float32 all-to-all rounded back once")
        for name, got in res.items():
            codec = CODECS[name]
            split = split_matrix(world, seed, _part_scale(codec))
            for q, part in enumerate(parts_of(got, split, r)):
                sent = sent_part(gaussian(q, sum(split[q]), seed), split, q, r)
                if q == r:
                    ok = np.array_equal(part, sent)
                elif codec.rounding == "nearest":
                    ok = np.array_equal(part, codec_ref.encode(codec, sent)[1])
                else:
                    err = np.abs(part.astype(np.float64) - sent)
                    ok = bool((err <= quantization_bound(codec, sent)).all())
                if not ok:
                    failures.append(f"{name}: rank {r}'s part from rank {q} ({sent.size} elements) is wrong")
    assert not failures, "\n".join(failures[:20])


def body_grouped(comm, rank, world, seed):
    """Even parts through both CPU executors (the grouped program is the one GPUs run)."""
    m = 3 * (comm.segment_bytes // CODECS["int4"].block_bytes) * CODECS["int4"].block_elems + 5
    x = gaussian(rank, world * m, seed)
    fragment = np.empty_like(x)
    pycoll.all_to_all(x, fragment, compression="int4", timeout=60)
    plain = np.empty_like(x)
    pycoll.all_to_all(x, plain, timeout=60)
    comm.grouped_on_cpu = True
    try:
        grouped, grouped_plain = np.empty_like(x), np.empty_like(x)
        pycoll.all_to_all(x, grouped, compression="int4", timeout=60)
        pycoll.all_to_all(x, grouped_plain, timeout=60)
        try:
            pycoll.all_to_all(x, np.empty_like(x), [m] * world, [m] * world, timeout=60)
            uneven = "ran"
        except pycoll.InvalidUsageError as e:
            uneven = str(e)
    finally:
        comm.grouped_on_cpu = False
    return fragment, grouped, plain, grouped_plain, uneven


def test_even_parts_on_the_grouped_executor():
    world, seed = 3, 6
    with RankPool(world, env={"PYCOLL_SHM_SLOT_BYTES": "16384"}) as pool:
        results = pool.run(body_grouped, seed, timeout=300)
    m = results[0][0].size // world
    for r, (fragment, grouped, plain, grouped_plain, uneven) in enumerate(results):
        assert np.array_equal(fragment, grouped), f"rank {r}: the two executors differ"
        want = np.concatenate([gaussian(q, world * m, seed)[r * m:(r + 1) * m] for q in range(world)])
        assert np.array_equal(plain, want) and np.array_equal(grouped_plain, want), f"rank {r}: uncompressed"
        assert "uneven parts runs on the fragment executor only" in uneven, uneven


# ---- what is refused, and ranks that disagree -------------------------------------------------------------
def body_bad_input(comm, rank, world):
    """Refused on every rank, before anything is sent, and out left untouched."""
    x = gaussian(rank, world * 10, 1)
    out = np.zeros(world * 10, np.float32)
    even = [10] * world
    skewed = [10] * world
    skewed[rank] = 9
    errors = refusals(lambda *a, **kw: pycoll.all_to_all(*a, timeout=30, **kw), [
        ((x, out, even[:-1], even), {}, rf"send_counts must be {world} non-negative element counts"),
        ((x, out, even, [-1] + even[1:]), {}, r"recv_counts must be .* got \[-1"),
        ((x, out, even, [11] * world), {}, rf"summing to out.size \({world * 10}\)"),
        ((x, out, even, None), {}, r"give both send_counts and recv_counts"),
        ((x, out, even, ["a"] * world), {}, r"recv_counts must be a sequence of"),
        ((x, out[:-1], None, None), {}, rf"the same multiple of {world} elements"),
        ((x, out.astype(np.float64), None, None), {}, r"x and out must have the same dtype"),
        ((x, out, even, even), {"algorithm": "ring"}, r"algorithm for all_to_all must be auto or direct"),
        ((x.astype(np.int32), out.astype(np.int32), None, None), {"compression": "int8"},
         r"needs float32, float16, bfloat16 data"),
        ((x.astype(np.float64), out.astype(np.float64), None, None), {"compression": "int8"}, r"got float64"),
        ((x, out, even, even), {"error_budget": 0.01}, r'error_budget= applies to compression="auto"'),
        ((x, out, even, even), {"compression": "auto"}, r'compression="auto" needs equal parts'),
    ])  # fmt: skip
    if world > 1:  # its own part must be the same size both ways
        y = gaussian(rank, world * 10 - 1, 1)
        errors += refusals(lambda *a: pycoll.all_to_all(*a, timeout=30), [
            ((y, np.zeros(world * 10, np.float32), skewed, even), {},
             rf"sends itself send_counts\[{rank}\] = 9"),
        ])  # fmt: skip
    good = np.empty_like(x)
    pycoll.all_to_all(x, good, compression="int8", timeout=30)  # the ranks are still in step
    return errors


def test_bad_input_is_refused_on_every_rank(rank_pool):
    for errors in rank_pool(3).run(body_bad_input, timeout=120):
        assert not errors, errors


def body_mismatch(comm, rank, world):
    """Rank 0 expects one element more from rank 1 than rank 1 sends: both raise CollectiveMismatchError,
    long before the deadline, naming the counts; a rank whose own parts all matched may finish, and its
    next collective raises."""
    send, recv = [4] * world, [4] * world
    if rank == 0:
        recv[1] = 5
    x = np.zeros(sum(send), np.float32)
    out = np.zeros(sum(recv), np.float32)
    errors = []
    for call in (lambda: pycoll.all_to_all(x, out, send, recv, timeout=20),
                 lambda: pycoll.barrier(timeout=20)):  # fmt: skip
        try:
            call()
        except pycoll.PycollError as e:
            errors.append((type(e).__name__, str(e)))
    return errors


def test_parts_of_different_sizes_raise_a_mismatch(rank_pool):
    results = rank_pool(3).run(body_mismatch, timeout=60)
    for rank, errors in enumerate(results):
        assert errors, f"rank {rank} raised nothing"
        name, message = errors[0]
        if rank in (0, 1):
            assert name == "CollectiveMismatchError", (rank, name, message)
            assert "rank 1's send_counts[0] must equal rank 0's recv_counts[1]" in message, message


def body_odd_tail(comm, rank, world):
    """int4 packs two codes a byte: a last block of 33 elements and one of 34 encode into as many bytes, so
    only the element count the messages carry tells rank 0's 33-element parts from rank 1's 34."""
    m = 33 if rank == 0 else 34
    x = np.ones(world * m, np.float32)
    out = np.zeros(world * m, np.float32)
    try:
        pycoll.all_to_all(x, out, compression=pycoll.compression.Int4(), timeout=20)
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)
    return "no error", ""


def test_int4_parts_of_one_encoded_size_but_other_lengths_raise_a_mismatch(rank_pool):
    for name, message in rank_pool(2).run(body_odd_tail, timeout=60):
        assert name == "CollectiveMismatchError", (name, message)
        assert "elements" in message and "send_counts" in message, message
