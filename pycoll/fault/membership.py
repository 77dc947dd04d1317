"""Membership changes of a communicator: the plane formed at start-up, shrink (the survivors go on after
a loss), grow (processes that asked to join get the next ranks), and the joining process's side.

The parts, named once:

- **old** / **new**: the communicator the change starts from and the one it makes (epoch + 1).
- **decision**: an agreement on old's plane (pycoll/fault/agreement.py): for a shrink, who is dead; for a
  grow, which joiners every member holds. It carries a random **nonce** the deciding root drew; the new
  plane's token is a hash of it, so a process left out of the decision cannot reach the new plane.
- **change**: what a change needs of old (``Change``: its plane, rank, size and epoch, how to revoke it,
  its joiners) and the way to build new (``Change.build``), which the communicator hands in: this module
  never sees a Communicator.
- **build**: forming new's plane, then new itself (``Change.build``: its shared memory and TCP links, set
  up through the new plane's store, pycoll/fault/kvstore.py, not the job's rendezvous store, which may
  have died with rank 0).
- **commit**: a second agreement on old's plane on whether every survivor's build succeeded (and no one
  was lost meanwhile). Committed: new is returned and old is finalized. Not committed: new is dropped;
  a shrink tries again with what it has learned, a grow raises and old stays usable (atomic).
- **joiner**: a process that dialled a member's control socket with ``join``; that member, its
  **holder**, tells it its rank and the new plane (``assign``), then ``commit`` or ``abort``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, TypeVar

from pycoll.errors import (
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    InvalidUsageError,
    PeerLostError,
    PycollError,
)
from pycoll.fault import wire
from pycoll.fault.agreement import Decision
from pycoll.fault.kvstore import PlaneStore
from pycoll.fault.listener import ControlListener, dial, listener_for
from pycoll.fault.plane import Plane, form

if TYPE_CHECKING:
    from pycoll.bootstrap import Store
    from pycoll.env import Settings

log = logging.getLogger("pycoll")


class Member(Protocol):
    """What this module asks of the communicator a change builds: that it can be finalized."""

    def finalize(self) -> None: ...


M = TypeVar("M", bound=Member)


@dataclass(frozen=True)
class Change(Generic[M]):
    """What a membership change needs of the communicator it starts from (old), and the way to build the
    next one (new)."""

    plane: Plane
    rank: int
    world_size: int
    epoch: int
    #: old's deadline of set-up and collectives (a joiner's new communicator takes it too).
    timeout: float
    revoke: Callable[[str], None]
    check_usable: Callable[[], None]
    joiners: Joiners
    #: new, formed over its plane and that plane's store: build(store, rank, world, plane, epoch, parents).
    build: Callable[[Store, int, int, Plane, int, tuple[int, ...]], M]


def member_info(listener: ControlListener, host: str) -> dict[str, Any]:
    """What a plane's members know of one another: its control address, host and pid."""
    return {"address": listener.address, "host": host, "pid": os.getpid()}


def _new_plane_id(plane: Plane, decision: Decision, epoch: int) -> tuple[str, str]:
    nonces = decision.nonce + "/" + ",".join(map(str, sorted(decision.payloads)))
    base = plane.id.split("/")[0]
    token = hashlib.sha256(f"{plane.token}/{epoch}/{nonces}".encode()).hexdigest()[:32]
    return f"{base}/e{epoch}.{hashlib.sha256(nonces.encode()).hexdigest()[:8]}", token


def _build(
    old: Change[M],
    members: list[dict[str, Any]],
    rank: int,
    plane_id: str,
    token: str,
    parent_ranks: tuple[int, ...],
    deadline: float,
    gone: Any,
) -> M:
    plane = form(
        old.plane.listener,
        rank,
        len(members),
        members,
        plane_id,
        token,
        old.plane.heartbeat_timeout,
        deadline,
        gone,
    )
    try:
        store = PlaneStore(plane, max(0.1, deadline - time.monotonic()))
        return old.build(store, rank, len(members), plane, old.epoch + 1, parent_ranks)
    except BaseException:
        plane.close()
        raise


def _any_dead(plane: Plane, members: tuple[int, ...]) -> str | None:
    """Why an attempt with these members (old ranks) cannot succeed: one of them is dead."""
    for r in members:
        if r in plane.dead:
            return f"rank {r} was lost ({plane.dead[r]})"
    return None


