"""The chains and publishers the native executor fuses (csrc/engine/plan_fusion.h), checked against their
definition on every plan: every chain is one the executor may run in one pass with the bits of its ops one
by one, and the passes the design is for are found (tests/distributed/test_fused_chains.py checks the
bits themselves).
"""

from __future__ import annotations

import pytest

from pycoll import _C
from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.plan import WRITES_DST, OpKind, Plan

REDUCES = (OpKind.RECV_REDUCE, OpKind.RECV_REDUCE_COPY_SEND)


def _chains(plan: Plan, coded: bool = False) -> list[tuple[list[int], list[int]]]:
    table, starts = plan.to_table()
    native = _C.NativePlan(table, starts, 4, plan.input_count, plan.output_count, plan.rank, plan.world,
                           coded=coded)
    return _C.testing.plan_chains(native)


def _check(plan: Plan) -> list[tuple[list[int], list[int]]]:
    ops = list(plan.ops())
    step_of = [s for s, step in enumerate(plan.steps) for _ in step]
    chains = _chains(plan)
    for members, publishers in chains:
        head, last = ops[members[0]], ops[members[-1]]
        region = head.dst
        assert len(members) >= 2 and members == list(range(members[0], members[-1] + 1))
        assert len({step_of[m] for m in members}) == 1, "a chain stays in one step"
        assert head.kind == OpKind.RECV_REDUCE and head.src[1] == region[1] and head.count > 0
        assert len({ops[m].recv_peer for m in members}) == len(members), "one member per peer"
        for m in members[1:]:
            op = ops[m]
            assert op.kind in REDUCES and op.src == region and op.dst == region and op.count == head.count
        assert not any(ops[m].finalize for m in members[:-1]), "only the last member finalizes"
        assert all(ops[m].kind == OpKind.RECV_REDUCE for m in members[:-1])
        if publishers:
            assert last.finalize
        peers = [ops[p].send_peer for p in publishers]
        assert len(set(peers)) == len(peers) and (last.kind != OpKind.RECV_REDUCE_COPY_SEND or
                                                  last.send_peer not in peers)
        for p in publishers:
            op = ops[p]
            assert op.kind == OpKind.SEND and op.src == region and op.count == head.count
            assert p > members[-1] and step_of[p] <= step_of[members[-1]] + 1
            between = ops[members[-1] + 1:p]
            assert not any(o.kind in WRITES_DST and o.dst[1] < region[1] + head.count and
                           region[1] < o.dst[1] + o.count for o in between), "D is written before it is sent"
    return chains


CASES = [(a, w) for a in ALGORITHMS["allreduce"] for w in (2, 3, 4, 5, 8)]


@pytest.mark.parametrize("algorithm,world", CASES)
def test_every_chain_fits_its_definition(algorithm: str, world: int) -> None:
    seg = 4
    for count in (0, 1, world * seg - 1, 3 * world * seg + 5):
        for rank in range(world):
            local = 2 if algorithm == "hierarchical" and world % 2 == 0 else 1
            _check(build_plan("allreduce", algorithm, rank, world, count, segment_elems=seg,
                              local_size=local))


@pytest.mark.parametrize("world", (3, 4, 8))
def test_direct_reduces_each_segment_in_one_pass_and_publishes_it_to_every_peer(world: int) -> None:
    """The case the fusion is for: per segment, the owner's world - 1 receive-reduces are one chain and
    its world - 1 final SENDs its publishers; the ring has no chain, and neither has any compressed plan."""
    seg, segments = 16, 3
    count = world * seg * segments
    for rank in range(world):
        chains = _check(build_plan("allreduce", "direct", rank, world, count, segment_elems=seg))
        assert len(chains) == segments
        assert all(len(m) == world - 1 and len(p) == world - 1 for m, p in chains)
        assert not _chains(build_plan("allreduce", "ring", rank, world, count, segment_elems=seg))
        coded = build_compressed_plan("direct", rank, world, count, 8, 2)
        assert not _chains(coded, coded=True)


def test_the_tree_up_phase_is_left_op_by_op() -> None:
    """A tree node's two children (RECV_REDUCE, then RECV_REDUCE_SEND to the parent) form no chain:
    fused they ran slower (plan_fusion.h)."""
    seg, world = 8, 4
    count = 6 * seg * world
    plans = [build_plan("allreduce", "tree", r, world, count, segment_elems=seg) for r in range(world)]
    assert any(op.kind == OpKind.RECV_REDUCE_SEND for plan in plans for op in plan.ops())
    assert not any(_chains(plan) for plan in plans)
