"""Lowering plans to grouped programs (pycoll/algorithms/grouped.py), checked without processes.

``check_grouped`` replays the programs with NCCL's semantics (a group completes when each of its messages
meets its partner, FIFO per ordered pair), independently of how they were lowered. The data path of the
programs is checked on real ranks in tests/distributed/test_grouped_programs.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.grouped import (
    STAGING_ALIGN,
    Action,
    GroupedProgram,
    GroupingError,
    check_grouped,
    lower_to_groups,
)
from pycoll.algorithms.plan import RECEIVES, SENDS, Buf, Op, OpKind, make_plan


def _lower(collective, algorithm, world, count, segment=64, root=0):
    plans = [
        build_plan(collective, algorithm, r, world, count, root=root, segment_elems=segment)
        for r in range(world)
    ]
    return plans, lower_to_groups(plans, lambda op: op.count * 4)


@pytest.mark.parametrize("collective,algorithm", [(c, a) for c, algs in ALGORITHMS.items() for a in algs])
@pytest.mark.parametrize("world", range(1, 10))
def test_every_plan_lowers_to_programs_that_cannot_deadlock(collective, algorithm, world):
    for count in (0, 1, 7, 100, 1000):
        plans, programs = _lower(collective, algorithm, world, count, root=world - 1)
        check_grouped(programs, plans)
        for plan, prog in zip(plans, programs):
            ops = list(plan.ops())
            acts = [tuple(a) for a in prog.actions.tolist()]
            assert sorted(i for a, i in acts if a == Action.SEND) == [
                i for i, o in enumerate(ops) if o.kind in SENDS
            ]
            assert sorted(i for a, i in acts if a == Action.RECV) == [
                i for i, o in enumerate(ops) if o.kind in RECEIVES
            ]
            finishes = [i for a, i in acts if a == Action.FINISH]
            assert finishes == sorted(finishes), "ops must finish in list order"
            for a, i in acts:
                if a == Action.FINISH and ops[i].kind in RECEIVES:
                    assert acts.index((Action.RECV, i)) < acts.index((Action.FINISH, i))


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct"])
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_compressed_plans_lower_and_encode_sends_from_input_first(algorithm, world):
    block = 32
    plans = [build_compressed_plan(algorithm, r, world, 5000, block, 4) for r in range(world)]

    def encoded(op):
        return op.count + 4 * -(-op.count // block)

    programs = lower_to_groups(plans, encoded, compressed=True)
    check_grouped(programs, plans)
    for plan, prog in zip(plans, programs):
        ops = list(plan.ops())
        acts = [tuple(a) for a in prog.actions.tolist()]
        for i, op in enumerate(ops):
            if op.kind == OpKind.SEND and op.src[0] == Buf.INPUT:
                assert acts.index((Action.PREPARE, i)) < acts.index((Action.SEND, i))
            if op.kind == OpKind.RECV_REDUCE_SEND:
                assert prog.work_stage[i] >= 0


def test_staging_regions_never_overlap_while_alive():
    plans, programs = _lower("allreduce", "tree", 6, 5000, segment=300)
    for plan, prog in zip(plans, programs):
        regions = []
        for kind, arr in (("recv", prog.recv_stage), ("send", prog.send_stage)):
            for i in np.flatnonzero(arr >= 0):
                regions.append((int(arr[i]), int(arr[i]) + int(prog.msg_bytes[i]), kind, int(i)))
        assert all(off % STAGING_ALIGN == 0 for off, *_ in regions)
        assert max(end for _, end, *_ in regions) <= prog.staging_bytes
        # Reuse happens (staging is smaller than every message laid end to end) ...
        assert prog.staging_bytes < sum(-(-(e - o) // STAGING_ALIGN) * STAGING_ALIGN for o, e, *_ in regions)
        # ... but never between a message still to be sent or finished and another one.
        acts = [tuple(a) for a in prog.actions.tolist()]

        plan_ops = list(plan.ops())

        def span(kind, i, acts=acts, plan_ops=plan_ops):
            first = acts.index((Action.RECV, i)) if kind == "recv" else acts.index((Action.FINISH, i))
            last = (
                acts.index((Action.SEND, i))
                if kind == "send" or plan_ops[i].kind == OpKind.RECV_COPY_SEND
                else (acts.index((Action.FINISH, i)))
            )
            # a group is one instant: widen each span to the whole groups it touches
            while first > 0 and acts[first - 1][0] in (Action.SEND, Action.RECV):
                first -= 1
            while acts[last][0] != Action.GROUP_END and acts[last][0] in (Action.SEND, Action.RECV):
                last += 1
            return first, last

        spans = [(o, e, *span(k, i)) for o, e, k, i in regions]
        for a in range(len(spans)):
            for b in range(a + 1, len(spans)):
                o1, e1, f1, l1 = spans[a]
                o2, e2, f2, l2 = spans[b]
                if o1 < e2 and o2 < e1:
                    assert l1 < f2 or l2 < f1, "two live staging regions overlap"


def _program(rank, world, actions, msg):
    n = len(msg)
    none = np.full(n, -1, dtype=np.int64)
    table = np.array(actions, dtype=np.int64).reshape(len(actions), 2)
    return GroupedProgram(rank, world, table, np.array(msg, dtype=np.int64), none, none, none, 0, 1)


def test_check_grouped_finds_a_deadlock_and_a_size_mismatch():
    plans = [
        make_plan(
            r, 2, "allreduce", "x", 4, 4, [[Op(OpKind.SEND, 4, 1 - r), Op(OpKind.RECV, 4, recv_peer=1 - r)]]
        )
        for r in range(2)
    ]
    good = lower_to_groups(plans, lambda op: op.count * 4)
    check_grouped(good, plans)
    # Each rank receives in a group of its own and sends only in a later group: a cycle.
    cyclic = [
        _program(
            r,
            2,
            [(Action.RECV, 1), (Action.GROUP_END, -1), (Action.SEND, 0), (Action.GROUP_END, -1)],
            [16, 16],
        )
        for r in range(2)
    ]
    with pytest.raises(GroupingError, match="deadlock"):
        check_grouped(cyclic, plans)
    wrong = [_program(r, 2, good[r].actions.tolist(), [16, 16] if r else [12, 16]) for r in range(2)]
    with pytest.raises(GroupingError, match="disagree"):
        check_grouped(wrong, plans)


def test_lowering_rejects_plans_that_deadlock_or_do_not_pair_up():
    receive_first = [
        make_plan(
            r, 2, "allreduce", "x", 4, 4, [[Op(OpKind.RECV, 4, recv_peer=1 - r)], [Op(OpKind.SEND, 4, 1 - r)]]
        )
        for r in range(2)
    ]
    with pytest.raises(GroupingError, match="no message can be matched"):
        lower_to_groups(receive_first, lambda op: op.count * 4)
    unpaired = [
        make_plan(0, 2, "allreduce", "x", 4, 4, [[Op(OpKind.SEND, 4, 1)]]),
        make_plan(1, 2, "allreduce", "x", 4, 4, [[]]),
    ]
    with pytest.raises(GroupingError, match="sends 1 messages to rank 1"):
        lower_to_groups(unpaired, lambda op: op.count * 4)
