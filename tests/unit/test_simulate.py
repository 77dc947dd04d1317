"""The simulator itself: exact op semantics, ordering, arithmetic, and the errors it must raise."""

from __future__ import annotations

import numpy as np
import pytest

from pycoll.algorithms import build_plan
from pycoll.algorithms._layout import (
    copy,
    recv,
    recv_copy_send,
    recv_reduce,
    recv_reduce_copy_send,
    recv_reduce_send,
    send,
)
from pycoll.algorithms.plan import Buf, Op, OpKind, Plan, make_plan
from pycoll.algorithms.simulate import (
    CountMismatchError,
    DeadlockError,
    PlanError,
    UnmatchedMessageError,
    check_plan,
    simulate,
)

IN, OUT = Buf.INPUT, Buf.OUTPUT


def plan(rank: int, world: int, steps: list[list[Op]], n_in: int = 4, n_out: int = 4,
         collective: str = "custom") -> Plan:
    return make_plan(rank, world, collective, "handmade", n_in, n_out, steps)


def run(plans: list[Plan], inputs: list[list[float]], dtype: type = np.float64, op: str = "sum",
        inplace: bool = False):
    return simulate(plans, [np.array(x, dtype=dtype) for x in inputs], op, inplace=inplace)


# ---- semantics ----------------------------------------------------------------------------------------

def test_fifo_per_pair_and_list_order() -> None:
    plans = [plan(0, 2, [[send(2, 1, (IN, 0)), send(2, 1, (IN, 2))]]),
             plan(1, 2, [[recv(2, 0, (OUT, 2)), recv(2, 0, (OUT, 0))]])]
    res = run(plans, [[1, 2, 3, 4], [0, 0, 0, 0]])
    np.testing.assert_array_equal(res.outputs[1], [3, 4, 1, 2])
    assert res.messages_per_link == {(0, 1): 2} and res.elements_per_link == {(0, 1): 4}
    assert res.bytes_per_link == {(0, 1): 32}
    assert not res.output_written[0].any() and res.output_written[1].all()


def test_fused_ops() -> None:
    """0 -> 1 -> 2 -> 0 around a ring of three: RRS writes nothing, RRCS writes and sends, RCS forwards."""
    plans = [
        plan(0, 3, [[send(2, 1, (IN, 0))], [recv_copy_send(2, 2, 1, (OUT, 0))]]),
        plan(1, 3, [[recv_reduce_send(2, 0, 2, (IN, 0))], [recv(2, 0, (OUT, 2))]]),
        plan(2, 3, [[recv_reduce_copy_send(2, 1, 0, (IN, 0), (OUT, 1), finalize=True)]]),
    ]
    res = run(plans, [[1, 2, 0, 0], [10, 20, 0, 0], [100, 200, 0, 0]])
    np.testing.assert_array_equal(res.outputs[2], [0, 111, 222, 0])
    np.testing.assert_array_equal(res.outputs[0], [111, 222, 0, 0])
    np.testing.assert_array_equal(res.outputs[1], [0, 0, 111, 222])
    assert not res.output_written[1][:2].any(), "RECV_REDUCE_SEND must not write locally"
    assert res.heard_from == [frozenset({0, 1, 2})] * 3
    assert res.finalized == [[], [], [(OUT, 1, 2)]]


def test_recv_reduce_order_is_list_order() -> None:
    """Float sums are not associative; the owner must reduce in exactly the order its ops are listed."""
    big = np.float32(2 ** 24)

    def result(order: list[int]) -> float:
        plans = [plan(0, 3, [[recv_reduce(1, order[0], (IN, 0), (OUT, 0)),
                              recv_reduce(1, order[1], (OUT, 0), (OUT, 0))]], 1, 1),
                 plan(1, 3, [[send(1, 0, (IN, 0))]], 1, 1),
                 plan(2, 3, [[send(1, 0, (IN, 0))]], 1, 1)]
        return float(run(plans, [[1], [big], [-big]], np.float32).outputs[0][0])

    assert result([1, 2]) == 0.0  # (1 + 2^24) rounds to 2^24, minus 2^24
    assert result([2, 1]) == 1.0  # (1 - 2^24) is exact, plus 2^24


def test_copy_then_send_in_the_next_step() -> None:
    plans = [plan(0, 2, [[copy(2, (IN, 0), (OUT, 2)), recv(2, 1, (OUT, 0))], [send(4, 1, (OUT, 0))]]),
             plan(1, 2, [[send(2, 0, (IN, 0))], [recv(4, 0, (OUT, 0))]])]
    res = run(plans, [[1, 2, 3, 4], [7, 8, 0, 0]])
    np.testing.assert_array_equal(res.outputs[0], [7, 8, 1, 2])
    np.testing.assert_array_equal(res.outputs[1], [7, 8, 1, 2])


