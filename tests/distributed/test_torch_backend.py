"""pycoll as a torch.distributed backend (``init_process_group("pycoll")``), on 2 and 4 CPU ranks.

Every op torch's gloo backend runs on CPU, checked against closed-form or float64 / int64 results
computed here, every rank's result bitwise identical to the others'; the async Work contract; sub-groups
and DeviceMesh; per-group compression (what compresses, its error bound, error feedback); refused
options; and failures (mismatch, timeout, a lost peer) raising pycoll's errors on every rank.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the backend needs it)")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _torch_backend as tb  # noqa: E402
from harness import RankPool, run_ranks  # noqa: E402

from pycoll.compression import get_codec  # noqa: E402
from pycoll.compression import reference as codec_ref  # noqa: E402
from pycoll.compression.bounds import error_bound, reduce_scatter_bound  # noqa: E402

WORLDS = (2, 4)


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    """One pool of fresh processes per world size, the pycoll backend initialized in each."""
    made: dict[int, RankPool] = {}

    def get(world: int) -> RankPool:
        if world not in made or not made[world].alive:
            pool = RankPool(world)
            path = tmp_path_factory.mktemp(f"torch-backend-{world}") / "store"
            assert pool.run(tb.init, str(path), timeout=90) == ["pycoll"] * world
            made[world] = pool
        return made[world]

    yield get
    for pool in made.values():
        pool.close()


def _identical(values: list) -> None:
    for r, v in enumerate(values[1:], 1):
        assert v == values[0], f"rank {r} differs from rank 0"


# ---- all-reduce ----------------------------------------------------------------------------------------
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8", "int16", "bool"]
OPS = ["sum", "min", "max", "product", "avg", "premul_sum", "band", "bor", "bxor"]


def _applies(dtype: str, op: str) -> bool:
    floating = dtype.startswith(("float", "bfloat"))
    if op in ("band", "bor", "bxor"):
        return not floating
    if op in ("avg", "premul_sum"):
        return floating
    return True


def _expected(dtype: str, op: str, n: int, world: int) -> list:
    maker = {"product": tb.prod_value, "band": tb.bits_value, "bor": tb.bits_value, "bxor": tb.bits_value}
    rows = [maker.get(op, tb.value)(r, n) for r in range(world)]
    if dtype == "bool":
        rows = [[v % 3 == 0 for v in row] for row in rows]
        fold = {"sum": any, "max": any, "bor": any, "min": all, "product": all, "band": all}.get(op)
        fold = fold or (lambda col: sum(col) % 2 == 1)  # bxor
        return [fold(col) for col in zip(*rows)]
    out = []
    for col in zip(*rows):
        if op == "sum" or op == "premul_sum":
            v = sum(col) * (0.5 if op == "premul_sum" else 1)
        elif op == "avg":
            v = sum(col) / world
        elif op == "min":
            v = min(col)
        elif op == "max":
            v = max(col)
        elif op == "product":
            v = math.prod(col)
        else:
            v = col[0]
            for c in col[1:]:
                v = {"band": v & c, "bor": v | c, "bxor": v ^ c}[op]
        out.append(v)
    t = torch.tensor(out, dtype=torch.float64 if out and isinstance(out[0], float) else torch.int64)
    return tb._as_list(t.to(getattr(torch, dtype)))  # wraps (int8 sums) and rounds as the dtype does


@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_every_op_and_dtype(pools, world):
    cases = [(d, op, n, n == 37) for d in DTYPES for op in OPS if _applies(d, op) for n in (1, 37, 1500)]
    cases += [("complex64", "sum", 50, False), ("complex128", "avg", 50, True), ("float32", "sum", 0, False)]
    results = pools(world).run(tb.all_reduce_cases, cases, timeout=120)
    for i, (dtype, op, n, strided) in enumerate(cases):
        _identical([res[i][1] for res in results])
        got = results[0][i][0]
        if dtype.startswith("complex"):
            scale = world if op == "avg" else 1
            col = [sum(tb.value(r, n)[k] for r in range(world)) / scale for k in range(n)]
            assert got[0::2] == pytest.approx(col) and got[1::2] == pytest.approx([-c for c in col])
            continue
        assert got == _expected(dtype, op, n, world), f"{dtype} {op} n={n} strided={strided}"


def test_refused_reductions_leave_the_group_usable(pools):
    for errors in pools(2).run(tb.bad_reductions, timeout=60):
        assert errors[0].startswith("InvalidUsageError") and "BAND" in errors[0], errors[0]
        assert errors[1].startswith("InvalidUsageError") and "avg" in errors[1], errors[1]
        assert errors[2].startswith("InvalidUsageError") and "float8_e4m3fn" in errors[2], errors[2]
        assert errors[3] == "[2.0, 2.0, 2.0]"


# ---- data movement --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", WORLDS)
def test_broadcast_gathers_scatter_all_to_all_p2p_reduce(pools, world):
    results = pools(world).run(tb.data_movement, timeout=120)
    for rank, got in enumerate(results):
        for root in range(world):
            b, flags, col, untouched = got[f"broadcast{root}"]
            assert b == [root * 10 + i for i in range(5)]
            assert flags == [True, False]
            assert col == [root + 0.5] * 4 and untouched == [0.0] * 4
        assert got["all_gather"] == [[float(r), float(r * r)] for r in range(world)]
        assert got["all_gather_into_tensor"] == [v for r in range(world) for v in (r + 1.0, 2.0, 3.0)]
        assert got["all_gather_object"] == [{"rank": r, "s": "x" * r} for r in range(world)]
        rs = got["reduce_scatter"]
        col = [[float(r * 100 + rank * 2 + k) for r in range(world)] for k in range(2)]
        assert rs["tensor_sum"] == [sum(c) for c in col]
        assert rs["tensor_max"] == [max(c) for c in col]
        assert rs["tensor_avg"] == pytest.approx([sum(c) / world for c in col], rel=1e-6)
        assert rs["list_sum"] == [sum(r + rank for r in range(world)), world]
        assert rs["in_place"] == [sum(c) for c in col]
        a2a = got["all_to_all"]
        assert a2a["even"] == [float(r * 100 + rank) for r in range(world)]
        assert a2a["uneven"] == [[r, rank, k] for r in range(world) for k in range(rank + 1)]
        assert a2a["list"] == [[r * 10 + rank] * (rank + 1) for r in range(world)]
        p2p = got["p2p"]
        assert p2p["ring"] == [(rank - 1) % world, 2 * ((rank - 1) % world), -((rank - 1) % world)]
        if rank == 1:
            assert p2p["recv"][:2] == ([42.0, 43.0], [44.0, 45.0])
        assert got["gather"] == ([[float(r), float(-r)] for r in range(world)] if rank == 0 else None)
        assert got["scatter"] == [rank, 100 + rank]
        expected_reduce = float(math.factorial(world)) if rank == 1 else float(rank + 1)
        assert got["reduce"] == [expected_reduce] * 3  # the root holds the product; the others keep theirs


def test_async_work_behaves_as_gloos(pools):
    for got in pools(2).run(tb.async_work, timeout=60):
        assert got["wait"] is True and got["completed"] and got["success"] and got["exception"] is None
        assert got["future_value"] == ["list", True, 3.0]  # the future's value: the output tensors
        assert got["result_is_t"] and got["t0"] == 3.0
        assert got["chained"] == [4.0] * 4


def test_async_ops_see_what_the_ops_before_them_wrote(pools):
    world = 2
    total = float(sum(r + 1 for r in range(world)))
    for got in pools(world).run(tb.async_order, timeout=60):
        assert got["gathered"] == [total] * (2 * world)  # the all-reduced values, not each rank's own
        assert got["scattered"] == [world * total] * 2


def test_skew_report_names_the_rank_that_arrives_late(pools):
    world, delayed, delay_ms, n = 2, 1, 20.0, 20
    got = pools(world).run(tb.skew, delayed, delay_ms / 1000, n, timeout=60)
    for g in got:
        assert g["report"] == got[0]["report"]  # the same report on every rank
        assert g["again_ranks"] == world
        assert "gloo" in g["refused"] and "HookState.skew()" in g["refused"]
    window = got[0]["report"]
    assert window["collectives"] == n and window["ranks"][delayed]["last"] >= n // 2  # every delayed one
    # The truth: when each rank called each all-reduce (one clock on this host). It is more than the
    # sleeps: a loaded VM wakes a sleeping rank late, and that rank then enters the next one late too.
    calls = [g["entered_ms"] for g in got]
    truth = [max(c) - min(c) for c in zip(*calls)]
    mine = [c[delayed] - min(c) for c in zip(*calls)]
    late = window["ranks"][delayed]
    assert sum(mine) >= 0.9 * delay_ms * n / 2
    assert abs(late["late_ms"]["mean"] - sum(mine) / n) <= max(0.1 * sum(mine) / n, 2.0)
    assert abs(late["wait_inflicted_ms"] - sum(t for t, m in zip(truth, mine) if m > 0)) <= max(
        0.1 * sum(mine), 2.0 * n
    )
    assert window["ranks"][1 - delayed]["late_ms"]["mean"] < 2.0


@pytest.mark.parametrize("world", WORLDS)
def test_lossless_results_equal_gloos_and_are_identical(pools, world):
    n = 1 << 18
    results = pools(world).run(tb.compare_with_gloo, n, timeout=90)
    _identical([r["bytes"] for r in results])
    for got in results:
        # float32 sums of `world` N(0,1) values: both within a few ulps of the float64 sum
        assert got["pycoll_err"] <= 1e-5 * world and got["gloo_err"] <= 1e-5 * world, got
        assert got["diff"] <= 2e-5 * world, got


def test_subgroups_and_device_mesh(pools):
    world = 4
    for rank, got in enumerate(pools(world).run(tb.subgroups, timeout=90)):
        parity = [r for r in range(world) if r % 2 == rank % 2]
        assert got["parity_sum"] == float(sum(parity))
        assert got["parity_bcast"] == parity[-1]
        dp_ranks = [r for r in range(world) if r % 2 == rank % 2]  # mesh [[0, 1], [2, 3]]: dp = columns
        tp_ranks = [r for r in range(world) if r // 2 == rank // 2]
        assert got["dp"] == (float(sum(dp_ranks)), "pycoll", dp_ranks)
        assert got["tp"] == (float(sum(tp_ranks)), "pycoll", tp_ranks)


# ---- compression ------------------------------------------------------------------------------------------
def test_int8_group_compresses_float_sums_only(pools):
    world, n, steps = 2, 4096, 20
    results = pools(world).run(tb.compressed, n, steps, timeout=90)
    _identical([r["once_bytes"] for r in results])
    xs = [torch.tensor(r["x"]) for r in results]
    exact = sum(x.double() for x in xs)
    once = torch.tensor(results[0]["once"]).double()
    inputs = [x.numpy() for x in xs]
    bound = torch.from_numpy(error_bound(get_codec("int8"), "direct", inputs, once.float().numpy())).double()
    err = (once - exact).abs()
    assert bool((err <= bound).all()), f"{int((err > bound).sum())} elements outside the int8 bound"
    assert float(err.max()) > 0, "int8 compression was not applied"
    values = [tb.value(r, 4096) for r in range(world)]
    exact_ints = [sum(col) for col in zip(*values)]
    exact_doubles = [sum(v / 3 for v in col) for col in zip(*values)]
    for got in results:
        assert got["small"] == [pytest.approx(sum(r + 0.1 for r in range(world)), rel=1e-6)] * 100
        assert got["ints"] == exact_ints
        assert got["doubles"] == pytest.approx(exact_doubles, rel=1e-15, abs=0)
        assert got["max"] == torch.maximum(xs[0], xs[1]).tolist()  # MAX never compresses
        # error feedback: the mean over steps is much closer than one step (residual carried over)
        mean_err = (torch.tensor(got["mean"]).double() - exact).abs().max()
        assert float(mean_err) < 0.25 * float(err.max()), (float(mean_err), float(err.max()))
        assert got["residuals"] == 2  # `once` and the reused buffer: one residual per storage
        assert got["residuals_after_rs"] == 3  # the reduce-scatter's input: one more, however often
    rs_inputs = [torch.tensor(r["rs_in"]) for r in results]
    rs_exact = sum(x.double() for x in rs_inputs)
    inputs = [x.numpy() for x in rs_inputs]
    for rank, got in enumerate(results):
        chunk = slice(rank * 2048, (rank + 1) * 2048)
        # pycoll's compressed reduce-scatter: each element quantized once, its sum never re-encoded
        rs_bound = torch.from_numpy(reduce_scatter_bound(get_codec("int8"), inputs, rank))
        rs_err = (torch.tensor(got["rs"]).double() - rs_exact[chunk]).abs()
        assert bool((rs_err <= rs_bound).all()), f"rank {rank}: reduce-scatter outside bound"
        assert float(rs_err.max()) > 0, "the int8 reduce-scatter was not compressed"


def test_all_gather_compression_is_opted_in_and_identical_everywhere(pools):
    world = 2
    results = pools(world).run(tb.compressed_all_gather, timeout=90)
    out = np.frombuffer(results[0]["out"], dtype=np.float32)
    for rank, got in enumerate(results):
        assert got["out"] == results[0]["out"], f"rank {rank}: outputs must be bitwise identical"
        assert got["inplace"] == results[0]["out"], f"rank {rank}: the in-place all-gather differs"
        assert got["double_exact"], "float64 is never compressed"
        assert got["small"] == [pytest.approx(r + 0.1) for r in range(world) for _ in range(100)]
        x = np.asarray(got["w"], dtype=np.float32)
        _, decoded = codec_ref.encode(get_codec("int8"), x)  # each chunk: its owner's encoding, decoded
        assert np.array_equal(out[rank * 4096 : (rank + 1) * 4096], decoded), f"chunk {rank}"
        assert not np.array_equal(decoded, x), "int8 was not applied"


def test_all_to_all_compression_encodes_each_part_once(pools):
    world, row = 3, 8
    results = pools(world).run(tb.compressed_all_to_all, timeout=90)
    sent = [np.frombuffer(r["x"], dtype=np.float32).reshape(-1, row) for r in results]
    for rank, got in enumerate(results):
        out = np.frombuffer(got["out"], dtype=np.float32).reshape(-1, row)
        ids = np.frombuffer(got["ids"], dtype=np.int64).reshape(-1, row)
        rows = (rank + 1) * 300
        for q in range(world):
            start = sum((j + 1) * 300 for j in range(rank))  # where rank q's rows for this rank begin
            part = sent[q][start:start + rows].reshape(-1)
            got_part = out[q * rows:(q + 1) * rows].reshape(-1)
            want = part if q == rank else codec_ref.encode(get_codec("int8"), part)[1]
            assert np.array_equal(got_part, want), f"rank {rank}: the part from rank {q}"
            want_ids = np.arange(start * row, (start + rows) * row, dtype=np.int64) + 10**6 * q
            assert np.array_equal(ids[q * rows:(q + 1) * rows].reshape(-1), want_ids), "int64 rows are exact"
        # constant rows (one value per sender) survive int8 exactly; rank 0 sent none
        want = [[float(q)] * row for q in range(1, world) for _ in range(10 * (rank + 1))]
        assert got["empty"] == want, f"rank {rank}: the all-to-all with an empty sender"


def test_options_and_device_maps_that_cannot_work_are_refused(pools):
    for errors in pools(2).run(tb.refused_options, timeout=60):
        assert errors[0].startswith("InvalidUsageError") and "pycoll.torch.Options" in errors[0], errors[0]
        assert errors[1].startswith("InvalidUsageError") and "cpu:pycoll,cuda:gloo" in errors[1], errors[1]


# ---- failures ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind", ["mismatch", "async_mismatch", "timeout", "peer_lost", "monitored_lost", "any_source_lost"]
)
def test_failures_raise_pycolls_errors_on_every_rank(tmp_path, kind):
    lost = kind in ("peer_lost", "monitored_lost", "any_source_lost")
    world = 3 if lost else 2
    results = run_ranks(
        world, tb.fresh_group_failure, kind, str(tmp_path / "store"), timeout=90, allow_exit=lost
    )
    expected = {
        "mismatch": "CollectiveMismatchError",
        "async_mismatch": "CollectiveMismatchError",
        "timeout": "CollectiveTimeoutError",
    }.get(kind, "PeerLostError")
    for rank, got in enumerate(results):
        if (kind == "timeout" or lost) and rank == 1:
            continue  # the rank that stayed away / exited
        assert got["error"] == expected, f"rank {rank}: {got}"
        assert got["after_s"] < 15, f"rank {rank} took {got['after_s']:.1f} s to fail"


# ---- receive from any source ---------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 4])
def test_receive_from_any_source_names_the_sender_in_each_senders_order(pools, world):
    per_sender = 3
    got = pools(world).run(tb.any_source, per_sender, timeout=120)[0]
    assert len(got["order"]) == (world - 1) * per_sender
    assert [msg[0] for msg in got["order"]] == got["sources"]  # source_rank is the sender of the data
    for src in range(1, world):  # every message once, and each sender's in the order it sent them
        assert [k for s, k in got["order"] if s == src] == list(range(per_sender))
    # receives are matched in posting order: the one from any source gets rank 1's first message, the one
    # posted after it from rank 1 by name the second
    assert got["posted_order"] == (1, [1, 100], [1, 101])


# ---- monitored barrier ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "world, late, wait_all", [(2, [1], False), (4, [2], False), (4, [1, 3], True), (4, [1, 3], False)]
)
def test_monitored_barrier_names_the_ranks_that_did_not_arrive(pools, world, late, wait_all):
    results = pools(world).run(tb.monitored, late, wait_all, timeout=120)
    missing = ", ".join(map(str, late))
    arrived = ", ".join(str(r) for r in range(world) if r not in late)
    for rank, got in enumerate(results):
        assert got["passed"] and got["after"] == [float(world)] * 3
        kind, text = got["error"]
        assert kind == "CollectiveTimeoutError", got["error"]
        if rank == 0:
            if len(late) == 1 or wait_all:  # every missing rank named; else the first, then the others
                failed = f"{'Ranks' if len(late) > 1 else 'Rank'} {missing} failed to pass monitoredBarrier:"
            else:
                failed = f"Rank {late[0]} failed to pass monitoredBarrier (and rank {late[1]}):"
            assert text.startswith(f"Rank 0 timed out in monitoredBarrier after 2 s. {failed} ")
            assert (f"(ranks {arrived} did" if "," in arrived else "(only rank 0 did") in text
            assert ("wait_all_ranks=True" in text) == wait_all
            assert 2 <= got["seconds"] < 4
        elif rank in late:
            assert text.startswith(f"Rank {rank} failed to pass monitoredBarrier: it reached it after rank 0")
        else:
            assert text.startswith(f"Rank {rank} successfully reached monitoredBarrier, but received errors ")
            assert "from rank 0: rank 0 reports that" in text
            who = f"{'ranks' if len(late) > 1 else 'rank'} {missing}"
            assert text.endswith(f"{who} did not arrive within 2 s")


# ---- sparse all-reduce ---------------------------------------------------------------------------------
def _sparse_expected(world: int, counts: list[int]) -> dict[int, list[float]]:
    rows = 2 * world
    want: dict[int, list[float]] = {}
    for r, n in enumerate(counts):
        for j in range(n):
            i = (r + j) % rows
            acc = want.setdefault(i, [0.0, 0.0, 0.0])
            for k in range(3):
                acc[k] += i * 10 + k + r / 8
    return want


@pytest.mark.parametrize("world", [2, 4])
def test_sparse_all_reduce_sums_every_ranks_rows_exactly(pools, world):
    results = pools(world).run(tb.sparse_all_reduce, timeout=120)
    for name, counts in (
        ("overlapping", [r + 1 for r in range(world)]),
        ("one empty", [0 if r == 1 else 2 for r in range(world)]),
    ):
        want = _sparse_expected(world, counts)
        for got in results:
            indices, values, coalesced, _ = got[name]
            assert coalesced and indices == [sorted(want)]
            assert values == [want[i] for i in sorted(want)]  # exact: sums of multiples of 1/8
        _identical([got[name][3] for got in results])
    for rank, got in enumerate(results):
        kind, text = got["mismatch"]
        assert kind == "CollectiveMismatchError" and "sparse all_reduce" in text
        differ = [world - 1] if rank < world - 1 else list(range(world - 1))
        assert f"ranks {differ} hold another layout" in text
        assert got["max"][0] == "InvalidUsageError" and "SUM only" in got["max"][1]
