"""How the ranks of a new communicator find each other: which ranks share a host, which transport joins
them (shared memory, TCP, or both), the cost model every rank chooses by, and the fault plane.

Every step goes through the communicator's store in two *rounds* (``gather``), each O(1) store operations
per rank and O(n) in all, never n reads on one rank but the first:

    hosts   every rank publishes its host id, pid and clock domain; rank 0 reads the n records and
            publishes them as one table, which every other rank reads once. From it every rank knows the
            same layout: which ranks share a host, the transport, the segments' and rings' sizes.
    links   every rank publishes where its peers reach it (its shared-memory segment, its TCP port, its
            control socket); rank 0 adds what every rank must take from one rank (the fault plane's id and
            token, the TCP job key, its cost model and PYCOLL_TOPOLOGY) and publishes the table.

No data link is made here: the native transport maps a peer's segment, or connects to it over TCP, when a
collective first needs it (csrc/transport/shm.h, tcp.h). Only the fault plane's links are formed (every
dial at once, natively: pycoll/fault/plane.py). A rank that does not publish its record in time is named
in the error every rank raises (rank 0 publishes the failure in place of the table); one of this host whose
process has exited (its pid, from the first round) is found at once.

``pycoll.comm.Communicator`` calls ``form`` once; the Context it returns is all the communicator keeps.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import time
from typing import Any, Callable, Sequence

from pycoll import _C, auto
from pycoll.bootstrap import Store
from pycoll.bootstrap.net import interface_address, reachable_address
from pycoll.bootstrap.store.adapters import get_many
from pycoll.context import Context, Group
from pycoll.env import Settings, rendezvous_secret, usable_cpus
from pycoll.errors import (
    CollectiveTimeoutError,
    InvalidUsageError,
    PeerFailedError,
    PeerLostError,
    PycollError,
    ranks_text,
)
from pycoll.fault.listener import listener_for
from pycoll.fault.membership import member_info
from pycoll.fault.plane import Plane, check_heartbeat_timeout
from pycoll.fault.plane import form as form_plane
from pycoll.flight import recorder as flight
from pycoll.tuning import Model
from pycoll.tuning.persist import load_model, model_from_dict, model_to_dict

log = logging.getLogger("pycoll")

#: How long a round's waits last between two looks at whether a rank of this host has exited.
_SLICE_S = 0.25
#: How much longer than the set-up deadline the other ranks wait for rank 0's table: rank 0 may need all
#: of it to find a rank that never came, and then publishes that instead of the table.
_ROOT_GRACE_S = 2.0


def host_id(settings: Settings | None = None) -> str:
    """Identifies the machine: PYCOLL_HOST_ID when set, else hostname plus the kernel's boot id
    (containers on one host share the boot id; ranks with the same id share memory)."""
    override = (settings if settings is not None else Settings.from_environ()).host_id
    if override is not None:
        return override
    return f"{socket.gethostname()}/{boot_id()}"


def boot_id() -> str:
    """The running kernel's boot id: processes that share it share one steady clock and one memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "?"


def host_layout(hosts: Sequence[str], rank: int) -> tuple[int, int, int, int]:
    """Where ``rank`` sits among the ranks of its host, given every rank's host id in rank order:
    (local rank, local world size, node rank, number of nodes). Nodes are numbered in the order of their
    lowest rank, so node 0 is rank 0's host."""
    order = list(dict.fromkeys(hosts))  # distinct hosts, first appearance (lowest rank) first
    mine = hosts[rank]
    peers = [r for r, h in enumerate(hosts) if h == mine]
    return peers.index(rank), len(peers), order.index(mine), len(order)


def hosts_text(hosts: Sequence[str]) -> str:
    """ "host 'a': ranks 0, 1; host 'b': ranks 2, 3" (in node order)."""
    groups: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    parts = []
    for h, ranks in groups.items():
        shown = ", ".join(str(r) for r in ranks[:16]) + (
            f", ... ({len(ranks)} in all)" if len(ranks) > 16 else ""
        )
        parts.append(f"host {h!r}: rank{'s' if len(ranks) > 1 else ''} {shown}")
    return "; ".join(parts)


def tcp_addresses(settings: Settings, store: Store, hosts: Sequence[str]) -> tuple[str, str]:
    """(address this rank's TCP transport listens on, address it tells the other ranks)."""
    if settings.socket_ifname is not None:
        address = interface_address(settings.socket_ifname)
        return address, address
    if len(set(hosts)) == 1:
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", reachable_address(store)


def clock_domain(offset_ns: int) -> int:
    """Ranks with the same value read one steady clock: one kernel (boot id), the same test offset
    (PYCOLL_FAKE_CLOCK_OFFSET_S); the skew recorder compares their stamps directly."""
    digest = hashlib.blake2b(f"{boot_id()}/{offset_ns}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def process_exited(pid: int) -> bool:
    """Whether process ``pid`` of this host has exited (or is a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


# ---- rounds ------------------------------------------------------------------------------------------
def gather(
    store: Store,
    name: str,
    rank: int,
    world: int,
    mine: dict[str, Any],
    timeout: float,
    *,
    extra: Callable[[], dict[str, Any]] | None = None,
    gone: Callable[[int], str | None] = lambda r: None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every rank's record of round ``name`` (``mine`` on this rank) in rank order, and what rank 0 added
    (``extra()``, called on rank 0 alone). Each rank sets its record and reads one table; rank 0 reads the
    n records (one request: ``get_many``) and sets the table. ``gone(r)`` says why rank r will never
    publish (its process exited), or None. A rank missing after ``timeout`` (or gone) is named in the
    error every rank raises."""
    if rank != 0:
        store.set(f"round/{name}/{rank}", json.dumps(mine).encode())
        wait = timeout + _ROOT_GRACE_S
        key = f"round/{name}/all"
        (data,) = _wait_all(store, [key], wait, [0], gone, f"rank 0's {name} table")
        table = json.loads(data)
        failure = table.get("error")
        if failure is not None:
            raise _error_from(failure)
        return table["ranks"], table["extra"]
    others = list(range(1, world))
    try:
        keys = [f"round/{name}/{r}" for r in others]
        records = [mine] + [json.loads(v) for v in _wait_all(store, keys, timeout, others, gone, "the ranks")]
        added = extra() if extra is not None else {}
    except PeerFailedError:
        raise  # a rank that failed told every rank itself (pycoll/bootstrap/failfast.py)
    except PycollError as exc:
        missing = _missing(store, name, others)
        error = _round_error(exc, name, world, missing, timeout)
        try:
            store.set(f"round/{name}/all", json.dumps({"error": error}).encode())
        except PycollError:
            log.debug("rank 0 could not publish the failure of round %s", name, exc_info=True)
        raise _error_from(error) from None
    store.set(f"round/{name}/all", json.dumps({"ranks": records, "extra": added}).encode())
    return records, added


def _missing(store: Store, name: str, ranks: list[int]) -> list[int] | None:
    """Of ``ranks``, those whose record of round ``name`` is not there (None: the store cannot tell)."""
    check: Callable[[list[str]], bool] | None = getattr(store, "check", None)
    if check is None:
        return None
    try:
        return [r for r in ranks if not check([f"round/{name}/{r}"])]
    except PycollError:
        return None


def _wait_all(
    store: Store,
    keys: list[str],
    timeout: float,
    ranks: list[int],
    gone: Callable[[int], str | None],
    what: str,
) -> list[bytes]:
    """``keys``' values once all exist (``get_many``), looking between slices whether one of ``ranks``
    (those who write them) is gone: PeerLostError naming it then, CollectiveTimeoutError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return get_many(store, keys, max(0.0, min(_SLICE_S, left)))
        except PeerFailedError:
            raise
        except CollectiveTimeoutError:
            for r in ranks:
                why = gone(r)
                if why is not None:
                    raise PeerLostError(why, rank=r) from None
            if left <= _SLICE_S:
                raise CollectiveTimeoutError(f"{what} did not publish the set-up records in time") from None


def _round_error(
    exc: PycollError, name: str, world: int, missing: list[int] | None, timeout: float
) -> dict[str, Any]:
    """What every rank raises when round ``name`` failed on rank 0 (``exc``; ``missing``: the ranks whose
    records did not come)."""
    gone = getattr(exc, "rank", -1)
    if isinstance(exc, PeerLostError) and gone >= 0:
        text = f"rank {gone} of {world} exited during pycoll.init's set-up ({exc})"
        return {"type": "PeerLostError", "rank": gone, "message": text}
    first = missing[0] if missing else -1
    if isinstance(exc, CollectiveTimeoutError) and missing:
        text = (
            f"rank(s) {ranks_text(missing)} of {world} did not reach pycoll.init's set-up (round {name!r}) "
            f"within {timeout:g} s: started late, hung, or died before; the others stop waiting for them"
        )
        return {"type": "CollectiveTimeoutError", "rank": first, "message": text}
    return {"type": type(exc).__name__, "rank": getattr(exc, "rank", -1), "message": str(exc)}


def _error_from(error: dict[str, Any]) -> PycollError:
    if error.get("type") == "PeerLostError":
        return PeerLostError(str(error["message"]), rank=int(error.get("rank", -1)))
    if error.get("type") == "CollectiveTimeoutError":
        return CollectiveTimeoutError(str(error["message"]))
    return PycollError(f"{error.get('type')}: {error.get('message')}")


# ---- forming -----------------------------------------------------------------------------------------
def form(
    store: Store,
    rank: int,
    world: int,
    *,
    settings: Settings,
    timeout: float,
    plane: Plane | None,
    fault_tolerance: bool,
    addresses: tuple[str, str] | None,
    epoch: int,
    parent_ranks: tuple[int, ...],
    hosting: bool,
) -> Context:
    """Forms this rank's part of a new communicator on ``store`` (module docstring): its Context. With
    ``plane`` (a shrink or a grow: the store runs over it) no fault plane is formed; else one is, when
    ``fault_tolerance``. ``hosting``: this rank hosts the store (it must not close it under the others)."""
    offset = round(settings.fake_clock_offset_s * 1e9)
    mine = {"host": host_id(settings), "pid": os.getpid(), "domain": clock_domain(offset)}
    first, _ = gather(store, "hosts", rank, world, mine, timeout)
    hosts = tuple(str(r["host"]) for r in first)
    pids = [int(r["pid"]) for r in first]
    local_rank, local_world, node_rank, num_nodes = host_layout(hosts, rank)
    if plane is None and fault_tolerance:
        check_heartbeat_timeout(settings.heartbeat_timeout_s, local_world)
    transport = auto.transport(settings.transport, num_nodes, world)
    if num_nodes > 1 and transport == "shm":
        _refuse_shm_across_hosts(store, rank, world, hosts, hosting, timeout)
    if addresses is None:
        addresses = tcp_addresses(settings, store, hosts)
    native = _native_communicator(rank, world, hosts, transport, addresses, settings, local_world, offset)
    listener = None
    if plane is None and fault_tolerance:
        listener = listener_for(addresses[0], addresses[1], settings.secret)
    links = {
        "shm": native.segment_fd if transport in ("shm", "mixed") else None,
        "tcp": f"{addresses[1]}:{native.tcp_port}" if transport in ("tcp", "mixed") else None,
        "control": None if listener is None else member_info(listener, hosts[rank]),
    }

    def gone(r: int) -> str | None:
        if hosts[r] == hosts[rank] and process_exited(pids[r]):
            return f"rank {r}'s process (pid {pids[r]}) has exited"
        return None

    def root_extra() -> dict[str, Any]:
        model, gpu = _root_model(transport, native, settings)
        return {
            "plane": {"id": secrets.token_hex(8), "token": secrets.token_hex(16)},
            "key": secrets.token_hex(32),
            "model": model_to_dict(model),
            "gpu_topology": gpu,
        }

    records, extra = gather(store, "links", rank, world, links, timeout, extra=root_extra, gone=gone)
    local = [h == hosts[rank] for h in hosts] if transport == "mixed" else []
    if transport in ("shm", "mixed"):
        here = [not local or local[r] for r in range(world)]
        native.set_shm_peers([p if h else 0 for p, h in zip(pids, here)],
                             [int(rec["shm"]) if h else -1 for rec, h in zip(records, here)])  # fmt: skip
    if transport in ("tcp", "mixed"):
        tcp = ["" if local and local[r] else str(rec["tcp"]) for r, rec in enumerate(records)]
        native.set_tcp_peers(tcp, _tcp_key(bytes.fromhex(extra["key"])), timeout)
    if listener is not None:
        members = [rec["control"] for rec in records]
        plane_id = f"{extra['plane']['id']}/e0"
        plane = form_plane(listener, rank, world, members, plane_id, extra["plane"]["token"],
                           settings.heartbeat_timeout_s, time.monotonic() + timeout, gone)  # fmt: skip
    try:
        # Counted so that a rank hosting the store keeps it up until every rank is past its reads.
        store.add("past_setup", 1)
    except BaseException:
        if listener is not None and plane is not None:
            plane.close()
        raise
    group = Group(
        rank=rank,
        world_size=world,
        hosts=hosts,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=num_nodes,
        transport=transport,
        addresses=addresses,
        timeout=timeout,
        settings=settings,
        model=model_from_dict(extra["model"]),
        segment_bytes=int(native.segment_bytes),
        fragment_bytes=int(native.fragment_bytes),
        gpu_topology_setting=extra["gpu_topology"],
        spans_equal_hosts=auto.spans_equal_hosts(hosts),
        clock_domains=tuple(int(r["domain"]) for r in first),
        epoch=epoch,
        parent_ranks=parent_ranks,
    )
    log.info(
        "rank %d/%d: %s transport (links made at first use), reduce loops %s",
        rank,
        world,
        {"shm": "shared-memory", "tcp": "TCP", "mixed": "shared-memory (this host) and TCP"}[transport],
        _C.reduce_isa(),
    )
    _name_for_records(native, group, plane, settings)
    return Context(group, native, plane, store)


def _name_for_records(native: Any, group: Group, plane: Plane | None, settings: Settings) -> None:
    """Names the communicator in the flight recorder (pycoll/flight/): by its plane's id, the same on every
    rank, with its members' control addresses; notes this process's address for ``pycoll trace dump``."""
    flight.start(settings)
    members = [] if plane is None else [str(m["address"]) for m in plane.members]
    flight.register(native, flight.comm_name(plane), group.rank, group.world_size, group.epoch, members)
    if plane is not None:
        flight.note_live(settings, plane.listener.address)


def _refuse_shm_across_hosts(
    store: Store, rank: int, world: int, hosts: Sequence[str], hosting: bool, timeout: float
) -> None:
    """PYCOLL_TRANSPORT=shm on several hosts: every rank saw the same table, so every rank raises here. A
    rank hosting the store first waits (bounded) for the others to be past their reads, which would
    otherwise fail with a lost store instead of this error."""
    store.add("hosts_checked", 1)
    if hosting:
        deadline = time.monotonic() + min(timeout, 10.0)
        while store.add("hosts_checked", 0) < world and time.monotonic() < deadline:
            time.sleep(0.005)
    raise InvalidUsageError(
        f"rank {rank}: the {world} ranks run on {len(set(hosts))} hosts "
        f"({hosts_text(hosts)}), but PYCOLL_TRANSPORT=shm connects the ranks of one host only; "
        "unset it (or set tcp). If these ranks do share a host, unset PYCOLL_HOST_ID or give it the "
        "same value on all of them"
    )


def _native_communicator(
    rank: int,
    world: int,
    hosts: Sequence[str],
    transport: str,
    addresses: tuple[str, str],
    settings: Settings,
    local_world: int,
    clock_offset_ns: int,
) -> Any:
    """This rank's native communicator over ``transport`` ("shm", "tcp" or "mixed": shared memory to this
    host's ranks, TCP to the others), its links not made yet."""
    spin, yield_us = auto.wait_policy(settings, local_world, transport, usable_cpus())
    slot_bytes, slots = auto.ring_shape(settings, transport, world)
    local = [h == hosts[rank] for h in hosts] if transport == "mixed" else []
    return _C.NativeCommunicator(
        rank,
        world,
        slot_bytes,
        slots,
        spin * 1000,
        yield_us * 1000,
        settings.stream_bytes,
        addresses[0] if transport in ("tcp", "mixed") else "",
        local,
        auto.skew(settings.skew, world),
        settings.skew_window,
        clock_offset_ns,
    )


def _tcp_key(job_key: bytes) -> bytes:
    """What both ends of every TCP connection prove they hold (csrc/transport/tcp.h): rank 0's random job
    key, or with PYCOLL_SECRET an HMAC of it under the secret, so that someone who read the store's
    traffic (authenticated, not encrypted) still cannot connect."""
    secret = rendezvous_secret()
    if secret is None:
        return job_key
    return hmac.new(secret, b"pycoll tcp data sockets\0" + job_key, hashlib.sha256).digest()


def _root_model(transport: str, native: Any, settings: Settings) -> tuple[Model, dict[str, Any]]:
    """Rank 0's cost model (this host's calibration, or the defaults), which every rank takes so that all
    make the same choices, and its PYCOLL_TOPOLOGY setting."""
    segment_bytes, fragment_bytes = int(native.segment_bytes), int(native.fragment_bytes)
    model = None
    if auto.uses_calibration(transport):
        model = load_model(segment_bytes=segment_bytes, fragment_bytes=fragment_bytes, workers=usable_cpus())
    if model is None:
        model = auto.default_model(
            transport, workers=usable_cpus(), segment_bytes=segment_bytes, fragment_bytes=fragment_bytes
        )
    return model, auto.gpu_topology_setting(settings.gpu_topology)
