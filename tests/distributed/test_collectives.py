"""broadcast, barrier, reduce_scatter, all_gather, algorithm="auto", async Work and mixed sync/async order,
on long-lived rank pools.

Every body returns a list of failures (empty: passed) so one pytest case checks many combinations; every
rank checks its own result exactly against inputs it can rebuild (``_inputs``), and the parent checks
that digests agree across ranks where every rank must hold the same bits.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time

import numpy as np
import pytest
from _inputs import (
    FLOATS,
    ITEMSIZE,
    array_from_bits,
    bf16_backend,
    bits_of,
    digest,
    expected_bits,
    expected_values,
    input_values,
    make_input,
    values_of,
)

import pycoll
from pycoll.algorithms import ALGORITHMS

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")
WORLDS = (1, 2, 3, 4, 7)


def _dtypes(backend: str) -> tuple[str, ...]:
    if backend == "numpy" and bf16_backend()[0] is None:
        return tuple(d for d in DTYPES if d != "bfloat16")
    return DTYPES


def _counts(comm, dtype: str) -> list[int]:
    seg = comm.segment_bytes // ITEMSIZE[dtype]
    return [0, 1, 7, 3 * seg + 5]


def _wrong(label: str, got: np.ndarray, want: np.ndarray) -> list[str]:
    if got.shape == want.shape and np.array_equal(got, want):
        return []
    if got.shape != want.shape:
        return [f"{label}: {got.size} bytes, expected {want.size}"]
    bad = np.flatnonzero(got != want)
    return [f"{label}: {bad.size} of {want.size} bytes wrong, first at byte {bad[0]}"]


def _garbage_like(dtype: str, count: int, backend: str):
    """A destination pre-filled with a byte pattern that no correct result leaves in place."""
    return array_from_bits(np.full(count * ITEMSIZE[dtype], 0x5A, dtype=np.uint8), dtype, backend)


# ---- broadcast -----------------------------------------------------------------------------------------
def body_broadcast(comm, rank, world, backend="numpy"):
    failures, digests = [], {}
    for algorithm in ALGORITHMS["broadcast"] + ("auto",):
        for dtype in _dtypes(backend):
            for count in _counts(comm, dtype):
                roots = range(world) if count < 1000 else sorted({0, world - 1})
                for root in roots:
                    label = f"broadcast {dtype} count={count} root={root} {algorithm} world={world}"
                    x = make_input(dtype, "sum", rank, world, count, backend)
                    y = pycoll.broadcast(x, root, algorithm=algorithm, comm=comm, timeout=30)
                    if y is not x:
                        failures.append(f"{label}: did not return its input")
                    want = bits_of(make_input(dtype, "sum", root, world, count))
                    failures += _wrong(label, bits_of(x), want)
                    digests[label] = digest(x)
    return failures, digests


# ---- barrier -------------------------------------------------------------------------------------------
def body_barrier_timing(comm, rank, world, sleeper, delay):
    pycoll.barrier(comm=comm, timeout=30)
    if rank == sleeper:
        time.sleep(delay)
    enter = time.time()
    pycoll.barrier(comm=comm, timeout=30)
    leave = time.time()
    return enter, leave


def body_many_barriers(comm, rank, world, n):
    start = time.monotonic()
    for _ in range(n):
        pycoll.barrier(comm=comm, timeout=30)
    return time.monotonic() - start


# ---- reduce_scatter / all_gather -----------------------------------------------------------------------
RS_OPS = ("sum", "avg", "min", "max", "prod")
#: (dtype, op) pairs that also run reduce_scatter with 3 segments + 5 elements per rank
RS_SEGMENTED = (("float32", "sum"), ("bfloat16", "avg"), ("int8", "sum"), ("int64", "max"),
                ("float64", "prod"))


def body_reduce_scatter(comm, rank, world, backend="numpy"):
    failures = []
    for algorithm in ALGORITHMS["reduce_scatter"] + ("auto",):
        for dtype in _dtypes(backend):
            for m in _counts(comm, dtype):
                for op in RS_OPS:
                    if op == "avg" and dtype not in FLOATS:
                        continue
                    if m > 1000 and (dtype, op) not in RS_SEGMENTED:
                        continue
                    label = f"reduce_scatter {dtype} {op} m={m} {algorithm} world={world}"
                    x = make_input(dtype, op, rank, world, world * m, backend)
                    before = digest(x)
                    out = _garbage_like(dtype, m, backend)
                    y = pycoll.reduce_scatter(x, out, op, algorithm=algorithm, comm=comm, timeout=30)
                    if y is not out:
                        failures.append(f"{label}: did not return out")
                    if digest(x) != before:
                        failures.append(f"{label}: modified its input x")
                    mine = expected_values(dtype, op, world, world * m, rank * m, (rank + 1) * m)
                    want = expected_bits(mine, dtype)
                    failures += _wrong(label, bits_of(out), want)
    return failures


def body_all_gather(comm, rank, world, backend="numpy"):
    failures, digests = [], {}
    for algorithm in ALGORITHMS["all_gather"] + ("auto",):
        for dtype in _dtypes(backend):
            for m in _counts(comm, dtype):
                label = f"all_gather {dtype} m={m} {algorithm} world={world}"
                x = make_input(dtype, "max", rank, world, m, backend)
                before = digest(x)
                out = _garbage_like(dtype, world * m, backend)
                y = pycoll.all_gather(x, out, algorithm=algorithm, comm=comm, timeout=30)
                if y is not out:
                    failures.append(f"{label}: did not return out")
                if digest(x) != before:
                    failures.append(f"{label}: modified its input x")
                digests[label] = digest(out)
                if rank == 0 or m < 1000:  # the other ranks' bits are compared by digest in the parent
                    want = np.concatenate([bits_of(make_input(dtype, "max", r, world, m))
                                           for r in range(world)])
                    failures += _wrong(label, bits_of(out), want)
    return failures, digests


# ---- allreduce extras ----------------------------------------------------------------------------------
def body_auto_and_default_comm(comm, rank, world):
    """algorithm="auto" at every size class, through the default communicator (no comm=)."""
    failures = []
    if pycoll.get_comm() is not comm:
        failures.append("pycoll.init() did not make the pool's communicator the default")
    for count in (0, 1, 1000, 16 * 1024 + 3, 300_000, 1_200_000):
        for dtype in ("float32", "int64"):
            x = make_input(dtype, "sum", rank, world, count)
            pycoll.allreduce(x)  # op="sum", algorithm="auto", default communicator
            want = expected_bits(expected_values(dtype, "sum", world, count), dtype)
            failures += _wrong(f"auto allreduce {dtype} count={count}", bits_of(x), want)
    return failures


def body_nan_propagation(comm, rank, world):
    """A NaN on one rank makes the result NaN on every rank, for sum/min/max/prod and every algorithm."""
    failures = []
    for algorithm in ALGORITHMS["allreduce"]:
        for dtype in ("float32", "float64", "float16"):
            for op in ("sum", "min", "max", "prod"):
                x = np.ones(9, dtype=dtype)
                if rank == world - 1:
                    x[4] = np.nan
                pycoll.allreduce(x, op, algorithm=algorithm, comm=comm, timeout=30)
                if not np.isnan(x[4]) or np.isnan(np.delete(x, 4)).any():
                    failures.append(f"NaN {dtype} {op} {algorithm}: got {x.tolist()}")
    return failures


def body_unaligned_and_0d(comm, rank, world):
    """Arrays whose data is not aligned to their itemsize (numpy's flags.aligned is False), and 0-d arrays:
    either reduced correctly or refused with InvalidUsageError, never a crash or a wrong result."""
    failures = []
    for dtype in ("float32", "float64", "int64", "float16", "int32"):
        for algorithm in ALGORITHMS["allreduce"]:
            n = 3 * comm.segment_bytes // 8 + 11
            raw = np.zeros(n * np.dtype(dtype).itemsize + 1, np.uint8)[1:]
            x = raw.view(dtype)
            x[:] = np.arange(n) % 7 + rank
            try:
                pycoll.allreduce(x, algorithm=algorithm, comm=comm, timeout=30)
            except pycoll.InvalidUsageError:
                continue
            want = (np.arange(n) % 7) * world + world * (world - 1) // 2
            if not np.array_equal(x, want.astype(dtype)):
                failures.append(f"unaligned {dtype} {algorithm}: wrong result")
    z = np.array(rank + 1.5)
    pycoll.allreduce(z, comm=comm, timeout=30)
    if z.shape != () or float(z) != sum(r + 1.5 for r in range(world)):
        failures.append(f"0-d array: got {z!r}")
    return failures


def body_fast_path(comm, rank, world):
    """Repeated all-reduces of numpy arrays like one reduced before take the fast path (no Python-side
    validation: as_buffer is not called again), on new arrays each time, and still get checked: arrays
    it cannot take (read-only, strided) are refused by the full path, other dtypes, lengths, operators and
    async calls are right."""
    import pycoll.api as api

    failures = []
    validated = []
    real_as_buffer = api.as_buffer
    api.as_buffer = lambda x, name, **kw: validated.append(name) or real_as_buffer(x, name, **kw)
    try:
        n = 1000
        want = (np.arange(n) % 13) * world + world * (world - 1) // 2
        for i in range(6):
            # New memory every call, the later ones at an odd offset into a larger array.
            x = np.zeros(n, np.float32) if i < 3 else np.zeros(n + 9, np.float32)[i:][:n]
            x[:] = np.arange(n) % 13 + rank
            pycoll.allreduce(x, comm=comm, timeout=30)
            if not np.array_equal(x, want.astype(np.float32)):
                failures.append(f"call {i}: wrong sum")
        if len(validated) != 1:
            failures.append(f"as_buffer ran {len(validated)} times for six like calls, expected once")
        if not comm.prepared:
            failures.append("no prepared call was kept")
        ro = np.ones(n, np.float32)
        ro.flags.writeable = False
        strided = np.ones(2 * n, np.float32)[::2]
        for bad, what in ((ro, "read-only"), (strided, "strided")):
            try:
                pycoll.allreduce(bad, comm=comm, timeout=30)
                failures.append(f"a {what} array was accepted")
            except pycoll.InvalidUsageError:
                pass
        others = (
            (np.full(n, rank + 1, np.int32), "sum", np.full(n, world * (world + 1) // 2, np.int32)),
            (np.full(n + 1, rank + 1.0, np.float32), "sum", np.full(n + 1, world * (world + 1) / 2, "f4")),
            (np.full(n, rank, np.float32), "max", np.full(n, world - 1, np.float32)),
        )
        for x, op, expected in others * 2:
            x = x.copy()
            pycoll.allreduce(x, op, comm=comm, timeout=30)
            if not np.array_equal(x, expected):
                failures.append(f"{x.dtype} x {x.size} {op}: wrong result")
        a, y = np.full(n, rank + 1, np.int32), np.full(n, rank + 1, np.int32)
        w = pycoll.allreduce(a, comm=comm, async_op=True)
        pycoll.allreduce(y, comm=comm, timeout=30)  # after an async call: in order, on the full path
        w.wait(30)
        if not (np.array_equal(a, y) and y[0] == world * (world + 1) // 2):
            failures.append("async then sync: wrong results")
    finally:
        api.as_buffer = real_as_buffer
    return failures


# ---- async ---------------------------------------------------------------------------------------------
def _sum_ok(x, dtype, world, count) -> bool:
    want = expected_bits(expected_values(dtype, "sum", world, count), dtype)
    return np.array_equal(bits_of(x), want)


def body_async_work(comm, rank, world):
    failures = []
    # one op: wait / is_completed / exception / result / get_future
    x = make_input("float32", "sum", rank, world, 1000)
    work = pycoll.allreduce(x, algorithm="ring", comm=comm, async_op=True, timeout=30)
    if not isinstance(work, pycoll.Work):
        return [f"async_op=True returned {type(work).__name__}, not pycoll.Work"]
    if work.wait() is not True:
        failures.append("Work.wait() did not return True")
    if not work.is_completed():
        failures.append("is_completed() is False after wait()")
    if work.exception() is not None:
        failures.append(f"exception() is {work.exception()!r} after a successful collective")
    if work.result() is not x:
        failures.append("Work.result() is not the reduced array")
    if not _sum_ok(x, "float32", world, 1000):
        failures.append("async allreduce result wrong")
    fut = work.get_future()
    if "torch" in sys.modules:
        import torch

        if not isinstance(fut, torch.futures.Future):
            failures.append(f"get_future() with torch imported gave {type(fut).__name__}")
        elif fut.wait() is not x:
            failures.append("torch future's value is not the array")
    else:
        if not isinstance(fut, concurrent.futures.Future):
            failures.append(f"get_future() without torch gave {type(fut).__name__}")
        elif fut.result(timeout=10) is not x:
            failures.append("future's result is not the array")

    # several in flight complete in issue order, each with its own (correct) result
    n = 12
    order: list[int] = []
    lock = threading.Lock()
    xs = [make_input("int64", "sum", rank, world, 5000 + 997 * k) for k in range(n)]
    works = []
    for k, xk in enumerate(xs):
        algorithm = ALGORITHMS["allreduce"][k % 3]
        w = pycoll.allreduce(xk, algorithm=algorithm, comm=comm, async_op=True, timeout=30)
        works.append(w)

        def record(_f, k=k):
            with lock:
                order.append(k)

        w.get_future().add_done_callback(record)
    works[-1].wait(timeout=30)
    not_done = [k for k, w in enumerate(works) if not w.is_completed()]
    if not_done:
        failures.append(f"the last async op completed before earlier ones {not_done}")
    for w in works:
        w.wait(timeout=30)
    time.sleep(0.05)  # let the done callbacks of the last future run
    with lock:
        if order != sorted(order) or len(order) != n:
            failures.append(f"async ops completed in order {order}, expected 0..{n - 1}")
    for k, xk in enumerate(xs):
        if not _sum_ok(xk, "int64", world, 5000 + 997 * k):
            failures.append(f"async op {k}: wrong result")
    return failures


def body_mixed_sync_async(comm, rank, world):
    """async, sync, async, sync... in one order on every rank; ranks wait on their Works at different
    points. A sync call issued behind pending async ops runs after them."""
    failures = []
    a = make_input("float64", "sum", rank, world, 70_000)
    wa = pycoll.allreduce(a, algorithm="ring", comm=comm, async_op=True, timeout=30)
    if rank == 0:
        wa.wait(timeout=30)
    b = make_input("int32", "sum", rank, world, 33)
    pycoll.allreduce(b, algorithm="tree", comm=comm, timeout=30)  # sync, queued behind wa
    if not wa.is_completed():
        failures.append("a sync allreduce returned before the async one issued before it completed")
    c = make_input("uint8", "sum", rank, world, 1001)
    wc = pycoll.broadcast(c, root=world - 1, comm=comm, async_op=True, timeout=30)
    d = make_input("float32", "max", rank, world, 3 * 65536 + 1)
    wd = pycoll.allreduce(d, "max", algorithm="direct", comm=comm, async_op=True, timeout=30)
    pycoll.barrier(comm=comm, timeout=30)
    if not (wc.is_completed() and wd.is_completed()):
        failures.append("barrier returned before the async ops issued before it completed")
    e = make_input("float32", "sum", rank, world, 10)
    pycoll.allreduce(e, comm=comm, timeout=30)
    for w in (wa, wc, wd):
        w.wait(timeout=30)
    def exact(x, dtype, op, count):
        return np.array_equal(bits_of(x), expected_bits(expected_values(dtype, op, world, count), dtype))

    checks = {
        "a": exact(a, "float64", "sum", 70_000),
        "b": exact(b, "int32", "sum", 33),
        "c": np.array_equal(bits_of(c), bits_of(make_input("uint8", "sum", world - 1, world, 1001))),
        "d": exact(d, "float32", "max", 3 * 65536 + 1),
        "e": exact(e, "float32", "sum", 10),
    }
    failures += [f"mixed sync/async: result {k} wrong" for k, ok in checks.items() if not ok]
    return failures


def body_work_wait_timeout(comm, rank, world, delay):
    """Work.wait(timeout=) raises CollectiveTimeoutError when the collective has not finished in time,
    but the collective goes on (its own deadline is longer) and completes once the late rank joins."""
    x = make_input("float32", "sum", rank, world, 4096)
    if rank == world - 1:
        time.sleep(delay)
    work = pycoll.allreduce(x, comm=comm, async_op=True, timeout=30)
    out = {"early_timeout": None}
    if rank != world - 1:
        t0 = time.monotonic()
        try:
            work.wait(timeout=0.05)
            out["early_timeout"] = "no error"
        except pycoll.CollectiveTimeoutError as exc:
            out["early_timeout"] = "ok"
            out["early_elapsed"] = time.monotonic() - t0
            out["message"] = str(exc)
        out["completed_early"] = work.is_completed()
    out["wait"] = work.wait(timeout=30)
    out["correct"] = _sum_ok(x, "float32", world, 4096)
    y = make_input("int8", "sum", rank, world, 77)  # the communicator still works
    pycoll.allreduce(y, comm=comm, timeout=30)
    out["after"] = _sum_ok(y, "int8", world, 77)
    return out


# ---- tests ---------------------------------------------------------------------------------------------
def _no_failures(results, what):
    failures = [f for res in results for f in (res[0] if isinstance(res, tuple) else res)]
    assert not failures, f"{what}: {len(failures)} failures:\n" + "\n".join(failures[:40])


def _same_digests(results, what):
    digests = [res[1] for res in results]
    for r, d in enumerate(digests[1:], start=1):
        assert d == digests[0], f"{what}: rank {r}'s results differ bitwise from rank 0's"


@pytest.mark.parametrize("world", WORLDS)
def test_broadcast_from_every_root(rank_pool, world):
    results = rank_pool(world).run(body_broadcast, timeout=180)
    _no_failures(results, f"broadcast world {world}")
    _same_digests(results, f"broadcast world {world}")


def body_wait_stats(comm, rank, world, late, delay_s, n):
    """The executor's own account of a rank's time (bench/profile.py reads it): ``n`` all-reduces, before
    each of which rank ``late`` sleeps ``delay_s``."""
    native = comm.native()
    x = np.ones(1000, np.float32)
    pycoll.barrier(comm=comm)
    before = native.wait_stats()
    for _ in range(n):
        if rank == late:
            time.sleep(delay_s)
        pycoll.allreduce(x, comm=comm)
    after = native.wait_stats()
    return {k: after[k] - before[k] for k in after}


def test_wait_stats_count_the_collectives_and_the_time_spent_waiting(rank_pool):
    late, delay, n = 1, 0.02, 5
    results = rank_pool(2).run(body_wait_stats, late, delay, n, timeout=60)
    for r, d in enumerate(results):
        assert d["collectives"] == n, d
        assert 0 <= d["wait_ns"] <= d["run_ns"], d
        assert d["waits"] >= (n if r != late else 0), d
    # The punctual rank waited for the late one's sleeps; the late one found its peer there already.
    assert results[0]["wait_ns"] >= 0.7 * n * delay * 1e9, results[0]
    assert results[late]["wait_ns"] < 0.3 * results[0]["wait_ns"], results


@pytest.mark.parametrize("world", (2, 3, 4))
def test_barrier_waits_for_the_last_rank(rank_pool, world):
    delay = 0.3
    sleeper = world - 1
    results = rank_pool(world).run(body_barrier_timing, sleeper, delay, timeout=60)
    sleeper_enter = results[sleeper][0]
    for r, (enter, leave) in enumerate(results):
        assert leave >= sleeper_enter - 0.002, f"rank {r} left the barrier before rank {sleeper} entered it"
        if r != sleeper:
            waited = leave - enter
            assert waited >= delay - 0.06, f"rank {r} waited only {waited:.3f} s for a {delay} s sleeper"
    many = rank_pool(world).run(body_many_barriers, 300, timeout=60)
    assert max(many) < 30, f"300 barriers took {max(many):.1f} s"


def test_barrier_world_of_one(rank_pool):
    assert rank_pool(1).run(body_many_barriers, 10, timeout=30)[0] < 5


@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter(rank_pool, world):
    _no_failures(rank_pool(world).run(body_reduce_scatter, timeout=180), f"reduce_scatter world {world}")


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather(rank_pool, world):
    results = rank_pool(world).run(body_all_gather, timeout=180)
    _no_failures(results, f"all_gather world {world}")
    _same_digests(results, f"all_gather world {world}")


@pytest.mark.parametrize("world", (3,))
def test_torch_tensors_in_other_collectives(rank_pool, world):
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    pool = rank_pool(world)
    _no_failures(pool.run(body_broadcast, "torch", timeout=180), "torch broadcast")
    _no_failures(pool.run(body_reduce_scatter, "torch", timeout=180), "torch reduce_scatter")
    _no_failures(pool.run(body_all_gather, "torch", timeout=180), "torch all_gather")


@pytest.mark.parametrize("world", (1, 2, 4))
def test_auto_algorithm_and_default_communicator(rank_pool, world):
    _no_failures(rank_pool(world).run(body_auto_and_default_comm, timeout=120), f"auto world {world}")


@pytest.mark.parametrize("world", (1, 3))
def test_unaligned_and_zero_dimensional_arrays(rank_pool, world):
    _no_failures(rank_pool(world).run(body_unaligned_and_0d, timeout=60), f"unaligned world {world}")


@pytest.mark.parametrize("world", (1, 3))
def test_repeated_calls_take_the_fast_path_and_still_check_their_arrays(rank_pool, world):
    _no_failures(rank_pool(world).run(body_fast_path, timeout=60), f"fast path world {world}")


@pytest.mark.parametrize("world", (2, 3))
def test_nan_propagates(rank_pool, world):
    _no_failures(rank_pool(world).run(body_nan_propagation, timeout=60), f"NaN world {world}")


@pytest.mark.parametrize("world", (1, 2, 3))
def test_async_work_semantics_and_order(rank_pool, world):
    _no_failures(rank_pool(world).run(body_async_work, timeout=60), f"async world {world}")


@pytest.mark.parametrize("world", (2, 4))
def test_mixed_sync_and_async(rank_pool, world):
    _no_failures(rank_pool(world).run(body_mixed_sync_async, timeout=60), f"mixed world {world}")


def test_work_wait_timeout_does_not_cancel_the_collective(rank_pool):
    world, delay = 3, 0.6
    results = rank_pool(world).run(body_work_wait_timeout, delay, timeout=60)
    for r, out in enumerate(results):
        assert out["wait"] is True and out["correct"] and out["after"], (r, out)
        if r != world - 1:
            assert out["early_timeout"] == "ok", (r, out)
            assert out["early_elapsed"] < delay, (r, out)
            assert not out["completed_early"], (r, out)
            assert "allreduce" in out["message"], out["message"]


def test_values_helper_roundtrip():
    # guards the helpers the bodies rely on: bfloat16 bits <-> values, wrapping integer inputs
    if bf16_backend()[0] is not None:
        v = input_values("bfloat16", "sum", 1, 4, 50)
        assert np.array_equal(values_of(make_input("bfloat16", "sum", 1, 4, 50), "bfloat16"), v)
    w = expected_values("uint8", "sum", 8, 100)
    manual = sum(input_values("uint8", "sum", r, 8, 100).astype(np.uint8).astype(np.int64)
                 for r in range(8)) % 256
    assert np.array_equal(w.astype(np.int64), manual)


def body_collective_in_callback(comm, rank, world):
    """A synchronous collective inside a future callback (the comm-hook pattern ``fut.then(...)``) while
    another asynchronous one is queued: it runs between the two, on every rank, instead of waiting for
    the very thread it runs on."""
    gate = threading.Event()
    comm.submit(lambda: gate.wait(10), True)  # hold the worker until every callback is in place
    a, b, c = np.ones(1000), np.ones(1000), np.ones(10)
    w1 = pycoll.allreduce(a, async_op=True, timeout=20)
    w2 = pycoll.allreduce(b, async_op=True, timeout=20)
    seen: dict = {}

    def callback(fut: concurrent.futures.Future) -> None:
        seen["thread"] = threading.current_thread().name
        pycoll.allreduce(c, timeout=20)
        seen["c"] = c.copy()

    w1.get_future().add_done_callback(callback)
    gate.set()
    w2.wait(timeout=25)
    return {"ok": bool(np.all(a == world) and np.all(b == world) and np.all(seen.get("c") == world)),
            "thread": seen.get("thread", "")}


def test_sync_collective_inside_a_future_callback(rank_pool):
    results = rank_pool(2).run(body_collective_in_callback, timeout=60)
    for r, out in enumerate(results):
        assert out["ok"], (r, out)
        assert out["thread"].startswith("pycoll-rank"), (r, out)