def test_pure_send_after_fused_send_to_same_peer_goes_second() -> None:
    """Messages to one peer leave in list order within a step, as the native executor sends them."""
    plans = [plan(0, 3, [[recv_reduce_send(1, 2, 1, (IN, 0)), send(1, 1, (IN, 1))]]),
             plan(1, 3, [[recv(1, 0, (OUT, 0)), recv(1, 0, (OUT, 1))]]),
             plan(2, 3, [[send(1, 0, (IN, 0))]])]
    res = run(plans, [[1, 2, 0, 0], [0, 0, 0, 0], [10, 0, 0, 0]])
    np.testing.assert_array_equal(res.outputs[1][:2], [11, 2])


def test_inputs_are_not_modified() -> None:
    plans = [build_plan("allreduce", "ring", r, 3, 6) for r in range(3)]
    inputs = [np.arange(6, dtype=np.int64) + r for r in range(3)]
    before = [x.copy() for x in inputs]
    simulate(plans, inputs)
    for x, b in zip(inputs, before):
        np.testing.assert_array_equal(x, b)


def test_aliasing_follows_the_collective() -> None:
    """allreduce aliases INPUT and OUTPUT; writing OUTPUT changes what a later read of INPUT sees."""
    steps = [[recv(1, 1, (OUT, 0))], [send(1, 1, (IN, 0))]]
    plans = [plan(0, 2, steps, 1, 1, "allreduce"),
             plan(1, 2, [[send(1, 0, (IN, 0))], [recv(1, 0, (OUT, 0))]], 1, 1, "allreduce")]
    res = simulate(plans, [np.array([5.0]), np.array([9.0])])
    assert res.outputs[1][0] == 9.0  # rank 0 wrote 9 into the aliased buffer, then sent it back
    apart = simulate(plans, [np.array([5.0]), np.array([9.0])], inplace=False)
    assert apart.outputs[1][0] == 5.0


# ---- arithmetic ---------------------------------------------------------------------------------------

def test_avg_divides_once_at_finalize_before_sending() -> None:
    plans = [plan(0, 2, [[send(1, 1, (IN, 0))], [recv(1, 1, (OUT, 0))]], 1, 1),
             plan(1, 2, [[recv_reduce_copy_send(1, 0, 0, (IN, 0), (OUT, 0), finalize=True)]], 1, 1)]
    res = run(plans, [[3.0], [4.0]], np.float32, "avg")
    assert [o[0] for o in res.outputs] == [3.5, 3.5]


def test_avg_is_a_true_division() -> None:
    """(a+b+c)/3 in float32, not (a+b+c) * (1/3): find inputs where the two differ and check."""
    rng = np.random.default_rng(1)
    while True:
        x = rng.uniform(-1, 1, 3).astype(np.float32)
        s = (x[1] + x[2]) + x[0]
        if s / np.float32(3) != s * (np.float32(1) / np.float32(3)):
            break
    plans = [build_plan("allreduce", "ring", r, 3, 1) for r in range(3)]
    # ring, one element: chunk 0 holds it; its partial goes 1 -> 2 -> 0, so the sum is (x1 + x2) + x0
    res = simulate(plans, [np.array([v], dtype=np.float32) for v in x], "avg")
    assert res.outputs[0][0] == ((x[1] + x[2]) + x[0]) / np.float32(3)


def test_integers_wrap() -> None:
    plans = [build_plan("allreduce", "direct", r, 2, 3) for r in range(2)]
    res = simulate(plans, [np.array([100, -100, 7], dtype=np.int8)] * 2)
    np.testing.assert_array_equal(res.outputs[0], np.array([-56, 56, 14], dtype=np.int8))
    res = simulate(plans, [np.array([100, 3, 7], dtype=np.int8)] * 2, "prod")
    np.testing.assert_array_equal(res.outputs[0], np.array([16, 9, 49], dtype=np.int8))


def test_float16_is_computed_in_float32_and_rounded_once() -> None:
    """The native kernels compute half types in float32 and round on store: the finalizing reduction
    rounds (a + b) / world once, where naive float16 arithmetic would round the sum first."""
    plans = [build_plan("allreduce", "direct", r, 3, 1) for r in range(3)]
    rng = np.random.default_rng(3)
    f32 = np.float32
    for _ in range(5000):
        x = rng.uniform(-4, 4, 3).astype(np.float16)
        partial = np.float16(f32(x[0]) + f32(x[2]))  # rank 0 reduces rank 2's value first, then rank 1's
        kernel = np.float16((f32(partial) + f32(x[1])) / f32(3))
        naive = (partial + x[1]) / np.float16(3)
        if kernel != naive:
            break
    else:
        pytest.fail("no input separates the two roundings")
    res = simulate(plans, [np.array([v], dtype=np.float16) for v in x], "avg")
    assert all(o.dtype == np.float16 and o[0] == kernel for o in res.outputs)


def test_min_max_propagate_nan() -> None:
    plans = [build_plan("allreduce", "ring", r, 2, 2) for r in range(2)]
    for op in ("min", "max"):
        res = simulate(plans, [np.array([np.nan, 1.0]), np.array([2.0, np.nan])], op)
        assert np.isnan(res.outputs[0]).all() and np.isnan(res.outputs[1]).all()


