"""``monitored_barrier`` of the pycoll backend: a barrier that says which ranks did not arrive.

It runs on the group communicator's fault plane (its control links; pycoll/fault/plane.py), beside the
data transport, so a barrier that fails leaves no message behind in a data channel. The parts, by the
names used below:

- **call**: each rank numbers its monitored barriers on the group (1, 2, ...); every message names it.
- **arrival**: every rank but the group's rank 0 tells rank 0 that it arrived at a call.
- **check-in**: rank 0 waits, until the call's deadline, for every rank's arrival. A rank found lost (its
  control link closed, or silent past the plane's heartbeat timeout) ends the wait at once, unless
  ``wait_all_ranks``: then rank 0 waits out the deadline for the others, so the report names every rank
  that did not arrive.
- **verdict**: rank 0 sends each rank that arrived the ranks that did not (none: the barrier passed), and
  answers a late arrival with the verdict of the call it came too late for.

What each rank raises when a rank did not arrive (torch's and gloo's phrases first, so that what scripts
and torch's own tests look for is found, then pycoll's report; group ranks throughout): rank 0,
CollectiveTimeoutError "Rank 0 timed out in monitoredBarrier after 2 s. Rank 1 failed to pass
monitoredBarrier: ..." naming the ranks that arrived (PeerLostError when a missing rank is lost, with
why); a rank that arrived, "Rank 2 successfully reached monitoredBarrier, but received errors while
waiting for send/recv from rank 0: rank 0 reports that rank 1 did not arrive within 2 s" (PeerLostError
too when one is lost); a rank that came late, that it did.
"""

from __future__ import annotations

import time
from typing import Any

from pycoll.errors import CollectiveTimeoutError, PeerLostError
from pycoll.fault.plane import Plane

#: How long after its own deadline a rank that arrived still waits for rank 0's verdict (rank 0 decides at
#: its deadline, which started when it arrived).
VERDICT_GRACE_S = 2.0
#: Calls rank 0 gave up on that it remembers, to answer ranks that arrive late.
_REMEMBERED = 16


def _ranks(ranks: list[int]) -> str:
    return ("Rank " if len(ranks) == 1 else "Ranks ") + ", ".join(map(str, ranks))


def _arrived_but(rank: int) -> str:
    return (
        f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for "
        "send/recv from rank 0"
    )


class MonitoredBarriers:
    """One rank's monitored barriers on one group (module docstring); message state under ``plane.lock``."""

    def __init__(self, plane: Plane, rank: int, size: int) -> None:
        self.plane, self.rank, self.size = plane, rank, size
        self._calls = 0
        self._arrived: dict[int, set[int]] = {}  # rank 0: call -> the ranks that arrived
        self._given_up: dict[int, list[int]] = {}  # rank 0: call -> its missing ranks
        # the others: call -> the missing ranks rank 0 reported, and why those lost were
        self._verdicts: dict[int, tuple[list[int], dict[int, str]]] = {}
        plane.on("mb", self._on_message)

    def _on_message(self, peer: int, msg: dict[str, Any]) -> None:  # the plane's thread, its lock held
        call = int(msg["n"])
        if msg["k"] == "arrive":
            if call in self._given_up:  # too late: tell it at once
                self.plane.send(peer, {"t": "mb", "k": "verdict", "n": call, "missing": self._given_up[call]})
            else:
                self._arrived.setdefault(call, set()).add(peer)
        else:
            self._verdicts[call] = (
                [int(r) for r in msg["missing"]],
                {int(r): w for r, w in msg.get("lost", {}).items()},
            )
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
        deadline = time.monotonic() + timeout
        with plane.cv:
            while True:
                arrived = self._arrived.get(call, set())
                missing = [r for r in others if r not in arrived]
                lost = [r for r in missing if r in plane.dead or r in plane.left]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or len(lost) == len(missing) or (lost and not wait_all_ranks):
                    break
                plane.cv.wait(left)
            arrived = self._arrived.pop(call, set())
            if missing:
                self._given_up[call] = missing
                for old in sorted(self._given_up)[:-_REMEMBERED]:
                    del self._given_up[old]
            lost_why = {r: plane.dead.get(r, "it left the group (finalized)") for r in lost}
        for r in sorted(arrived):
            plane.send(r, {"t": "mb", "k": "verdict", "n": call, "missing": missing, "lost": lost_why})
        if missing:
            raise self._report(missing, sorted(arrived), lost_why, timeout, wait_all_ranks)

    def _report(
        self, missing: list[int], arrived: list[int], lost: dict[int, str], timeout: float, wait_all: bool
    ) -> Exception:
        verb = "it" if len(missing) == 1 else "they"
        did = f"ranks {', '.join(map(str, [0, *arrived]))} did" if arrived else "only rank 0 did"
        text = (
            f"Rank 0 timed out in monitoredBarrier after {timeout:g} s. {_ranks(missing)} failed to pass "
            f"monitoredBarrier: {verb} did not reach monitored_barrier on this group of {self.size} ranks in "
            f"time ({did}" + ("; every rank was waited for, wait_all_ranks=True)" if wait_all else ")")
        )
        if lost:
            text += "; lost: " + "; ".join(f"rank {r}: {why}" for r, why in sorted(lost.items()))
            return PeerLostError(text, rank=min(lost))
        return CollectiveTimeoutError(text)

    # ---- the other ranks -----------------------------------------------------------------------------------
    def _arrive(self, call: int, timeout: float) -> None:
        plane, me = self.plane, self.rank
        plane.send(0, {"t": "mb", "k": "arrive", "n": call})
        deadline = time.monotonic() + timeout + VERDICT_GRACE_S
        with plane.cv:
            while call not in self._verdicts:
                if 0 in plane.dead:
                    raise PeerLostError(
                        f"{_arrived_but(me)}: rank 0 of the group, which checks who arrived, is lost "
                        f"({plane.dead[0]})", rank=0,
                    )  # fmt: skip
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(
                        f"Rank {me} timed out in monitoredBarrier after {timeout:g} s: rank 0 of the group, "
                        "which checks who arrived, did not answer (did it reach monitored_barrier?)"
                    )
                plane.cv.wait(left)
            missing, lost = self._verdicts.pop(call)
        if me in missing:
            raise CollectiveTimeoutError(
                f"Rank {me} failed to pass monitoredBarrier: it reached it after rank 0 stopped waiting "
                f"({timeout:g} s after rank 0 arrived)"
            )
        if missing:
            text = (
                f"{_arrived_but(me)}: rank 0 reports that {_ranks(missing).lower()} did not arrive within "
                f"{timeout:g} s"
            )
            if lost:
                text += "; lost: " + "; ".join(f"rank {r}: {why}" for r, why in sorted(lost.items()))
                raise PeerLostError(text, rank=min(lost))
            raise CollectiveTimeoutError(text)
