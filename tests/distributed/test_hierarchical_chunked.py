"""The hierarchical reduce-scatter and all-gather (pycoll/algorithms/hierarchical.py) on pretend hosts:
shared memory within each, TCP between them (PYCOLL_TEST_RANKS_PER_HOST).

Every result, and with error feedback every residual, is checked bit for bit against the plan simulator
(pycoll.algorithms.simulate, the executor's oracle) on the same inputs, plain and compressed, by the
fragment executor and as the grouped program GPUs run. Compressed, each element is quantized once, on
its host's sum, between hosts: the error is held element by element to the sum over the other hosts of
one quantization of their sums, and a host's network bytes to (hosts - 1) encoded chunks per rank.

The all-gather forwards its owners' encodings: every rank's output is bitwise identical and each chunk
is, bit for bit, the reference codec's decoding of its owner's input (exact_own: the owner keeps its own).
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import RankPool

import pycoll
from pycoll.algorithms import build_plan
from pycoll.algorithms.compressed import (
    build_compressed_hierarchical_all_gather,
    build_compressed_hierarchical_reduce_scatter,
)
from pycoll.algorithms.simulate import simulate
from pycoll.compression import Int4, Int8
from pycoll.compression import reference as codec_ref
from pycoll.compression.bounds import F32_U, quantization_bound

HOSTS_OF = {2: {"PYCOLL_TEST_RANKS_PER_HOST": "2"}, 3: {"PYCOLL_TEST_RANKS_PER_HOST": "3"}}
CODECS = [None, Int8(), Int4(block=64, rounding="stochastic", seed=4), Int4(rotation="hadamard")]


def _inputs(world: int, n: int, seed: int, dtype=np.float32) -> list[np.ndarray]:
    return [(np.random.default_rng([seed, r, n]).standard_normal(n) * 4).astype(dtype) for r in range(world)]


def body_against_simulator(comm, rank, world, local_size, m):
    failures = []
    for k, codec in enumerate(CODECS):
        for op, grouped, feedback in (("sum", False, True), ("avg", True, False)):
            inputs = _inputs(world, world * m, 10 * k + grouped)
            residuals = [np.random.default_rng([r, k]).standard_normal(world * m).astype(np.float32) / 50
                         for r in range(world)] if codec is not None and feedback else None
            res = None if residuals is None else residuals[rank].copy()
            out = np.full(m, np.nan, dtype=np.float32)
            seq = comm.native().seq + 1  # keys stochastic rounding
            comm.grouped_on_cpu = grouped
            try:
                pycoll.reduce_scatter(inputs[rank], out, op, algorithm="hierarchical", compression=codec,
                                      residual=res, comm=comm, timeout=60)  # fmt: skip
            finally:
                comm.grouped_on_cpu = False
            label = f"{codec!r} {op} grouped={grouped}"
            if codec is not None and codec.rotation is not None:  # checked against its bound below
                continue
            if codec is None:
                plans = [build_plan("reduce_scatter", "hierarchical", r, world, m, local_size=local_size,
                                    segment_elems=comm.segment_bytes // 4) for r in range(world)]  # fmt: skip
            else:
                segment_blocks = max(1, comm.segment_bytes // codec.block_bytes)
                block, build = codec.block_elems, build_compressed_hierarchical_reduce_scatter
                plans = [build(r, world, m, block, segment_blocks, local_size) for r in range(world)]
            sim = simulate(plans, inputs, op, codec=codec, residuals=residuals, seq=seq)
            if out.tobytes() != sim.outputs[rank][rank * m:(rank + 1) * m].tobytes():
                failures.append(f"{label}: the result differs from the simulator's")
            if res is not None and res.tobytes() != residuals[rank].tobytes():
                failures.append(f"{label}: the residual differs from the simulator's")
    return failures


@pytest.mark.parametrize("local_size,world,m", [(2, 4, 5003), (3, 6, 777), (2, 6, 64)])
def test_results_and_residuals_are_the_simulators(local_size, world, m):
    with RankPool(world, env=HOSTS_OF[local_size]) as pool:
        results = pool.run(body_against_simulator, local_size, m, timeout=300)
    assert results == [[]] * world


def body_bound(comm, rank, world, seed, m):
    out = {}
    for codec in (Int8(), Int4(), Int4(rotation="hadamard")):
        x = _inputs(world, world * m, seed)[rank]
        got = np.empty(m, dtype=np.float32)
        pycoll.reduce_scatter(x, got, compression=codec, comm=comm, timeout=60)  # auto: hierarchical here
        out[repr(codec)] = got
    ints = np.arange(world * m, dtype=np.int64) * (rank + 1)
    exact = np.empty(m, dtype=np.int64)
    pycoll.reduce_scatter(ints, exact, comm=comm, timeout=60)
    return out, exact


def test_each_element_is_quantized_once_between_hosts():
    """2 hosts of 2: the error of every element is within one quantization of the other host's sum (its
    own host's sum is exact), far below what the direct reduce-scatter's three quantized shares allow;
    integers stay exact."""
    world, local_size, seed, m = 4, 2, 7, 4099
    with RankPool(world, env=HOSTS_OF[local_size]) as pool:
        results = pool.run(body_bound, seed, m, timeout=300)
    inputs = _inputs(world, world * m, seed)
    exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
    host_sums = [np.sum([v.astype(np.float64) for v in inputs[h * 2:h * 2 + 2]], axis=0) for h in range(2)]
    for rank, (got, ints) in enumerate(results):
        assert np.array_equal(ints, np.arange(rank * m, (rank + 1) * m) * sum(range(1, world + 1)))
        chunk = slice(rank * m, (rank + 1) * m)
        other = host_sums[1 - rank // local_size][chunk].astype(np.float32)
        magnitude = np.sum([np.abs(v[chunk].astype(np.float64)) for v in inputs], axis=0)
        for name, values in got.items():
            codec = {repr(c): c for c in (Int8(), Int4(), Int4(rotation="hadamard"))}[name]
            bound = quantization_bound(codec, other) + 4 * world * F32_U * magnitude * 16
            err = np.abs(values.astype(np.float64) - exact[chunk])
            assert (err <= bound).all(), f"rank {rank} {name}: {(err > bound).sum()} elements outside"


def test_a_host_sends_one_chunk_per_other_host_and_rank():
    """The plan's network bytes: (hosts - 1) encoded chunks per rank, where the direct reduce-scatter
    sends (world - local_size) of them; over shared memory, (local_size - 1) * hosts float32 chunks."""
    world, local_size, m, codec = 6, 2, 1000, Int8()
    plans = [build_compressed_hierarchical_reduce_scatter(r, world, m, codec.block_elems, 4, local_size)
             for r in range(world)]
    sim = simulate(plans, _inputs(world, world * m, 1), codec=codec)
    for r in range(world):
        host = r // local_size
        sent = {dst: b for (src, dst), b in sim.bytes_per_link.items() if src == r}
        network = sum(b for dst, b in sent.items() if dst // local_size != host)
        local = sum(b for dst, b in sent.items() if dst // local_size == host)
        assert network == (world // local_size - 1) * codec.encoded_bytes(m)
        assert local == (local_size - 1) * (world // local_size) * m * 4


# ---- the all-gather ------------------------------------------------------------------------------------
AG_CODECS = [Int8(), Int4(block=16), Int4(rotation="hadamard")]


def body_all_gather(comm, rank, world, m):
    out = {}
    x = _inputs(world, m, 3)[rank]
    for codec in [None, *AG_CODECS]:
        for exact_own, grouped in ((False, False), (True, True)):
            if codec is None and exact_own:
                continue
            got = np.full(world * m, np.nan, dtype=np.float32)
            comm.grouped_on_cpu = grouped
            try:  # algorithm auto: hierarchical on these hosts
                pycoll.all_gather(x, got, compression=codec, exact_own=exact_own, comm=comm, timeout=60)
            finally:
                comm.grouped_on_cpu = False
            out[(repr(codec), exact_own)] = got
    ran = {(k.collective, k.algorithm) for k in comm.dispatcher.plans.keys()}
    assert ("all_gather", "hierarchical") in ran, ran
    return out


@pytest.mark.parametrize("local_size,world,m", [(2, 4, 3001), (3, 6, 200), (2, 6, 0)])
def test_all_gather_every_rank_decodes_its_owners_bytes(local_size, world, m):
    with RankPool(world, env=HOSTS_OF[local_size]) as pool:
        results = pool.run(body_all_gather, m, timeout=300)
    inputs = _inputs(world, m, 3)
    for (name, exact_own), got0 in results[0].items():
        codec = {repr(c): c for c in AG_CODECS}.get(name)
        want = np.concatenate([x if codec is None else codec_ref.roundtrip(codec, x) for x in inputs])
        for rank, res in enumerate(results):
            got = res[(name, exact_own)]
            if exact_own:
                mine = slice(rank * m, (rank + 1) * m)
                assert np.array_equal(got[mine], inputs[rank]), f"{name}: rank {rank}'s own chunk"
                others = np.arange(world * m) // max(m, 1) != rank
                assert np.array_equal(got[others], want[others]), f"{name} exact_own: rank {rank}'s others"
            else:
                assert got.tobytes() == got0.tobytes(), f"{name}: rank {rank} differs from rank 0"
                assert np.array_equal(got, want), f"{name}: rank {rank}'s chunks are not their owners'"


def test_an_all_gather_sends_its_chunk_once_per_other_host():
    """(hosts - 1) encoded chunks per rank cross the network, where the direct all-gather sends
    (world - 1); within a host, each rank forwards its column's hosts chunks, still encoded."""
    world, local_size, m, codec = 6, 2, 1000, Int8()
    plans = [build_compressed_hierarchical_all_gather(r, world, m, codec.block_elems, 4, local_size)
             for r in range(world)]
    for r, plan in enumerate(plans):
        host = r // local_size
        sends = [op for op in plan.ops() if op.send_peer >= 0]
        network = sum(op.count for op in sends if op.send_peer // local_size != host)
        local = sum(op.count for op in sends if op.send_peer // local_size == host)
        assert network == (world // local_size - 1) * m
        assert local == (local_size - 1) * (world // local_size) * m
        assert all(op.src[0].name == "ENCODED" for op in sends)
