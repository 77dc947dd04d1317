"""The communicator: a group of ranks, the native transport that connects them, and the plans it has
compiled. ``pycoll.init()`` makes one; the collectives in ``pycoll.api`` run on it."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, NoReturn, TypeVar, cast

from pycoll import _C, auto
from pycoll.algorithms import build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.grouped import lower_to_groups
from pycoll.algorithms.plan import Plan
from pycoll.arrays import Buffer
from pycoll.bootstrap import PrefixStore, Store, TCPStoreServer, store_barrier
from pycoll.bootstrap.failfast import LINGER_S, FailFastStore
from pycoll.bootstrap.net import interface_address, reachable_address
from pycoll.codes import ALGORITHM_CODES, COLLECTIVE_CODES
from pycoll.env import STRAGGLER_WINDOW, Settings, rendezvous_secret, usable_cpus
from pycoll.errors import (
    CollectiveMismatchError,
    CommunicatorBrokenError,
    CommunicatorRevokedError,
    EvictedError,
    InvalidUsageError,
    PeerLostError,
    PycollError,
)
from pycoll.fault import membership
from pycoll.fault.agreement import Decision
from pycoll.fault.membership import Joiners, initial_plane
from pycoll.fault.plane import Plane
from pycoll.skew.report import SkewReport
from pycoll.skew.tracker import Notice, SkewTracker, StragglerEvent, clock_domain
from pycoll.tuning import Model
from pycoll.tuning.persist import load_model, model_from_dict, model_to_dict
from pycoll.tuning.topology import TopologyModel

if TYPE_CHECKING:
    from pycoll.gpu import Enqueued, GpuSide

log = logging.getLogger("pycoll")

_PLAN_CACHE_SIZE = 512
#: Prepared arguments of plain collectives kept (pycoll.comm.Communicator.run).
_ARGS_CACHE_SIZE = 64


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


def host_layout(hosts: list[str], rank: int) -> tuple[int, int, int, int]:
    """Where ``rank`` sits among the ranks of its host, given every rank's host id in rank order:
    (local rank, local world size, node rank, number of nodes). Nodes are numbered in the order of their
    lowest rank, so node 0 is rank 0's host."""
    order = list(dict.fromkeys(hosts))  # distinct hosts, first appearance (lowest rank) first
    mine = hosts[rank]
    peers = [r for r, h in enumerate(hosts) if h == mine]
    return peers.index(rank), len(peers), order.index(mine), len(order)


def _hosts_text(hosts: list[str]) -> str:
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


_Init = TypeVar("_Init", bound=Callable[..., None])


