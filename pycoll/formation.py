"""How the ranks of a new communicator find each other and connect: which ranks share a host, which
transport joins them (shared memory, TCP, or both), and the cost model every rank chooses by.

Every step goes through the communicator's store, in the same order on every rank: each rank publishes
its host id, then its shared-memory segment or TCP address, then waits for the others' (each wait bounded
by the set-up timeout). ``pycoll.comm.Communicator`` calls ``form`` once; what it returns is all the
communicator keeps of it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
from typing import Any, Sequence

from pycoll import _C, auto
from pycoll.bootstrap import Store, store_barrier
from pycoll.bootstrap.net import interface_address, reachable_address
from pycoll.env import Settings, rendezvous_secret, usable_cpus
from pycoll.tuning import Model
from pycoll.tuning.persist import load_model, model_from_dict, model_to_dict

log = logging.getLogger("pycoll")


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


def discover_hosts(store: Store, rank: int, world_size: int, settings: Settings, timeout: float) -> list[str]:
    """Every rank's host id, in rank order (each rank publishes its own)."""
    store.set(f"host/{rank}", host_id(settings).encode())
    return [store.get(f"host/{r}", timeout).decode() for r in range(world_size)]


def tcp_addresses(settings: Settings, store: Store, hosts: Sequence[str]) -> tuple[str, str]:
    """(address this rank's TCP transport listens on, address it tells the other ranks)."""
    if settings.socket_ifname is not None:
        address = interface_address(settings.socket_ifname)
        return address, address
    if len(set(hosts)) == 1:
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", reachable_address(store)


class Formed:
    """What forming a communicator's transport left: the native communicator, its message sizes, and the
    cost model every rank agreed on (with rank 0's PYCOLL_TOPOLOGY setting for the GPU machine)."""

    def __init__(self, native: Any, model: Model, gpu_topology_setting: dict[str, Any]) -> None:
        self.native = native
        self.segment_bytes = int(native.segment_bytes)
        self.fragment_bytes = int(native.fragment_bytes)
        self.model = model
        self.gpu_topology_setting = gpu_topology_setting


def form(
    store: Store,
    rank: int,
    world_size: int,
    hosts: Sequence[str],
    transport: str,
    addresses: tuple[str, str],
    settings: Settings,
    timeout: float,
) -> Formed:
    """Makes this rank's native communicator and connects it to every peer over ``transport`` ("shm",
    "tcp" or "mixed": shared memory to this host's ranks, TCP to the others); then the cost model."""
    local_world_size = host_layout(hosts, rank)[1]
    spin, yield_us = auto.wait_policy(settings, local_world_size, transport, usable_cpus())
    slot_bytes, slots = auto.ring_shape(settings, transport, world_size)
    local = [h == hosts[rank] for h in hosts] if transport == "mixed" else []
    bind, advertised = addresses if transport in ("tcp", "mixed") else ("", "")
    native = _C.NativeCommunicator(
        rank,
        world_size,
        slot_bytes,
        slots,
        spin * 1000,
        yield_us * 1000,
        settings.stream_bytes,
        bind,
        local,
        settings.skew,
        settings.skew_window,
        round(settings.fake_clock_offset_s * 1e9),
    )
    if transport in ("shm", "mixed"):
        _attach_shared_memory(native, store, rank, world_size, timeout, local)
    if transport in ("tcp", "mixed"):
        _connect_tcp(native, store, rank, world_size, advertised, timeout, local)
    # Counted so that a rank hosting the store keeps it up until every rank is past the barrier.
    store.add("past_setup", 1)
    model, gpu_topology = _agree_on_model(store, rank, transport, native, settings, timeout)
    log.info(
        "rank %d/%d: %s transport to every peer (%d slots x %d KiB per link), "
        "spin %d us, yield %d us, reduce loops %s",
        rank,
        world_size,
        {"shm": "shared-memory", "tcp": "TCP", "mixed": "shared-memory (this host) and TCP"}[transport],
        slots,
        slot_bytes // 1024,
        spin,
        yield_us,
        _C.reduce_isa(),
    )
    return Formed(native, model, gpu_topology)


def _attach_shared_memory(
    native: Any, store: Store, rank: int, world_size: int, timeout: float, local: list[bool]
) -> None:
    """Maps the segments of this host's ranks (``local``; empty: every rank is on this host)."""
    store.set(f"shm/{rank}", f"{os.getpid()},{native.segment_fd}".encode())
    pids, fds = [], []
    for r in range(world_size):
        pid, fd = store.get(f"shm/{r}", timeout).decode().split(",")
        here = not local or local[r]
        pids.append(int(pid) if here else 0)  # 0: a rank of another host, reached over TCP
        fds.append(int(fd) if here else -1)
    native.connect(pids, fds)
    store_barrier(store, "attached", rank, world_size, timeout, what="shared-memory set-up")
    native.close_segment_fd()


def _connect_tcp(
    native: Any, store: Store, rank: int, world_size: int, advertised: str, timeout: float, local: list[bool]
) -> None:
    """Every rank publishes where it listens; each dials the ranks below it, and both ends of every
    connection prove they hold the job's key (csrc/transport/tcp.h). The key is rank 0's random job
    key from the store; with PYCOLL_SECRET it is HMAC(secret, job key), so that someone who read the
    store's traffic (authenticated, not encrypted) still cannot connect."""
    if rank == 0:
        store.set("tcp/job_key", secrets.token_hex(32).encode())
    key = bytes.fromhex(store.get("tcp/job_key", timeout).decode())
    secret = rendezvous_secret()
    if secret is not None:
        key = hmac.new(secret, b"pycoll tcp data sockets\0" + key, hashlib.sha256).digest()
    store.set(f"tcp/{rank}", f"{advertised}:{native.tcp_port}".encode())
    addresses = [store.get(f"tcp/{r}", timeout).decode() for r in range(world_size)]
    if local:  # this host's ranks are reached over shared memory
        addresses = ["" if here else a for a, here in zip(addresses, local)]
    native.connect_tcp(addresses, key, timeout)
    store_barrier(store, "connected", rank, world_size, timeout, what="TCP set-up")


def _agree_on_model(
    store: Store, rank: int, transport: str, native: Any, settings: Settings, timeout: float
) -> tuple[Model, dict[str, Any]]:
    """The cost model ``auto`` chooses by: rank 0's (this host's calibration, or the defaults), handed to
    every rank through the store, so that all ranks make the same choices; and rank 0's PYCOLL_TOPOLOGY."""
    if rank != 0:
        gpu_topology = json.loads(store.get("gpu-topology", timeout).decode())
        return model_from_dict(json.loads(store.get("tuning", timeout).decode())), gpu_topology
    segment_bytes, fragment_bytes = int(native.segment_bytes), int(native.fragment_bytes)
    model = None
    if auto.uses_calibration(transport):
        model = load_model(segment_bytes=segment_bytes, fragment_bytes=fragment_bytes, workers=usable_cpus())
    if model is None:
        model = auto.default_model(
            transport, workers=usable_cpus(), segment_bytes=segment_bytes, fragment_bytes=fragment_bytes
        )
    gpu_topology = auto.gpu_topology_setting(settings.gpu_topology)
    store.set("gpu-topology", json.dumps(gpu_topology).encode())
    store.set("tuning", json.dumps(model_to_dict(model)).encode())
    return model, gpu_topology
