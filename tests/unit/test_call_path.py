"""One call, one path (pycoll/call.py, pycoll/dispatch.py, pycoll/plans.py): every collective of the API
builds one validated Call and hands it to the dispatcher once; the dispatcher's table picks the executor;
the plan cache keeps plans and grouped programs under one key type; one rule says what may be compressed.
Multi-rank behaviour is checked in tests/distributed/; here the values each layer passes down."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import pycoll
from pycoll import _C
from pycoll import plans as plans_module
from pycoll.arrays import Buffer
from pycoll.call import COMPRESSIBLE_DTYPES, Call, compression_refusal, gpu_codec_refusal
from pycoll.codes import DTYPE_CODES, OP_CODES
from pycoll.compression import CODEC_DTYPES, Int8
from pycoll.dispatch import EXECUTORS


@pytest.fixture
def calls(one_rank_comm, monkeypatch):
    """Every Call the communicator launches, in order (they still run)."""
    seen: list[Call] = []
    real = one_rank_comm.launch

    def launch(call: Call):
        seen.append(call)
        return real(call)

    monkeypatch.setattr(one_rank_comm, "launch", launch)
    return seen


# ---- what may be compressed: one rule -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", sorted(DTYPE_CODES))
@pytest.mark.parametrize("op", sorted(OP_CODES))
def test_the_compression_rule_is_dtype_and_op(dtype: str, op: str) -> None:
    allowed = dtype in ("float32", "float16", "bfloat16") and op in ("sum", "avg")
    assert (compression_refusal("allreduce", dtype, op) is None) == allowed
    assert (compression_refusal("allreduce", dtype, op.upper()) is None) == allowed
    assert _C.testing.compressible(DTYPE_CODES[dtype], OP_CODES[op]) == allowed  # the engine's rule agrees


@pytest.mark.parametrize("collective", ["broadcast", "barrier"])
def test_what_compresses_is_allreduce_reduce_scatter_all_gather_and_all_to_all(collective: str) -> None:
    refusal = compression_refusal(collective, "float32", "sum")
    assert "allreduce, reduce_scatter, all_gather, all_to_all only" in refusal
    assert compression_refusal("reduce_scatter", "float32", "avg") is None
    assert compression_refusal("all_gather", "bfloat16", "sum") is None
    assert compression_refusal("all_to_all", "float16", "sum") is None


@pytest.mark.parametrize("kind", ["fp16", "bf16", "int8", "int4", "user", "numba"])
def test_gpus_refuse_user_codecs_only(kind: str) -> None:
    # "user" has a wire code (KIND_CODES) like the built-in kinds, but no GPU kernel: the GPU check of
    # 2026-12-05 found it slipping through a test of membership in KIND_CODES.
    refusal = gpu_codec_refusal(kind)
    if kind in ("fp16", "bf16", "int8", "int4"):
        assert refusal is None
    else:
        assert refusal is not None and "user codec, which runs on CPUs only" in refusal


def test_the_codecs_dtypes_are_the_rules() -> None:
    assert CODEC_DTYPES is COMPRESSIBLE_DTYPES


def test_the_api_and_auto_follow_the_rule(one_rank_comm) -> None:
    x = np.arange(8, dtype=np.int32)
    with pytest.raises(pycoll.InvalidUsageError, match=r"needs float32, float16, bfloat16 data, got int32"):
        pycoll.allreduce(x, compression="int8", comm=one_rank_comm)
    y = np.arange(8, dtype=np.float32)
    with pytest.raises(pycoll.InvalidUsageError, match=r"supports op 'sum' or 'avg', got 'max'"):
        pycoll.allreduce(y, "max", compression="int8", comm=one_rank_comm)
    pycoll.allreduce(x, compression="auto", comm=one_rank_comm)  # auto: no codec for int32, no error
    np.testing.assert_array_equal(x, np.arange(8, dtype=np.int32))


# ---- the API builds one Call per collective ---------------------------------------------------------------
def test_each_collective_launches_one_call_with_its_fields(one_rank_comm, calls) -> None:
    comm = one_rank_comm
    x = np.arange(10, dtype=np.float32)
    assert pycoll.allreduce(x, "avg", algorithm="ring", timeout=7, comm=comm) is x
    out = np.zeros(10, dtype=np.float32)
    pycoll.reduce_scatter(np.arange(10, dtype=np.float32) * 2, out, "max", comm=comm)
    gathered = np.zeros(10, dtype=np.int64)
    pycoll.all_gather(np.arange(10, dtype=np.int64), gathered, comm=comm)
    pycoll.broadcast(x, 0, comm=comm)
    pycoll.barrier(comm=comm)
    parts = np.zeros(10, dtype=np.float32)
    pycoll.all_to_all(x, parts, [10], [10], comm=comm)
    even = np.zeros(10, dtype=np.float32)
    pycoll.all_to_all(x, even, compression="int8", comm=comm)
    kinds = [c.collective for c in calls]
    assert kinds == [
        "allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "all_to_all", "all_to_all"
    ]
    ar, rs, ag, bc, _, a2a, a2a_even = calls
    assert (ar.algorithm, ar.op, ar.op_name, ar.timeout, ar.count, ar.result) == ("ring", 1, "avg", 7, 10, x)
    assert ar.inp is ar.out and ar.codec is None and ar.report
    assert (rs.count, rs.op, rs.out.obj is out) == (10, OP_CODES["max"], True)
    assert (ag.count, ag.inp.dtype, ag.result is gathered) == (10, "int64", True)
    assert bc.root == 0 and bc.result is x
    # uneven parts: no count the ranks agree on, the part sizes instead; one rank copies exactly (no codec)
    assert (a2a.count, a2a.agreed_count, a2a.splits, a2a.algorithm) == (0, 0, ((10,), (10,)), "direct")
    assert (a2a_even.count, a2a_even.agreed_count, a2a_even.splits, a2a_even.codec) == (10, 0, None, None)
    np.testing.assert_array_equal(parts, x)
    np.testing.assert_array_equal(out, np.arange(10, dtype=np.float32) * 2)  # one rank: its own chunk
    np.testing.assert_array_equal(gathered, np.arange(10))


def test_describe_names_what_was_called() -> None:
    buf = Buffer(0, 100, "float32", 4, None)
    assert Call("allreduce", "ring", buf, buf, 100, op_name="avg", codec=Int8(block=64)).describe() == (
        "allreduce(100 x float32, avg, ring, int8(block=64))"
    )
    assert Call("broadcast", "tree", buf, buf, 100, root=3).describe() == "broadcast(100 x float32, root=3)"
    assert Call("all_gather", "ring", buf, buf, 25).describe() == "all_gather(25 x float32, ring)"
    even = Call("all_to_all", "direct", buf, buf, 25)
    assert even.describe() == "all_to_all(25 x float32 per rank, direct)"
    uneven = Call("all_to_all", "direct", buf, buf, 0, splits=((60, 40), (30, 70)))
    assert uneven.describe() == "all_to_all(send [60, 40], receive [30, 70] x float32, direct)"


def test_an_async_call_is_a_work_that_holds_the_result(one_rank_comm, calls) -> None:
    x = np.full(6, 3.0, dtype=np.float32)
    work = pycoll.allreduce(x, async_op=True, comm=one_rank_comm)
    assert work.result() is x and calls[-1].async_op
    assert "allreduce(6 x float32, sum," in repr(calls[-1])


# ---- the executor table ---------------------------------------------------------------------------------
def test_the_table_names_four_executors() -> None:
    assert sorted(EXECUTORS) == ["cpu-fragment", "cpu-grouped", "host-staged", "nccl"]


def test_the_dispatcher_picks_the_executor_by_memory_and_settings(one_rank_comm, monkeypatch) -> None:
    dispatcher = one_rank_comm.dispatcher
    host = Buffer(0, 4, "float32", 4, None)
    device = Buffer(0, 4, "float32", 4, None, device=0)
    assert dispatcher.executor_for(Call("allreduce", "ring", host, host, 4)) == "cpu-fragment"
    assert dispatcher.executor_for(Call("allreduce", "ring", device, device, 4)) == "nccl"
    monkeypatch.setattr(one_rank_comm, "grouped_on_cpu", True)
    assert dispatcher.executor_for(Call("allreduce", "ring", host, host, 4)) == "cpu-grouped"
    ctx = one_rank_comm.context  # the dispatcher's: the formed group's facts, the settings among them
    monkeypatch.setattr(ctx, "group", replace(ctx.group, settings=replace(ctx.settings, gpu_transport="shm")))
    assert dispatcher.executor_for(Call("allreduce", "ring", device, device, 4)) == "host-staged"
    assert dispatcher.executor("cpu-grouped").name == "cpu-grouped"


def test_grouped_on_cpu_runs_through_the_grouped_executor(one_rank_comm, monkeypatch) -> None:
    monkeypatch.setattr(one_rank_comm, "grouped_on_cpu", True)
    x = np.arange(1000, dtype=np.float32)
    pycoll.allreduce(x, algorithm="ring", comm=one_rank_comm)
    np.testing.assert_array_equal(x, np.arange(1000, dtype=np.float32))
    assert any(k.kind == "program" for k in one_rank_comm.plans.keys())


# ---- the plan cache ---------------------------------------------------------------------------------------
def test_plans_and_programs_share_one_cache_under_one_key(one_rank_comm) -> None:
    cache = one_rank_comm.plans
    plan = cache.plan("allreduce", "ring", 1000, 4)
    assert cache.plan("allreduce", "ring", 1000, 4) is plan
    cache.program("allreduce", "ring", 1000, 4)
    kinds = {(k.kind, k.collective, k.algorithm, k.elements) for k in cache.keys()}
    assert {("plan", "allreduce", "ring", 1000), ("program", "allreduce", "ring", 1000)} <= kinds


def test_a_codec_key_is_on_float32_cut_at_its_blocks(one_rank_comm) -> None:
    cache = one_rank_comm.plans
    codec = Int8(block=64)
    key = cache.key("plan", "allreduce", "direct", 1000, 2, codec=codec)
    assert (key.itemsize, key.layout, key.segment_bytes) == (4, (64, 68), one_rank_comm.segment_bytes)
    assert key == cache.key("plan", "allreduce", "direct", 1000, 4, codec=codec)  # float16 runs on float32


def test_the_cache_drops_the_least_recently_used(one_rank_comm, monkeypatch) -> None:
    monkeypatch.setattr(plans_module, "CACHE_SIZE", 3)
    cache = plans_module.PlanCache(0, 1, ["h"], one_rank_comm.segment_bytes)
    first = cache.plan("allreduce", "ring", 1, 4)
    for n in (2, 3):
        cache.plan("allreduce", "ring", n, 4)
    assert cache.plan("allreduce", "ring", 1, 4) is first  # used again: now the most recent
    cache.plan("allreduce", "ring", 4, 4)  # drops n=2
    assert [k.elements for k in cache.keys()] == [3, 1, 4]


def test_native_arguments_are_made_once_per_kind_of_call(one_rank_comm) -> None:
    """Compressed calls too: per codec (by identity and seed) and residual, made once and reused."""
    fragment = one_rank_comm.dispatcher.executor("cpu-fragment")
    x = np.arange(1000, dtype=np.float32)
    codec = Int8(block=64, rounding="stochastic", seed=1)
    made = []
    real = fragment.make_args

    def make_args(call, program=None):
        made.append((call.codec.seed, call.residual is not None))
        return real(call, program)

    fragment.make_args = make_args
    for _ in range(3):
        pycoll.allreduce(x, compression=codec, comm=one_rank_comm)
    assert len(made) == 1
    codec.seed = 2  # another seed is another kind of call: its rounding keys differ
    pycoll.allreduce(x, compression=codec, comm=one_rank_comm)
    pycoll.allreduce(x, compression=Int8(block=64, rounding="stochastic", seed=2), comm=one_rank_comm)
    residual = pycoll.compression.ErrorFeedback()
    for _ in range(2):
        pycoll.allreduce(x, compression=codec, residual=residual, comm=one_rank_comm)
    assert made == [(1, False), (2, False), (2, False), (2, True)]
    np.testing.assert_array_equal(x, np.arange(1000, dtype=np.float32))  # one rank: nothing is quantized


def test_hierarchical_needs_equal_hosts() -> None:
    cache = plans_module.PlanCache(0, 3, ["a", "a", "b"], 1 << 20)
    with pytest.raises(pycoll.InvalidUsageError, match=r"same number of ranks on every host.*ranks 0, 1"):
        cache.plan("allreduce", "hierarchical", 100, 4)