def test_bfloat16_if_available() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    plans = [build_plan("allreduce", "tree", r, 3, 4) for r in range(3)]
    x = [np.array([1, 2, 3, 4], dtype=bf16) * (r + 1) for r in range(3)]
    res = simulate(plans, x, "avg")
    assert res.outputs[0].dtype == bf16
    np.testing.assert_array_equal(res.outputs[0].astype(np.float32), [2, 4, 6, 8])


# ---- errors -------------------------------------------------------------------------------------------

def test_deadlock_is_reported() -> None:
    plans = [plan(0, 2, [[recv(1, 1, (OUT, 0))], [send(1, 1, (IN, 0))]]),
             plan(1, 2, [[recv(1, 0, (OUT, 0))], [send(1, 0, (IN, 0))]])]
    with pytest.raises(DeadlockError, match=r"rank 0 step 0 op 0 \(RECV\) waits .* from rank 1.*rank 1"):
        run(plans, [[0] * 4, [0] * 4])


def test_deadlock_behind_list_order() -> None:
    """Receiving ops complete in list order: waiting on the wrong peer first deadlocks."""
    plans = [plan(0, 3, [[recv(1, 2, (OUT, 0)), recv(1, 1, (OUT, 1))], [send(1, 2, (IN, 0))]]),
             plan(1, 3, [[send(1, 0, (IN, 0))]]),
             plan(2, 3, [[recv(1, 0, (OUT, 0))], [send(1, 0, (IN, 0))]])]
    with pytest.raises(DeadlockError, match="rank 2"):
        run(plans, [[0] * 4] * 3)


def test_count_mismatch() -> None:
    plans = [plan(0, 2, [[send(3, 1, (IN, 0))]]), plan(1, 2, [[recv(4, 0, (OUT, 0))]])]
    with pytest.raises(CountMismatchError, match="expects 4 elements from rank 0.* has 3"):
        run(plans, [[0] * 4, [0] * 4])


def test_count_mismatch_between_real_plans() -> None:
    plans = [build_plan("allreduce", "ring", r, 3, 10 if r else 11) for r in range(3)]
    with pytest.raises(CountMismatchError):
        simulate(plans, [np.zeros(p.input_count) for p in plans])


def test_unreceived_messages() -> None:
    plans = [plan(0, 2, [[send(1, 1, (IN, 0)), send(1, 1, (IN, 1))]]), plan(1, 2, [[recv(1, 0, (OUT, 0))]])]
    with pytest.raises(UnmatchedMessageError, match="rank 0 -> rank 1: 1 message"):
        run(plans, [[0] * 4, [0] * 4])


def test_writing_input_out_of_place_is_rejected() -> None:
    bad = plan(0, 2, [[recv_reduce(1, 1, (IN, 0), (IN, 0))]], collective="reduce_scatter")
    with pytest.raises(PlanError, match="writes INPUT in out-of-place collective 'reduce_scatter'"):
        simulate([bad, plan(1, 2, [[send(1, 0, (IN, 0))]], collective="reduce_scatter")],
                 [np.zeros(4), np.zeros(4)])
    check_plan(bad, inplace=True)  # fine when the buffers alias


@pytest.mark.parametrize("op,message", [
    (send(2, 1, (IN, 3)), "reads INPUT\\[3:5\\] outside its 4 elements"),
    (recv(2, 1, (OUT, 3)), "writes OUTPUT\\[3:5\\] outside"),
    (send(1, 0, (IN, 0)), "peer 0 is not another rank"),
    (recv(1, 2, (OUT, 0)), "peer 2 is not another rank"),
    (Op(OpKind.RECV, 1, recv_peer=1, dst=(OUT, 0), finalize=True), "does not reduce"),
])
def test_malformed_ops_are_rejected(op: Op, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        check_plan(plan(0, 2, [[op]]), inplace=False)


def test_send_reading_what_the_step_writes_is_rejected() -> None:
    racy = plan(0, 2, [[send(2, 1, (IN, 0)), recv(2, 1, (OUT, 1))]], collective="allreduce")
    with pytest.raises(PlanError, match=r"reads INPUT\[0:2\] while op 1 of the same step writes \[1:3\]"):
        check_plan(racy, inplace=True)
    check_plan(racy, inplace=False)  # separate buffers: no race


def test_bad_arguments() -> None:
    plans = [build_plan("allreduce", "ring", r, 2, 4) for r in range(2)]
    x = [np.zeros(4, dtype=np.int32)] * 2
    with pytest.raises(ValueError, match="avg needs a floating dtype"):
        simulate(plans, x, "avg")
    with pytest.raises(ValueError, match="unknown op"):
        simulate(plans, x, "xor")
    with pytest.raises(ValueError, match="plans expects|plan expects"):
        simulate(plans, [np.zeros(5, dtype=np.int32)] * 2)
    with pytest.raises(ValueError, match="2 plans but 1 inputs"):
        simulate(plans, x[:1])
    with pytest.raises(ValueError, match="expected rank 0"):
        simulate(plans[::-1], x)
    with pytest.raises(ValueError, match="pass inplace"):
        simulate([plan(0, 1, [])], [np.zeros(4)])
