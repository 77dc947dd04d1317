"""Liveness that does not wait for Python, and links only where the plans go (issue 51), on real rank
processes over shared memory and TCP:

- a busy rank is not a dead one: one rank holds the GIL (one C call that never releases it, as a sort of
  a huge list or pickling a checkpoint does) for three heartbeat timeouts, while the others wait for it
  in a collective, or while its own collective waits and another of its threads holds the GIL. Nobody is
  found dead or evicted, and every result is exact;
- a peer that died before the first message to it: the link made at that first use fails, and every rank
  raises PeerLostError naming it (the fault plane off: the data transport alone finds it);
- above 16 ranks a rank maps the segments of, or connects to, exactly the peers of the plans it ran.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from harness import RankPool

import pycoll
from pycoll import _C
from pycoll.errors import PeerLostError

HEARTBEAT_S = 1.0
ENVS = {
    "shm": {"PYCOLL_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S)},
    "tcp": {"PYCOLL_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S), "PYCOLL_TRANSPORT": "tcp"},
}


def _exact(comm, rank: int, world: int, n: int) -> bool:
    x = np.full(n, rank + 1.0, dtype=np.float32)
    pycoll.allreduce(x, comm=comm)
    return bool(np.all(x == world * (world + 1) / 2))


def body_busy(comm, rank, world, busy, hold_s, other_thread):
    """Rank ``busy`` holds the GIL for ``hold_s`` while the others wait for it in an all-reduce: in its
    main thread (before its own call), or in another thread while its main thread's call waits."""
    ok = [_exact(comm, rank, world, 1000)]
    if rank == busy and not other_thread:
        _C.testing.hold_gil(hold_s)
    holder = None
    if rank == busy and other_thread:
        holder = threading.Thread(target=_C.testing.hold_gil, args=(hold_s,))
        holder.start()
    started = time.monotonic()
    ok.append(_exact(comm, rank, world, 1 << 16))
    waited = time.monotonic() - started
    if holder is not None:
        holder.join()
    time.sleep(2 * HEARTBEAT_S)  # a late verdict would come now
    ok.append(_exact(comm, rank, world, 1 << 20))
    plane = comm.plane
    return {"ok": ok, "waited": waited, "dead": dict(plane.dead), "evicted": plane.evicted}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("other_thread", [False, True], ids=["main-thread", "other-thread"])
def test_a_rank_holding_the_gil_for_three_heartbeat_timeouts_is_not_dead(transport, world, other_thread):
    hold_s = 3 * HEARTBEAT_S
    with RankPool(world, env=ENVS[transport]) as pool:
        results = pool.run(body_busy, 1, hold_s, other_thread, timeout=60)
    for rank, res in enumerate(results):
        assert res["ok"] == [True, True, True], (rank, res)
        assert res["dead"] == {} and res["evicted"] is None, (rank, res)
    # the others really waited for the busy rank, past the heartbeat timeout
    assert max(res["waited"] for r, res in enumerate(results) if r != 1) > 2 * HEARTBEAT_S, results


def body_dead_before_first_use(comm, rank, world, victim):
    if rank == victim:
        os._exit(0)  # no goodbye: its sockets and segment go with it, as with a kill
    time.sleep(1.0)  # it is gone before anyone needs it
    x = np.full(1 << 12, rank + 1.0, dtype=np.float32)
    try:
        pycoll.allreduce(x, algorithm="ring", comm=comm)
    except PeerLostError as exc:
        return {"type": "PeerLostError", "rank": exc.rank, "message": str(exc)}
    except pycoll.PycollError as exc:
        return {"type": type(exc).__name__, "rank": getattr(exc, "rank", None), "message": str(exc)}
    return {"type": None}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_link_made_at_first_use_to_a_dead_peer_names_it(transport):
    world, victim = 4, 2
    env = {k: v for k, v in ENVS[transport].items() if k != "PYCOLL_HEARTBEAT_TIMEOUT"}
    with RankPool(world, env=env, init_kwargs={"fault_tolerance": False}) as pool:
        results = pool.run(body_dead_before_first_use, victim, timeout=60, allow_exit=True)
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        assert res["type"] == "PeerLostError" and res["rank"] == victim, (rank, res)
        assert f"rank {victim}" in res["message"], res


def body_links(comm, rank, world):
    """Collectives whose auto plans are ring or tree above 16 ranks; the peers this rank is linked to, and
    the peers of the plans it ran."""
    ok = _exact(comm, rank, world, 1 << 10) and _exact(comm, rank, world, 1 << 20)
    part = np.full(64, rank, dtype=np.int32)
    gathered = np.empty(64 * world, dtype=np.int32)
    pycoll.all_gather(part, gathered, comm=comm)
    ok = ok and bool(np.all(gathered == np.repeat(np.arange(world, dtype=np.int32), 64)))
    planned = set()
    for key in comm.plans.keys():
        for op in comm.plans.python_plan(rank, key).ops():
            planned.update(p for p in (op.send_peer, op.recv_peer) if p >= 0)
    native = comm.native()
    linked = native.shm_mapped_peers() if comm.transport == "shm" else _C.testing.tcp_linked(native)
    algorithms = sorted({key.algorithm for key in comm.plans.keys()})
    return {"ok": ok, "planned": sorted(planned), "linked": sorted(linked), "algorithms": algorithms,
            "fds": len(os.listdir("/proc/self/fd"))}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_above_16_ranks_a_rank_links_only_to_its_plans_peers(transport):
    world = 20
    env = {k: v for k, v in ENVS[transport].items() if k != "PYCOLL_HEARTBEAT_TIMEOUT"}
    with RankPool(world, env=env, start_timeout=120.0) as pool:
        results = pool.run(body_links, timeout=120)
    for rank, res in enumerate(results):
        assert res["ok"], (rank, res)
        assert "direct" not in res["algorithms"], res
        assert res["linked"] == res["planned"], (rank, res)
        assert len(res["linked"]) <= 6, (rank, res)  # a ring's 2, a double binary tree's few