def _commit(old: Change[M], new: M | None, survivors: list[int], left: float) -> bool:
    """The commit agreement: True when every survivor built ``new`` and none of them was lost."""
    d = old.plane.agreements.agree(new is not None, None, left)
    ok = d.flag and not (d.dead & set(survivors))
    if not ok and new is not None:
        new.finalize()
    return ok


def shrink(old: Change[M], timeout: float) -> M:
    """The survivors' communicator (the caller replaces old with it)."""
    plane = old.plane
    plane.raise_if_evicted()
    old.revoke(f"rank {old.rank} is shrinking the communicator")
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollectiveTimeoutError(f"shrink on rank {old.rank} did not complete within {timeout:.1f} s")
        d = plane.agreements.agree(True, None, left)
        plane.raise_if_evicted()
        survivors = sorted(d.payloads)
        epoch = old.epoch + 1
        plane_id, token = _new_plane_id(plane, d, epoch)
        members = [plane.members[r] for r in survivors]
        new: M | None = None
        try:
            new = _build(
                old,
                members,
                survivors.index(plane.rank),
                plane_id,
                token,
                tuple(survivors),
                deadline,
                lambda r, alive=tuple(survivors): _any_dead(plane, alive),
            )
        except PycollError as exc:
            log.info("rank %d: shrink attempt failed (%s); trying again", old.rank, exc)
        if _commit(old, new, survivors, max(0.1, deadline - time.monotonic())):
            assert new is not None
            log.info(
                "rank %d: shrunk from %d to %d ranks (epoch %d; lost %s)",
                old.rank,
                old.world_size,
                len(survivors),
                epoch,
                sorted(d.dead),
            )
            return new


