"""Fault-tolerant agreement on a fault plane: every live member calls ``agree(flag, payload)`` and all
survivors return the same ``Decision``: the AND of the live members' flags, the set of members found
dead, and every live member's payload.

The parts, named once:

- **agreement k**: the k-th ``agree`` call on the plane (every member calls them in the same order).
- **proposal**: what a member brings to k: its flag, its payload and the members it knows dead. It sends
  its proposal to every member when it enters k.
- **coordinator**: the lowest live member. It decides once it holds a proposal from every live member:
  flag = AND, dead = its own dead set and every proposal's, payloads = the proposals'. It sends the
  **decision** to every member.
- **ballot**: a coordinator's rank. A member that becomes coordinator because every member below it is
  dead first sends a **query** with its ballot to the live members; each answers with the decision it
  already holds (if any) and *promises* to ignore decisions of lower ballots from then on. If any answer
  holds a decision, the new coordinator sends that one (a dead coordinator may have reached some members
  before it died: they must not be contradicted); otherwise it decides as above. Rank 0 never needs a
  query: no ballot is lower than its own. A member that holds a decision and becomes coordinator (the
  coordinator that sent it died) sends that decision on.

Why all survivors get the same decision: only coordinators decide, a coordinator of ballot b decides
only after every live member promised b, and a member that promised b rejects every decision of a ballot
below b. A member wrongly taken for dead (stopped, slow) is evicted by the detector (pycoll/fault/plane.py),
so "dead" is final and a decision it missed is never needed from it. Every wait ends: the detector finds
a silent member dead within its heartbeat timeout, and ``agree`` has its own deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pycoll.errors import CollectiveTimeoutError
from pycoll.fault.members import Members

_KEEP = 64  # agreements remembered (a member far behind asks about recent ones only)


@dataclass(frozen=True)
class Decision:
    flag: bool
    dead: frozenset[int]
    payloads: dict[int, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "flag": self.flag,
            "dead": sorted(self.dead),
            "payloads": {str(r): p for r, p in self.payloads.items()},
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Decision:
        return cls(
            bool(d["flag"]),
            frozenset(int(r) for r in d["dead"]),
            {int(r): p for r, p in d["payloads"].items()},
        )


class Agreements:
    """The agreement state of one plane; every method runs with ``plane.lock`` held."""

    def __init__(self, plane: Members) -> None:
        self.plane = plane
        self.count = 0  # agreements this member has entered
        self.proposals: dict[int, dict[int, dict[str, Any]]] = {}
        self.decided: dict[int, Decision] = {}
        self.promised: dict[int, int] = {}
        self.replies: dict[int, dict[int, dict[str, Any]]] = {}
        self.queried: set[int] = set()
        self.announced: set[int] = set()  # agreements whose decision this member sent as coordinator

    # ---- the caller's side -------------------------------------------------------------------------
    def agree(self, flag: bool, payload: Any, timeout: float) -> Decision:
        plane = self.plane
        with plane.cv:
            self.count += 1
            k = self.count
            mine = {"flag": bool(flag), "payload": payload, "dead": sorted(plane.dead)}
            self.proposals.setdefault(k, {})[plane.rank] = mine
        plane.broadcast({"t": "propose", "k": k, **mine})
        deadline = time.monotonic() + timeout
        with plane.cv:
            while True:
                self._drive(k)
                if k in self.decided:
                    self._forget_before(k - _KEEP)
                    return self.decided[k]
                plane.raise_if_evicted()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(self._timeout_text(k, timeout))
                plane.cv.wait(min(left, 0.25))

    def _timeout_text(self, k: int, timeout: float) -> str:
        live = self.plane.live()
        missing = [r for r in live if r not in self.proposals.get(k, {})]
        who = ", ".join(map(str, missing)) or "none"
        return (
            f"agreement #{k} on rank {self.plane.rank} did not complete within {timeout:.1f} s: live ranks "
            f"{', '.join(map(str, live))}; not heard from: {who} (did every rank call agree / shrink / grow?)"
        )

    # ---- messages ----------------------------------------------------------------------------------
    def on_message(self, peer: int, msg: dict[str, Any]) -> None:
        kind, k = msg["t"], int(msg["k"])
        if kind == "propose":
            self.proposals.setdefault(k, {})[peer] = {
                "flag": msg["flag"],
                "payload": msg["payload"],
                "dead": msg["dead"],
            }
        elif kind == "ballot":
            ballot = int(msg["ballot"])
            if ballot >= self.promised.get(k, -1):
                self.promised[k] = ballot
                dec = self.decided.get(k)
                self.plane.send(
                    peer,
                    {
                        "t": "promise",
                        "k": k,
                        "ballot": ballot,
                        "decision": None if dec is None else dec.to_wire(),
                    },
                )
        elif kind == "promise":
            if int(msg["ballot"]) == self.plane.rank:
                self.replies.setdefault(k, {})[peer] = msg
        elif kind == "decide":
            if k not in self.decided and int(msg["ballot"]) >= self.promised.get(k, -1):
                self._accept(k, Decision.from_wire(msg["decision"]))
        self.plane.cv.notify_all()
        self.changed()

    def changed(self) -> None:
        """Membership or messages changed: every open agreement this member may coordinate moves on, and
        a member that became coordinator sends the decisions it holds (it may have got one from a
        coordinator that died before reaching everyone)."""
        for k in list(self.proposals):
            if k not in self.decided:
                self._drive(k)
        live = self.plane.live()
        if live and live[0] == self.plane.rank:
            for k, decision in list(self.decided.items()):
                if k not in self.announced:
                    self.announced.add(k)
                    msg = {"t": "decide", "k": k, "ballot": self.plane.rank, "decision": decision.to_wire()}
                    self.plane.broadcast(msg)

    # ---- the coordinator's side --------------------------------------------------------------------
    def _drive(self, k: int) -> None:
        plane = self.plane
        if k in self.decided or plane.rank not in self.proposals.get(k, {}):
            return
        props = self.proposals[k]
        for prop in list(props.values()):  # what the proposers found dead counts as dead here too
            for r in prop["dead"]:
                if r not in plane.dead and r != plane.rank:
                    plane.found_dead(int(r), "found dead by another rank during an agreement")
        if k in self.decided:  # decided while the deaths above were handled
            return
        live = plane.live()
        if live[0] != plane.rank:
            return
        ballot = plane.rank
        adopted: Decision | None = None
        if ballot > 0:
            if self.promised.get(k, -1) > ballot:
                return
            if k not in self.queried:
                self.queried.add(k)
                self.promised[k] = ballot
                self.replies.setdefault(k, {})
                plane.broadcast({"t": "ballot", "k": k, "ballot": ballot})
            replies = self.replies.get(k, {})
            if any(r not in replies for r in live if r != plane.rank):
                return
            held = [m["decision"] for r, m in replies.items() if r in live and m.get("decision")]
            if held:
                adopted = Decision.from_wire(held[0])
        if adopted is None:
            if any(r not in props for r in live):
                return
            adopted = Decision(
                flag=all(bool(props[r]["flag"]) for r in live),
                dead=frozenset(plane.dead),
                payloads={r: props[r]["payload"] for r in live},
            )
        self._accept(k, adopted)
        self.announced.add(k)
        plane.broadcast({"t": "decide", "k": k, "ballot": ballot, "decision": adopted.to_wire()})

    def _accept(self, k: int, decision: Decision) -> None:
        if k in self.decided:
            return
        self.decided[k] = decision
        for r in decision.dead:
            if r != self.plane.rank:
                self.plane.found_dead(r, "found dead by the ranks' agreement")
        if self.plane.rank in decision.dead:
            self.plane.evicted = self.plane.evicted or "the other ranks agreed it was lost"
        self.plane.cv.notify_all()

    def _forget_before(self, k: int) -> None:
        for table in (self.proposals, self.decided, self.promised, self.replies):
            for old in [x for x in table if x < k]:
                del table[old]
        self.announced = {x for x in self.announced if x >= k}
        self.queried = {x for x in self.queried if x >= k}
