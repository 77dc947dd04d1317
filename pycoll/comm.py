"""The communicator: a group of ranks, the native transport that connects them, and the collectives run
on it. ``pycoll.init()`` makes one; the collectives in ``pycoll.api`` run on it.

A thin front over its parts, each in a module of its own:

    formation    pycoll/formation.py  which ranks share a host, the transport, the agreed cost model
    dispatcher   pycoll/dispatch.py   the executors each validated call (pycoll/call.py) runs on, the
                                      plans they run (pycoll/plans.py), the worker thread
    fault plane  pycoll/fault/        revoke, agree, shrink, grow; finding a stopped rank
    skew         pycoll/skew/         who entered late
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn, cast

from pycoll import auto
from pycoll.bootstrap import PrefixStore, Store, TCPStoreServer
from pycoll.bootstrap.failfast import LINGER_S, FailFastStore
from pycoll.call import Call
from pycoll.codes import ERROR_KIND_CODES
from pycoll.dispatch import Dispatcher
from pycoll.env import STRAGGLER_WINDOW, Settings
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
from pycoll.formation import boot_id, discover_hosts, form, host_layout, hosts_text, tcp_addresses
from pycoll.formation import host_id as host_id  # (re-exported: where it was before pycoll.formation)
from pycoll.skew.report import SkewReport
from pycoll.skew.tracker import Notice, SkewTracker, StragglerEvent, clock_domain
from pycoll.tuning import Model
from pycoll.tuning.topology import TopologyModel

if TYPE_CHECKING:
    from pycoll.gpu import GpuSide

log = logging.getLogger("pycoll")

__all__ = ["Communicator", "host_id", "host_layout"]


class Communicator:
    """Ranks 0..world_size-1 of one job, connected over shared memory (one host) or TCP (several hosts).

    Collectives on one communicator must be called in the same order by every rank. A communicator that
    saw an error (timeout, lost peer, mismatch) is broken: every later call raises
    CommunicatorBrokenError; ``shrink()`` makes one of the surviving ranks (docs/fault-tolerance.md).
    """

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
        self._native: Any = None
        self._plane: Plane | None = plane
        #: The error that broke this communicator (every later call raises CommunicatorBrokenError), or None.
        self.broken: BaseException | None = None
        #: Whether ``finalize`` ran.
        self.closed = False
        #: Run CPU collectives as grouped programs (whole messages in matched groups, as GPUs run them over
        #: NCCL) instead of fragment by fragment: slower, and meant for the tests that check those programs.
        self.grouped_on_cpu = False
        self._gpu: GpuSide | None = None
        self._skew: SkewTracker | None = None
        self._replaced: list[Callable[[Communicator], None]] = []
        self.joiners = Joiners()
        #: The membership generation: 0 for a communicator made by ``pycoll.init``, one more for each
        #: shrink or grow it came from.
        self.epoch = epoch
        #: For each rank, its rank in the communicator this one was shrunk or grown from (-1: a process
        #: that joined); ``range(world_size)`` for one made by ``pycoll.init``.
        self.parent_ranks: tuple[int, ...] = (
            parent_ranks if parent_ranks is not None else tuple(range(world_size))
        )
        # Keys of the n-th communicator formed on this store. n is counted per rank in the store itself,
        # not per process: ranks that made different numbers of communicators elsewhere (on other
        # groups' stores) still agree on it.
        n = store.add(f"pycoll/communicators/{rank}", 1)
        # On a rendezvous store, its waits end early, naming the rank, when a peer's set-up fails
        # (_announce_failure); a fault plane's store (shrink, grow) ends them itself when a member is lost.
        prefixed = PrefixStore(store, f"pycoll/comm{n}")
        #: This communicator's keys in the store it was formed on.
        self.store: Store = (
            prefixed if plane is not None else FailFastStore(prefixed, "failure", rank=rank, timeout=timeout)
        )
        try:
            self._form(settings, timeout, fault_tolerance, addresses)
        except BaseException as exc:
            self._announce_failure(exc)
            raise

    def _form(
        self,
        settings: Settings,
        timeout: float,
        fault_tolerance: bool | None,
        addresses: tuple[str, str] | None,
    ) -> None:
        rank, world_size = self.rank, self.world_size
        #: Every rank's host id, in rank order (ranks with the same id share memory).
        self.hosts: list[str] = discover_hosts(self.store, rank, world_size, settings, timeout)
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
            self.store.add("hosts_checked", 1)
            self._wait_for_ranks_if_hosting("hosts_checked", min(timeout, 10.0))
            raise InvalidUsageError(
                f"rank {rank}: the {world_size} ranks run on {self.num_nodes} hosts "
                f"({hosts_text(self.hosts)}), but PYCOLL_TRANSPORT=shm connects the ranks of one host only; "
                "unset it (or set tcp). If these ranks do share a host, unset PYCOLL_HOST_ID or give it the "
                "same value on all of them"
            )
        #: (address this rank listens on for TCP, address it tells the other ranks)
        self.addresses = (
            addresses if addresses is not None else tcp_addresses(settings, self.store, self.hosts)
        )
        if self._plane is None and (settings.fault_tolerance if fault_tolerance is None else fault_tolerance):
            self._plane = initial_plane(
                self.store, rank, world_size, self.hosts[rank], self.addresses, settings, timeout
            )
        try:
            formed = form(
                self.store, rank, world_size, self.hosts, self.transport, self.addresses, settings, timeout
            )
            self._native = formed.native
            self.segment_bytes = formed.segment_bytes
            self.fragment_bytes = formed.fragment_bytes
            #: The cost model ``auto`` chooses by: rank 0's, the same on every rank.
            self.model: Model = formed.model
            self._gpu_topology_setting = formed.gpu_topology_setting  # PYCOLL_TOPOLOGY, rank 0's
            self.dispatcher = Dispatcher(self)
            #: pycoll.allreduce's fast path (read there): the fragment executor's prepared calls.
            self.prepared = self.dispatcher.cpu.prepared
            self.run_prepared = self.dispatcher.cpu.run_prepared
            self._skew = SkewTracker(self)
            offset = round(settings.fake_clock_offset_s * 1e9)
            self._skew.sync_clocks(clock_domain(boot_id(), offset), timeout)
            if settings.straggler_ms is not None and settings.skew:
                self._skew.add(None, settings.straggler_ms, min(STRAGGLER_WINDOW, settings.skew_window))
        except BaseException:
            if self._plane is not None:
                self._plane.close()
            raise
        if self._plane is not None:
            self._plane.add_listener(self._on_plane_event)
            self._plane.listener.admit_joins(self.joiners.take)

    def _announce_failure(self, exc: BaseException) -> None:
        """Set-up failed once the communicator's store existed: tell the other ranks through it, so that
        they stop waiting for this one (pycoll/bootstrap/failfast.py). A rank hosting the store keeps it
        up briefly for them to read that."""
        if isinstance(self.store, FailFastStore):
            hosting = any(isinstance(obj, TCPStoreServer) for obj in self._owned)
            self.store.announce(exc, self.world_size, linger=LINGER_S if hosting else 0.0)

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

    @property
    def plans(self) -> Any:
        """The compiled plans and grouped programs (pycoll/plans.py ``PlanCache``)."""
        return self.dispatcher.plans

    # ---- running -----------------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.closed:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        plane = self._plane
        if plane is not None and (plane.evicted is not None or plane.revoked is not None):
            raise self._plane_error()
        if self.broken is not None:
            raise CommunicatorBrokenError(
                f"this communicator failed earlier and cannot be used any more "
                f"({type(self.broken).__name__}: {self.broken}); create a new one"
            )

    def launch(self, call: Call) -> Any:
        """Runs one validated call (pycoll/call.py) on its executor (pycoll/dispatch.py): its result, or a
        Work when ``call.async_op``."""
        return self.dispatcher.launch(call)

    def submit(self, fn: Callable[[], Any], async_op: bool) -> Any:
        """Runs fn now (sync) or on the communicator's worker thread (async), in call order with the
        collectives (pycoll/dispatch.py ``Worker``)."""
        return self.dispatcher.worker.submit(fn, async_op)

    def native_failed(self, e: BaseException) -> NoReturn:
        """Raises what the failure ``e`` of a native collective means for this communicator: broken,
        revoked, a death the fault plane should hear of."""
        if isinstance(e, PycollError):
            if isinstance(e, InvalidUsageError):
                raise e
            self.broken = e
            plane = self._plane
            if plane is not None:
                lost = getattr(e, "rank", -1)
                if isinstance(e, PeerLostError) and lost >= 0:
                    # The data transport saw the death first: the fault plane (and so every other
                    # rank's shrink) learns it from here too.
                    plane.found_dead(lost, f"its data connection to rank {self.rank} broke ({e})")
                plane.settle()  # an eviction or revocation already on its way explains the error
                if plane.evicted is not None or (
                    not isinstance(e, CollectiveMismatchError) and (plane.revoked is not None or plane.dead)
                ):
                    raise self._plane_error(prefer=lost) from e
            raise e
        # KeyboardInterrupt mid-collective: the peers were told, this is over
        self.broken = e
        if self._plane is not None:
            self._plane.revoke(f"rank {self.rank} was interrupted ({type(e).__name__})")
        raise e

    def break_with(self, error: BaseException) -> bool:
        """Marks the communicator broken by ``error`` unless it already was; whether it was this call."""
        if self.broken is not None:
            return False
        self.broken = error
        return True

    def native(self) -> Any:
        """The native communicator (``_C.NativeCommunicator``); InvalidUsageError once finalized."""
        if self._native is None:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        return self._native

    def native_or_none(self) -> Any:
        """The native communicator, or None once finalized (for what must not raise then)."""
        return self._native

    def deliver_straggler_events(self) -> None:
        """After a collective that left straggler events: their WARNING and callbacks (pycoll/skew/)."""
        if self._skew is not None:
            self._skew.dispatch()

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

    # ---- fault tolerance (pycoll/fault/) -----------------------------------------------------------
    def plane_required(self) -> Plane:
        if self._plane is None:
            raise InvalidUsageError(
                "this communicator has no fault plane (it was made with fault_tolerance=False or "
                "PYCOLL_FAULT_TOLERANCE=0), so it cannot revoke, agree, shrink or grow"
            )
        return self._plane

    def _on_plane_event(self, kind: str, rank: int, why: str) -> None:
        """The fault plane found a member dead, or the communicator revoked, or this rank evicted: every
        pending and later collective on this rank must raise."""
        native = self._native
        if native is None:
            return
        if kind == "dead":
            native.abort(ERROR_KIND_CODES["peer_lost"], f"rank {rank} is lost: {why}")
        else:
            native.abort(ERROR_KIND_CODES["broken"], f"the communicator was revoked ({why})")
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
            self._native.abort(ERROR_KIND_CODES["broken"], f"the communicator was revoked ({why})")
        if self.broken is None:
            self.broken = CommunicatorRevokedError(why)

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
    def plane(self) -> Plane | None:
        """The communicator's fault plane (pycoll/fault/plane.py): its control links to every rank, with
        their failure detector; None when it was formed without one (``fault_tolerance=False``)."""
        return self._plane

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
            while self.store.add(counter, 0) < self.world_size and time.monotonic() < deadline:
                time.sleep(0.005)
        except PycollError:
            pass

    def finalize(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.dispatcher.close()
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
        if self.settings.skew_report and self._skew is not None and self._native is not None:
            self._skew.write(self.settings.skew_report)
        self._native = None  # unmaps the segments (the kernel frees them when the last rank lets go)
        if self.broken is not None:
            # The error's traceback holds the frames of the failed call, and they the native transport:
            # dropped, so that finalizing a broken communicator frees its memory and sockets now.
            self.broken.__traceback__ = None
        if self._plane is not None:
            if self._plane.listener.join_handler() == self.joiners.take:
                self._plane.listener.admit_joins(None)
            self._plane.close()
        if self.broken is None:
            # This rank hosts the store: do not pull it from under ranks still finishing set-up.
            self._wait_for_ranks_if_hosting("past_setup", min(self.timeout, 10.0))
        for obj in self._owned:
            try:
                obj.close()
            except Exception:  # noqa: BLE001 - teardown must not mask the user's own error
                log.debug("closing %r failed", obj, exc_info=True)
        self._owned = ()
