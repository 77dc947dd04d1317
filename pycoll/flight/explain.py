"""A collective's failure explained where it is raised: a timeout, a lost peer or a mismatch gets a
paragraph that says where every rank is, and every rank's records go to a dump file the error names.

What this rank asks, with a deadline of ``PROBE_TIMEOUT_S`` (the time it adds to the error):

    who          what it is asked
    every rank   its last records (all ranks up to ``PROBE_ALL``; past that, only the ranks below)
    suspects     also its threads' stacks and its main thread's state: the ranks that have not entered
                 the collective, the peer a timeout waited for or a mismatch names (at most
                 ``MAX_STACKS``)

Ranks the fault plane knows dead or gone are not asked. Without a fault plane (fault_tolerance=False)
there is no one to ask: the error says so, and the dump holds this rank's own records.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Protocol

from pycoll.env import Settings
from pycoll.errors import CollectiveMismatchError, CollectiveTimeoutError, PeerLostError, PycollError
from pycoll.flight import analysis
from pycoll.flight.probe import probe_many
from pycoll.flight.recorder import comm_name, local_report, trace_dir

log = logging.getLogger("pycoll")

#: Ranks asked for their records at most; past this world size, only the suspects are.
PROBE_ALL = 64
#: Ranks asked for their stacks at most.
MAX_STACKS = 8
#: How long the probes may take (the time from the deadline to the error grows by at most this).
PROBE_TIMEOUT_S = 2.0
#: Records asked of each rank (kept in the dump, beside all of this rank's own): a few collectives around
#: the failed one, small enough that every rank of a large job asking every other stays cheap.
PROBE_RECORDS = 32
#: This rank's own records in its dump: all its ring holds.
OWN_RECORDS = 1 << 20
EXPLAINED = (CollectiveTimeoutError, PeerLostError, CollectiveMismatchError)


class Context(Protocol):
    """What a failed communicator's context (pycoll/context.py) gives the explanation."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def settings(self) -> Settings: ...

    plane: Any

    def native_or_none(self) -> Any: ...


def explain(ctx: Context, error: PycollError) -> None:
    """Adds to ``error``'s message where every rank is and the dump file's name (in place: the same error,
    its type and attributes, a longer message). Never raises: a failure here is logged and the error is
    raised as it was."""
    if not isinstance(error, EXPLAINED) or getattr(error, "_pycoll_explained", False):
        return
    native = ctx.native_or_none()
    if native is None or not ctx.settings.trace or native.trace_comm < 0:
        return
    try:
        text = _paragraph(ctx, error, native)
    except Exception:  # noqa: BLE001 - the diagnosis must never hide the error it explains
        log.debug("explaining %r failed", error, exc_info=True)
        return
    error.args = (f"{error}\n{text}", *error.args[1:])
    setattr(error, "_pycoll_explained", True)  # noqa: B010 - a mark on the error, not a declared field


def _paragraph(ctx: Context, error: PycollError, native: Any) -> str:
    name, rank, seq = comm_name(ctx.plane), ctx.rank, int(native.seq)
    own = local_report(OWN_RECORDS)
    _, _, mine_all = analysis.records_of(own, name)
    mine = next((r for r in reversed(mine_all) if int(r.get("seq", 0)) == seq), None)
    if mine is None:
        return "(the flight recorder has no record of this collective)"
    plane = ctx.plane
    reports: dict[int, dict[str, Any] | str] = {}
    gone: dict[int, str] = {}
    if plane is not None:
        with plane.lock:
            gone = {r: f"is lost ({why})" for r, why in plane.dead.items()}
            gone.update({r: "left the communicator" for r in plane.left})
        suspects = _suspects(error, native, seq, rank)
        world = ctx.world_size
        asked = [r for r in range(world) if r != rank and r not in gone]
        if world > PROBE_ALL:
            asked = [r for r in asked if r in suspects]
        addresses = {r: str(plane.members[r]["address"]) for r in asked}
        stacks = set(sorted(r for r in suspects if r in addresses)[:MAX_STACKS])
        reports = probe_many(addresses, records=PROBE_RECORDS, stacks=stacks, secret=ctx.settings.secret,
                             timeout=PROBE_TIMEOUT_S)  # fmt: skip
    positions = [analysis.Position(r, "gone", why) for r, why in sorted(gone.items())]
    positions += [analysis.position(r, rep, name, mine) for r, rep in sorted(reports.items())]
    text = analysis.summary(positions, rank, mine)
    if plane is None:
        text += (" (This communicator has no fault plane, so the other ranks could not be asked: form it "
                 "with fault_tolerance=True to see where they are.)")  # fmt: skip
    path = _dump(ctx, name, own, reports, str(error))
    if path:
        text += f" Records of every rank: {path} (pycoll trace analyze {os.path.dirname(path)})."
    return text


def _suspects(error: PycollError, native: Any, seq: int, rank: int) -> set[int]:
    """The ranks whose stacks are worth asking for: those that have not entered collective ``seq``, and
    the peer the error names."""
    found: set[int] = set()
    if isinstance(error, CollectiveTimeoutError):
        try:
            found.update(int(r) for r in native.ranks_not_entered(seq))
        except Exception:  # noqa: BLE001 - a transport torn down meanwhile: the peer named is enough
            pass
    peer = getattr(error, "rank", -1)
    if isinstance(peer, int) and peer >= 0:
        found.add(peer)
    found.discard(rank)
    return found


def _dump(ctx: Context, name: str, own: dict[str, Any], reports: dict[int, Any], error: str) -> str:
    """Writes this rank's records and what the others answered to <trace dir>/<communicator>/rank<r>.json;
    its path, or "" where it could not be written."""
    directory = trace_dir(ctx.settings) / name.replace("/", "-")
    path = directory / f"rank{ctx.rank}.json"
    data = {
        "rank": ctx.rank,
        "comm": name,
        "error": error,
        "written": time.time(),
        "report": own,
        "probed": {str(r): rep for r, rep in reports.items()},
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError as exc:
        log.warning("pycoll: rank %d could not write its flight records to %s (%s)", ctx.rank, path, exc)
        return ""
    return str(path)
