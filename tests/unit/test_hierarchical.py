"""The hierarchical all-reduce plan (pycoll/algorithms/hierarchical.py), run by the plan simulator.

Hosts of 1-4 ranks, 1-3 hosts, counts that do not divide: integer sums equal the closed form on every
rank, float averages are bitwise identical across ranks, the grouped lowering is
deadlock-free, and the cross-host traffic is the ring's on one share per rank, spread over every rank's
link.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pycoll.algorithms import build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.grouped import check_grouped, lower_to_groups
from pycoll.algorithms.plan import split_even
from pycoll.algorithms.simulate import simulate
from pycoll.compression import Int8


@pytest.mark.parametrize("local_size,hosts", list(itertools.product((1, 2, 3, 4), (1, 2, 3))))
def test_hierarchical_allreduce_is_exact_and_identical_everywhere(local_size, hosts):
    world = local_size * hosts
    for count in (0, 1, 5, 37, 1000):
        plans = [
            build_plan("allreduce", "hierarchical", r, world, count, segment_elems=16, local_size=local_size)
            for r in range(world)
        ]
        # in place only: the host's sum is kept in INPUT between the stages (all-reduce is in place)
        inputs = [np.arange(count, dtype=np.int64) * (r + 1) + r for r in range(world)]
        result = simulate(plans, inputs, "sum")
        want = np.sum(inputs, axis=0)
        assert all(np.array_equal(out, want) for out in result.outputs)
        floats = [np.random.default_rng(r).standard_normal(count).astype(np.float32) for r in range(world)]
        outs = simulate(plans, floats, "avg").outputs
        assert all(out.tobytes() == outs[0].tobytes() for out in outs)
        np.testing.assert_allclose(outs[0], np.mean(floats, axis=0), atol=1e-5)
        check_grouped(lower_to_groups(plans, lambda op: op.count * 4), plans)


def test_every_rank_carries_an_equal_share_across_hosts():
    local_size, hosts, count = 4, 2, 8000
    world = local_size * hosts
    plans = [
        build_plan("allreduce", "hierarchical", r, world, count, segment_elems=1 << 20, local_size=local_size)
        for r in range(world)
    ]
    links = simulate(plans, [np.ones(count, np.float32)] * world, "sum").elements_per_link
    cross = {(a, b): n for (a, b), n in links.items() if a // local_size != b // local_size}
    # column l (ranks l and 4 + l) ring-all-reduces share l (count / 4): 2 * (2-1)/2 * 2000 each way
    assert cross == {(a, (a + local_size) % world): count // local_size for a in range(world)}


def test_compressed_hierarchical_plans_stay_on_block_boundaries():
    codec = Int8(block=32)
    plans = [
        build_compressed_plan("hierarchical", r, 6, 5000, codec.block_elems, 4, local_size=3)
        for r in range(6)
    ]
    inputs = [np.random.default_rng(r).standard_normal(5000).astype(np.float32) for r in range(6)]
    outs = simulate(plans, inputs, "sum", codec=codec).outputs
    assert all(out.tobytes() == outs[0].tobytes() for out in outs)
    assert np.max(np.abs(outs[0] - np.sum(inputs, axis=0))) < 0.2


def _compressed_plans(local_size, hosts, count, codec, segment_blocks=4):
    world = local_size * hosts
    return [
        build_compressed_plan("hierarchical", r, world, count, codec.block_elems, segment_blocks,
                              local_size=local_size)
        for r in range(world)
    ]


@pytest.mark.parametrize("local_size,hosts", [(2, 2), (3, 2), (2, 3), (4, 2)])
def test_compression_is_only_on_the_links_between_hosts(local_size, hosts):
    codec, count = Int8(block=32), 4000
    world = local_size * hosts
    plans = _compressed_plans(local_size, hosts, count, codec)
    inputs = [np.random.default_rng(r).standard_normal(count).astype(np.float32) for r in range(world)]
    result = simulate(plans, inputs, "sum", codec=codec)
    for link, elements in result.elements_per_link.items():
        within = link[0] // local_size == link[1] // local_size
        if within:  # float32 elements, as without a codec
            assert result.bytes_per_link[link] == 4 * elements
        else:  # int8: a byte per element and a float32 scale per block of 32
            assert result.bytes_per_link[link] < 1.2 * elements
    # quantized as in a ring among the hosts: hosts - 1 times on the way, the final value once
    assert max(int(q.max()) for q in result.quantizations) == hosts
    programs = lower_to_groups(plans, lambda op: op.count + 4 * -(-op.count // 32), compressed=True)
    check_grouped(programs, plans)


@pytest.mark.parametrize("local_size,hosts", [(2, 2), (3, 2), (2, 3)])
def test_compressed_hierarchical_is_the_compressed_ring_of_the_hosts_sums(local_size, hosts):
    """With small integers (exact float32 sums in any order) and nearest rounding, the host's sum is
    exact, and what the hosts then do with share l is bit for bit the compressed ring over ``hosts``
    ranks on that share of the host sums; the error feedback is that ring's, kept by local rank l."""
    codec, count = Int8(block=32), 3000
    world = local_size * hosts
    inputs = [np.random.default_rng(r).integers(-50, 50, count).astype(np.float32) for r in range(world)]
    residuals = [np.zeros(count, np.float32) for _ in range(world)]
    outs = simulate(_compressed_plans(local_size, hosts, count, codec), inputs, "sum", codec=codec,
                    residuals=residuals).outputs
    host_sums = [np.sum(inputs[h * local_size:(h + 1) * local_size], axis=0, dtype=np.float32)
                 for h in range(hosts)]
    blocks = -(-count // 32)
    for local, (first, n_blocks) in enumerate(split_even(blocks, local_size)):
        lo, hi = first * 32, min((first + n_blocks) * 32, count)
        ring = [build_compressed_plan("ring", h, hosts, hi - lo, 32, 4) for h in range(hosts)]
        ring_residuals = [np.zeros(hi - lo, np.float32) for _ in range(hosts)]
        want = simulate(ring, [s[lo:hi] for s in host_sums], "sum", codec=codec, residuals=ring_residuals)
        for r in range(world):
            assert outs[r][lo:hi].tobytes() == want.outputs[0].tobytes()
            mine = r % local_size == local
            expect = ring_residuals[r // local_size] if mine else np.zeros(hi - lo, np.float32)
            assert residuals[r][lo:hi].tobytes() == expect.tobytes()
    assert all(out.tobytes() == outs[0].tobytes() for out in outs)


def test_compressed_hierarchical_on_one_host_is_exact():
    codec, count = Int8(block=32), 1000
    inputs = [np.random.default_rng(r).integers(-50, 50, count).astype(np.float32) for r in range(3)]
    outs = simulate(_compressed_plans(3, 1, count, codec), inputs, "avg", codec=codec).outputs
    assert all(out.tobytes() == (np.sum(inputs, axis=0) / np.float32(3)).tobytes() for out in outs)


def test_uneven_layouts_are_refused():
    with pytest.raises(ValueError, match="multiple of local_size"):
        build_plan("allreduce", "hierarchical", 0, 5, 10, local_size=2)
