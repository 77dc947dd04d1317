"""The communicator: a group of ranks, the native transport that connects them, and the collectives run
on it. ``pycoll.init()`` makes one; the collectives in ``pycoll.api`` run on it.

A thin front over its parts, each in a module of its own and each built from the communicator's Context
(pycoll/context.py: the formed group's facts and its state), never from the Communicator itself:

    formation    pycoll/formation.py  the rounds through the store that form the group and its Context:
                                      who shares a host, the transport, the agreed cost model, the plane
    dispatcher   pycoll/dispatch.py   the executors each validated call (pycoll/call.py) runs on, the
                                      plans they run (pycoll/plans.py), the worker thread, the GPU side
    fault plane  pycoll/fault/        revoke, agree, shrink, grow (given a way to build the next
                                      communicator: ``_change``); finding a stopped rank
    skew         pycoll/skew/         who entered late
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn, cast

from pycoll import formation
from pycoll.bootstrap import PrefixStore, Store, TCPStoreServer
from pycoll.bootstrap.failfast import LINGER_S, FailFastStore
from pycoll.call import Call
from pycoll.context import Context
from pycoll.dispatch import Dispatcher
from pycoll.env import STRAGGLER_WINDOW, Settings
from pycoll.errors import CollectiveMismatchError, CommunicatorRevokedError, InvalidUsageError, PycollError
from pycoll.fault import membership
from pycoll.fault.agreement import Decision
from pycoll.fault.membership import Change, Joiners
from pycoll.fault.plane import Plane
from pycoll.formation import host_id as host_id  # (re-exported: where it was before pycoll.formation)
from pycoll.formation import host_layout
from pycoll.skew.report import SkewReport
from pycoll.skew.tracker import Notice, SkewTracker, StragglerEvent

if TYPE_CHECKING:
    from pycoll.gpu import GpuSide
    from pycoll.tuning import Model
    from pycoll.tuning.topology import TopologyModel

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
        self._owned = owned  # store client / server this communicator closes at finalize
        self._world = world_size  # (for _announce_failure, which may run before the context exists)
        self._replaced: list[Callable[[Communicator], None]] = []
        self.joiners = Joiners()
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
            self._ctx = formation.form(
                self.store,
                rank,
                world_size,
                settings=settings,
                timeout=timeout,
                plane=plane,
                fault_tolerance=settings.fault_tolerance if fault_tolerance is None else fault_tolerance,
                addresses=addresses,
                epoch=epoch,
                parent_ranks=parent_ranks if parent_ranks is not None else tuple(range(world_size)),
                hosting=self._hosting,
            )
        except BaseException as exc:
            self._announce_failure(exc)
            raise
        ctx = self._ctx
        try:
            self.dispatcher = Dispatcher(ctx)
            self._skew = SkewTracker(ctx, self.dispatcher.launch)
            self.dispatcher.on_events = self._skew.dispatch
            self._skew.sync_clocks(timeout)
            if settings.straggler_ms is not None and self.native().skew_enabled:
                self._skew.add(None, settings.straggler_ms, min(STRAGGLER_WINDOW, settings.skew_window))
        except BaseException:
            if ctx.plane is not None:
                ctx.plane.close()
            raise
        #: pycoll.allreduce's fast path (read there): the fragment executor's prepared calls.
        self.prepared = self.dispatcher.cpu.prepared
        self.run_prepared = self.dispatcher.cpu.run_prepared
        if ctx.plane is not None:
            ctx.plane.add_listener(self._on_plane_event)
            ctx.plane.listener.admit_joins(self.joiners.take)

    @property
    def _hosting(self) -> bool:
        """Whether this rank hosts the rendezvous store (then it must not close it under the others)."""
        return any(isinstance(obj, TCPStoreServer) for obj in self._owned)

    def _announce_failure(self, exc: BaseException) -> None:
        """Set-up failed once the communicator's store existed: tell the other ranks through it, so that
        they stop waiting for this one (pycoll/bootstrap/failfast.py). A rank hosting the store keeps it
        up briefly for them to read that."""
        if isinstance(self.store, FailFastStore):
            self.store.announce(exc, self._world, linger=LINGER_S if self._hosting else 0.0)

    # ---- the formed group's facts (pycoll/context.py Group) ------------------------------------------
    @property
    def context(self) -> Context:
        """What this communicator's parts share (pycoll/context.py)."""
        return self._ctx

    @property
    def rank(self) -> int:
        return self._ctx.group.rank

    @property
    def world_size(self) -> int:
        return self._ctx.group.world_size

    @property
    def timeout(self) -> float:
        return self._ctx.group.timeout

    @property
    def settings(self) -> Settings:
        return self._ctx.group.settings

    @property
    def hosts(self) -> list[str]:
        """Every rank's host id, in rank order (ranks with the same id share memory)."""
        return list(self._ctx.group.hosts)

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its host."""
        return self._ctx.group.local_rank

    @property
    def local_world_size(self) -> int:
        """The number of ranks on this rank's host."""
        return self._ctx.group.local_world_size

    @property
    def node_rank(self) -> int:
        """This host's index among the distinct hosts, ordered by their lowest rank."""
        return self._ctx.group.node_rank

    @property
    def num_nodes(self) -> int:
        """The number of distinct hosts."""
        return self._ctx.group.num_nodes

    @property
    def transport(self) -> str:
        """How this rank's messages travel: "shm" (every rank on this host), "tcp" (every peer over TCP:
        PYCOLL_TRANSPORT=tcp, or one rank per host) or "mixed" (shared memory to this host's ranks, TCP
        to the others)."""
        return self._ctx.group.transport

    @property
    def addresses(self) -> tuple[str, str]:
        """(address this rank listens on for TCP, address it tells the other ranks)."""
        return self._ctx.group.addresses

    @property
    def model(self) -> Model:
        """The cost model ``auto`` chooses by: rank 0's, the same on every rank."""
        return self._ctx.group.model

    @property
    def segment_bytes(self) -> int:
        return self._ctx.group.segment_bytes

    @property
    def fragment_bytes(self) -> int:
        return self._ctx.group.fragment_bytes

    @property
    def epoch(self) -> int:
        """The membership generation: 0 for a communicator made by ``pycoll.init``, one more for each
        shrink or grow it came from."""
        return self._ctx.group.epoch

    @property
    def parent_ranks(self) -> tuple[int, ...]:
        """For each rank, its rank in the communicator this one was shrunk or grown from (-1: a process
        that joined); ``range(world_size)`` for one made by ``pycoll.init``."""
        return self._ctx.group.parent_ranks

    @property
    def spans_equal_hosts(self) -> bool:
        """Whether the ranks sit on several hosts with the same number (more than one) of ranks each,
        numbered host by host: where ``algorithm="auto"`` all-reduces with ``hierarchical``."""
        return self._ctx.group.spans_equal_hosts

    @property
    def gpu_model(self) -> TopologyModel | None:
        """The cost model of the GPU machine, for ``compression="auto"`` on GPU memory."""
        return self._ctx.gpu_model

    @property
    def plans(self) -> Any:
        """The compiled plans and grouped programs (pycoll/plans.py ``PlanCache``)."""
        return self.dispatcher.plans

    # ---- its state (pycoll/context.py Context) ---------------------------------------------------------
    @property
    def broken(self) -> BaseException | None:
        """The error that broke this communicator (every later call raises CommunicatorBrokenError), or
        None."""
        return self._ctx.broken

    @property
    def closed(self) -> bool:
        """Whether ``finalize`` ran."""
        return self._ctx.closed

    @property
    def grouped_on_cpu(self) -> bool:
        """Run CPU collectives as grouped programs (whole messages in matched groups, as GPUs run them over
        NCCL) instead of fragment by fragment: slower, and meant for the tests that check those programs."""
        return self._ctx.grouped_on_cpu

    @grouped_on_cpu.setter
    def grouped_on_cpu(self, on: bool) -> None:
        self._ctx.grouped_on_cpu = bool(on)

    def check_usable(self) -> None:
        self._ctx.check_usable()

    def native_failed(self, e: BaseException) -> NoReturn:
        """Raises what the failure ``e`` of a native collective means for this communicator."""
        self._ctx.native_failed(e)

    def break_with(self, error: BaseException) -> bool:
        """Marks the communicator broken by ``error`` unless it already was; whether it was this call."""
        return self._ctx.break_with(error)

    def native(self) -> Any:
        """The native communicator (``_C.NativeCommunicator``); InvalidUsageError once finalized."""
        return self._ctx.native()

    def native_or_none(self) -> Any:
        """The native communicator, or None once finalized (for what must not raise then)."""
        return self._ctx.native_or_none()

    # ---- running -----------------------------------------------------------------------------------
    def launch(self, call: Call) -> Any:
        """Runs one validated call (pycoll/call.py) on its executor (pycoll/dispatch.py): its result, or a
        Work when ``call.async_op``."""
        return self.dispatcher.launch(call)

    def submit(self, fn: Callable[[], Any], async_op: bool) -> Any:
        """Runs fn now (sync) or on the communicator's worker thread (async), in call order with the
        collectives (pycoll/dispatch.py ``Worker``)."""
        return self.dispatcher.worker.submit(fn, async_op)

    def deliver_straggler_events(self) -> None:
        """After a collective that left straggler events: their WARNING and callbacks (pycoll/skew/)."""
        self._skew.dispatch()

    def gpu(self) -> GpuSide:
        """The GPU side (NCCL communicator, device, watchdog), made at the first GPU collective."""
        return cast("GpuSide", self.dispatcher.gpu())

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
        return cast(SkewReport, self.submit(lambda: tracker.gathered_report(window, timeout), False))

    def skew_local(self, window: int | None = None) -> SkewReport:
        """This rank's own skew report: every rank records every rank's lateness, so it differs from
        ``skew()`` only in collectives whose stamps have not all reached this rank yet. Works on a broken
        communicator; no communication."""
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
        return self._skew.add(callback, late_ms, window)

    # ---- fault tolerance (pycoll/fault/) -----------------------------------------------------------
    @property
    def plane(self) -> Plane | None:
        """The communicator's fault plane (pycoll/fault/plane.py): its control links to every rank, with
        their failure detector; None when it was formed without one (``fault_tolerance=False``)."""
        return self._ctx.plane

    def plane_required(self) -> Plane:
        if self._ctx.plane is None:
            raise InvalidUsageError(
                "this communicator has no fault plane (it was made with fault_tolerance=False or "
                "PYCOLL_FAULT_TOLERANCE=0), so it cannot revoke, agree, shrink or grow"
            )
        return self._ctx.plane

    def _on_plane_event(self, kind: str, rank: int, why: str) -> None:
        """The fault plane found a member dead, or the communicator revoked, or this rank evicted: every
        pending and later collective on this rank must raise."""
        if self._ctx.native_or_none() is None:
            return
        self._ctx.abort_native(kind, rank, why)
        self.dispatcher.fail_gpu(self._ctx.plane_error())

    def revoke(self, why: str | None = None) -> None:
        """Revokes this communicator on every rank: every pending and later collective raises
        (CommunicatorRevokedError, or the PeerLostError that caused it). Local and idempotent; any thread."""
        why = why or f"revoked by rank {self.rank}"
        if self._ctx.plane is not None:
            broken, mismatch = self._ctx.broken, None
            if isinstance(broken, CollectiveMismatchError):  # the peers raise it too, worded as an abort
                mismatch = str(broken)
                if not mismatch.startswith("(reported by rank"):
                    mismatch = f"(reported by rank {self.rank}) {mismatch}"
            self._ctx.plane.revoke(why, cause=mismatch)
        else:
            self._ctx.abort_native("revoked", -1, why)
        self._ctx.break_with(CommunicatorRevokedError(why))

    def agree(self, flag: bool, timeout: float | None = None) -> tuple[bool, frozenset[int]]:
        """A fault-tolerant AND of ``flag`` over the live ranks, and the ranks found dead: the same pair on
        every survivor. Works on a broken or revoked communicator; every rank must call it."""
        d: Decision = self.plane_required().agreements.agree(
            bool(flag), None, self.timeout if timeout is None else timeout
        )
        return d.flag, d.dead

    def _change(self) -> Change[Communicator]:
        """What a membership change (pycoll/fault/membership.py) needs of this communicator, with the way
        to build the next one: over a new plane and its store, with this one's settings."""
        cls, timeout, settings, addresses = type(self), self.timeout, self.settings, self.addresses

        def build(store: Store, rank: int, world: int, plane: Plane, epoch: int, parents: tuple[int, ...]):
            return cls(store, rank, world, timeout=timeout, settings=settings, plane=plane, epoch=epoch,
                       parent_ranks=parents, addresses=addresses)  # fmt: skip

        return Change(
            plane=self.plane_required(),
            rank=self.rank,
            world_size=self.world_size,
            epoch=self.epoch,
            timeout=self.timeout,
            revoke=self.revoke,
            check_usable=self.check_usable,
            joiners=self.joiners,
            build=build,
        )

    def shrink(self, timeout: float | None = None) -> Communicator:
        """The survivors' communicator: revokes this one, agrees on which ranks are dead (no list from the
        caller), and returns a new communicator of the others with contiguous ranks (old order), epoch + 1,
        ``parent_ranks`` and the same settings. Call it on every surviving rank, after any error; this
        communicator is finalized. On a rank the others found dead it raises EvictedError."""
        new = membership.shrink(self._change(), self.timeout if timeout is None else timeout)
        self.replaced_by(new)
        return new

    def grow(
        self, timeout: float | None = None, *, min_joiners: int = 1, max_joiners: int | None = None
    ) -> Communicator:
        """Admits the processes that asked to join (``pycoll.init(join=...)``), waiting up to ``timeout``
        for at least ``min_joiners``: they get the next ranks in a new communicator (epoch + 1), returned
        here on every member. Atomic: if a joiner or member fails half-way it raises and this communicator
        stays usable. ``max_joiners``: admit at most this many (the others wait for a later grow)."""
        if min_joiners < 1:
            raise InvalidUsageError(f"min_joiners must be >= 1, got {min_joiners}")
        timeout = self.timeout if timeout is None else timeout
        new = membership.grow(self._change(), timeout, min_joiners, max_joiners)
        self.replaced_by(new)
        return new

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
        if not self._hosting:
            return
        deadline = time.monotonic() + seconds
        try:
            while self.store.add(counter, 0) < self.world_size and time.monotonic() < deadline:
                time.sleep(0.005)
        except PycollError:
            pass

    def finalize(self) -> None:
        ctx = self._ctx
        if ctx.closed:
            return
        ctx.closed = True
        self.dispatcher.close()
        if self.settings.skew_report and ctx.native_or_none() is not None:
            self._skew.write(self.settings.skew_report)
        ctx.release_native()  # unmaps the segments (the kernel frees them when the last rank lets go)
        if ctx.broken is not None:
            # The error's traceback holds the frames of the failed call, and they the native transport:
            # dropped, so that finalizing a broken communicator frees its memory and sockets now.
            ctx.broken.__traceback__ = None
        plane = ctx.plane
        if plane is not None:
            if plane.listener.join_handler() == self.joiners.take:
                plane.listener.admit_joins(None)
            plane.close()
        if ctx.broken is None:
            # This rank hosts the store: do not pull it from under ranks still finishing set-up.
            self._wait_for_ranks_if_hosting("past_setup", min(self.timeout, 10.0))
        for obj in self._owned:
            try:
                obj.close()
            except Exception:  # noqa: BLE001 - teardown must not mask the user's own error
                log.debug("closing %r failed", obj, exc_info=True)
        self._owned = ()
