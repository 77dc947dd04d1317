"""The communicator's parts, each built from a Context (pycoll/context.py) alone, without a Communicator:
the dispatcher and its worker, the skew tracker, what a failed native collective means, and a membership
change (pycoll/fault/membership.py) given nothing of the communicator but its ``Change``."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
from test_agreement import close_all, die, make_planes

from pycoll import _C
from pycoll.arrays import as_buffer
from pycoll.call import Call
from pycoll.context import Context, Group
from pycoll.dispatch import Dispatcher
from pycoll.env import Settings
from pycoll.errors import (
    CommunicatorBrokenError,
    InvalidUsageError,
    PeerLostError,
)
from pycoll.fault import membership
from pycoll.skew.tracker import SkewTracker
from pycoll.tuning import Model


def one_rank_context() -> Context:
    native = _C.NativeCommunicator(0, 1, 65536, 4, 0, 0, 1 << 30)
    native.set_shm_peers([0], [-1])
    group = Group(
        rank=0,
        world_size=1,
        hosts=("here",),
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        transport="shm",
        addresses=("127.0.0.1", "127.0.0.1"),
        timeout=10.0,
        settings=Settings(),
        model=Model.for_link("shm", workers=1, segment_bytes=int(native.segment_bytes)),
        segment_bytes=int(native.segment_bytes),
        fragment_bytes=int(native.fragment_bytes),
        gpu_topology_setting={"spec": {}},
        spans_equal_hosts=False,
        clock_domains=(7,),
        epoch=0,
        parent_ranks=(0,),
    )
    return Context(group, native, None, None)  # type: ignore[arg-type]


def test_a_dispatcher_runs_collectives_on_a_context_alone() -> None:
    ctx = one_rank_context()
    dispatcher = Dispatcher(ctx)
    x = np.arange(1000, dtype=np.float32)
    buf = as_buffer(x, "x", writable=True)
    dispatcher.launch(Call("allreduce", "ring", buf, buf, 1000))
    np.testing.assert_array_equal(x, np.arange(1000, dtype=np.float32))
    assert ctx.native().seq == 1
    y = np.full(10, 3, dtype=np.int64)
    yb = as_buffer(y, "x", writable=True)
    work = dispatcher.launch(Call("allreduce", "direct", yb, yb, 10, async_op=True))
    work.wait()
    np.testing.assert_array_equal(y, 3)
    dispatcher.close()
    ctx.closed = True
    with pytest.raises(InvalidUsageError, match="finalized"):
        ctx.check_usable()


def test_a_skew_tracker_runs_on_a_context_and_a_launch() -> None:
    ctx = one_rank_context()
    dispatcher = Dispatcher(ctx)
    launched: list[str] = []

    def launch(call: Call) -> object:
        launched.append(call.collective)
        return dispatcher.launch(call)

    tracker = SkewTracker(ctx, launch)
    tracker.sync_clocks(10.0)  # one clock domain: no barrier
    assert launched == []
    x = np.ones(8, dtype=np.float32)
    buf = as_buffer(x, "x", writable=True)
    for _ in range(8):
        dispatcher.launch(Call("allreduce", "ring", buf, buf, 8))
    report = tracker.local_report()
    assert report.world == 1 and report.run.collectives == 8
    assert tracker.gathered_report(None, 10.0).run.collectives == 8  # two broadcasts, not in the report
    assert launched == ["broadcast", "broadcast"]


def test_the_context_says_what_a_failed_native_collective_means() -> None:
    ctx = one_rank_context()
    lost = PeerLostError("rank 3 died", rank=3)
    with pytest.raises(PeerLostError, match="rank 3 died"):
        ctx.native_failed(lost)
    assert ctx.broken is lost
    with pytest.raises(CommunicatorBrokenError, match="rank 3 died"):
        ctx.check_usable()
    usage = InvalidUsageError("bad argument")  # the caller's mistake: the communicator is fine
    fresh = one_rank_context()
    with pytest.raises(InvalidUsageError):
        fresh.native_failed(usage)
    assert fresh.broken is None
    assert not fresh.break_with(usage) or fresh.broken is usage


def test_the_group_is_the_same_facts_everywhere() -> None:
    group = one_rank_context().group
    with pytest.raises(AttributeError):
        group.rank = 1  # type: ignore[misc]
    assert replace(group, epoch=1).epoch == 1


class Built:
    """What a Change's build makes here: the arguments it got, and a key it read through the new store."""

    def __init__(self, store, rank, world, plane, epoch, parents):
        store.set(f"hello/{rank}", str(rank).encode())
        self.others = sorted(int(store.get(f"hello/{r}", 10.0)) for r in range(world))
        self.rank, self.world, self.plane, self.epoch, self.parents = rank, world, plane, epoch, parents
        self.finalized = False

    def finalize(self) -> None:
        self.finalized = True
        self.plane.close()


def test_a_shrink_needs_nothing_of_the_communicator_but_its_change() -> None:
    planes = make_planes(4, heartbeat=5.0)
    die(planes[2])
    survivors = [p for r, p in enumerate(planes) if r != 2]
    results: dict[int, object] = {}

    def shrink(plane) -> None:
        change = membership.Change(
            plane=plane,
            rank=plane.rank,
            world_size=4,
            epoch=3,
            timeout=20.0,
            revoke=plane.revoke,
            check_usable=lambda: None,
            joiners=membership.Joiners(),
            build=Built,
        )
        try:
            results[plane.rank] = membership.shrink(change, 20.0)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            results[plane.rank] = exc

    threads = [threading.Thread(target=shrink, args=(p,)) for p in survivors]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        for old_rank, new_rank in ((0, 0), (1, 1), (3, 2)):
            new = results[old_rank]
            assert isinstance(new, Built), new
            assert (new.rank, new.world, new.epoch, new.parents) == (new_rank, 3, 4, (0, 1, 3))
            assert new.others == [0, 1, 2] and not new.finalized
            assert new.plane.world == 3 and not new.plane.dead
    finally:
        for new in results.values():
            if isinstance(new, Built):
                new.finalize()
        close_all(survivors)
