"""Fault-tolerant agreement on a fault plane, on a tree: every live member calls ``agree(flag, payload)``
and all survivors return the same ``Decision``: the AND of the live members' flags, the set of members
found dead, and every live member's payload. O(log world) rounds and O(1) messages per member when nobody
dies; a death costs its subtree (or, for the root, everyone) one more pass up the tree.

The parts, named once:

- **agreement k**: the k-th ``agree`` call on the plane (every member calls them in the same order).
- **view**: the members this member knows dead or left; the **tree** (pycoll/fault/overlay.py: binomial,
  rooted at the lowest live member, dead members skipped) is a function of it, so members with the same
  view see the same tree, and a member whose view changes moves its part of the tree at once.
- **entry**: what a member brings to k: its flag, its payload, and its **promise**: the highest root it has
  seen for k (the lowest live member when it last looked); it rejects decisions of any lower root from then
  on. A member raises its promise whenever its view gives k a higher root.
- **bag**: the entries a member holds for k: its own and those its subtree sent up, with the dead its
  subtree knows and the best decision any of them already **holds** (the highest root's). A member sends
  its bag **up** to its parent once it holds an entry, promised to the current root, from every live member
  of its subtree, and again whenever that bag, its parent or the root changes.
- **root**: decides once its bag is complete for the whole tree: the held decision if there is one (a root
  that died may have reached some members before it died: they must not be contradicted), else a new one:
  flag = AND, dead = its view, payloads = the live entries'. The **decision** goes **down** the tree (and
  to any member that sends up a bag after it was made), tagged with its root, the **ballot**.
- **quorum**: a new decision needs more live members than silent ones among those not certainly gone (a
  member whose links closed is certainly dead; a silent one may be alive on the other side of a partition),
  or exactly half with the lowest of them. A root without quorum decides that its side is cut off: every
  member that gets that decision is evicted (``EvictedError``), so two sides of a partition never both go
  on.

Why all survivors get the same decision: only roots decide; a root r decides only once every live member
sent it an entry promised to r, so every member that could still accept a lower root's decision has
reported it (and r adopts it), and every other member will reject one. "Dead" is final: a member found dead
while alive is evicted (pycoll/fault/plane.py), so a decision it missed is never needed from it. Every wait
ends: the detector finds a silent member dead within its heartbeat timeout, and ``agree`` has its deadline.
"""

from __future__ import annotations

import bisect
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pycoll.errors import CollectiveTimeoutError
from pycoll.fault import overlay
from pycoll.fault.members import Members

_KEEP = 64  # agreements remembered (a member far behind asks about recent ones only)
#: A member waiting for a decision sends its bag up again this often (seconds): a frame routed through a
#: member that died on the way is lost, and the member that holds the decision answers the repeat.
RETRY_S = 1.0


class Payloads(Mapping[int, Any]):
    """A decision's payloads by rank, read-only: those that are None kept as runs of ranks, so that a
    decision of n members whose payloads are mostly None costs O(runs), not O(n), on every member."""

    def __init__(self, given: Mapping[int, Any] = MappingProxyType({}), none: Iterable[tuple[int, int]] = ()):
        self._given = {r: p for r, p in given.items() if p is not None}
        runs = sorted([(r, r) for r, p in given.items() if p is None] + [(int(a), int(b)) for a, b in none])
        merged: list[tuple[int, int]] = []
        for first, last in runs:
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        self.none = merged  # [(first, last)], sorted, disjoint
        self._firsts = [first for first, _ in merged]

    def _in_runs(self, r: int) -> bool:
        i = bisect.bisect_right(self._firsts, r) - 1
        return i >= 0 and r <= self.none[i][1]

    def __getitem__(self, r: int) -> Any:
        if r in self._given:
            return self._given[r]
        if isinstance(r, int) and self._in_runs(r):
            return None
        raise KeyError(r)

    def __contains__(self, r: object) -> bool:
        return r in self._given or (isinstance(r, int) and self._in_runs(r))

    def __iter__(self) -> Iterator[int]:
        return iter(sorted([*self._given, *(r for first, last in self.none for r in range(first, last + 1))]))

    def __len__(self) -> int:
        return len(self._given) + sum(last - first + 1 for first, last in self.none)

    def given(self) -> dict[int, Any]:
        """The payloads that are not None."""
        return dict(self._given)

    def __repr__(self) -> str:
        return f"Payloads({self._given!r}, none={self.none!r})"


