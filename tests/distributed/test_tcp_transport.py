"""The TCP transport (csrc/transport/tcp.*) on real ranks: PYCOLL_TRANSPORT=tcp makes ranks of this one
host connect over loopback TCP, exactly as ranks of different hosts do.

Correctness: every collective and algorithm, integer data against closed forms, float data bitwise equal
on every rank and to what the shared-memory transport gives; compressed all-reduce bitwise across ranks.
Failures (the bodies of test_failures.py, over TCP): a missing rank times out naming it, a SIGKILLed
rank is reported as lost on every survivor, mismatched calls raise CollectiveMismatchError everywhere.
"""

from __future__ import annotations

import hashlib
import resource
import threading
import time

import numpy as np
import pytest
from harness import RankPool, run_ranks
from test_failures import (
    MISMATCHES,
    _assert_broken_afterwards,
    _check_peer_lost,
    _check_timeouts,
    _error,
    body_kill_before_call,
    body_kill_during_loop,
    body_mismatch,
    body_skip_call,
)

import pycoll
from pycoll.algorithms import ALGORITHMS

TCP = {"PYCOLL_TRANSPORT": "tcp"}
#: Ranks 0-1 and 2-3 on two pretend hosts: shared memory within each, TCP between them.
MIXED = {"PYCOLL_TEST_RANKS_PER_HOST": "2"}


