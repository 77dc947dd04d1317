"""``pycoll.elastic.run``: a training loop that survives lost ranks and admits new ones.

The parts, named once:

- **step**: one call of the user's ``step_fn(ctx)``; ``ctx.comm``, ``ctx.rank``, ``ctx.world_size`` say
  who takes part in it, so the step divides its data by them (the survivors take over a lost rank's
  share). A step must be deterministic given (state, step, rank, world size).
- **boundary**: after every ``commit_every`` steps, and after a step that failed on any rank. Every rank
  meets at a boundary through one agreement on the communicator's fault plane (``ok`` = the steps since
  the last boundary succeeded here); a rank whose step failed first revokes the communicator, so that the
  ranks still blocked in a collective of that step raise and come to the boundary too.
- **commit**: at a boundary where every rank agreed ``ok``: a copy of the state in memory, and the step
  number (no checkpoint file).
- **roll-back**: at a boundary where some rank failed: the survivors shrink the communicator, write the
  last commit back into the state and go on from its step. No committed step is lost; the steps after the
  commit are done again by the survivors (``ElasticResult.redone``).
- **join**: at a commit where some member holds a join request (``pycoll.init(join=...)``) and the job has
  fewer than ``max_ranks`` ranks, the members grow the communicator and send the state (striped across
  them) and the step to the newcomers, which enter the loop there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pycoll import api
from pycoll.comm import Communicator
from pycoll.elastic import state as statelib
from pycoll.errors import (
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    EvictedError,
    InvalidUsageError,
    PeerLostError,
    PycollError,
)

log = logging.getLogger("pycoll")

#: The errors a step may end with that a shrink repairs (a lost or stopped rank, a revoked communicator).
RECOVERABLE = (PeerLostError, CommunicatorBrokenError, CollectiveTimeoutError)


@dataclass
class StepContext:
    """What ``step_fn`` gets: the communicator of this step and the state (the caller's own arrays)."""

    comm: Communicator
    step: int
    state: statelib.State

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size


@dataclass(frozen=True)
class Change:
    """One membership change: at which step, what happened, the world size before and after, the ranks
    lost (old numbering) or the number that joined, and how long the change took (seconds)."""

    step: int
    kind: str  # "shrink" | "grow"
    world_before: int
    world_after: int
    lost: tuple[int, ...] = ()
    joined: int = 0
    seconds: float = 0.0


@dataclass
class ElasticResult:
    comm: Communicator
    steps: int  # the step the loop ended at (== the ``steps`` asked for)
    changes: list[Change] = field(default_factory=list)
    redone: int = 0  # steps done again after a roll-back
    #: The world size each committed step ran with, by step (this rank's view, the same on every rank).
    world_by_step: dict[int, int] = field(default_factory=dict)


def run(
    step_fn: Callable[[StepContext], Any],
    state: statelib.State,
    *,
    steps: int,
    comm: Communicator | None = None,
    min_ranks: int = 1,
    max_ranks: int | None = None,
    commit_every: int = 1,
    timeout: float | None = None,
    on_change: Callable[[StepContext, Change], None] | None = None,
) -> ElasticResult:
    """Runs ``step_fn`` for steps 0..steps-1 on every rank through lost and joining ranks.

    ``state``: name -> numpy array / CPU torch tensor, every array the steps change (parameters, optimizer
    buffers). ``comm``: the communicator (default: pycoll's); a process that joined passes the
    communicator ``pycoll.init(join=...)`` gave it and gets the state and the step from the members.
    ``min_ranks``: fewer survivors than this raise instead of going on. ``max_ranks``: joiners are
    admitted while the job is smaller. ``commit_every``: steps between commits (a loss redoes at most this
    many). ``timeout``: bound of each shrink or grow (default: the communicator's timeout).
    ``on_change(ctx, change)`` runs on every rank after each membership change (e.g. to point a DDP hook's
    state at ``ctx.comm``). Returns the final communicator and what happened; an evicted rank raises
    EvictedError.
    """
    if steps < 0 or commit_every < 1 or min_ranks < 1:
        raise InvalidUsageError("steps must be >= 0, commit_every >= 1 and min_ranks >= 1")
    comm = api.get_comm(comm)
    comm.plane_required()
    limit = comm.timeout if timeout is None else timeout
    result = ElasticResult(comm, 0)
    step = 0
    if comm.epoch > 0 and comm.parent_ranks[comm.rank] == -1:  # this process joined a running job
        holders = sum(1 for p in comm.parent_ranks if p != -1)
        step = statelib.send_to_joiners(comm, state, holders, 0)
    commit, committed = statelib.snapshot(state), step
    ok, since = True, []
    while step < steps or not ok:
        if ok and step < steps:
            try:
                step_fn(StepContext(comm, step, state))
                since.append((step, comm.world_size))
                step += 1
            except EvictedError:
                raise
            except RECOVERABLE as exc:
                log.warning("rank %d: step %d failed (%s: %s)", comm.rank, step, type(exc).__name__, exc)
                comm.revoke(f"step {step} failed on rank {comm.rank}")
                ok = False
        if ok and step % commit_every and step < steps:
            continue
        decision = comm.plane_required().agreements.agree(ok, {"joiners": len(comm.joiners.alive())}, limit)
        if decision.flag:
            commit, committed = statelib.snapshot(state), step
            result.world_by_step.update(since)
            since = []
            waiting = sum(int(p["joiners"]) for p in decision.payloads.values())
            room = (max_ranks or 1 << 30) - comm.world_size
            if waiting and room > 0 and step < steps:
                comm = _grow(comm, state, step, min(waiting, room), limit, result, on_change)
            continue
        # Some rank failed since the last boundary: shrink, roll back.
        t0 = time.monotonic()
        old_world = comm.world_size
        new = comm.shrink(limit)
        lost = tuple(r for r in range(old_world) if r not in new.parent_ranks)
        if new.world_size < min_ranks:
            raise PycollError(f"only {new.world_size} ranks are left (min_ranks={min_ranks}); lost {lost}")
        statelib.restore(state, commit)
        result.redone += step - committed
        step, comm, ok, since = committed, new, True, []
        change = Change(step, "shrink", old_world, new.world_size, lost=lost, seconds=time.monotonic() - t0)
        result.changes.append(change)
        if on_change is not None:
            on_change(StepContext(comm, step, state), change)
    result.comm, result.steps = comm, step
    return result


def _grow(
    comm: Communicator,
    state: statelib.State,
    step: int,
    joiners: int,
    limit: float,
    result: ElasticResult,
    on_change: Callable[[StepContext, Change], None] | None,
) -> Communicator:
    t0 = time.monotonic()
    old_world = comm.world_size
    try:
        new = comm.grow(limit, min_joiners=1, max_joiners=joiners)
    except PycollError as exc:  # the joiner went away half-way: the communicator is unchanged
        log.warning("rank %d: a process could not join at step %d (%s)", comm.rank, step, exc)
        return comm
    statelib.send_to_joiners(new, state, old_world, step)
    change = Change(
        step,
        "grow",
        old_world,
        new.world_size,
        joined=new.world_size - old_world,
        seconds=time.monotonic() - t0,
    )
    result.changes.append(change)
    if on_change is not None:
        on_change(StepContext(new, step, state), change)
    return new