@dataclass(frozen=True)
class Decision:
    flag: bool
    dead: frozenset[int]
    payloads: Payloads = field(default_factory=Payloads)
    #: False: the deciding side of the plane lacked quorum (it is cut off); every member that gets it is
    #: evicted.
    quorum: bool = True
    #: A random value the deciding root drew: only the members that got the decision know it (a membership
    #: change makes the next plane's token from it).
    nonce: str = ""

    def to_wire(self) -> dict[str, Any]:
        """Compact at any size: the members whose payload is None as runs [first, last] of ranks."""
        return {
            "flag": self.flag,
            "dead": sorted(self.dead),
            "payloads": {str(r): p for r, p in self.payloads.given().items()},
            "none": [list(run) for run in self.payloads.none],
            "quorum": self.quorum,
            "nonce": self.nonce,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Decision:
        payloads = Payloads({int(r): p for r, p in d["payloads"].items()},
                            [(int(first), int(last)) for first, last in d.get("none", ())])  # fmt: skip
        dead = frozenset(int(r) for r in d["dead"])
        return cls(bool(d["flag"]), dead, payloads, bool(d.get("quorum", True)), str(d.get("nonce", "")))


def has_quorum(world: int, live: list[int], gone: set[int]) -> bool:
    """Whether ``live`` may decide for the plane: more than half of the members not certainly ``gone``
    (dead with their links closed, or left), or exactly half holding the lowest of them."""
    base = [r for r in range(world) if r not in gone]
    if not base:
        return False
    return 2 * len(live) > len(base) or (2 * len(live) == len(base) and base[0] in live)


class Agreements:
    """The agreement state of one plane; every method runs with ``plane.lock`` held."""

    def __init__(self, plane: Members) -> None:
        self.plane = plane
        self.count = 0  # agreements this member has entered
        self.joined: set[int] = set()
        self.bags: dict[int, dict[int, list[Any]]] = {}  # k -> rank -> [flag, payload, promise]
        self.held: dict[int, tuple[int, dict[str, Any]]] = {}  # k -> (ballot, decision on the wire)
        self.promised: dict[int, int] = {}
        self.decided: dict[int, Decision] = {}
        self.wires: dict[int, dict[str, Any]] = {}  # k -> the decision held, on the wire
        self.ballots: dict[int, int] = {}  # k -> the ballot of the decision held
        self.sent_up: dict[int, tuple[Any, ...]] = {}  # k -> what the last bag sent up was (to skip repeats)
        self.sent_down: dict[int, dict[int, int]] = {}  # k -> child -> ballot sent to it
        self._shape: tuple[tuple[int, int], int, list[int], int | None, list[int]] | None = None

    # ---- the caller's side -------------------------------------------------------------------------
    def start(self, flag: bool, payload: Any) -> int:
        """Enters the next agreement with this member's entry; returns its k (``decided[k]`` once made)."""
        self.count += 1
        k = self.count
        self.joined.add(k)
        self.bags.setdefault(k, {})[self.plane.rank] = [bool(flag), payload, self.promised.get(k, -1)]
        self._progress(k)
        return k

    def agree(self, flag: bool, payload: Any, timeout: float) -> Decision:
        plane = self.plane
        deadline = time.monotonic() + timeout
        retry = time.monotonic() + RETRY_S
        with plane.cv:
            k = self.start(flag, payload)
            while True:
                if time.monotonic() >= retry:
                    retry = time.monotonic() + RETRY_S
                    self.retry()
                if k in self.decided:
                    self._forget_before(k - _KEEP)
                    plane.raise_if_evicted()
                    return self.decided[k]
                plane.raise_if_evicted()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(self._timeout_text(k, timeout))
                plane.cv.wait(min(left, 0.25, max(0.0, retry - time.monotonic())))

    def _timeout_text(self, k: int, timeout: float) -> str:
        plane = self.plane
        root, subtree, _, _ = self._tree()
        bag = self.bags.get(k, {})
        missing = [r for r in subtree if r not in bag]
        waiting = f"none below it; waiting for root {root}'s decision"
        who = ", ".join(map(str, missing)) if missing else waiting
        return (
            f"agreement #{k} on rank {plane.rank} did not complete within {timeout:.1f} s: live ranks "
            f"{', '.join(map(str, plane.live()))}; not heard from: {who} (did every rank call agree / "
            "shrink / grow?)"
        )

    # ---- the tree ----------------------------------------------------------------------------------
    def _gone(self, r: int) -> bool:
        return r in self.plane.dead or r in self.plane.left

    def _tree(self) -> tuple[int, list[int], int | None, list[int]]:
        """The root, this member's live subtree, its parent and its children, in the current view (the
        same for every k; kept until the view changes: dead and left only grow)."""
        plane = self.plane
        view = (len(plane.dead), len(plane.left))
        if self._shape is None or self._shape[0] != view:
            found = overlay.tree_root(plane.world, self._gone)
            root = plane.rank if found is None else found
            self._shape = (
                view,
                root,
                overlay.tree_subtree(plane.rank, root, plane.world, self._gone),
                overlay.tree_parent(plane.rank, root, plane.world, self._gone),
                overlay.tree_children(plane.rank, root, plane.world, self._gone),
            )
        return self._shape[1], self._shape[2], self._shape[3], self._shape[4]

    def _open(self) -> list[int]:
        """The agreements that may still be open somewhere: this member's latest, and while that one is
        undecided here the one before (a member behind may wait in it: members call agreements in order, and
        one that holds k + 1's decision knows every live member left k)."""
        k = self.count
        return [k, k - 1] if k not in self.decided else [k]

    # ---- messages ----------------------------------------------------------------------------------
    def on_message(self, peer: int, msg: dict[str, Any]) -> None:
        kind, k = msg["t"], int(msg["k"])
        plane = self.plane
        if k <= self.count - _KEEP:
            return
        if kind == "up":
            bag = self.bags.setdefault(k, {})
            for r, entry in msg["e"].items():
                mine = bag.get(int(r))
                if mine is None or int(entry[2]) > int(mine[2]):
                    bag[int(r)] = list(entry)
            if msg.get("h"):
                self._hold(k, int(msg["h"][0]), msg["h"][1])
            for r, certain in msg.get("d", {}).items():
                if int(r) == plane.rank:
                    plane.evict_self(f"rank {peer}'s subtree found it lost during an agreement")
                elif not self._gone(int(r)) or certain:
                    plane.found_dead(int(r), f"found dead by rank {peer}'s subtree during an agreement",
                                     confirmed=bool(certain))  # fmt: skip
            if k in self.decided and not msg.get("h"):  # it lacks the decision (its parent died, or it was
                self._send_decision(k, peer, again=True)  # adopted after the decision went down)
        elif kind == "decide":
            ballot = int(msg["b"])
            if ballot >= self.promised.get(k, -1) and ballot >= self.ballots.get(k, -1):
                self._accept(k, Decision.from_wire(msg["d"]), ballot, msg["d"])
        plane.cv.notify_all()
        self._progress(k)

    def retry(self) -> None:
        """Sends this member's bag up again for its undecided agreements (``agree`` calls it every
        ``RETRY_S`` while it waits)."""
        for k in self._open():
            if k in self.joined and k not in self.decided:
                self.sent_up.pop(k, None)
                self._progress(k)

    def last(self) -> list[Any] | None:
        """The latest decision this member holds, [k, ballot, decision on the wire], for its goodbye."""
        if not self.decided:
            return None
        k = max(self.decided)
        return [k, self.ballots[k], self.wires[k]]

    def from_leaver(self, last: list[Any]) -> None:
        """A member that left held this decision: it is taken whatever this member promised (a member leaves
        only once it returned from its agreements, with a decision no live member contradicts), and held for
        adoption should this member become the root."""
        k, ballot, wire = int(last[0]), int(last[1]), last[2]
        if k <= self.count - _KEEP:
            return
        self._hold(k, ballot, wire)
        if k not in self.decided:
            self._accept(k, Decision.from_wire(wire), ballot, wire)

    def changed(self) -> None:
        """The view changed (a member dead or left): every open agreement moves its part of the tree. What
        went to a member that is not a finger is sent again: a member it was routed through may have died
        with it."""
        fingers = set(self.plane.fingers)
        for k in self._open():
            sent = self.sent_up.get(k)
            if sent is not None and sent[0] not in fingers:
                del self.sent_up[k]
            down = self.sent_down.get(k, {})
            for child in [c for c in down if c not in fingers]:
                del down[child]
            self._progress(k)

    def _hold(self, k: int, ballot: int, decision: dict[str, Any]) -> None:
        if ballot > self.held.get(k, (-1, {}))[0]:
            self.held[k] = (ballot, decision)

    # ---- moving k on -------------------------------------------------------------------------------
    def _progress(self, k: int) -> None:
        plane = self.plane
        if k not in self.joined:
            return
        root, subtree, parent, _ = self._tree()
        promise = max(self.promised.get(k, -1), root)
        self.promised[k] = promise
        bag = self.bags.setdefault(k, {})
        bag[plane.rank][2] = promise
        if k in self.decided:
            if k not in self._open():
                return
            self._send_down(k)
            if self.ballots[k] >= root:
                return  # decided by the live root: nothing to report up
        complete = all(r in bag and int(bag[r][2]) >= root for r in subtree)
        if root == plane.rank:
            if complete and (k not in self.decided or self.ballots[k] < root):
                self._decide(k)  # a decision held from a dead root is sent on under this root's ballot
            return
        if not complete:
            return
        held = self.held.get(k)
        signature = (parent, root, tuple(sorted((r, int(e[2])) for r, e in bag.items())),
                     None if held is None else held[0])  # fmt: skip
        if parent is None or self.sent_up.get(k) == signature:
            return
        dead = {str(r): r in plane.confirmed for r in plane.dead}
        msg = {"t": "up", "k": k, "e": {str(r): e for r, e in bag.items()}, "d": dead,
               "h": None if held is None else [held[0], held[1]]}  # fmt: skip
        if plane.send(parent, msg):
            self.sent_up[k] = signature

    def _decide(self, k: int) -> None:
        plane = self.plane
        bag = self.bags[k]
        live = plane.live()
        held = self.held.get(k)
        if held is not None:
            self._accept(k, Decision.from_wire(held[1]), plane.rank, held[1])
            return
        if has_quorum(plane.world, live, plane.confirmed | plane.left):
            decision = Decision(
                flag=all(bool(bag[r][0]) for r in live),
                dead=frozenset(plane.dead),
                payloads=Payloads({r: bag[r][1] for r in live}),
                nonce=secrets.token_hex(8),
            )
        else:
            decision = Decision(flag=False, dead=frozenset(plane.dead), quorum=False)
        self._accept(k, decision, plane.rank, decision.to_wire())

    def _accept(self, k: int, decision: Decision, ballot: int, wire: dict[str, Any]) -> None:
        plane = self.plane
        if k not in self.decided:
            self.decided[k] = decision
            self.wires[k] = wire
            for r in decision.dead:
                if r != plane.rank and not self._gone(r):
                    plane.found_dead(r, "found dead by the ranks' agreement")
        self.ballots[k] = max(ballot, self.ballots.get(k, -1))
        self._hold(k, self.ballots[k], self.wires[k])
        if plane.rank in self.decided[k].dead:
            plane.evict_self("the other ranks agreed it was lost")
        elif not self.decided[k].quorum:
            silent = sorted(set(plane.dead) - plane.confirmed)
            plane.evict_self(
                f"it is on the smaller side of a partition: {len(plane.live())} rank(s) here, ranks "
                f"{', '.join(map(str, silent))} silent; the larger side goes on without it"
            )
        self._send_down(k)
        plane.cv.notify_all()

    def _send_down(self, k: int) -> None:
        for child in self._tree()[3]:
            self._send_decision(k, child)

    def _send_decision(self, k: int, peer: int, again: bool = False) -> None:
        ballot = self.ballots[k]
        sent = self.sent_down.setdefault(k, {})
        if sent.get(peer, -1) >= ballot and not again:
            return
        msg = {"t": "decide", "k": k, "b": ballot, "d": self.wires[k]}
        if self.plane.send(peer, msg):
            sent[peer] = ballot

    def _forget_before(self, k: int) -> None:
        tables = (self.bags, self.held, self.promised, self.decided, self.wires, self.ballots, self.sent_up,
                  self.sent_down)  # fmt: skip
        for table in tables:
            for old in [x for x in table if x < k]:
                del table[old]  # type: ignore[attr-defined]
        self.joined = {x for x in self.joined if x >= k}