def _body(comm, rank, world):
    failures, digest = [], hashlib.sha256()
    even = len({comm.hosts.count(h) for h in comm.hosts}) == 1  # hierarchical needs equal hosts
    if not even:
        try:
            pycoll.allreduce(np.ones(10, np.float32), algorithm="hierarchical", comm=comm)
            failures.append("hierarchical on hosts of unequal size did not raise")
        except pycoll.InvalidUsageError as exc:
            if "same number of ranks on every host" not in str(exc):
                failures.append(f"hierarchical on unequal hosts: {exc}")
    algorithms = [a for a in ALGORITHMS["allreduce"] if even or a != "hierarchical"]
    seg = comm.segment_bytes // 4
    for n in (0, 1, 7, 1000, 3 * seg + 5):
        ints = np.arange(n, dtype=np.int64) * (rank + 1)
        for algorithm in algorithms:
            x = ints.copy()
            pycoll.allreduce(x, algorithm=algorithm, comm=comm)
            if not np.array_equal(x, np.arange(n, dtype=np.int64) * (world * (world + 1) // 2)):
                failures.append(f"allreduce {algorithm} int64 n={n}: not the closed form")
            f = np.random.default_rng([rank, n]).standard_normal(n).astype(np.float32)
            pycoll.allreduce(f, "avg", algorithm=algorithm, comm=comm)
            digest.update(f.tobytes())
        chunk = np.full(n, rank, dtype=np.int32)
        for algorithm in ALGORITHMS["all_gather"]:
            if algorithm == "hierarchical" and not even:
                continue
            out = np.full(world * n, -1, np.int32)
            pycoll.all_gather(chunk, out, algorithm=algorithm, comm=comm)
            if not np.array_equal(out, np.repeat(np.arange(world, dtype=np.int32), n)):
                failures.append(f"all_gather {algorithm} n={n}: wrong")
        for algorithm in ALGORITHMS["reduce_scatter"]:
            if algorithm == "hierarchical" and not even:
                continue
            out = np.full(n, -1, np.int32)
            pycoll.reduce_scatter(np.tile(chunk + 1, world), out, algorithm=algorithm, comm=comm)
            if not (out == world * (world + 1) // 2).all():
                failures.append(f"reduce_scatter {algorithm} n={n}: wrong")
        for algorithm in ALGORITHMS["broadcast"]:
            y = np.full(n, rank, dtype=np.float64)
            pycoll.broadcast(y, world - 1, algorithm=algorithm, comm=comm)
            if not (y == world - 1).all():
                failures.append(f"broadcast {algorithm} n={n}: wrong")
        for codec, algorithm in (
            ("fp16", "direct"),
            ("int8", "hierarchical" if even else "tree"),
            ("int4", "ring"),
        ):
            g = np.random.default_rng([rank, n, 7]).standard_normal(n).astype(np.float32)
            res = np.zeros(n, np.float32)
            pycoll.allreduce(g, compression=codec, algorithm=algorithm, residual=res, comm=comm)
            digest.update(g.tobytes())
    work = pycoll.allreduce(np.ones(10_000, np.float32), comm=comm, async_op=True)
    if not (work.wait() and (work.result() == world).all()):
        failures.append("async allreduce: wrong")
    pycoll.barrier(comm=comm)
    return failures, digest.hexdigest()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_over_tcp(world):
    with RankPool(world, env=TCP) as pool:
        info = pool.run(_info, timeout=30)
        results = pool.run(_body, timeout=300)
    # TCP alone has rings of its own shape (pycoll.auto.ring_shape): 512 KiB fragments, 4 slots, half a ring
    # per message segment; the harness's PYCOLL_SHM_SLOT_BYTES does not apply to them.
    assert {(i["transport"], i["fragment"], i["segment"]) for i in info} == {("tcp", 512 << 10, 1 << 20)}
    assert [f for f, _ in results] == [[]] * world
    assert len({d for _, d in results}) == 1, "ranks ended with different bits"


def _info(comm, rank, world):
    return {
        "transport": comm.transport,
        "node": comm.node_rank,
        "local": comm.local_rank,
        "fragment": comm.fragment_bytes,
        "segment": comm.segment_bytes,
    }


@pytest.mark.parametrize("world", [3, 4])
def test_collectives_over_shared_memory_and_tcp(world):
    with RankPool(world, env=MIXED) as pool:
        info = pool.run(_info, timeout=30)
        results = pool.run(_body, timeout=300)
    # Both transports of a composite take the shared-memory shape: the harness's 64 KiB x 8 slots.
    shape = {"fragment": 64 << 10, "segment": 256 << 10}
    assert info == [{"transport": "mixed", "node": r // 2, "local": r % 2, **shape} for r in range(world)]
    assert [f for f, _ in results] == [[]] * world
    assert len({d for _, d in results}) == 1, "ranks ended with different bits"


def _compressed_hierarchical_against_simulator(comm, rank, world):
    """Compressed hierarchical all-reduce on hosts of 2 ranks, by the fragment executor and as a grouped
    program: results and residuals bit for bit the simulator's (int8 on the TCP links only)."""
    from pycoll.algorithms.compressed import build_compressed_plan
    from pycoll.algorithms.simulate import simulate
    from pycoll.compression import Int4, Int8

    failures = []
    for codec, op, count in ((Int8(), "sum", 20_011), (Int4(block=64, rounding="stochastic"), "avg", 5_000)):
        for grouped in (False, True):
            inputs = [np.random.default_rng([r, count]).standard_normal(count).astype(np.float32)
                      for r in range(world)]
            residuals = [np.random.default_rng([r, count, 1]).standard_normal(count).astype(np.float32) / 100
                         for r in range(world)]
            x, res = inputs[rank].copy(), residuals[rank].copy()
            seq = comm.native().seq + 1  # keys stochastic rounding
            comm.grouped_on_cpu = grouped
            try:
                pycoll.allreduce(x, op, algorithm="hierarchical", compression=codec, residual=res, comm=comm)
            finally:
                comm.grouped_on_cpu = False
            segment_blocks = max(1, comm.segment_bytes // codec.block_bytes)
            plans = [build_compressed_plan("hierarchical", r, world, count, codec.block_elems, segment_blocks,
                                           local_size=2) for r in range(world)]
            sim = simulate(plans, inputs, op, codec=codec, residuals=residuals, seq=seq)
            label = f"{codec!r} {op} grouped={grouped}"
            if x.tobytes() != sim.outputs[rank].tobytes():
                failures.append(f"{label}: result differs from the simulator's")
            if res.tobytes() != residuals[rank].tobytes():
                failures.append(f"{label}: residual differs from the simulator's")
    return failures


def test_compressed_hierarchical_matches_the_simulator_bitwise():
    with RankPool(4, env=MIXED) as pool:
        results = pool.run(_compressed_hierarchical_against_simulator, timeout=120)
    assert results == [[]] * 4


def _auto_across_hosts(comm, rank, world):
    """What algorithm="auto" all-reduces with, told apart by the bits each plan's summation order gives."""
    from pycoll.compression import Int8

    x = np.random.default_rng([rank, 3]).standard_normal(50_000).astype(np.float32)
    bits = {}
    for algorithm in ("auto", "hierarchical", "ring", "direct"):
        if algorithm == "hierarchical" and not comm.spans_equal_hosts:
            continue
        plain, packed = x.copy(), x.copy()
        pycoll.allreduce(plain, algorithm=algorithm, comm=comm)
        pycoll.allreduce(packed, algorithm=algorithm, compression=Int8(), comm=comm)
        bits[algorithm] = tuple(hashlib.sha256(y.tobytes()).hexdigest() for y in (plain, packed))
    return comm.spans_equal_hosts, bits


@pytest.mark.parametrize("world,env", [(4, MIXED), (3, MIXED), (4, {})])
def test_auto_is_hierarchical_on_several_equal_hosts(world, env):
    with RankPool(world, env=env) as pool:
        results = pool.run(_auto_across_hosts, timeout=120)
    spans, bits = results[0]
    assert all(r == results[0] for r in results), "ranks disagree"
    assert spans == (world == 4 and env == MIXED)  # 2 hosts x 2; not 2 + 1, not one host
    if spans:
        assert bits["ring"][0] != bits["hierarchical"][0] != bits["direct"][0]  # the plans are told apart
        assert bits["auto"] == bits["hierarchical"]  # plain and int8 alike
    else:
        assert bits["auto"][1] == bits["direct"][1]  # with a codec: two-shot


def _float_results(comm, rank, world):
    out = []
    for algorithm in ALGORITHMS["allreduce"]:
        f = np.random.default_rng([rank, 5]).standard_normal(100_003).astype(np.float32)
        pycoll.allreduce(f, algorithm=algorithm, comm=comm)
        out.append(hashlib.sha256(f.tobytes()).hexdigest())
    return out


def test_tcp_gives_the_bits_shared_memory_gives():
    with RankPool(3, env=TCP) as pool:
        tcp = pool.run(_float_results, timeout=120)
    with RankPool(3) as pool:
        shm = pool.run(_float_results, timeout=120)
    assert tcp == shm


def test_timeout_over_tcp_names_the_missing_rank():
    results = run_ranks(3, body_skip_call, [2], "allreduce", 1.0, "ring", timeout=60, env=TCP)
    _check_timeouts(results, [2], "allreduce", 1.0)


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_killed_peer_over_tcp_is_reported_on_every_rank(tmp_path, algorithm):
    stamp = tmp_path / "killed_at"
    results = run_ranks(
        4, body_kill_before_call, 2, "allreduce", algorithm, str(stamp), timeout=90, allow_exit=True, env=TCP
    )
    _check_peer_lost(results, 2, stamp)


def test_peer_killed_mid_allreduce_over_tcp(tmp_path):
    stamp = tmp_path / "killed_at"
    results = run_ranks(
        3, body_kill_during_loop, 1, "ring", str(stamp), 0.7, timeout=120, allow_exit=True, env=TCP
    )
    _check_peer_lost(results, 1, stamp)


@pytest.mark.parametrize("kind", ["count", "dtype", "collective", "codec"])
def test_mismatch_over_tcp_names_what_differs(kind):
    results = run_ranks(3, body_mismatch, kind, 2, timeout=60, env=TCP)
    for r, res in enumerate(results):
        assert res["error"] == "CollectiveMismatchError", f"rank {r}: {res}"
        missing = [s for s in MISMATCHES[kind][2] if s not in res["message"]]
        assert not missing, f"rank {r}: the message does not name {missing}: {res['message']}"
        _assert_broken_afterwards(res, r)


def _body_poll_fails_on_rank0(comm, rank, world):
    """Rank 0's I/O thread sees poll() fail (EINVAL: more descriptors than RLIMIT_NOFILE allows) while
    rank 0 waits in an all-reduce that the other ranks join only later."""
    pycoll.barrier(comm=comm, timeout=30)
    if rank == 0:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

        def starve():
            time.sleep(0.5)  # rank 0 is waiting in the all-reduce by now
            resource.setrlimit(resource.RLIMIT_NOFILE, (1, hard))
            time.sleep(1.5)  # an idle I/O thread polls at least every second
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        threading.Thread(target=starve, daemon=True).start()
    else:
        time.sleep(3.0)
    t0 = time.monotonic()
    try:
        pycoll.allreduce(np.ones(1000, np.float32), comm=comm, timeout=60)
        return {"error": None}
    except Exception as exc:  # noqa: BLE001
        return _error(exc, t0)


@pytest.mark.parametrize("world, env", [(2, TCP), (4, MIXED)], ids=["tcp", "mixed"])
def test_io_thread_failure_raises_at_once_on_every_rank(world, env):
    """A failing poll() in the I/O thread aborts the transport: every rank raises PeerLostError within
    seconds (the waiter on rank 0 names the cause) instead of waiting for its 60 s deadline."""
    results = run_ranks(world, _body_poll_fails_on_rank0, timeout=90, env=env)
    for r, res in enumerate(results):
        assert res["error"] == "PeerLostError", f"rank {r}: {res}"
        assert res["elapsed"] < 10, f"rank {r} raised only after {res['elapsed']:.1f} s: {res}"
    assert "poll: Invalid argument" in results[0]["message"], results[0]