# ---- grow ------------------------------------------------------------------------------------------
class Joiners:
    """The join requests a member holds (the process's listener hands them to the newest plane)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, tuple[socket.socket, dict[str, Any]]] = {}

    def take(self, sock: socket.socket, hello: dict[str, Any]) -> bool:
        with self.lock:
            self.held[str(hello["id"])] = (sock, hello)
        return True

    def alive(self) -> list[dict[str, Any]]:
        """The requests whose process is still there (a closed socket drops its request)."""
        out = []
        with self.lock:
            for jid, (sock, hello) in list(self.held.items()):
                if _closed(sock):
                    sock.close()
                    del self.held[jid]
                else:
                    out.append({k: hello[k] for k in ("id", "host", "pid", "address")})
        return out

    def send(self, jid: str, msg: dict[str, Any]) -> bool:
        with self.lock:
            got = self.held.get(jid)
        if got is None:
            return False
        try:
            got[0].sendall(wire.encode(msg))
            return True
        except OSError:
            return False

    def gone(self, jid: str) -> bool:
        with self.lock:
            got = self.held.get(jid)
        return got is None or _closed(got[0])

    def release(self, jid: str) -> None:
        with self.lock:
            got = self.held.pop(jid, None)
        if got is not None:
            got[0].close()


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (a joiner sends nothing after its request, so anything readable
    is its end of file)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def grow(old: Change[M], timeout: float, min_joiners: int, max_joiners: int | None = None) -> M:
    """The communicator with the joiners (the caller replaces old with it)."""
    plane = old.plane
    old.check_usable()
    joiners_here = old.joiners
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollectiveTimeoutError(
                f"grow on rank {old.rank}: fewer than {min_joiners} process(es) asked to join within "
                f"{timeout:.1f} s"
            )
        held = joiners_here.alive()
        d = plane.agreements.agree(True, {"joiners": held} if held else None, left)
        if d.dead:
            raise CommunicatorBrokenError(
                f"rank(s) {sorted(d.dead)} are lost: shrink the communicator first, then grow"
            )
        joiners = [(r, j) for r in sorted(d.payloads) for j in (d.payloads[r] or {}).get("joiners", ())]
        joiners = joiners[:max_joiners]
        if len(joiners) >= min_joiners:
            break
        time.sleep(0.02)
    world = old.world_size
    epoch = old.epoch + 1
    plane_id, token = _new_plane_id(plane, d, epoch)
    members = list(plane.members) + [{k: j[k] for k in ("address", "host", "pid")} for _, j in joiners]
    mine = [(world + i, j) for i, (holder, j) in enumerate(joiners) if holder == old.rank]
    for new_rank, j in mine:
        joiners_here.send(
            j["id"],
            {
                "t": "assign",
                "plane": plane_id,
                "token": token,
                "rank": new_rank,
                "members": members,
                "epoch": epoch,
                "parents": list(range(world)) + [-1] * len(joiners),
                "timeout": old.timeout,
                "deadline_s": max(0.1, deadline - time.monotonic()),
            },
        )

    def gone(r: int) -> str | None:
        """Why the grow cannot succeed: a member is dead, or a joiner went away (its holder sees that and
        tells the other members through the plane, so that none of them waits for the deadline)."""
        why = _any_dead(plane, tuple(range(world)))
        if why is not None:
            return why
        for holder, j in joiners:
            if j["id"] in plane.notes:
                return f"the joining process {j['id']} went away"
            if holder == old.rank and joiners_here.gone(j["id"]):
                plane.note(j["id"])
                return f"the joining process {j['id']} went away"
        return None

    new: M | None = None
    parents = tuple(range(world)) + (-1,) * len(joiners)
    try:
        new = _build(old, members, old.rank, plane_id, token, parents, deadline, gone)
    except PycollError as exc:
        log.warning("rank %d: grow failed (%s); the communicator stays as it was", old.rank, exc)
    ok = _commit(old, new, list(range(world)), max(0.1, deadline - time.monotonic()))
    for _, j in mine:
        joiners_here.send(j["id"], {"t": "commit" if ok else "abort"})
        joiners_here.release(j["id"])
    if not ok:
        old.check_usable()
        raise PeerLostError(
            f"grow on rank {old.rank}: a joining process or a member failed while the communicator was being "
            "formed; the communicator is unchanged"
        )
    assert new is not None
    log.info("rank %d: grew from %d to %d ranks (epoch %d)", old.rank, world, len(members), epoch)
    return new


def join(make: Callable[..., M], address: str, settings: Settings, timeout: float, host: str) -> M:
    """The joining process: asks a member at ``address`` (or one of several, comma-separated, or a file
    listing them) to be admitted, then takes part in the members' grow. ``make``: builds the communicator
    (the Communicator class, passed in: this module never imports pycoll.comm, which imports it)."""
    deadline = time.monotonic() + timeout
    candidates = _join_addresses(address)
    last: Exception | None = None
    for target in candidates:
        local = target.startswith("127.") or target.startswith("localhost")
        bind, advertise = ("127.0.0.1", "127.0.0.1") if local else ("0.0.0.0", _route_to(target))
        listener = listener_for(bind, advertise, settings.secret)
        jid = secrets.token_hex(8)
        hello = {"t": "join", "id": jid, "host": host, "pid": os.getpid(), "address": listener.address}
        try:
            sock = dial(target, hello, deadline, (jid, listener.address), settings.secret)
        except PeerLostError as exc:
            last = exc
            continue
        try:
            assign = wire.recv_frame(sock, deadline, f"the member at {target}")
            if assign.get("t") != "assign":
                raise InvalidUsageError(
                    f"the member at {target} refused to admit this process: {assign.get('why')}"
                )
            members = assign["members"]
            rank = int(assign["rank"])
            plane = form(
                listener,
                rank,
                len(members),
                members,
                assign["plane"],
                assign["token"],
                settings.heartbeat_timeout_s,
                deadline,
            )
            try:
                comm = make(
                    PlaneStore(plane, max(0.1, deadline - time.monotonic())),
                    rank,
                    len(members),
                    timeout=float(assign["timeout"]),
                    settings=settings,
                    plane=plane,
                    epoch=int(assign["epoch"]),
                    parent_ranks=tuple(int(p) for p in assign["parents"]),
                    addresses=(bind, advertise),
                )
            except BaseException:
                plane.close()
                raise
            verdict = wire.recv_frame(sock, deadline, f"the member at {target}")
            if verdict.get("t") != "commit":
                comm.finalize()
                raise PeerLostError(
                    "the job did not admit this process: a member or joiner failed during the grow"
                )
            return comm
        finally:
            sock.close()
    raise PeerLostError(f"no member of the job answered at {', '.join(candidates)} ({last})")


def _join_addresses(spec: str) -> list[str]:
    if os.path.isfile(spec):
        with open(spec) as f:
            spec = ",".join(line.strip() for line in f if line.strip())
    out = [a.strip() for a in spec.split(",") if a.strip()]
    if not out or any(":" not in a for a in out):
        raise InvalidUsageError(
            f"join= must be host:port (or several, comma-separated, or a file of them), got {spec!r}"
        )
    return out


def _route_to(address: str) -> str:
    host = address.rpartition(":")[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((socket.gethostbyname(host), 9))
        return str(sock.getsockname()[0])
