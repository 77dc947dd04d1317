"""What the parts of one communicator share, so that none of them needs the Communicator itself.

    Group     the formed group's facts, the same on every rank and fixed once formed (pycoll/formation.py
              makes it): ranks, hosts and their layout, the transport, the settings, the cost model, the
              messages' sizes, the membership generation
    Context   a Group and the communicator's state: the native communicator (until finalized), whether it
              broke or was closed, its fault plane; and what a failed native collective means for it
              (``native_failed``), worded in one place

The parts that run on it (pycoll/dispatch.py's executors, the GPU side of pycoll/gpu.py, the skew
tracker of pycoll/skew/tracker.py) are each built from a Context and what they need of each other, so that
each can be built and tested alone; pycoll/comm.py puts them together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from pycoll.codes import ERROR_KIND_CODES
from pycoll.env import Settings
from pycoll.errors import (
    CollectiveMismatchError,
    CommunicatorBrokenError,
    CommunicatorRevokedError,
    EvictedError,
    InvalidUsageError,
    PeerLostError,
    PycollError,
)
from pycoll.flight.explain import explain
from pycoll.tuning.model import Model

if TYPE_CHECKING:
    from pycoll.bootstrap import Store
    from pycoll.fault.plane import Plane
    from pycoll.tuning.topology import TopologyModel

__all__ = ["Context", "Group"]


@dataclass(frozen=True)
class Group:
    """A formed communicator's facts: the same on every rank, and fixed once formed."""

    rank: int
    world_size: int
    #: Every rank's host id, in rank order (ranks with the same id share memory).
    hosts: tuple[str, ...]
    #: This rank's index among the ranks of its host, and their number.
    local_rank: int
    local_world_size: int
    #: This host's index among the distinct hosts (ordered by their lowest rank), and their number.
    node_rank: int
    num_nodes: int
    #: How this rank's messages travel: "shm", "tcp" or "mixed" (pycoll.auto.transport).
    transport: str
    #: (address this rank listens on for TCP, address it tells the other ranks).
    addresses: tuple[str, str]
    #: The set-up deadline and every collective's default one (seconds).
    timeout: float
    settings: Settings
    #: The cost model ``auto`` chooses by: rank 0's, the same on every rank.
    model: Model
    #: The largest message a CPU plan sends on one link, and the transport's fragment.
    segment_bytes: int
    fragment_bytes: int
    #: PYCOLL_TOPOLOGY as rank 0 read it (pycoll.auto.gpu_topology_setting).
    gpu_topology_setting: dict[str, Any]
    #: Whether the ranks sit on several hosts of the same number (more than one) of ranks each, numbered
    #: host by host (pycoll.auto.spans_equal_hosts): where ``auto`` all-reduces hierarchically.
    spans_equal_hosts: bool
    #: Each rank's clock domain: ranks with one value read one steady clock (pycoll/skew/).
    clock_domains: tuple[int, ...]
    #: The membership generation, and each rank's rank in the communicator this one came from (-1: a
    #: process that joined).
    epoch: int
    parent_ranks: tuple[int, ...]


