"""The dependencies the native executor runs plans by (csrc/engine/plan_dependencies.h), checked against
the plans themselves: an op may start before earlier steps complete only where that changes nothing.

For every algorithm, world size and count (empty chunks, one segment, several), the compiled plan's
dependencies are compared with the conflicts computed here by brute force over every pair of ops:

* every op listed is a real conflict (regions that overlap where one op writes, or the previous op
  sending to, or receiving from, the same peer), so no needless ordering creeps in;
* every conflict is ordered: the earlier op is a dependency, or a dependency of a dependency, and so on
  (the executor need not list what is implied);
* an empty message waits for every op of the earlier steps (a barrier round, an acknowledgement).
"""

from __future__ import annotations

import pytest

from pycoll import _C
from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.direct import direct_all_to_all
from pycoll.algorithms.plan import RECEIVES, SENDS, Buf, OpKind, Plan

READS_SRC = {
    OpKind.SEND, OpKind.RECV_REDUCE, OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND, OpKind.COPY,
}
WRITES_DST = {k for k in OpKind if k not in (OpKind.SEND, OpKind.RECV_REDUCE_SEND)}


def _regions(op, coded: bool, distinct: bool) -> list[tuple[int, int, int, bool]]:
    """(space, start, end, writes) of what the op touches, in elements: one space where the buffers may
    alias (in place), else INPUT's (0) and OUTPUT's, which ENCODED shares (1)."""
    def space(buf: Buf) -> int:
        return int(distinct and buf != Buf.INPUT)

    out = []
    if op.kind in READS_SRC:
        out.append((space(op.src[0]), op.src[1], op.src[1] + op.count, coded))
    if op.kind in WRITES_DST:
        out.append((space(op.dst[0]), op.dst[1], op.dst[1] + op.count, True))
    return [r for r in out if r[2] > r[1]]


def _conflicts(plan: Plan, coded: bool) -> list[set[int]]:
    ops = list(plan.ops())
    regions = [_regions(op, coded, not plan.in_place) for op in ops]
    out: list[set[int]] = []
    for i, op in enumerate(ops):
        mine = set()
        for j in range(i):
            other = ops[j]
            if op.kind in SENDS and other.kind in SENDS and other.send_peer == op.send_peer:
                mine.add(j)
            if op.kind in RECEIVES and other.kind in RECEIVES and other.recv_peer == op.recv_peer:
                mine.add(j)
            for sa, a0, a1, aw in regions[i]:
                for sb, b0, b1, bw in regions[j]:
                    if sa == sb and a0 < b1 and b0 < a1 and (aw or bw):
                        mine.add(j)
        out.append(mine)
    return out


def _check(plan: Plan, coded: bool = False) -> None:
    table, starts = plan.to_table()
    native = _C.NativePlan(table, starts, 4, plan.input_count, plan.output_count, plan.rank, plan.world,
                           coded=coded, distinct=not plan.in_place)
    deps = _C.testing.plan_dependencies(native)
    want = _conflicts(plan, coded)
    step_of = [s for s, step in enumerate(plan.steps) for _ in step]
    first_of_step = [int(starts[s]) for s in step_of]
    reach: list[set[int]] = []  # every op an op is ordered after, through its dependencies
    for i, (listed, after_all_before) in enumerate(deps):
        assert set(listed) <= want[i], f"op {i}: needless dependencies {set(listed) - want[i]}"
        closure = set(listed).union(*(reach[j] for j in listed)) if listed else set()
        closure |= set(range(after_all_before)).union(*(reach[j] for j in range(after_all_before)))
        reach.append(closure)
        assert want[i] <= closure, f"op {i} of {plan.algorithm}: conflicts not ordered: {want[i] - closure}"
        op = list(plan.ops())[i]
        assert after_all_before == (first_of_step[i] if op.count == 0 else 0), f"op {i}: fence"


CASES = [(c, a, w) for c in ("allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
         for a in ALGORITHMS[c] for w in (2, 3, 4, 5, 8)]


@pytest.mark.parametrize("collective,algorithm,world", CASES)
def test_dependencies_order_every_conflict_and_nothing_else(collective: str, algorithm: str,
                                                             world: int) -> None:
    seg = 4
    for count in (0, 1, world * seg - 1, 3 * world * seg + 5):
        for rank in range(world):
            local = 2 if algorithm == "hierarchical" and world % 2 == 0 else 1
            _check(build_plan(collective, algorithm, rank, world, count, root=world - 1, segment_elems=seg,
                              local_size=local))


@pytest.mark.parametrize("algorithm", ("direct", "ring", "tree"))
@pytest.mark.parametrize("world", (2, 3, 4))
def test_compressed_plans_count_every_touched_region_as_written(algorithm: str, world: int) -> None:
    for count in (1, 37 * world + 3):
        for rank in range(world):
            _check(build_compressed_plan(algorithm, rank, world, count, 8, 2), coded=True)


def test_the_two_shot_gather_sends_overlap_and_the_barrier_rounds_do_not() -> None:
    """What the dependencies buy: the direct all-reduce's final SENDs of one chunk to every peer read the
    same region and wait for none of each other; a barrier's second round waits for its first."""
    plan = build_plan("allreduce", "direct", 0, 4, 4000, segment_elems=4000)
    table, starts = plan.to_table()
    deps = _C.testing.plan_dependencies(_C.NativePlan(table, starts, 4, 4000, 4000, 0, 4))
    ops = list(plan.ops())
    finals = [i for i, op in enumerate(ops) if op.kind == OpKind.SEND and op.src[1] == 0]
    assert len(finals) == 3
    assert all(not set(deps[i][0]) & set(finals) for i in finals)
    barrier = build_plan("barrier", "dissemination", 0, 4, 0)
    table, starts = barrier.to_table()
    bdeps = _C.testing.plan_dependencies(_C.NativePlan(table, starts, 4, 0, 0, 0, 4))
    assert [after for _, after in bdeps] == [0, 0, 2, 2]


def test_an_all_to_alls_receives_wait_for_none_of_its_sends() -> None:
    """Out of place, a receive into OUTPUT and a send from INPUT at the same offsets are independent: were
    the receive to wait for the send, two ranks exchanging parts larger than a ring would each wait for
    the other to receive first. Compiled as in place, the same plan orders them (what it must not)."""
    plan = direct_all_to_all(0, 3, [5, 7000, 9000], [5, 8000, 6000])
    table, starts = plan.to_table()
    ops = list(plan.ops())
    sends = {i for i, op in enumerate(ops) if op.kind == OpKind.SEND}
    recvs = [i for i, op in enumerate(ops) if op.kind == OpKind.RECV]
    for distinct, waits in ((True, False), (False, True)):
        native = _C.NativePlan(table, starts, 4, plan.input_count, plan.output_count, 0, 3, distinct=distinct)
        deps = _C.testing.plan_dependencies(native)
        assert any(set(deps[i][0]) & sends for i in recvs) == waits, f"distinct={distinct}"
    _check(plan)
