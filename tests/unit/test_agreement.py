"""The fault plane's agreement and failure detector, with every rank's plane in this process (threads):
the outcomes every survivor must share, including a decider that dies after reaching only some ranks."""

from __future__ import annotations

import os
import secrets
import threading
import time

import pytest

from pycoll.errors import CollectiveTimeoutError, EvictedError
from pycoll.fault.listener import listener_for
from pycoll.fault.plane import Plane, form


def make_planes(n: int, heartbeat: float = 5.0) -> list[Plane]:
    listener = listener_for("127.0.0.1", "127.0.0.1", None)
    members = [{"address": listener.address, "host": "h", "pid": 0}] * n
    plane_id, token = secrets.token_hex(4), secrets.token_hex(8)
    planes: list[Plane | None] = [None] * n
    errors: list[BaseException] = []

    def one(r: int) -> None:
        try:
            planes[r] = form(listener, r, n, members, plane_id, token, heartbeat, time.monotonic() + 10)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not errors, errors
    return [p for p in planes if p is not None]


def die(plane: Plane) -> None:
    """As a SIGKILL would: every link closes at once, no goodbye, and nothing more is said (a real killed
    process says nothing; here its thread could still see its own links close)."""
    plane._leaving = True
    plane._closed = True
    plane._native.close(0.0)


def agree_all(planes: list[Plane], flags: list[bool], timeout: float = 10.0) -> list:
    out: list = [None] * len(planes)

    def one(i: int) -> None:
        try:
            out[i] = planes[i].agreements.agree(flags[i], {"i": i}, timeout)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(planes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out


def close_all(planes: list[Plane]) -> None:
    for p in planes:
        if not p._closed:
            p.close()


def test_and_of_flags_and_payloads_on_every_rank():
    planes = make_planes(4)
    try:
        first = agree_all(planes, [True] * 4)
        assert all(d.flag and not d.dead for d in first)
        assert all(d.payloads == {r: {"i": r} for r in range(4)} for d in first)
        second = agree_all(planes, [True, True, False, True])
        assert [d.flag for d in second] == [False] * 4
    finally:
        close_all(planes)


@pytest.mark.parametrize("victim", [0, 2])
def test_a_dead_rank_is_in_every_survivors_decision(victim):
    planes = make_planes(4)
    try:
        die(planes[victim])
        alive = [p for r, p in enumerate(planes) if r != victim]
        out = agree_all(alive, [True] * 3)
        assert all(d.flag and d.dead == frozenset({victim}) for d in out), out
        assert all(set(d.payloads) == set(range(4)) - {victim} for d in out)
    finally:
        close_all([p for r, p in enumerate(planes) if r != victim])


def test_a_decider_that_dies_after_reaching_one_rank_is_not_contradicted():
    """Rank 0 (the root) decides, its decision reaches rank 1 only (rank 1 accepts it), then rank 0 dies:
    rank 1 is the root now (once ranks 2 and 3 promised it) and every survivor ends with rank 0's decision,
    although rank 0 is now dead. Rank 0 dies only once rank 1 holds the decision: otherwise rank 1 may hear
    of the death (from rank 2 or 3) first, decide anew, and rightly ignore the lower ballot's decision."""
    planes = make_planes(4)
    p0 = planes[0]
    real = p0.send

    def partial(peer, msg):
        if msg.get("t") == "decide":
            if peer == 1:
                real(1, msg)
                deadline = time.monotonic() + 10
                while int(msg["k"]) not in planes[1].agreements.decided and time.monotonic() < deadline:
                    time.sleep(0.001)
            die(p0)
            return False
        return real(peer, msg)

    p0.send = partial  # type: ignore[method-assign]
    try:
        out = agree_all(planes, [True] * 4)
        decisions = [d for d in out[1:]]
        assert all(not isinstance(d, BaseException) for d in decisions), decisions
        assert len({(d.flag, d.dead, tuple(sorted(d.payloads))) for d in decisions}) == 1
        assert decisions[0].dead == frozenset()  # rank 0's decision, made while it was alive
        # The next agreement knows rank 0 is dead.
        again = agree_all(planes[1:], [True] * 3)
        assert all(getattr(d, "dead", None) == frozenset({0}) for d in again), again
    finally:
        close_all(planes[1:])


def test_a_silent_rank_is_evicted_and_learns_it_when_it_comes_back():
    planes = make_planes(3, heartbeat=0.5)
    stopped = planes[2]
    stopped._native._hold_for_testing(2.0)  # its links' thread and its sends stand still, as under SIGSTOP
    try:
        out = agree_all(planes[:2], [True, True])
        assert all(d.dead == frozenset({2}) for d in out)
        deadline = time.monotonic() + 5
        while stopped.evicted is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(EvictedError):
            stopped.raise_if_evicted()
    finally:
        close_all(planes)


def test_agreement_times_out_naming_the_rank_not_heard_from():
    planes = make_planes(3)
    try:
        out = agree_all(planes[:2], [True, True], timeout=0.5)
        assert all(isinstance(e, CollectiveTimeoutError) for e in out)
        assert "not heard from: 2" in str(out[0])
    finally:
        close_all(planes)


def test_a_member_slow_to_make_its_links_is_waited_for_until_the_formation_deadline():
    """Rank 1 dials rank 0 at once (rank 0's listener holds the hello); rank 0 makes its links 4 heartbeat
    timeouts later (a loaded machine, a large world). Rank 1's formation waits for rank 0's answer, within
    the deadline: both planes form, and neither finds the other dead."""
    listener = listener_for("127.0.0.1", "127.0.0.1", None)
    members = [{"address": listener.address, "host": "h", "pid": 0}] * 2
    plane_id, token, heartbeat = secrets.token_hex(4), secrets.token_hex(8), 0.5
    deadline = time.monotonic() + 10
    planes: list[Plane] = []

    def rank1() -> None:
        planes.append(form(listener, 1, 2, members, plane_id, token, heartbeat, deadline))

    dialler = threading.Thread(target=rank1)
    dialler.start()
    time.sleep(2.0)
    assert not planes, "rank 1's plane formed before rank 0 made its links"
    planes.append(form(listener, 0, 2, members, plane_id, token, heartbeat, deadline))
    dialler.join(10)
    try:
        assert len(planes) == 2
        time.sleep(1.5)
        assert all(p.dead == {} for p in planes), [p.dead for p in planes]
    finally:
        close_all(planes)


def test_a_member_that_never_makes_its_links_is_named_at_the_formation_deadline():
    listener = listener_for("127.0.0.1", "127.0.0.1", None)
    members = [{"address": listener.address, "host": "h", "pid": 0}] * 2
    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"rank\(s\) 0 did not connect"):
        form(listener, 1, 2, members, secrets.token_hex(4), secrets.token_hex(8), 0.5, started + 1.5)
    assert 1.4 < time.monotonic() - started < 5


