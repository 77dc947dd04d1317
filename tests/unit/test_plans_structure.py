"""The shape of the plans: trees, segment-major order, fused ops, pipelining, empty regions, the API."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pycoll.algorithms import ALGORITHMS, DEFAULT_SEGMENT_ELEMS, build_plan
from pycoll.algorithms._layout import cut_segments
from pycoll.algorithms.plan import OP_COLUMNS, READS_SRC, SENDS, WRITES_DST, Buf, OpKind, split_even
from pycoll.algorithms.simulate import simulate
from pycoll.algorithms.tree import binary_tree, double_binary_tree


def all_plans(collective: str, algorithm: str, world: int, count: int, seg: int = DEFAULT_SEGMENT_ELEMS,
              root: int = 0) -> list:
    return [build_plan(collective, algorithm, r, world, count, root=root, segment_elems=seg)
            for r in range(world)]


# ---- trees --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", range(1, 70))
def test_binary_tree_is_a_tree(world: int) -> None:
    for tree in double_binary_tree(world):
        assert tree.parent[tree.root] == -1
        assert sum(p == -1 for p in tree.parent) == 1
        for rank, kids in enumerate(tree.children):
            assert len(kids) <= 2
            for k in kids:
                assert tree.parent[k] == rank and tree.depth[k] == tree.depth[rank] + 1
        assert sorted(k for kids in tree.children for k in kids) == sorted(set(range(world)) - {tree.root})
        assert tree.height <= max(0, math.ceil(math.log2(world)))


@pytest.mark.parametrize("world", range(2, 70))
def test_double_tree_is_complementary(world: int) -> None:
    """A rank that is a leaf in one tree is interior in the other (so the work is shared)."""
    first, second = double_binary_tree(world)
    assert not first.leaves() & second.leaves()
    if world % 2 == 0:
        assert first.leaves() | second.leaves() == frozenset(range(world))
    else:  # rank 0 is interior in both
        assert first.leaves() | second.leaves() == frozenset(range(1, world))


def test_broadcast_tree_is_rooted_at_root() -> None:
    for world in (1, 2, 5, 9):
        for root in range(world):
            tree = binary_tree(world, [(label + root) % world for label in range(world)])
            assert tree.root == root


# ---- segment-major order and fused ops ----------------------------------------------------------------

def regions(op):  # (buffer, start, end) of what an op reads and writes
    out = []
    if op.kind in READS_SRC:
        out.append((op.src[0], op.src[1], op.src[1] + op.count))
    if op.kind in WRITES_DST:
        out.append((op.dst[0], op.dst[1], op.dst[1] + op.count))
    return out


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_allreduce_is_segment_major(algorithm: str, world: int) -> None:
    count, seg = 11 * world + 3, 4
    chunk_segments = cut_segments(split_even(count, world), seg)
    n_segments = len(chunk_segments[0])
    for plan in all_plans("allreduce", algorithm, world, count, seg):
        assert len(plan.steps) == 2 * n_segments  # a reduce-scatter and an all-gather step per segment
        for k, step in enumerate(plan.steps):
            segment = [chunk_segments[c][k // 2] for c in range(world)]
            for op in step:
                for _, start, end in regions(op):
                    assert any(off <= start and end <= off + n for off, n in segment), (k, op)


@pytest.mark.parametrize("world", [2, 3, 4, 9])
def test_ring_allreduce_uses_fused_ops(world: int) -> None:
    for plan in all_plans("allreduce", "ring", world, 5 * world, 2):
        for reduce_scatter, all_gather in zip(plan.steps[::2], plan.steps[1::2]):
            assert [op.kind for op in reduce_scatter] == (
                [OpKind.SEND] + [OpKind.RECV_REDUCE_SEND] * (world - 2) + [OpKind.RECV_REDUCE_COPY_SEND])
            assert [op.finalize for op in reduce_scatter] == [False] * (world - 1) + [True]
            assert [op.kind for op in all_gather] == [OpKind.RECV_COPY_SEND] * (world - 2) + [OpKind.RECV]
            right, left = (plan.rank + 1) % world, (plan.rank - 1) % world
            assert all(op.send_peer in (-1, right) and op.recv_peer in (-1, left) for op in plan.ops())


def test_direct_reduces_in_a_fixed_rotation() -> None:
    world = 5
    for plan in all_plans("allreduce", "direct", world, 40, 3):
        reduce_scatter = plan.steps[0]
        sends = [op.send_peer for op in reduce_scatter if op.kind == OpKind.SEND]
        receives = [op.recv_peer for op in reduce_scatter if op.kind == OpKind.RECV_REDUCE]
        assert sends == [(plan.rank + k) % world for k in range(1, world)]
        assert receives == [(plan.rank - k) % world for k in range(1, world)]
        reduces = [op for op in reduce_scatter if op.kind == OpKind.RECV_REDUCE]
        assert reduces[0].src[0] == Buf.INPUT and all(op.src[0] == Buf.OUTPUT for op in reduces[1:])
        assert [op.finalize for op in reduces] == [False] * (world - 2) + [True]


@pytest.mark.parametrize("world", [2, 3, 6, 8, 16])
def test_latency_closed_forms(world: int) -> None:
    """Direct takes 2 message latencies per segment, ring 2(n-1); tree pipelines: about one per segment."""
    seg = 3
    count = 7 * world * seg
    n_segments = len(cut_segments(split_even(count, world), seg)[0])
    ones = [np.ones(count)] * world
    assert simulate(all_plans("allreduce", "direct", world, count, seg), ones).latency_hops == 2 * n_segments
    ring = simulate(all_plans("allreduce", "ring", world, count, seg), ones).latency_hops
    assert ring == 2 * (world - 1) * n_segments

    def tree_hops(segments: int) -> int:
        n = 2 * segments * (seg // 2)  # the tree's segments are half the largest message
        return simulate(all_plans("allreduce", "tree", world, n, seg), [np.ones(n)] * world).latency_hops

    height = double_binary_tree(world)[0].height
    assert tree_hops(1) <= 4 * height + 2
    assert tree_hops(40) - tree_hops(20) <= 20 + 2  # each extra segment costs about one latency


@pytest.mark.parametrize("world", [2, 3, 7, 8, 13])
def test_tree_allreduce_interleaves_up_and_down(world: int) -> None:
    count, seg = 40 * world, 2
    mixed = 0
    for plan in all_plans("allreduce", "tree", world, count, seg):
        for step in plan.steps:
            pairs = [(plan.rank, op.send_peer) for op in step if op.kind in SENDS]
            assert len(pairs) == len(set(pairs)), "at most one message per ordered pair per step"
            # up: reductions, and leaves sending their INPUT; down: receiving finals, SENDs from OUTPUT
            up = {op.src[1] for op in step if op.kind in (OpKind.RECV_REDUCE, OpKind.RECV_REDUCE_SEND)
                  or (op.kind == OpKind.SEND and op.src[0] == Buf.INPUT)}
            down = {op.dst[1] for op in step if op.kind in (OpKind.RECV, OpKind.RECV_COPY_SEND)}
            down |= {op.src[1] for op in step if op.kind == OpKind.SEND and op.src[0] == Buf.OUTPUT}
            assert not up & down
            mixed += bool(up and down)
    assert mixed > 0, "some step must do the up phase of one segment and the down phase of another"


# ---- degenerate sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("collective,algorithm", [(c, a) for c, algs in ALGORITHMS.items() for a in algs])
def test_world_one(collective: str, algorithm: str) -> None:
    plan = build_plan(collective, algorithm, 0, 1, 10)
    if plan.result is not None:  # in place on a copy of the input: the copy is the result
        assert plan.steps == () and plan.result == (0, 10)
    elif collective in ("reduce_scatter", "all_gather", "all_to_all"):
        assert len(plan.steps) == 1 and len(plan.steps[0]) == 1
        (op,) = plan.steps[0]
        assert (op.kind, op.count, op.src, op.dst) == (OpKind.COPY, 10, (Buf.INPUT, 0), (Buf.OUTPUT, 0))
    else:
        assert plan.steps == ()


@pytest.mark.parametrize("collective,algorithm", [(c, a) for c, algs in ALGORITHMS.items() for a in algs])
@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("count", [0, 1, 3])
def test_empty_regions_still_send(collective: str, algorithm: str, world: int, count: int) -> None:
    """Count 0 (and chunks emptier than the world) still emit their ops, so every rank synchronises."""
    plans = all_plans(collective, algorithm, world, count, seg=1)
    for plan in plans:
        table, starts = plan.to_table()
        assert table.shape == (sum(len(s) for s in plan.steps), len(OP_COLUMNS))
        assert starts[-1] == len(table) and all(len(s) for s in plan.steps)
    if count == 0:
        assert all(op.count == 0 for plan in plans for op in plan.ops())
    x = [np.zeros(p.input_count, dtype=np.int64) for p in plans]
    res = simulate(plans, x)
    assert res.messages_per_link, "count 0 must still exchange (empty) messages"
    everyone = frozenset(range(world))
    for heard in res.heard_from:
        assert heard == everyone if collective != "broadcast" else 0 in heard


# ---- the API ------------------------------------------------------------------------------------------

def test_algorithms_table() -> None:
    assert set(ALGORITHMS) == {
        "allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "all_to_all"
    }
    assert ALGORITHMS["allreduce"] == ("ring", "tree", "direct", "hierarchical")


def test_build_plan_is_cached_and_validates() -> None:
    assert build_plan("allreduce", "ring", 1, 4, 100) is build_plan("allreduce", "ring", 1, 4, 100)
    with pytest.raises(ValueError, match="all_gather, broadcast, barrier, all_to_all"):
        build_plan("alltoall", "ring", 0, 2, 1)
    with pytest.raises(ValueError, match="ring, tree, direct"):
        build_plan("allreduce", "butterfly", 0, 2, 1)
    with pytest.raises(ValueError, match="choose_algorithm"):
        build_plan("allreduce", "auto", 0, 2, 1)
    for bad in (dict(rank=2, world=2, count=1), dict(rank=0, world=0, count=1),
                dict(rank=0, world=2, count=-1)):
        with pytest.raises(ValueError):
            build_plan("allreduce", "ring", **bad)
    with pytest.raises(ValueError, match="root"):
        build_plan("broadcast", "tree", 0, 2, 1, root=2)
    with pytest.raises(ValueError):
        build_plan("allreduce", "ring", 0, 2, 1, segment_elems=0)