class Context:
    """One communicator's Group and state (module docstring)."""

    def __init__(self, group: Group, native: Any, plane: Plane | None, store: Store) -> None:
        self.group = group
        self._native = native
        #: The fault plane, or None (formed with ``fault_tolerance=False``).
        self.plane = plane
        #: This communicator's keys in the store it was formed on (the NCCL communicator meets there).
        self.store = store
        #: The error that broke this communicator (every later call raises CommunicatorBrokenError), or None.
        self.broken: BaseException | None = None
        #: Whether ``finalize`` ran.
        self.closed = False
        #: Run CPU collectives as grouped programs (the tests of the programs GPUs run; pycoll/dispatch.py).
        self.grouped_on_cpu = False

    # ---- the facts the parts ask most ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def timeout(self) -> float:
        return self.group.timeout

    @property
    def settings(self) -> Settings:
        return self.group.settings

    @property
    def model(self) -> Model:
        return self.group.model

    @property
    def spans_equal_hosts(self) -> bool:
        return self.group.spans_equal_hosts

    @functools.cached_property
    def gpu_model(self) -> TopologyModel | None:
        """The cost model of the GPU machine, for ``compression="auto"`` on GPU memory (PYCOLL_TOPOLOGY as
        rank 0 has it; worked out at the first such call, which raises for a bad setting)."""
        from pycoll import auto

        return auto.gpu_topology(self.group.gpu_topology_setting, self.group.hosts)

    # ---- the state ------------------------------------------------------------------------------------
    def native(self) -> Any:
        """The native communicator (``_C.NativeCommunicator``); InvalidUsageError once finalized."""
        if self._native is None:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        return self._native

    def native_or_none(self) -> Any:
        """The native communicator, or None once finalized (for what must not raise then)."""
        return self._native

    def release_native(self) -> None:
        """Drops the native communicator (finalize): its segments are unmapped, its sockets closed."""
        self._native = None

    def check_usable(self) -> None:
        if self.closed:
            raise InvalidUsageError("the communicator was finalized; call pycoll.init() again")
        plane = self.plane
        if plane is not None and (plane.evicted is not None or plane.revoked is not None):
            raise self.plane_error()
        if self.broken is not None:
            raise CommunicatorBrokenError(
                f"this communicator failed earlier and cannot be used any more "
                f"({type(self.broken).__name__}: {self.broken}); create a new one"
            )

    def break_with(self, error: BaseException) -> bool:
        """Marks the communicator broken by ``error`` unless it already was; whether it was this call."""
        if self.broken is not None:
            return False
        self.broken = error
        return True

    def native_failed(self, e: BaseException) -> NoReturn:
        """Raises what the failure ``e`` of a native collective means for this communicator: broken,
        revoked, a death the fault plane should hear of."""
        if isinstance(e, PycollError):
            if isinstance(e, InvalidUsageError):
                raise e
            self.broken = e
            plane = self.plane
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
                    error = self.plane_error(prefer=lost)
                    explain(self, error)
                    try:
                        raise error from e
                    finally:
                        # Its traceback holds this frame: a local naming it would make a cycle that keeps
                        # the failed call's frames (and so its native transport) until the next collection.
                        del error
            explain(self, e)
            raise e
        # KeyboardInterrupt mid-collective: the peers were told, this is over
        self.broken = e
        if self.plane is not None:
            self.plane.revoke(f"rank {self.rank} was interrupted ({type(e).__name__})")
        raise e

    def abort_native(self, kind: str, rank: int, why: str) -> None:
        """The fault plane found member ``rank`` dead (``kind`` "dead"), or the communicator was revoked
        or this rank evicted: every pending and later collective on this rank raises."""
        native = self._native
        if native is None:
            return
        cause = self.plane.revoked_cause if self.plane is not None and kind == "revoked" else None
        if kind == "dead":
            native.abort(ERROR_KIND_CODES["peer_lost"], f"rank {rank} is lost: {why}")
        elif cause is not None:  # the mismatch that made a peer revoke: this rank raises it too
            native.abort(ERROR_KIND_CODES["mismatch"], cause)
        else:
            native.abort(ERROR_KIND_CODES["broken"], f"the communicator was revoked ({why})")

    def plane_error(self, prefer: int = -1) -> PycollError:
        """What a collective on a revoked communicator raises: EvictedError on an evicted rank, the loss
        that caused it (PeerLostError), or CommunicatorRevokedError."""
        plane = self.plane
        assert plane is not None
        if plane.evicted is not None:
            return EvictedError(
                f"rank {self.rank} was evicted from its communicator ({plane.evicted}); the other ranks went "
                "on without it. A new process may join the job (pycoll.init(join=...))"
            )
        if plane.dead:
            r = prefer if prefer in plane.dead else next(iter(plane.dead))  # the first found dead: the cause
            why = plane.dead[r]
            return PeerLostError(
                f"rank {r} of the communicator is lost ({why}); the communicator was revoked on every rank: "
                "call comm.shrink() to go on with the survivors",
                rank=r,
            )
        return CommunicatorRevokedError(
            f"the communicator was revoked ({plane.revoked}); call comm.shrink() to make a new one"
        )
