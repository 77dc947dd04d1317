"""A communicator's fault plane: a full mesh of small TCP connections beside the data transport, with
a failure detector, revocation, eviction, and the messages agreement and membership changes need.

The parts, named once and used by these names below:

- **members**: ranks 0..world-1 of this plane, each with its control ``address``, ``host`` and ``pid``.
- **links**: the connections between this rank and the members, native (``_C.ControlLinks``,
  csrc/fault/links.h): formed (every dial at once), read, written and watched by a native I/O thread that
  never needs the GIL; this module reads the *events* it makes (a frame, a link closed, a link silent).
- **detector**: a member is *dead* once its link closes (the kernel closes a killed process's sockets at
  once), once it was silent for ``heartbeat_timeout`` seconds (stopped, hung, cut off), or once another
  member reports it dead. The links' thread sends a heartbeat on every link that sent nothing for a fifth
  of the timeout, so a member is silent only when its process (or host) stops: never because its Python
  is busy (a long C call that holds the GIL, a pickling of a checkpoint), which holds up this module's
  thread, not the links'. A member found dead by silence may still be alive: it is *evicted* (sent
  ``evict`` before its link is closed), so "dead" is final and the same on every member eventually. A
  member that sends ``bye`` (finalize) has *left*: not a failure. When this process itself was stopped
  (the links' thread saw a gap longer than half the timeout), silence is not counted for that gap.
- **revoke**: local, idempotent; broadcast to every live member, who revoke too. Revoking or finding a
  member dead calls the plane's *listeners* (the communicator aborts its native transport with them, so
  every pending and later collective raises).
- **epoch**: a plane's id names its communicator and epoch; a link is accepted only with the plane's
  token, so a process from an older epoch can never reach a newer plane (fencing).

Agreement (pycoll/fault/agreement.py) and the plane's key-value store (pycoll/fault/kvstore.py) run on
the messages the plane hands them, under the plane's lock; the plane's thread never blocks on them.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import weakref
from typing import Any, Callable

from pycoll import _C
from pycoll.errors import CollectiveTimeoutError, EvictedError, PeerLostError, ranks_text
from pycoll.fault import wire
from pycoll.fault.agreement import Agreements
from pycoll.fault.kvstore import KvServer
from pycoll.fault.listener import ControlListener

log = logging.getLogger("pycoll")

#: Messages of kinds no handler was set for yet that a plane keeps (a quicker peer's, while this rank sets
#: its handlers up); past this many, they are dropped.
_UNCLAIMED_MAX = 4096
#: How long leaving the plane waits for its goodbyes to be written.
_FLUSH_S = 2.0
#: Forming a plane looks whether a member it waits for is gone this often (seconds).
_FORM_SLICE_S = 0.25
#: What the links' send answers (csrc/fault/links.h ControlLinks::SendResult).
_SENT, _GONE, _BACKED_UP = 0, 1, 2

Listener = Callable[[str, int, str], None]  # (kind: "dead" | "revoked" | "evicted", rank, why)


class Plane:
    """One rank's end of a formed fault plane (``form`` makes one)."""

    def __init__(
        self,
        rank: int,
        world: int,
        plane_id: str,
        token: str,
        links: _C.ControlLinks,
        members: list[dict[str, Any]],
        listener: ControlListener,
        heartbeat_timeout: float,
    ) -> None:
        self.rank, self.world, self.id, self.token = rank, world, plane_id, token
        self.members = members
        self.listener = listener
        self.heartbeat_timeout = heartbeat_timeout
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)
        self._native = links  # _C.ControlLinks, formed
        self._linked = set(range(world)) - {rank}  # members whose link this rank has not dropped
        self._handled = 0  # the links' events this plane's thread has handled (settle)
        #: Dead members and why (final), in the order they were found dead.
        self.dead: dict[int, str] = {}
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
        self.agreements = Agreements(self)
        self.kv = KvServer(self)
        self._closed = False
        self._leaving = False
        self._thread = threading.Thread(target=self._loop, name=f"pycoll-control-{rank}", daemon=True)
        self._thread.start()
        _open.add(self)

    # ---- what the rest of pycoll asks --------------------------------------------------------------
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
        """Sends to one member; False if its link is gone (the links' thread says why: a ``closed`` event
        this plane's thread handles), or if it reads nothing of what it is sent (it is found dead here)."""
        if peer not in self._linked or peer in self.dead or peer in self.left:
            return False
        return self._send_body(peer, wire.body(msg))

    def broadcast(self, msg: dict[str, Any], skip: tuple[int, ...] = ()) -> None:
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
        if threading.current_thread() is self._thread or self._closed:
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
    def found_dead(self, peer: int, why: str, *, tell: bool = True) -> None:
        """Marks ``peer`` dead (once): evicts it, tells the other members, calls the listeners."""
        with self.cv:
            if peer == self.rank or peer in self.dead or peer in self.left or not 0 <= peer < self.world:
                return
            if self._leaving or self.evicted is not None:
                # This rank said goodbye (its peers closing their links is no failure), or was evicted
                # (the others went on without it: what it now sees must not evict them in turn).
                self._drop(peer)
                return
            self.dead[peer] = why
            linked = peer in self._linked
            self.cv.notify_all()
        log.warning("pycoll: rank %d of plane %s: rank %d is lost (%s)", self.rank, self.id, peer, why)
        if linked:
            evict = {"t": "evict", "why": f"rank {self.rank} found it lost: {why}"}
            self._native.send(peer, wire.body(evict))
            self._drop(peer)  # once the eviction is written (at most 0.2 s)
        if tell:
            self.broadcast({"t": "lost", "rank": peer, "why": why})
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
        self.broadcast({"t": "revoke", "why": why} | ({} if cause is None else {"cause": cause}))
        self._notify("revoked", -1, why)

    def note(self, fact: str) -> None:
        """Adds ``fact`` to ``notes`` here and on every member."""
        with self.cv:
            if fact in self.notes:
                return
            self.notes.add(fact)
            self.cv.notify_all()
        self.broadcast({"t": "note", "v": fact})

    def _notify(self, kind: str, rank: int, why: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(kind, rank, why)
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the detector
                log.debug("fault-plane listener failed", exc_info=True)

    # ---- the plane's thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            for peer, kind, data in self._native.take(1.0):  # the GIL is released while it waits
                if kind == "f":
                    try:
                        msg = json.loads(data)
                        if not isinstance(msg, dict):
                            raise ValueError("not a JSON object")
                    except ValueError as exc:
                        self.found_dead(peer, f"it sent a malformed control frame ({exc})")
                    else:
                        self._handle(peer, msg)
                elif kind == "c":
                    self._drop(peer)
                    if peer not in self.left:
                        self.found_dead(peer, data.decode(errors="replace"))
                elif kind == "s":
                    self.found_dead(peer, f"it was silent for {data.decode()} s (stopped or hung)")
                with self.cv:
                    self._handled += 1
                    self.cv.notify_all()

    def _handle(self, peer: int, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "bye":
            with self.cv:
                self.left.add(peer)
                self.agreements.changed()
                self.cv.notify_all()
            self._drop(peer)
            return
        if kind == "lost":
            self.found_dead(int(msg["rank"]), f"{msg.get('why')}, reported by rank {peer}")
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
            with self.cv:
                self.evicted = str(msg.get("why"))
                self.cv.notify_all()
            self._notify("evicted", self.rank, self.evicted)
            self.revoke(f"rank {self.rank} was evicted")
            return
        with self.cv:
            if kind in wire.AGREEMENT_KINDS:
                self.agreements.on_message(peer, msg)
            elif kind in ("kv", "kvr"):
                self.kv.on_message(peer, msg)
            elif kind in self._handlers:
                try:
                    self._handlers[kind](peer, msg)
                except (KeyError, TypeError, ValueError) as exc:  # a malformed message: not this thread's end
                    log.warning("pycoll: rank %d ignored a malformed %r message from rank %d (%s)", self.rank,
                                kind, peer, exc)  # fmt: skip
            elif len(self._unclaimed) < _UNCLAIMED_MAX:  # for a handler not set yet (set up after the plane)
                self._unclaimed.append((peer, msg))

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
        self.broadcast({"t": "bye"})
        self._closed = True
        self._native.close(_FLUSH_S)
        if threading.current_thread() is not self._thread:
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
        plane.broadcast({"t": "bye"})
        plane._closed = True
        plane._native.close(_FLUSH_S)


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
    """Forms the mesh: every member below ``rank`` is dialled at once, and those above dial in (native:
    ``_C.ControlLinks``). ``gone(r)`` says why member r will never come (known dead), or None."""
    addresses = [str(m["address"]) for m in members]
    # A member this rank dials may answer (make its own links) until the formation's deadline.
    answer_s = max(0.0, deadline - time.monotonic())
    links = _C.ControlLinks(
        listener.native, rank, world, plane_id, token, heartbeat_timeout, addresses, answer_timeout_s=answer_s
    )
    try:
        while True:
            left = deadline - time.monotonic()
            # Returns as soon as every link is up; between slices, whether a member is gone. The GIL is
            # released while it waits.
            missing = links.wait_formed(max(0.0, min(left, _FORM_SLICE_S)))
            for r, failure in links.failures():
                raise PeerLostError(f"rank {r} of the new communicator cannot be reached: {failure}", rank=r)
            if not missing:
                return Plane(rank, world, plane_id, token, links, members, listener, heartbeat_timeout)
            for r in missing:
                why = gone(r)
                if why is not None:
                    raise PeerLostError(f"rank {r} did not join the fault plane: {why}", rank=r)
            if left <= 0:
                raise CollectiveTimeoutError(
                    f"rank(s) {ranks_text(missing)} did not connect their fault plane to rank {rank} in time "
                    f"(plane {plane_id})"
                )
    except BaseException:
        links.close(0.0)
        listener.forget(plane_id)
        raise
