"""``monitored_barrier`` of the pycoll backend: a barrier that says which ranks did not arrive.

It runs on the group communicator's fault plane (its control links; pycoll/fault/plane.py), beside the
data transport, so a barrier that fails leaves no message behind in a data channel. The parts, by the
names used below:

- **call**: each rank numbers its monitored barriers on the group (1, 2, ...); every message names it.
- **arrival**: every rank but the group's rank 0 tells rank 0 that it arrived at a call.
- **check-in**: rank 0 waits, until the call's deadline, for every rank's arrival. A rank found lost (its
  control link closed, silent past the plane's heartbeat timeout, or gone by finalize) ends the wait at
  once, unless ``wait_all_ranks``: then rank 0 waits out the deadline for the others, so the report names
  every rank that did not arrive. Without ``wait_all_ranks`` the report opens with the first missing rank
  (as gloo's, which stops at it) and names the others after it.
- **verdict**: rank 0 sends each rank that arrived the ranks that did not and those lost (none: the barrier
  passed), and answers a late arrival with the verdict of the call it came too late for. Only rank 0 holds
  the barrier's timeout (as with gloo): the others wait for the verdict at least the group's timeout, as
  rank 0 may arrive later than they do.

What each rank raises when a rank did not arrive (torch's and gloo's phrases first, so that what scripts
and torch's own tests look for is found, then pycoll's report; group ranks throughout): rank 0,
CollectiveTimeoutError "Rank 0 timed out in monitoredBarrier after 2 s. Rank 1 failed to pass
monitoredBarrier: ..." naming the ranks that arrived (PeerLostError when a missing rank is lost, with
why); a rank that arrived, "Rank 2 successfully reached monitoredBarrier, but received errors while
waiting for send/recv from rank 0: rank 0 reports that rank 1 did not arrive within 2 s" (PeerLostError
too when one is lost); a rank that came late, that it did.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from pycoll.errors import CollectiveTimeoutError, PeerLostError
from pycoll.fault.plane import Plane

#: How long after its own deadline a rank that arrived still waits for rank 0's verdict (rank 0 decides at
#: its deadline, which started when it arrived).
VERDICT_GRACE_S = 2.0
#: Calls rank 0 gave up on that it remembers, to answer ranks that arrive late.
_REMEMBERED = 16
#: Rank 0's verdict on a call: the ranks that did not arrive, and why those that are lost are.
Verdict = tuple[list[int], dict[int, str]]


def _ranks(ranks: list[int]) -> str:
    return ("Rank " if len(ranks) == 1 else "Ranks ") + ", ".join(map(str, ranks))


def _arrived_but(rank: int) -> str:
    return (
        f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for "
        "send/recv from rank 0"
    )


class MonitoredBarriers:
    """One rank's monitored barriers on one group (module docstring); message state under ``plane.lock``.
    ``group_timeout``: how long a rank that arrived waits for rank 0's verdict at least (rank 0 may come
    later than it; only rank 0 holds the barrier's own timeout, as with gloo)."""

    def __init__(self, plane: Plane, rank: int, size: int, group_timeout: float) -> None:
        self.plane, self.rank, self.size = plane, rank, size
        self.group_timeout = group_timeout
        self._calls = 0
        self._arrived: dict[int, set[int]] = {}  # rank 0: call -> the ranks that arrived
        self._given_up: dict[int, Verdict] = {}  # rank 0: call -> its verdict, for ranks that come late
        self._verdicts: dict[int, Verdict] = {}  # the others: call -> rank 0's verdict
        plane.on("mb", self._on_message)

    def _on_message(self, peer: int, msg: dict[str, Any]) -> None:  # the plane's thread, its lock held
        call = int(msg["n"])
        if msg["k"] == "arrive":
            if call in self._given_up:  # too late: tell it at once
                self.plane.send(peer, _verdict_message(call, self._given_up[call]))
            elif call >= self._calls:  # (one for a call given up on and forgotten: dropped)
                self._arrived.setdefault(call, set()).add(peer)
        elif call >= self._calls:  # (a verdict for a call this rank gave up on is dropped)
            missing = [int(r) for r in msg["missing"]]
            self._verdicts[call] = (missing, {int(r): str(w) for r, w in msg["lost"].items()})
        self.plane.cv.notify_all()

    def wait(self, timeout: float, wait_all_ranks: bool) -> None:
        self._calls += 1
        if self.rank == 0:
            self._check_in(self._calls, timeout, wait_all_ranks)
        else:
            self._arrive(self._calls, timeout)

    # ---- rank 0 ------------------------------------------------------------------------------------------
    def _check_in(self, call: int, timeout: float, wait_all_ranks: bool) -> None:
        plane, others = self.plane, range(1, self.size)
        start = time.monotonic()
        with plane.cv:
            while True:
                arrived = self._arrived.get(call, set())
                missing = [r for r in others if r not in arrived]
                lost = {r: plane.dead.get(r, "it left the group") for r in missing if _gone(plane, r)}
                left = start + timeout - time.monotonic()
                if not missing or left <= 0 or len(lost) == len(missing) or (lost and not wait_all_ranks):
                    break
                plane.cv.wait(left)
            arrived = self._arrived.pop(call, set())
            if missing:
                self._given_up[call] = (missing, lost)
                for old in sorted(self._given_up)[:-_REMEMBERED]:
                    del self._given_up[old]
        for r in sorted(arrived):
            plane.send(r, _verdict_message(call, (missing, lost)))
        if missing:
            waited = time.monotonic() - start
            raise self._report(missing, sorted(arrived), lost, timeout, waited, wait_all_ranks)

    def _report(
        self, missing: list[int], arrived: list[int], lost: dict[int, str], timeout: float, waited: float,
        wait_all: bool,
    ) -> Exception:  # fmt: skip
        did = f"ranks {', '.join(map(str, [0, *arrived]))} did" if arrived else "only rank 0 did"
        waited_all = "; every rank was waited for, wait_all_ranks=True" if wait_all else ""
        if lost:
            late = [r for r in missing if r not in lost]
            text = (
                f"{_ranks(sorted(lost))} failed to pass monitoredBarrier: lost ("
                + "; ".join(f"rank {r}: {why}" for r, why in sorted(lost.items()))
                + f"). Rank 0 stopped waiting after {waited:.3g} s of {timeout:g} s"
                + (f"; {_ranks(late).lower()} had not arrived yet" if late else "")
                + f" ({did}{waited_all})"
            )
            return PeerLostError(text, rank=min(lost))
        verb = "it" if len(missing) == 1 else "they"
        who = _ranks(missing) if wait_all or len(missing) == 1 else f"Rank {missing[0]}"
        rest = (
            ""
            if who != f"Rank {missing[0]}" or len(missing) == 1
            else f" (and {_ranks(missing[1:]).lower()})"
        )
        return CollectiveTimeoutError(
            f"Rank 0 timed out in monitoredBarrier after {timeout:g} s. {who} failed to pass monitoredBarrier"
            f"{rest}: {verb} did not reach monitored_barrier on this group of {self.size} ranks in time "
            f"({did}{waited_all})"
        )

    # ---- the other ranks -----------------------------------------------------------------------------------
    def _arrive(self, call: int, timeout: float) -> None:
        plane, me = self.plane, self.rank
        plane.send(0, {"t": "mb", "k": "arrive", "n": call})
        patience = max(timeout + VERDICT_GRACE_S, self.group_timeout)
        deadline = time.monotonic() + patience
        with plane.cv:
            for old in [c for c in self._verdicts if c < call]:
                del self._verdicts[old]
            while call not in self._verdicts:
                if _gone(plane, 0):
                    why = plane.dead.get(0, "it left the group")
                    raise PeerLostError(
                        f"{_arrived_but(me)}: rank 0 of the group, which checks who arrived, is lost ({why})",
                        rank=0,
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(
                        f"Rank {me} timed out in monitoredBarrier after {patience:g} s: rank 0 of the group, "
                        "which checks who arrived, did not answer (did it reach monitored_barrier?)"
                    )
                plane.cv.wait(left)
            missing, lost = self._verdicts.pop(call)
        if lost:
            raise PeerLostError(
                f"{_arrived_but(me)}: rank 0 reports that {_ranks(sorted(lost)).lower()} "
                + ("is" if len(lost) == 1 else "are")
                + " lost ("
                + "; ".join(f"rank {r}: {why}" for r, why in sorted(lost.items()))
                + ")",
                rank=min(lost),
            )
        if me in missing:
            raise CollectiveTimeoutError(
                f"Rank {me} failed to pass monitoredBarrier: it reached it after rank 0 stopped waiting "
                f"({timeout:g} s after rank 0 arrived)"
            )
        if missing:
            raise CollectiveTimeoutError(
                f"{_arrived_but(me)}: rank 0 reports that {_ranks(missing).lower()} did not arrive within "
                f"{timeout:g} s"
            )


def _gone(plane: Plane, rank: int) -> bool:
    return rank in plane.dead or rank in plane.left


def _verdict_message(call: int, verdict: Verdict) -> dict[str, Any]:
    missing, lost = verdict
    return {"t": "mb", "k": "verdict", "n": call, "missing": missing, "lost": lost}


def reach_pycoll_groups(group_class: type) -> None:
    """``dist.monitored_barrier`` refuses every backend but gloo by name before it asks the group; this
    wraps it so that a group of ``group_class`` (the pycoll backend's) is asked, and every other group
    goes to torch's own function, unchanged."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    torchs = c10d.monitored_barrier
    if getattr(torchs, "__wrapped_by_pycoll__", False):
        return

    @functools.wraps(torchs)
    def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        pg = c10d._get_default_group() if group is None or group is c10d.GroupMember.WORLD else group
        if c10d._rank_not_in_group(pg) or not isinstance(pg, group_class):
            return torchs(group, timeout, wait_all_ranks)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)  # type: ignore[attr-defined]

    monitored_barrier.__wrapped_by_pycoll__ = True  # type: ignore[attr-defined]
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier
