"""A communicator's fault plane: small TCP connections beside the data transport, O(log world) of them
per rank, with a failure detector, revocation, eviction, and the messages agreement and membership changes
need.

The parts, named once and used by these names below:

- **members**: ranks 0..world-1 of this plane, each with its control ``address``, ``host`` and ``pid``.
- **links**: the connections between this rank and its *fingers* (pycoll/fault/overlay.py: the members
  at ring distance 2^j either way), native (``_C.ControlLinks``, csrc/fault/links.h): formed (every dial
  at once), read, written and watched by a native I/O thread that never needs the GIL; this module reads
  the *events* it makes (a frame, a link closed, a link silent).
- **route**: a message for a member that is not a finger travels as ``via`` from finger to finger
  (overlay.next_hop), each hop at least halving the ring distance.
- **detector**: a finger is *dead* once its link closes (the kernel closes a killed process's sockets at
  once: *confirmed*), once it was silent for ``heartbeat_timeout`` seconds (stopped, hung, cut off:
  *suspected*), or once a member reports it dead. The links' thread sends a heartbeat on every link that
  sent nothing for a fifth of the timeout, so a member is silent only when its process (or host) stops:
  never because its Python is busy (a long C call that holds the GIL, a pickling of a checkpoint), which
  holds up this module's thread, not the links'. A member found dead by silence may still be alive: it is
  *evicted* (sent ``evict`` before its link is closed; a member that hears itself reported dead takes it
  as its eviction), so "dead" is final and the same on every member eventually. A member that sends
  ``bye`` (finalize) has *left*: not a failure. When this process itself was stopped (the links' thread
  saw a gap longer than half the timeout), silence is not counted for that gap.
- **flood**: what every member must learn (a death: ``lost``; a goodbye: ``left``; ``revoke``; ``note``)
  is sent to every finger, and each member that learns it first sends it on to its own fingers: every
  member learns it within the fingers' diameter, O(log world) hops, at one message per finger and member.
- **revoke**: local, idempotent, flooded. Revoking or finding a member dead calls the plane's *listeners*
  (the communicator aborts its native transport with them, so every pending and later collective raises).
- **epoch**: a plane's id names its communicator and epoch; a link is accepted only with the plane's
  token, so a process from an older epoch can never reach a newer plane (fencing).

Agreement (pycoll/fault/agreement.py) and the plane's key-value store (pycoll/fault/kvstore.py) run on
the messages the plane hands them, under the plane's lock; the plane's thread never blocks on them.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Protocol

from pycoll import _C
from pycoll.errors import CollectiveTimeoutError, EvictedError, InvalidUsageError, PeerLostError, ranks_text
from pycoll.fault import overlay, wire
from pycoll.fault.agreement import Agreements
from pycoll.fault.kvstore import KvServer
from pycoll.fault.listener import ControlListener

log = logging.getLogger("pycoll")

#: Messages of kinds no handler was set for yet that a plane keeps (a quicker peer's, while this rank sets
#: its handlers up); past this many, they are dropped.
_UNCLAIMED_MAX = 4096
#: Routed messages a rank remembers having flooded (so that it floods each once).
_FLOODED_MAX = 4096
#: How long leaving the plane waits for its goodbyes to be written.
_FLUSH_S = 2.0
#: Forming a plane looks whether a member it waits for is gone this often (seconds).
_FORM_SLICE_S = 0.25
#: What the links' send answers (csrc/fault/links.h ControlLinks::SendResult).
_SENT, _GONE, _BACKED_UP = 0, 1, 2

Listener = Callable[[str, int, str], None]  # (kind: "dead" | "revoked" | "evicted", rank, why)


class Links(Protocol):
    """What a plane asks of its links: ``_C.ControlLinks``, or the simulation's
    (pycoll/testing/fault_sim.py)."""

    def send(self, peer: int, body: bytes) -> int: ...
    def drop(self, peer: int) -> None: ...
    def take(self, timeout_s: float) -> list[tuple[int, str, bytes]]: ...
    def settle(self) -> int: ...
    def close(self, flush_s: float) -> None: ...


class Plane:
    """One rank's end of a formed fault plane (``form`` makes one)."""

    def __init__(
        self,
        rank: int,
        world: int,
        plane_id: str,
        token: str,
        links: Links,
        members: list[dict[str, Any]],
        listener: ControlListener | None,
        heartbeat_timeout: float,
        *,
        thread: bool = True,
    ) -> None:
        self.rank, self.world, self.id, self.token = rank, world, plane_id, token
        self.members = members
        self._listener = listener
        self.heartbeat_timeout = heartbeat_timeout
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)
        self._native = links  # _C.ControlLinks (formed), or the simulation's
        self.fingers = overlay.fingers(rank, world)
        self._linked = set(self.fingers)  # fingers whose link this rank has not dropped
        self._handled = 0  # the links' events this plane's thread has handled (settle)
        #: Dead members and why (final), in the order they were found dead.
        self.dead: dict[int, str] = {}
        #: The dead members whose death is certain (their links closed: the process is gone), as opposed
        #: to suspected (silent: stopped, or cut off by a partition). Agreement's quorum counts these out.
        self.confirmed: set[int] = set()
        #: Members that left cleanly (finalize).
        self.left: set[int] = set()
        self.revoked: str | None = None
        #: The error that made the revoking rank revoke, where it is one every rank should raise (a
        #: mismatched call): the revocation must not hide it on ranks that never saw it themselves.
        self.revoked_cause: str | None = None
        self.evicted: str | None = None
        #: Facts any member may add and every member learns (e.g. "this joiner went away").
        self.notes: set[str] = set()
        self._listeners: list[Listener] = []
        self._handlers: dict[str, Callable[[int, dict[str, Any]], None]] = {}
        self._unclaimed: list[tuple[int, dict[str, Any]]] = []  # messages of kinds no handler took yet
        self._routed = 0  # messages this rank routed (their ids)
        self._flooded: dict[tuple[int, int], None] = {}  # routed messages this rank flooded, oldest first
        self.agreements = Agreements(self)
        self.kv = KvServer(self)
        self._closed = False
        self._leaving = False
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._loop, name=f"pycoll-control-{rank}", daemon=True)
            self._thread.start()
            _open.add(self)

    # ---- what the rest of pycoll asks --------------------------------------------------------------
    @property
    def listener(self) -> ControlListener:
        """The process's control listener this plane's links came through (a simulated plane has none)."""
        if self._listener is None:
            raise InvalidUsageError(f"plane {self.id} has no control listener (it is simulated)")
        return self._listener

    def add_listener(self, fn: Listener) -> None:
        with self.lock:
            self._listeners.append(fn)
            pending = [("dead", r, why) for r, why in self.dead.items()]
            if self.revoked is not None:
                pending.append(("revoked", -1, self.revoked))
        for kind, r, why in pending:
            fn(kind, r, why)

    def on(self, kind: str, handler: Callable[[int, dict[str, Any]], None]) -> None:
        """Hands every message ``{"t": kind, ...}`` to ``handler(peer, msg)``: a kind of a user of the plane
        (the torch backend's receive from any source and monitored barrier), not one of the plane's own. The
        handler runs on the plane's thread with ``lock`` held (``cv`` to wake waiters): it must not block.
        Messages of ``kind`` that came before (a peer that was quicker to set up) are handed to it now, in
        the caller's thread, with ``lock`` held too."""
        with self.lock:
            self._handlers[kind] = handler
            early = [(peer, msg) for peer, msg in self._unclaimed if msg.get("t") == kind]
            self._unclaimed = [(peer, msg) for peer, msg in self._unclaimed if msg.get("t") != kind]
            for peer, msg in early:
                handler(peer, msg)

    def live(self) -> list[int]:
        """Members neither dead nor left, this rank included, in rank order."""
        with self.lock:
            return [r for r in range(self.world) if r not in self.dead and r not in self.left]

    def send(self, peer: int, msg: dict[str, Any]) -> bool:
        """Sends to one member, over its link or routed over fingers; False if it is dead or left, or no
        finger leads on (a link that is gone says why: a ``closed`` event this plane's thread handles), or
        if it reads nothing of what it is sent (it is found dead here)."""
        if peer == self.rank or peer in self.dead or peer in self.left or not 0 <= peer < self.world:
            return False
        if peer in self._linked:
            return self._send_body(peer, wire.body(msg))
        self._routed += 1
        env = {"t": "via", "to": peer, "from": self.rank, "id": self._routed,
               "h": overlay.hops_bound(self.world), "m": msg}  # fmt: skip
        return self._route(env, self.rank)

    def _route(self, env: dict[str, Any], came_from: int) -> bool:
        """One hop of a routed message: to the live finger closest to its destination, or, when none is
        closer than this member, flooded (``f``) to every live finger but the one it came from (once per
        message: ``_flooded``)."""
        dest = int(env["to"])
        with self.lock:
            usable = {r for r in self._linked if r not in self.dead and r not in self.left}
        body = wire.body(env)
        if dest in usable:
            if self._send_body(dest, body):
                return True
            usable.discard(dest)
        if not env.get("f"):
            while usable:
                hop = overlay.next_hop(self.rank, dest, self.world, usable)
                if hop is None:
                    break
                if self._send_body(hop, body):
                    return True
                usable.discard(hop)
            env = {**env, "f": 1}
        key = (int(env["from"]), int(env["id"]))
        if key in self._flooded:
            return False
        self._flooded[key] = None
        while len(self._flooded) > _FLOODED_MAX:
            del self._flooded[next(iter(self._flooded))]
        body = wire.body(env)
        return any([self._send_body(r, body) for r in sorted(usable) if r != came_from])

    def flood(self, msg: dict[str, Any], skip: tuple[int, ...] = ()) -> None:
        """Sends ``msg`` to every live finger but ``skip`` (a member that learns a flooded fact first sends
        it on the same way)."""
        body = wire.body(msg)
        with self.lock:
            targets = sorted(self._linked)
        for r in targets:
            if r not in skip and r not in self.dead and r not in self.left:
                self._send_body(r, body)

    def _send_body(self, peer: int, body: bytes) -> bool:
        status = self._native.send(peer, body)
        if status == _BACKED_UP:
            self.found_dead(peer, "it reads nothing of what it is sent (its control link is backed up)")
        return status == _SENT

    def raise_if_evicted(self) -> None:
        if self.evicted is not None:
            raise EvictedError(
                f"rank {self.rank} was evicted from its communicator ({self.evicted}); the other ranks "
                "went on without it. Start a new process (pycoll.init(join=...)) to take part again"
            )

    def settle(self, timeout: float = 0.2) -> None:
        """Returns once the plane's thread has handled what already arrived (so that an ``evict`` waiting in
        a link is seen before an error is reported), or after ``timeout``."""
        if self._thread is None or threading.current_thread() is self._thread or self._closed:
            return
        target = self._native.settle()
        deadline = time.monotonic() + timeout
        with self.cv:
            while self._handled < target and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cv.wait(left)

    # ---- failures ----------------------------------------------------------------------------------
    def found_dead(
        self, peer: int, why: str, *, tell: bool = True, confirmed: bool = False, by: int | None = None,
        skip: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        """Marks ``peer`` dead (once): evicts it, floods the news (``by``: the member that found it, when
        not this one; ``skip``: who sent the news here), calls the listeners. ``confirmed``: its process is
        certainly gone (its link closed), not only silent."""
        with self.cv:
            if peer == self.rank or peer in self.left or not 0 <= peer < self.world:
                return
            if peer in self.dead:
                if confirmed:
                    self.confirmed.add(peer)
                return
            if self._leaving or self.evicted is not None:
                # This rank said goodbye (its peers closing their links is no failure), or was evicted
                # (the others went on without it: what it now sees must not evict them in turn).
                self._drop(peer)
                return
            self.dead[peer] = why
            if confirmed:
                self.confirmed.add(peer)
            linked = peer in self._linked
            self.cv.notify_all()
        log.warning("pycoll: rank %d of plane %s: rank %d is lost (%s)", self.rank, self.id, peer, why)
        if linked:
            evict = {"t": "evict", "why": f"rank {self.rank} found it lost: {why}"}
            self._native.send(peer, wire.body(evict))
            self._drop(peer)  # once the eviction is written (at most 0.2 s)
        if tell:
            found_by = self.rank if by is None else by
            self.flood({"t": "lost", "rank": peer, "why": why, "by": found_by, "c": confirmed}, skip)
        self._notify("dead", peer, why)
        with self.cv:
            self.agreements.changed()

    def revoke(self, why: str, cause: str | None = None) -> None:
        """Revokes the communicator on every member (idempotent, any thread). ``cause``: the message of a
        mismatched call that made this rank revoke, which every member then raises (``revoked_cause``)."""
        with self.cv:
            if self.revoked is not None:
                return
            self.revoked = why
            self.revoked_cause = cause
            self.cv.notify_all()
        self.flood({"t": "revoke", "why": why} | ({} if cause is None else {"cause": cause}))
        self._notify("revoked", -1, why)

    def note(self, fact: str) -> None:
        """Adds ``fact`` to ``notes`` here and on every member."""
        with self.cv:
            if fact in self.notes:
                return
            self.notes.add(fact)
            self.cv.notify_all()
        self.flood({"t": "note", "v": fact})

    def _leaves(self, peer: int, last: Any, skip: tuple[int, ...] = ()) -> None:
        """``peer`` left (its goodbye, or the news of it): final, and flooded. ``last``: the latest decision
        it held (``Agreements.last``), which a member still waiting for that agreement takes before the
        leaver's absence moves the tree."""
        with self.cv:
            if peer == self.rank or peer in self.left or peer in self.dead or not 0 <= peer < self.world:
                return
            if last:
                self.agreements.from_leaver(last)
            self.left.add(peer)
            self.agreements.changed()
            self.cv.notify_all()
        if not self._leaving:
            self.flood({"t": "left", "rank": peer, "last": last}, skip)

    def _goodbye(self) -> dict[str, Any]:
        with self.lock:
            return {"t": "bye", "last": self.agreements.last()}

    def _notify(self, kind: str, rank: int, why: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(kind, rank, why)
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the detector
                log.debug("fault-plane listener failed", exc_info=True)

    # ---- the plane's thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            for peer, kind, data in self._native.take(5.0):  # the GIL is released while it waits
                self.on_event(peer, kind, data)
                with self.cv:
                    self._handled += 1
                    self.cv.notify_all()

    def on_event(self, peer: int, kind: str, data: bytes) -> None:
        """One event of the links: a frame from ``peer`` ('f'), its link closed ('c') or silent ('s')."""
        if kind == "f":
            try:
                msg = json.loads(data)
                if not isinstance(msg, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                self.found_dead(peer, f"it sent a malformed control frame ({exc})")
            else:
                try:
                    self._handle(peer, msg)
                except (KeyError, TypeError, ValueError) as exc:  # a member's malformed message
                    log.warning("pycoll: rank %d ignored a malformed %r message from rank %d (%s)", self.rank,
                                msg.get("t"), peer, exc)  # fmt: skip
        elif kind == "c":
            self._drop(peer)
            if peer not in self.left:
                self.found_dead(peer, data.decode(errors="replace"), confirmed=True)
        elif kind == "s":
            self.found_dead(peer, f"it was silent for {data.decode()} s (stopped, hung or cut off)")

    def _handle(self, peer: int, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "via":
            if int(msg["to"]) == self.rank:
                self._handle(int(msg["from"]), msg["m"])
            elif int(msg["h"]) > 1:
                self._route({**msg, "h": int(msg["h"]) - 1}, peer)
            return
        if kind == "bye":
            self._leaves(peer, msg.get("last"), (peer,))
            self._drop(peer)
            return
        if kind == "left":
            self._leaves(int(msg["rank"]), msg.get("last"), (peer,))
            return
        if kind == "lost":
            r, by = int(msg["rank"]), int(msg.get("by", peer))
            if r == self.rank:  # this rank, reported dead: it was evicted, and the others go on without it
                self.evict_self(f"rank {by} found it lost: {msg.get('why')}")
                return
            why = f"{msg.get('why')}, reported by rank {by}"
            self.found_dead(r, why, confirmed=bool(msg.get("c")), by=by, skip=(peer,))
            return
        if kind == "revoke":
            cause = msg.get("cause")
            self.revoke(str(msg.get("why")), None if cause is None else str(cause))
            return
        if kind == "note":
            with self.cv:
                self.notes.add(str(msg.get("v")))
                self.cv.notify_all()
            return
        if kind == "evict":
            self.evict_self(str(msg.get("why")))
            return
        with self.cv:
            if kind in wire.AGREEMENT_KINDS:
                self.agreements.on_message(peer, msg)
            elif kind in ("kv", "kvr"):
                self.kv.on_message(peer, msg)
            elif kind in self._handlers:
                self._handlers[kind](peer, msg)  # a malformed message is logged by on_event
            elif len(self._unclaimed) < _UNCLAIMED_MAX:  # for a handler not set yet (set up after the plane)
                self._unclaimed.append((peer, msg))

    def evict_self(self, why: str) -> None:
        """This rank was evicted (found dead by the others, or cut off from the larger side): it revokes."""
        with self.cv:
            if self.evicted is not None or self._leaving:
                return
            self.evicted = why
            self.cv.notify_all()
        self._notify("evicted", self.rank, why)
        self.revoke(f"rank {self.rank} was evicted")

    def _drop(self, peer: int) -> None:
        with self.lock:
            if peer not in self._linked:
                return
            self._linked.discard(peer)
        self._native.drop(peer)

    # ---- teardown ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Leaves the plane: tells the members (``bye``, so leaving is not a failure) and closes."""
        if self._closed:
            return
        _open.discard(self)
        self._leaving = True  # from here on, links that close are the members answering the goodbye
        self.flood(self._goodbye())
        self._closed = True
        self._native.close(_FLUSH_S)
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        with self.cv:
            self._linked.clear()
            self.cv.notify_all()


# Planes not closed yet. A process that exits without finalizing a communicator (after its last
# collective) says goodbye at exit, so that its peers see it leave, not die: a death would abort a
# collective they may still be finishing with data it already sent.
_open: weakref.WeakSet[Plane] = weakref.WeakSet()


@atexit.register
def _leave_all() -> None:
    for plane in list(_open):
        plane._leaving = True
        plane.flood(plane._goodbye())
        plane._closed = True
        plane._native.close(_FLUSH_S)


def keepable_heartbeat_timeout(local_ranks: int, cores: int) -> float:
    """The smallest heartbeat timeout a plane can keep with ``local_ranks`` ranks on a host of ``cores``
    cores. A rank's links' thread must run every tenth of the timeout (it checks its links' silence, and
    forgives silence it did not see itself); the ranks of a host share its cores, and Linux's scheduler lets
    a runnable thread wait about a 3 ms slice per thread ahead of it on its core: 30 ms per rank sharing a
    core (a tenth of the timeout), never under 0.1 s."""
    return max(0.1, 0.03 * math.ceil(local_ranks / max(1, cores)))


def check_heartbeat_timeout(timeout_s: float, local_ranks: int) -> None:
    """Refuses a heartbeat timeout this host's ranks cannot keep (``keepable_heartbeat_timeout``)."""
    cores = len(os.sched_getaffinity(0))
    least = keepable_heartbeat_timeout(local_ranks, cores)
    if timeout_s < least:
        raise InvalidUsageError(
            f"PYCOLL_HEARTBEAT_TIMEOUT={timeout_s:g} s cannot be kept by {local_ranks} ranks on this host's "
            f"{cores} core(s): each rank's liveness thread must run every tenth of the timeout, and "
            f"{math.ceil(local_ranks / cores)} ranks share a core; the smallest it can keep is {least:.2f} s"
        )


def form(
    listener: ControlListener,
    rank: int,
    world: int,
    members: list[dict[str, Any]],
    plane_id: str,
    token: str,
    heartbeat_timeout: float,
    deadline: float,
    gone: Callable[[int], str | None] = lambda r: None,
) -> Plane:
    """Forms the plane: every finger below ``rank`` is dialled at once, and those above dial in (native:
    ``_C.ControlLinks``); then a first agreement, which every member enters once its own links are up, so
    that no member's plane is formed unless every member's is (a member that fails tells its fingers who
    it found lost, and the agreement names them everywhere). ``gone(r)`` says why member r will never come
    (known dead), or None."""
    addresses = [str(m["address"]) for m in members]
    fingers = overlay.fingers(rank, world)
    # A member this rank dials may answer (make its own links) until the formation's deadline.
    answer_s = max(0.0, deadline - time.monotonic())
    links = _C.ControlLinks(
        listener.native, rank, world, plane_id, token, heartbeat_timeout, addresses,
        answer_timeout_s=answer_s, peers=fingers,
    )  # fmt: skip
    try:
        _wait_formed(links, rank, plane_id, deadline, gone)
    except PeerLostError as exc:
        if exc.rank >= 0:  # the fingers that formed learn whom this rank found lost before its links close
            lost = wire.body({"t": "lost", "rank": exc.rank, "why": str(exc), "by": rank, "c": True})
            for r in fingers:
                links.send(r, lost)
        links.close(_FORM_SLICE_S)
        listener.forget(plane_id)
        raise
    except BaseException:
        links.close(0.0)
        listener.forget(plane_id)
        raise
    plane = Plane(rank, world, plane_id, token, links, members, listener, heartbeat_timeout)
    try:
        decision = plane.agreements.agree(True, None, max(0.1, deadline - time.monotonic()))
        if decision.dead:
            with plane.lock:
                r = next((x for x in plane.dead if x in decision.dead), min(decision.dead))
                why = plane.dead.get(r, "found dead by the other ranks")
            raise PeerLostError(f"rank {r} of the new communicator was lost while it formed: {why}", rank=r)
    except BaseException:
        plane._leaving = True
        plane._closed = True
        links.close(0.0)
        listener.forget(plane_id)
        raise
    return plane


def _wait_formed(
    links: _C.ControlLinks, rank: int, plane_id: str, deadline: float, gone: Callable[[int], str | None]
) -> None:
    while True:
        left = deadline - time.monotonic()
        # Returns as soon as every link is up; between slices, whether a member is gone. The GIL is
        # released while it waits.
        missing = links.wait_formed(max(0.0, min(left, _FORM_SLICE_S)))
        for r, failure in links.failures():
            raise PeerLostError(f"rank {r} of the new communicator cannot be reached: {failure}", rank=r)
        if not missing:
            return
        for r in missing:
            why = gone(r)
            if why is not None:
                raise PeerLostError(f"rank {r} did not join the fault plane: {why}", rank=r)
        if left <= 0:
            raise CollectiveTimeoutError(
                f"rank(s) {ranks_text(missing)} did not connect their fault plane to rank {rank} in time "
                f"(plane {plane_id})"
            )