def _failing_fast(init: _Init) -> _Init:
    """``Communicator.__init__``, which, when it raises once the communicator's store exists, tells the
    other ranks through it, so that they stop waiting for this one (pycoll/bootstrap/failfast.py). A rank
    hosting the store keeps it up briefly for them to read that."""

    @functools.wraps(init)
    def wrapper(self: Communicator, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except BaseException as exc:
            watched = self.__dict__.get("_store")
            if isinstance(watched, FailFastStore):
                hosting = any(isinstance(obj, TCPStoreServer) for obj in self._owned)
                watched.announce(exc, self.world_size, linger=LINGER_S if hosting else 0.0)
            raise

    return cast(_Init, wrapper)


class Communicator:
    """Ranks 0..world_size-1 of one job, connected over shared memory (one host) or TCP (several hosts).

    Collectives on one communicator must be called in the same order by every rank. A communicator that
    saw an error (timeout, lost peer, mismatch) is broken: every later call raises
    CommunicatorBrokenError; ``shrink()`` makes one of the surviving ranks (docs/fault-tolerance.md).
    """

    @_failing_fast
    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        *,
        timeout: float,
        settings: Settings,
        owned: tuple[Any, ...] = (),
        fault_tolerance: bool | None = None,
        plane: Plane | None = None,
        epoch: int = 0,
        parent_ranks: tuple[int, ...] | None = None,
        addresses: tuple[str, str] | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise InvalidUsageError(f"rank must be in 0..{world_size - 1}, got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.settings = settings
        self._owned = owned  # store client / server this communicator closes at finalize
        # Keys of the n-th communicator formed on this store. n is counted per rank in the store itself,
        # not per process: ranks that made different numbers of communicators elsewhere (on other
        # groups' stores) still agree on it.
        n = store.add(f"pycoll/communicators/{rank}", 1)
        # On a rendezvous store, its waits end early, naming the rank, when a peer's set-up fails (see
        # _failing_fast); a control plane's store (shrink, grow) ends them itself when a member is lost.
        prefixed = PrefixStore(store, f"pycoll/comm{n}")
        self._store: Store = (
            prefixed if plane is not None else FailFastStore(prefixed, "failure", rank=rank, timeout=timeout)
        )
        self._plans: OrderedDict[tuple, Any] = OrderedDict()
        self._args: OrderedDict[tuple, Any] = OrderedDict()
        #: pycoll.allreduce's fast path: per (dtype number, length, op, algorithm, timeout) of a numpy
        #: array, its dtype and the prepared arguments of a call that passed the full path.
        self.in_place: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._async: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._worker_ident: int | None = None  # the thread that runs asynchronous collectives
        self._broken: BaseException | None = None
        self._logged: set[tuple] = set()
        self._closed = False
        #: Run CPU collectives as grouped programs (whole messages in matched groups, as GPUs run them over
        #: NCCL) instead of fragment by fragment: slower, and meant for the tests that check those programs.
        self.grouped_on_cpu = False
        self._gpu: GpuSide | None = None
        #: The membership generation: 0 for a communicator made by ``pycoll.init``, one more for each
        #: shrink or grow it came from.
        self.epoch = epoch
        #: For each rank, its rank in the communicator this one was shrunk or grown from (-1: a process
        #: that joined); ``range(world_size)`` for one made by ``pycoll.init``.
        self.parent_ranks: tuple[int, ...] = (
            parent_ranks if parent_ranks is not None else tuple(range(world_size))
        )
        self._plane: Plane | None = plane
        self._native: _C.NativeCommunicator | None = None
        self._skew: SkewTracker | None = None
        self._replaced: list[Callable[[Communicator], None]] = []
        self.joiners = Joiners()

        # Which ranks share a host (and so shared memory): every rank publishes its host id.
        self._store.set(f"host/{rank}", host_id(settings).encode())
        #: Every rank's host id, in rank order.
        self.hosts: list[str] = [self._store.get(f"host/{r}", timeout).decode() for r in range(world_size)]
        layout = host_layout(self.hosts, rank)
        #: This rank's index among the ranks of its host.
        self.local_rank: int = layout[0]
        #: The number of ranks on this rank's host.
        self.local_world_size: int = layout[1]
        #: This host's index among the distinct hosts, ordered by their lowest rank.
        self.node_rank: int = layout[2]
        #: The number of distinct hosts.
        self.num_nodes: int = layout[3]
        #: How this rank's messages travel: "shm" (every rank on this host), "tcp" (every peer over TCP:
        #: PYCOLL_TRANSPORT=tcp, or one rank per host) or "mixed" (shared memory to this host's ranks, TCP to
        #: the others).
        self.transport = auto.transport(settings.transport, self.num_nodes, world_size)
        if self.num_nodes > 1 and self.transport == "shm":
            # Every rank saw the same host list, so every rank raises here. A rank hosting the store closes
            # it as it raises: it first waits (bounded) for the others to be past their reads, which
            # would otherwise fail with a lost store instead of this error.
            self._store.add("hosts_checked", 1)
            self._wait_for_ranks_if_hosting("hosts_checked", min(timeout, 10.0))
            raise InvalidUsageError(
                f"rank {rank}: the {world_size} ranks run on {self.num_nodes} hosts "
                f"({_hosts_text(self.hosts)}), but PYCOLL_TRANSPORT=shm connects the ranks of one host only; "
                "unset it (or set tcp). If these ranks do share a host, unset PYCOLL_HOST_ID or give it the "
                "same value on all of them"
            )

        #: (address this rank listens on for TCP, address it tells the other ranks)
        self.addresses = addresses if addresses is not None else self._tcp_addresses()
        if plane is None and (settings.fault_tolerance if fault_tolerance is None else fault_tolerance):
            self._plane = initial_plane(
                self._store, rank, world_size, self.hosts[rank], self.addresses, settings, timeout
            )
        try:
            self._form_native(settings, timeout)
        except BaseException:
            if self._plane is not None:
                self._plane.close()
            raise
        if self._plane is not None:
            self._plane.add_listener(self._on_plane_event)
            self._plane.listener.admit_joins(self.joiners.take)

    def _form_native(self, settings: Settings, timeout: float) -> None:
        rank, world_size = self.rank, self.world_size
        spin, yield_us = auto.wait_policy(settings, self.local_world_size, self.transport, usable_cpus())
        slot_bytes, slots = auto.ring_shape(settings, self.transport, world_size)
        local = [h == self.hosts[rank] for h in self.hosts] if self.transport == "mixed" else []
        bind, advertised = self.addresses if self.transport in ("tcp", "mixed") else ("", "")
        self._native = _C.NativeCommunicator(
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
        if self.transport in ("shm", "mixed"):
            self._attach_shared_memory(timeout, local)
        if self.transport in ("tcp", "mixed"):
            self._connect_tcp(advertised, timeout, local)
        # Counted so that a rank hosting the store keeps it up until every rank is past the barrier.
        self._store.add("past_setup", 1)
        self.segment_bytes = int(self._native.segment_bytes)
        self.fragment_bytes = int(self._native.fragment_bytes)
        self._gpu_topology_setting: dict[str, Any] = {}  # PYCOLL_TOPOLOGY, rank 0's (_agree_on_model)
        self.model = self._agree_on_model(timeout)
        self._skew = SkewTracker(self)
        self._skew.sync_clocks(clock_domain(boot_id(), round(settings.fake_clock_offset_s * 1e9)), timeout)
        if settings.straggler_ms is not None and settings.skew:
            self._skew.add(None, settings.straggler_ms, min(STRAGGLER_WINDOW, settings.skew_window))
        log.info(
            "rank %d/%d: %s transport to every peer (%d slots x %d KiB per link), "
            "spin %d us, yield %d us, reduce loops %s",
            rank,
            world_size,
            {"shm": "shared-memory", "tcp": "TCP", "mixed": "shared-memory (this host) and TCP"}[
                self.transport
            ],
            slots,
            slot_bytes // 1024,
            spin,
            yield_us,
            _C.reduce_isa(),
        )

    def _attach_shared_memory(self, timeout: float, local: list[bool]) -> None:
        """Maps the segments of this host's ranks (``local``; empty: every rank is on this host)."""
        native = self._native
        assert native is not None
        self._store.set(f"shm/{self.rank}", f"{os.getpid()},{native.segment_fd}".encode())
        pids, fds = [], []
        for r in range(self.world_size):
            pid, fd = self._store.get(f"shm/{r}", timeout).decode().split(",")
            here = not local or local[r]
            pids.append(int(pid) if here else 0)  # 0: a rank of another host, reached over TCP
            fds.append(int(fd) if here else -1)
        native.connect(pids, fds)
        store_barrier(
            self._store, "attached", self.rank, self.world_size, timeout, what="shared-memory set-up"
        )
        native.close_segment_fd()

    def _tcp_addresses(self) -> tuple[str, str]:
        """(address this rank's TCP transport listens on, address it tells the other ranks)."""
        if self.settings.socket_ifname is not None:
            address = interface_address(self.settings.socket_ifname)
            return address, address
        if self.num_nodes == 1 or len(set(self.hosts)) == 1:
            return "127.0.0.1", "127.0.0.1"
        return "0.0.0.0", reachable_address(self._store)

    def _connect_tcp(self, advertised: str, timeout: float, local: list[bool]) -> None:
        """Every rank publishes where it listens; each dials the ranks below it, and both ends of every
        connection prove they hold the job's key (csrc/transport/tcp.h). The key is rank 0's random job
        key from the store; with PYCOLL_SECRET it is HMAC(secret, job key), so that someone who read the
        store's traffic (authenticated, not encrypted) still cannot connect."""
        native = self._native
        assert native is not None
        if self.rank == 0:
            self._store.set("tcp/job_key", secrets.token_hex(32).encode())
        key = bytes.fromhex(self._store.get("tcp/job_key", timeout).decode())
        secret = rendezvous_secret()
        if secret is not None:
            key = hmac.new(secret, b"pycoll tcp data sockets\0" + key, hashlib.sha256).digest()
        self._store.set(f"tcp/{self.rank}", f"{advertised}:{native.tcp_port}".encode())
        addresses = [self._store.get(f"tcp/{r}", timeout).decode() for r in range(self.world_size)]
        if local:  # this host's ranks are reached over shared memory
            addresses = ["" if here else a for a, here in zip(addresses, local)]
        native.connect_tcp(addresses, key, timeout)
        store_barrier(self._store, "connected", self.rank, self.world_size, timeout, what="TCP set-up")

    def _agree_on_model(self, timeout: float) -> Model:
        """The cost model ``auto`` chooses by: rank 0's (this host's calibration, or the defaults),
        handed to every rank through the store, so that all ranks make the same choices."""
        if self.rank == 0:
            model = None
            if auto.uses_calibration(self.transport):
                model = load_model(
                    segment_bytes=self.segment_bytes,
                    fragment_bytes=self.fragment_bytes,
                    workers=usable_cpus(),
                )
            if model is None:
                model = auto.default_model(
                    self.transport,
                    workers=usable_cpus(),
                    segment_bytes=self.segment_bytes,
                    fragment_bytes=self.fragment_bytes,
                )
            self._gpu_topology_setting = auto.gpu_topology_setting(self.settings.gpu_topology)
            self._store.set("gpu-topology", json.dumps(self._gpu_topology_setting).encode())
            self._store.set("tuning", json.dumps(model_to_dict(model)).encode())
            return model
        self._gpu_topology_setting = json.loads(self._store.get("gpu-topology", timeout).decode())
        return model_from_dict(json.loads(self._store.get("tuning", timeout).decode()))

    # ---- plans -------------------------------------------------------------------------------------
    def native_plan(
        self,
        collective: str,
        algorithm: str,
        count: int,
        itemsize: int,
        root: int = 0,
        codec: Any = None,
        segment_bytes: int | None = None,
    ) -> Any:
        """The compiled plan (cached). With a codec, an all-reduce plan on float32 cut at its blocks.
        ``segment_bytes``: the largest message (default: the shared-memory transport's segment)."""
        layout = None if codec is None else (codec.block_elems, codec.block_bytes)
        segment_bytes = segment_bytes or self.segment_bytes
        key = (collective, algorithm, count, itemsize, root, layout, segment_bytes)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        if layout is not None:
            itemsize = 4  # the executor works on float32 (wider types are widened first)
        p = self._python_plan(self.rank, collective, algorithm, count, itemsize, root, layout, segment_bytes)
        table, starts = p.to_table()
        plan = _C.NativePlan(
            table,
            starts,
            itemsize,
            p.input_count,
            p.output_count,
            self.rank,
            self.world_size,
            coded=layout is not None,
        )
        self._plans[key] = plan
        if len(self._plans) > _PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        if log.isEnabledFor(logging.INFO):
            bucket = (collective, algorithm, max(count * itemsize, 1).bit_length(), repr(codec))
            if bucket not in self._logged:
                self._logged.add(bucket)
                log.info(
                    "rank %d: %s of %d bytes uses %s%s (%d steps, %d ops)",
                    self.rank,
                    collective,
                    count * itemsize,
                    algorithm,
                    "" if codec is None else f" with {codec!r}",
                    plan.num_steps,
                    plan.num_ops,
                )
        if log.isEnabledFor(5):  # TRACE
            for i, step in enumerate(p.steps):
                log.log(5, "rank %d %s/%s step %d: %s", self.rank, collective, algorithm, i, step)
        return plan

    def _python_plan(
        self,
        rank: int,
        collective: str,
        algorithm: str,
        count: int,
        itemsize: int,
        root: int,
        layout: Any,
        segment_bytes: int,
    ) -> Plan:
        local_size = self._hierarchy() if algorithm == "hierarchical" else 1
        if layout is not None:
            segment_blocks = max(1, segment_bytes // layout[1])
            return build_compressed_plan(
                algorithm, rank, self.world_size, count, layout[0], segment_blocks, local_size
            )
        segment_elems = max(1, segment_bytes // itemsize)
        return build_plan(
            collective,
            algorithm,
            rank,
            self.world_size,
            count,
            root=root,
            segment_elems=segment_elems,
            local_size=local_size,
        )

    @functools.cached_property
    def gpu_model(self) -> TopologyModel | None:
        """The cost model of the GPU machine, for ``compression="auto"`` on GPU memory
        (``pycoll.auto.gpu_topology``; PYCOLL_TOPOLOGY as rank 0 has it)."""
        return auto.gpu_topology(self._gpu_topology_setting, self.hosts)

    @functools.cached_property
    def spans_equal_hosts(self) -> bool:
        """Whether the ranks sit on several hosts with the same number (more than one) of ranks each,
        numbered host by host: where ``algorithm="auto"`` all-reduces with ``hierarchical``. Asked on
        every auto all-reduce, and the hosts never change: worked out once."""
        return auto.spans_equal_hosts(self.hosts)

    def _hierarchy(self) -> int:
        """Ranks per host for ``hierarchical``: hosts must hold equally many ranks, numbered host by host
        (as torchrun, mpirun's default mapping, srun's block distribution and ``pycoll run`` number them)."""
        size = auto.ranks_per_host(self.hosts)
        if size is None:
            raise InvalidUsageError(
                "algorithm='hierarchical' needs the same number of ranks on every host, numbered host by "
                f"host ({_hosts_text(self.hosts)}); use ring, tree or direct"
            )
        return size

    def grouped_program(
        self,
        collective: str,
        algorithm: str,
        count: int,
        itemsize: int,
        root: int = 0,
        codec: Any = None,
        segment_bytes: int | None = None,
    ) -> Any:
        """This rank's grouped program (pycoll/algorithms/grouped.py) for the plan ``native_plan`` returns
        (cached): every rank's plan is built and lowered, which every rank does alike."""
        layout = None if codec is None else (codec.block_elems, codec.block_bytes)
        segment_bytes = segment_bytes or self.segment_bytes
        key = ("grouped", collective, algorithm, count, itemsize, root, layout, segment_bytes)
        program = self._plans.get(key)
        if program is not None:
            self._plans.move_to_end(key)
            return program
        plan = self.native_plan(collective, algorithm, count, itemsize, root, codec, segment_bytes)
        size = 4 if layout is not None else itemsize
        plans = [
            self._python_plan(r, collective, algorithm, count, size, root, layout, segment_bytes)
            for r in range(self.world_size)
        ]
        if codec is None:
            programs = lower_to_groups(plans, lambda op: op.count * size)
        else:
            programs = lower_to_groups(plans, lambda op: codec.encoded_bytes(op.count), compressed=True)
        mine = programs[self.rank]
        program = _C.GroupedProgram(
            plan,
            mine.actions,
            mine.msg_bytes,
            mine.recv_stage,
            mine.send_stage,
            mine.work_stage,
            mine.staging_bytes,
        )
        self._plans[key] = program
        if len(self._plans) > _PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return program

    # ---- running -----------------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self._closed:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        plane = self._plane
        if plane is not None and (plane.evicted is not None or plane.revoked is not None):
            raise self._plane_error()
        if self._broken is not None:
            raise CommunicatorBrokenError(
                f"this communicator failed earlier and cannot be used any more "
                f"({type(self._broken).__name__}: {self._broken}); create a new one"
            )

    def run(
        self,
        collective: str,
        algorithm: str,
        inp: Buffer,
        out: Buffer,
        count: int,
        op: int,
        root: int,
        timeout: float | None,
        codec: Any = None,
        residual: Buffer | None = None,
        *,
        report: bool = True,
    ) -> None:
        """Runs one collective on the calling thread (the GIL is released while it runs).

        ``codec`` (a pycoll.compression.Codec, all-reduce only) compresses the messages; ``residual`` is its
        float32 error-feedback state. ``report=False``: one of the library's own collectives, left out of
        the skew report. Straggler notices that it completed are delivered before it returns.
        """
        native = self._native
        if native is None:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        if codec is None and residual is None:
            args = self.plain_args(collective, algorithm, inp, count, op, root, timeout, report)
            if args is not None:
                self._run_native(native, args, inp.ptr, out.ptr, report)
                return
        timeout_s = self.timeout if timeout is None else timeout
        args = self._make_args(
            collective, algorithm, inp, count, op, root, timeout_s, codec, residual, report
        )
        self._run_native(native, args, inp.ptr, out.ptr, report)

    def plain_args(
        self,
        collective: str,
        algorithm: str,
        inp: Buffer,
        count: int,
        op: int,
        root: int,
        timeout: float | None,
        report: bool = True,
    ) -> Any:
        """The native arguments of a plain (uncompressed) CPU collective of this kind, made once per kind
        of call (making them costs more than the rest of a small call): only the buffers' addresses
        change from call to call. None where each call needs its own (grouped programs)."""
        if self.grouped_on_cpu:
            return None
        timeout_s = self.timeout if timeout is None else timeout
        key = (collective, algorithm, count, inp.code, op, root, timeout_s, report)
        args = self._args.get(key)
        if args is not None:
            self._args.move_to_end(key)
            return args
        args = self._make_args(collective, algorithm, inp, count, op, root, timeout_s, None, None, report)
        self._args[key] = args
        if len(self._args) > _ARGS_CACHE_SIZE:
            self._args.popitem(last=False)
        return args

    def _make_args(
        self,
        collective: str,
        algorithm: str,
        inp: Buffer,
        count: int,
        op: int,
        root: int,
        timeout_s: float,
        codec: Any,
        residual: Buffer | None,
        report: bool,
    ) -> Any:
        plan = self.native_plan(collective, algorithm, count, inp.itemsize, root, codec)
        program = None
        if self.grouped_on_cpu:
            program = self.grouped_program(collective, algorithm, count, inp.itemsize, root, codec)
        args = _C.CollectiveArgs(  # the buffers' addresses are given per call (_run_native)
            plan=plan,
            dtype=inp.code,
            op=op,
            collective=COLLECTIVE_CODES[collective],
            algorithm=ALGORITHM_CODES[algorithm],
            count=count,
            root=root,
            codec=None if codec is None else codec.native(),
            codec_id=0 if codec is None else codec.wire_id,
            residual=0 if residual is None else residual.ptr,
            seed=0 if codec is None else codec.seed,
            timeout_s=timeout_s,
            program=program,
        )
        if not report:
            args.skew = False
        return args

    def remember_in_place(
        self,
        key: tuple,
        dtype: Any,
        collective: str,
        algorithm: str,
        buf: Buffer,
        op: int,
        timeout: float | None,
    ) -> None:
        """Keeps the prepared arguments of a validated in-place call on arrays of ``dtype`` (a numpy dtype,
        matched by identity: byte-swapped variants are other objects) under ``key`` (``in_place``)."""
        args = self.plain_args(collective, algorithm, buf, buf.count, op, 0, timeout)
        if args is None:
            return
        if len(self.in_place) >= _ARGS_CACHE_SIZE:
            self.in_place.clear()
        self.in_place[key] = (dtype, args)

    def run_in_place(self, args: Any, array: Any) -> bool:
        """The fast path of a small call (pycoll.allreduce on a numpy array like one it ran before):
        ``args`` from plain_args, run in place on ``array``. False, with nothing run, where the call must
        take the full path: an asynchronous collective was ever started (call order is kept there), the
        communicator failed or runs grouped programs, or the array is not writable and C-contiguous."""
        native = self._native
        if native is None or self._async is not None or self._broken is not None or self.grouped_on_cpu:
            return False
        try:
            events = native.run_in_place(args, array)
        except BaseException as e:
            self._native_failed(e)
        if events > 0 and self._skew is not None:
            self._skew.dispatch()
        return events >= 0

    def _run_native(self, native: _C.NativeCommunicator, args: Any, inp: int, out: int, report: bool) -> None:
        """Runs prepared arguments on the buffers at ``inp`` and ``out``."""
        try:
            events = native.run_at(args, inp, out)
        except BaseException as e:
            self._native_failed(e)
        if events and report and self._skew is not None:  # never inside the library's own collectives
            self._skew.dispatch()

    def _native_failed(self, e: BaseException) -> NoReturn:
        """Raises what the failure ``e`` of a native collective means for this communicator: broken,
        revoked, a death the control plane should hear of."""
        if isinstance(e, PycollError):
            if isinstance(e, InvalidUsageError):
                raise e
            self._broken = e
            plane = self._plane
            if plane is not None:
                lost = getattr(e, "rank", -1)
                if isinstance(e, PeerLostError) and lost >= 0:
                    # The data transport saw the death first: the control plane (and so every other
                    # rank's shrink) learns it from here too.
                    plane.found_dead(lost, f"its data connection to rank {self.rank} broke ({e})")
                plane.settle()  # an eviction or revocation already on its way explains the error
                if plane.evicted is not None or (
                    not isinstance(e, CollectiveMismatchError) and (plane.revoked is not None or plane.dead)
                ):
                    raise self._plane_error(prefer=lost) from e
            raise e
        # KeyboardInterrupt mid-collective: the peers were told, this is over
        self._broken = e
        if self._plane is not None:
            self._plane.revoke(f"rank {self.rank} was interrupted ({type(e).__name__})")
        raise e

    def native(self) -> _C.NativeCommunicator:
        """The native communicator; InvalidUsageError once finalized."""
        if self._native is None:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        return self._native

    # ---- skew (pycoll/skew/) -------------------------------------------------------------------------
    def skew(self, window: int | None = None, timeout: float | None = None) -> SkewReport:
        """Who entered this communicator's collectives late, and how long the others waited for them
        (docs/skew.md): per rank and collective kind, over the whole run and the last ``window``
        collectives (default: PYCOLL_SKEW_WINDOW). A collective: every rank must call it, and gets the
        same report. ``self.skew_local()`` is this rank's own view, without communication."""
        self.check_usable()
        if window is not None and (not isinstance(window, int) or window < 0):
            raise InvalidUsageError(f"window must be a number of collectives >= 0, got {window!r}")
        tracker = self._skew
        assert tracker is not None
        return cast(SkewReport, self.submit(lambda: tracker.gathered_report(window, timeout), False))

    def skew_local(self, window: int | None = None) -> SkewReport:
        """This rank's own skew report: every rank records every rank's lateness, so it differs from
        ``skew()`` only in collectives whose stamps have not all reached this rank yet. Works on a broken
        communicator; no communication."""
        if self._skew is None or self._native is None:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        return self._skew.local_report(window)

    def on_straggler(
        self,
        callback: Callable[[StragglerEvent], None] | None = None,
        *,
        late_ms: float,
        window: int = STRAGGLER_WINDOW,
    ) -> Notice:
        """Calls ``callback(event)`` when one rank's mean lateness over the last ``window`` collectives
        passes ``late_ms``, and again once per window while it stays above: on every rank, after the same
        collective (the one that completed the window, or up to 3 later: collectives are processed 4 at a
        time); rank 0 also logs a WARNING on the ``pycoll`` logger (at most one a
        minute per rank). ``callback=None``: the WARNING only. Returns a Notice (``.remove()``)."""
        if self._skew is None or self._native is None:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        return self._skew.add(callback, late_ms, window)

    def gpu(self) -> GpuSide:
        """The GPU side (NCCL communicator, device, watchdog), made at the first GPU collective."""
        if self._gpu is None:
            from pycoll.gpu import GpuSide

            self._gpu = GpuSide(self)
        return self._gpu

    def run_gpu(
        self,
        collective: str,
        algorithm: str,
        inp: Buffer,
        out: Buffer,
        count: int,
        op: int,
        root: int,
        timeout: float | None,
        codec: Any = None,
        residual: Buffer | None = None,
    ) -> Enqueued:
        """Enqueues one collective on GPU memory (pycoll/gpu.py); returns it (its CUDA event, deadline)."""
        self.check_usable()
        with self._lock:  # one rank's GPU collectives are enqueued in call order, from any thread
            try:
                return self.gpu().run(
                    collective, algorithm, inp, out, count, op, root, timeout, codec, residual
                )
            except PycollError as e:
                if not isinstance(e, InvalidUsageError):
                    self._broken = e
                    if self._gpu is not None:
                        self._gpu.fail(e)
                raise

    def submit(self, fn: Callable[[], Any], async_op: bool) -> Any:
        """Runs fn now (sync) or on the communicator's worker thread (async), keeping call order."""
        if self._broken is not None or self._closed:
            self.check_usable()
        if not async_op and self._async is None:
            return fn()  # the common case: nothing asynchronous was ever started
        if not async_op and threading.get_ident() == self._worker_ident:
            # A synchronous call from the worker thread itself: a future's callback (e.g. a DDP hook's
            # fut.then(...)) runs there when its collective finishes. Queuing it behind the next
            # asynchronous collective and waiting would wait for this very thread; run it now, between
            # the finished collective and the next one, which is the same point on every rank.
            return fn()
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            if not async_op and not self._pending:
                fut = None
            else:
                if self._async is None:
                    self._async = ThreadPoolExecutor(
                        max_workers=1,
                        thread_name_prefix=f"pycoll-rank{self.rank}",
                        initializer=self._note_worker,
                    )
                fut = self._async.submit(fn)
                self._pending.append(fut)
        if fut is None:
            return fn()
        return fut if async_op else fut.result()

    def _note_worker(self) -> None:
        self._worker_ident = threading.get_ident()

    # ---- fault tolerance (pycoll/fault/) -----------------------------------------------------------
    def plane_required(self) -> Plane:
        if self._plane is None:
            raise InvalidUsageError(
                "this communicator has no control plane (it was made with fault_tolerance=False or "
                "PYCOLL_FAULT_TOLERANCE=0), so it cannot revoke, agree, shrink or grow"
            )
        return self._plane

    def _on_plane_event(self, kind: str, rank: int, why: str) -> None:
        """The control plane found a member dead, or the communicator revoked, or this rank evicted: every
        pending and later collective on this rank must raise."""
        native = self._native
        if native is None:
            return
        if kind == "dead":
            native.abort(2, f"rank {rank} is lost: {why}")
        else:
            native.abort(6, f"the communicator was revoked ({why})")
        if self._gpu is not None:
            self._gpu.fail(self._plane_error())

    def _plane_error(self, prefer: int = -1) -> PycollError:
        """What a collective on a revoked communicator raises: EvictedError on an evicted rank, the loss
        that caused it (PeerLostError), or CommunicatorRevokedError."""
        plane = self._plane
        assert plane is not None
        if plane.evicted is not None:
            return EvictedError(
                f"rank {self.rank} was evicted from its communicator ({plane.evicted}); the other ranks went "
                "on without it. A new process may join the job (pycoll.init(join=...))"
            )
        if plane.dead:
            r = prefer if prefer in plane.dead else min(plane.dead)
            why = plane.dead[r]
            return PeerLostError(
                f"rank {r} of the communicator is lost ({why}); the communicator was revoked on every rank: "
                "call comm.shrink() to go on with the survivors",
                rank=r,
            )
        return CommunicatorRevokedError(
            f"the communicator was revoked ({plane.revoked}); call comm.shrink() to make a new one"
        )

    def revoke(self, why: str | None = None) -> None:
        """Revokes this communicator on every rank: every pending and later collective raises
        (CommunicatorRevokedError, or the PeerLostError that caused it). Local and idempotent; any thread."""
        why = why or f"revoked by rank {self.rank}"
        if self._plane is not None:
            self._plane.revoke(why)
        elif self._native is not None:
            self._native.abort(6, f"the communicator was revoked ({why})")
        if self._broken is None:
            self._broken = CommunicatorRevokedError(why)

    def agree(self, flag: bool, timeout: float | None = None) -> tuple[bool, frozenset[int]]:
        """A fault-tolerant AND of ``flag`` over the live ranks, and the ranks found dead: the same pair on
        every survivor. Works on a broken or revoked communicator; every rank must call it."""
        d: Decision = self.plane_required().agreements.agree(
            bool(flag), None, self.timeout if timeout is None else timeout
        )
        return d.flag, d.dead

    def shrink(self, timeout: float | None = None) -> Communicator:
        """The survivors' communicator: revokes this one, agrees on which ranks are dead (no list from the
        caller), and returns a new communicator of the others with contiguous ranks (old order), epoch + 1,
        ``parent_ranks`` and the same settings. Call it on every surviving rank, after any error; this
        communicator is finalized. On a rank the others found dead it raises EvictedError."""
        return membership.shrink(self, self.timeout if timeout is None else timeout)

    def grow(
        self, timeout: float | None = None, *, min_joiners: int = 1, max_joiners: int | None = None
    ) -> Communicator:
        """Admits the processes that asked to join (``pycoll.init(join=...)``), waiting up to ``timeout``
        for at least ``min_joiners``: they get the next ranks in a new communicator (epoch + 1), returned
        here on every member. Atomic: if a joiner or member fails half-way it raises and this communicator
        stays usable. ``max_joiners``: admit at most this many (the others wait for a later grow)."""
        if min_joiners < 1:
            raise InvalidUsageError(f"min_joiners must be >= 1, got {min_joiners}")
        return membership.grow(self, self.timeout if timeout is None else timeout, min_joiners, max_joiners)

    @property
    def join_address(self) -> str:
        """Where a new process asks to join (``pycoll.init(join=comm.join_address)``): this rank's control
        socket, "host:port"."""
        return self.plane_required().listener.address

    def replaced_by(self, new: Communicator) -> None:
        """A shrink or grow made ``new`` out of this one: whoever followed this one (the default
        communicator of ``pycoll.api``) follows ``new``, and this one is finalized."""
        for fn in self._replaced:
            fn(new)
            new._replaced.append(fn)
        self.finalize()

    # ---- teardown ----------------------------------------------------------------------------------
    def _wait_for_ranks_if_hosting(self, counter: str, seconds: float) -> None:
        """When this rank hosts the store, wait (at most ``seconds``) until every rank has added 1 to
        ``counter``, so that closing the store cuts nobody off; best effort."""
        if not any(isinstance(obj, TCPStoreServer) for obj in self._owned):
            return
        deadline = time.monotonic() + seconds
        try:
            while self._store.add(counter, 0) < self.world_size and time.monotonic() < deadline:
                time.sleep(0.005)
        except PycollError:
            pass

    def finalize(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._async is not None:
            self._async.shutdown(wait=True)
            self._async = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
        if self.settings.skew_report and self._skew is not None and self._native is not None:
            self._skew.write(self.settings.skew_report)
        self._native = None  # unmaps the segments (the kernel frees them when the last rank lets go)
        if self._broken is not None:
            # The error's traceback holds the frames of the failed call, and they the native transport:
            # dropped, so that finalizing a broken communicator frees its memory and sockets now.
            self._broken.__traceback__ = None
        if self._plane is not None:
            if self._plane.listener.join_handler() == self.joiners.take:
                self._plane.listener.admit_joins(None)
            self._plane.close()
        if self._broken is None:
            # This rank hosts the store: do not pull it from under ranks still finishing set-up.
            self._wait_for_ranks_if_hosting("past_setup", min(self.timeout, 10.0))
        for obj in self._owned:
            try:
                obj.close()
            except Exception:  # noqa: BLE001 - teardown must not mask the user's own error
                log.debug("closing %r failed", obj, exc_info=True)
        self._owned = ()