def test_a_heartbeat_timeout_the_host_cannot_keep_is_refused_naming_the_smallest(monkeypatch):
    from pycoll.fault.plane import keepable_heartbeat_timeout

    assert keepable_heartbeat_timeout(4, 2) == 0.1
    assert keepable_heartbeat_timeout(64, 2) == pytest.approx(0.96)
    assert keepable_heartbeat_timeout(128, 16) == pytest.approx(0.24)
    import pycoll
    from pycoll.bootstrap import TCPStoreClient, TCPStoreServer
    from pycoll.errors import InvalidUsageError

    monkeypatch.setenv("PYCOLL_HEARTBEAT_TIMEOUT", "0.05")
    server = TCPStoreServer("127.0.0.1", 0)
    try:
        smallest = r"HEARTBEAT_TIMEOUT=0.05 s cannot be kept .* smallest it can keep is 0.10 s"
        with pytest.raises(InvalidUsageError, match=smallest):
            pycoll.init(store=TCPStoreClient("127.0.0.1", server.port, timeout=10), rank=0, world_size=1)
    finally:
        server.close()


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def test_sixteen_ranks_link_only_their_fingers_route_the_rest_and_agree_after_a_death():
    """16 planes in this process: each links its 7 fingers only (both ends of every link are here: 16 x 7
    sockets, against 16 x 15 for a full mesh); rank 13's store requests reach rank 0 (not a finger of it)
    routed; after rank 5 dies every survivor's agreement names it."""
    from pycoll.fault import overlay
    from pycoll.fault.kvstore import PlaneStore

    listener_for("127.0.0.1", "127.0.0.1", None)  # the process's listener, there before the count
    before = _sockets()
    planes = make_planes(16)
    try:
        assert all(sorted(p._linked) == overlay.fingers(p.rank, 16) for p in planes)
        assert _sockets() - before == 16 * 7
        assert 0 not in planes[13]._linked
        store = PlaneStore(planes[13], 10.0)
        store.set("k", b"routed")
        assert PlaneStore(planes[0], 10.0).get("k") == b"routed"
        assert store.add("n", 3) == 3
        die(planes[5])
        alive = [p for p in planes if p.rank != 5]
        out = agree_all(alive, [True] * 15)
        assert all(not isinstance(d, BaseException) and d.dead == frozenset({5}) for d in out), out
        assert all(set(d.payloads) == set(range(16)) - {5} for d in out)
    finally:
        close_all([p for p in planes if p.rank != 5])
