"""The fault plane's protocol at thousands of ranks, in one process: every rank's real ``Plane`` (its
detector's decisions, the flood, the routes, the agreement: pycoll/fault/plane.py, agreement.py,
overlay.py) runs over an in-memory network with delays, losses, partitions, stops and kills, in simulated
time, and every message is counted.

The parts, named once:

- **net** (``SimNet``): the ranks' planes and their links, and a queue of timed **deliveries**. A link is
  reliable and in order (TCP): a **loss** costs its frame a retransmission timeout, not the frame.
- **faults**: ``kill`` (the process is gone: each finger's link closes, its reader sees it ``delay`` later),
  ``stop`` (SIGSTOP: it handles nothing, and each finger finds it silent ``heartbeat_timeout`` later),
  ``partition`` (frames between the sides wait, as TCP's retransmissions do, and each side finds the other
  silent) and ``heal``.
- **heartbeats** are counted, not sent one by one: the links' thread sends one per link and heartbeat
  interval (timeout / 5) when nothing else was sent, so an idle rank sends one per live finger and interval;
  the silence they would reveal is scheduled where it would be found.
- **depth**: a frame sent while a delivery of depth d is handled has depth d + 1 (a fault's first events
  have depth 1): the hops a fact or an agreement took.

pycoll/fault/* never imports this module; tests/unit/test_fault_sim.py and bench/fault_sim.py use it.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import logging
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from pycoll.fault import overlay
from pycoll.fault.agreement import RETRY_S, Decision
from pycoll.fault.plane import Plane

_GONE, _SENT = 1, 0


class SimLinks:
    """One rank's links over the net (what ``Plane`` asks of ``_C.ControlLinks``)."""

    def __init__(self, net: SimNet, rank: int) -> None:
        self.net, self.rank = net, rank
        self.open = set(overlay.fingers(rank, net.world))

    def send(self, peer: int, body: bytes) -> int:
        net = self.net
        if peer not in self.open or not net.alive[self.rank]:
            return _GONE
        net.post(self.rank, peer, "f", body)
        return _SENT

    def drop(self, peer: int) -> None:
        if peer in self.open:
            self.open.discard(peer)
            self.net.post(self.rank, peer, "c", b"its control link closed: the process exited or was killed")

    def take(self, timeout_s: float) -> list[tuple[int, str, bytes]]:
        return []

    def settle(self) -> int:
        return 0

    def close(self, flush_s: float) -> None:
        for peer in sorted(self.open):
            self.drop(peer)


@dataclass
class Learned:
    """When (simulated seconds) and at what depth each rank learned a fact."""

    at: dict[int, float] = field(default_factory=dict)
    depth: dict[int, int] = field(default_factory=dict)


class SimNet:
    """``world`` ranks' planes over an in-memory network (see the module's docstring)."""

    def __init__(
        self,
        world: int,
        *,
        delay_ms: float = 0.5,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        rto_ms: float = 200.0,
        heartbeat_timeout: float = 5.0,
        seed: int = 0,
    ) -> None:
        self.world = world
        self.delay, self.jitter, self.loss, self.rto = delay_ms / 1e3, jitter_ms / 1e3, loss, rto_ms / 1e3
        self.heartbeat_timeout = heartbeat_timeout
        self.rng = random.Random(seed)
        self.now = 0.0
        self.depth = 0  # of the delivery being handled (0: none)
        self.last = (0, -1)  # the depth and destination of the last delivery
        self.alive = [True] * world
        self.stopped: set[int] = set()
        self.side: set[int] | None = None  # a partition: this side, and the rest
        self._queue: list[tuple[float, int, int, int, str, bytes, int]] = []
        self._seq = itertools.count()
        self._held: dict[int, list[tuple[int, str, bytes, int]]] = {}  # a stopped rank's deliveries
        self._cut: list[tuple[int, int, str, bytes, int]] = []  # frames waiting for a partition to heal
        self._last: dict[tuple[int, int], float] = {}  # per link: the last delivery time (in order)
        self.sent: Counter[str] = Counter()  # frames sent, by their "t" (routed ones by the inner one)
        self.sent_by: Counter[int] = Counter()
        #: Called as on_send(src, dst, msg) after every frame is queued (a scripted fault may kill src).
        self.on_send: Callable[[int, int, dict[str, Any]], None] | None = None
        self.dead_learned: dict[int, Learned] = {}
        logging.getLogger("pycoll").setLevel(logging.ERROR)  # one warning per rank and death is noise here
        self.links = [SimLinks(self, r) for r in range(world)]
        members: list[dict[str, Any]] = [{} for _ in range(world)]  # one list for all planes: O(n), not O(n²)
        self.planes = [
            Plane(r, world, "sim", "sim", self.links[r], members, None, heartbeat_timeout, thread=False)
            for r in range(world)
        ]
        for r, plane in enumerate(self.planes):
            plane.add_listener(functools.partial(self._learned, r))

    # ---- the network -------------------------------------------------------------------------------
    def post(self, src: int, dst: int, kind: str, data: bytes) -> None:
        """Queues an event of ``src``'s link for ``dst``: a frame ('f') or its closing ('c')."""
        depth = self.depth + 1
        if kind == "f":
            msg = json.loads(data)
            inner = msg.get("m", {}).get("t") if msg.get("t") == "via" else msg.get("t")
            self.sent[str(inner)] += 1
            self.sent_by[src] += 1
        if self.side is not None and (src in self.side) != (dst in self.side):
            self._cut.append((src, dst, kind, data, depth))
        else:
            self._schedule(src, dst, kind, data, depth, self.now)
        if kind == "f" and self.on_send is not None:
            self.on_send(src, dst, json.loads(data))

    def _schedule(self, src: int, dst: int, kind: str, data: bytes, depth: int, start: float) -> None:
        t = start + self.delay + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)
        while self.loss and self.rng.random() < self.loss:
            t += self.rto  # TCP retransmits what was lost
        t = max(t, self._last.get((src, dst), 0.0))  # a link delivers in order
        self._last[(src, dst)] = t
        heapq.heappush(self._queue, (t, next(self._seq), src, dst, kind, data, depth))

    def _timer(self, at: float, dst: int, src: int, kind: str, data: bytes) -> None:
        heapq.heappush(self._queue, (at, next(self._seq), src, dst, kind, data, 1))

    def run(self, until: Callable[[], bool] | None = None, max_s: float = 600.0) -> bool:
        """Delivers in time order until ``until()`` holds (True), or nothing is left or ``max_s`` of
        simulated time passed (False)."""
        limit = self.now + max_s
        if until is not None and until():
            return True
        while self._queue:
            t, _, src, dst, kind, data, depth = heapq.heappop(self._queue)
            if t > limit:
                heapq.heappush(self._queue, (t, next(self._seq), src, dst, kind, data, depth))
                break
            self.now = max(self.now, t)
            self._deliver(src, dst, kind, data, depth)
            if until is not None and until():
                return True
        return until() if until is not None else True

    def _deliver(self, src: int, dst: int, kind: str, data: bytes, depth: int) -> None:
        if not self.alive[dst]:
            return
        if dst in self.stopped:
            self._held.setdefault(dst, []).append((src, kind, data, depth))
            return
        if src not in self.links[dst].open:
            return  # this end closed the link: nothing more is read from it
        if kind == "s":  # a silence found: only if it still holds
            if not self._silent(dst, src):
                return
        elif kind == "c":
            self.links[dst].open.discard(src)
        self.depth = depth
        try:
            self.planes[dst].on_event(src, kind, data)
        finally:
            self.depth = 0
            self.last = (depth, dst)

    def _silent(self, watcher: int, peer: int) -> bool:
        if peer not in self.links[watcher].open:
            return False
        cut = self.side is not None and (watcher in self.side) != (peer in self.side)
        return peer in self.stopped or cut

    # ---- faults ------------------------------------------------------------------------------------
    def kill(self, rank: int) -> None:
        """SIGKILL: the process is gone; every finger's link closes."""
        if not self.alive[rank]:
            return
        self.alive[rank] = False
        depth, self.depth = self.depth, 0
        for peer in sorted(self.links[rank].open):
            self.links[rank].open.discard(peer)
            self.post(rank, peer, "c", b"its control link closed: the process exited or was killed")
        self.depth = depth

    def stop(self, rank: int) -> None:
        """SIGSTOP: it handles nothing; its fingers find it silent one heartbeat timeout later."""
        self.stopped.add(rank)
        for peer in self.links[rank].open:
            self._timer(self.now + self.heartbeat_timeout, peer, rank, "s", b"%.1f" % self.heartbeat_timeout)

    def resume(self, rank: int) -> None:
        """SIGCONT: it handles what waited for it."""
        self.stopped.discard(rank)
        for src, kind, data, _depth in self._held.pop(rank, []):
            self._schedule(src, rank, kind, data, 1, self.now)

    def partition(self, side: set[int]) -> None:
        """Cuts ``side`` off from the other ranks: frames wait, and each side finds the other silent."""
        self.side = set(side)
        for a in range(self.world):
            for b in self.links[a].open:
                if (a in self.side) != (b in self.side):
                    silent = b"%.1f" % self.heartbeat_timeout
                    self._timer(self.now + self.heartbeat_timeout, a, b, "s", silent)

    def heal(self) -> None:
        self.side = None
        for src, dst, kind, data, depth in self._cut:
            self._schedule(src, dst, kind, data, depth, self.now)
        self._cut = []

    # ---- what the tests and the benchmark read -----------------------------------------------------
    def _learned(self, rank: int, kind: str, who: int, why: str) -> None:
        if kind == "dead":
            seen = self.dead_learned.setdefault(who, Learned())
            seen.at.setdefault(rank, self.now)
            seen.depth.setdefault(rank, self.depth)

    def live(self) -> list[int]:
        """The ranks whose process runs (not stopped) and that were not evicted."""
        return [r for r in range(self.world)
                if self.alive[r] and r not in self.stopped and self.planes[r].evicted is None]  # fmt: skip

    def formation_messages(self) -> float:
        """Frames per rank to form the plane's links: a hello each way a finger link is dialled, and its
        answer."""
        return sum(len(overlay.fingers(r, self.world)) for r in range(self.world)) / self.world

    def idle_heartbeats(self) -> float:
        """Frames per live rank and heartbeat interval when idle: one per live finger."""
        live = [r for r in range(self.world) if self.alive[r]]
        return sum(len(self.links[r].open) for r in live) / max(1, len(live))

    def agree(
        self, ranks: list[int] | None = None, flag: Callable[[int], bool] = lambda r: True,
        payload: Callable[[int], Any] = lambda r: None, max_s: float = 600.0,
    ) -> AgreeRun:  # fmt: skip
        """Every rank of ``ranks`` (default: the live ones) enters the next agreement now; runs until each
        of them that is still live decided, or was evicted."""
        ranks = self.live() if ranks is None else ranks
        sent0, by0, t0 = Counter(self.sent), Counter(self.sent_by), self.now
        run = AgreeRun(t0=t0)
        ks: dict[int, int] = {}
        for r in ranks:
            ks[r] = self.planes[r].agreements.start(flag(r), payload(r))
        pending = set(ranks)
        count = itertools.count()

        def done() -> bool:
            # Only the rank a delivery went to can have decided by it; a sweep now and then finds the
            # ranks killed or evicted meanwhile.
            dst = self.last[1]
            if dst in pending:
                self._note_decided(run, dst, ks[dst])
                if dst in run.decisions:
                    pending.discard(dst)
            if next(count) % 4096 == 0 or not pending:
                for r in list(pending):
                    self._note_decided(run, r, ks[r])
                    if r in run.decisions or not self.alive[r] or self.planes[r].evicted is not None:
                        pending.discard(r)
            return not pending

        while not self.run(done, max_s - (self.now - t0)) and self.now - t0 < max_s:
            # Nothing left to deliver, and some wait still: agree()'s timer sends their bags again.
            self.now += RETRY_S
            for r in sorted(pending):
                if self.alive[r] and r not in self.stopped:
                    self.planes[r].agreements.retry()
            if not self._queue:
                break
        for r in ranks:
            if self.alive[r]:
                self._note_decided(run, r, ks[r])
        run.finished = all(r in run.decisions or r not in self.live() for r in ranks)
        run.kinds = self.sent - sent0
        run.messages = run.kinds["up"] + run.kinds["decide"]
        run.max_per_rank = max((self.sent_by[r] - by0[r] for r in ranks), default=0)
        run.seconds = max(run.at.values(), default=t0) - t0
        return run

    def shrink(self, max_s: float = 600.0) -> ShrinkRun:
        """What ``comm.shrink()`` does on the plane (pycoll/fault/membership.py): the agreement on who is
        left, the survivors' new plane (its links: ``SimNet`` of the survivors), and the commit agreement on
        this plane. Returns both agreements and the new net."""
        decision = self.agree(max_s=max_s)
        survivors = sorted({r for d in decision.decisions.values() if d.quorum for r in d.payloads})
        new = SimNet(max(1, len(survivors)), delay_ms=self.delay * 1e3,
                     heartbeat_timeout=self.heartbeat_timeout)  # fmt: skip
        commit = self.agree(flag=lambda r: True, max_s=max_s)
        return ShrinkRun(decision, commit, new, survivors)

    def _note_decided(self, run: AgreeRun, r: int, k: int) -> None:
        d = self.planes[r].agreements.decided.get(k)
        if d is not None and r not in run.decisions:
            run.decisions[r] = d
            run.at[r] = self.now
            run.rounds[r] = self.last[0] if self.last[1] == r else 0


@dataclass
class AgreeRun:
    """One agreement in the simulation: every rank's decision, when and at what depth it got it."""

    t0: float
    decisions: dict[int, Decision] = field(default_factory=dict)
    at: dict[int, float] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)
    #: Frames sent meanwhile, by kind (floods of the deaths found meanwhile included), and the agreement's
    #: own.
    kinds: Counter[str] = field(default_factory=Counter)
    messages: int = 0
    #: The most frames any rank sent meanwhile (all kinds).
    max_per_rank: int = 0
    seconds: float = 0.0
    finished: bool = False

    def uniform(self, ranks: list[int]) -> bool:
        """Whether every rank of ``ranks`` holds the same decision."""
        got = {self._key(self.decisions[r]) for r in ranks if r in self.decisions}
        return len(got) <= 1 and all(r in self.decisions for r in ranks)

    @staticmethod
    def _key(d: Decision) -> tuple[Any, ...]:
        return (d.flag, d.dead, tuple(sorted(d.payloads)), d.quorum)


def log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


@dataclass
class ShrinkRun:
    """A shrink in the simulation: its two agreements and the survivors' new plane."""

    decision: AgreeRun
    commit: AgreeRun
    new: SimNet
    survivors: list[int]

    def messages_per_rank(self) -> float:
        """Frames per survivor: both agreements, and the new plane's links."""
        n = max(1, len(self.survivors))
        return (self.decision.messages + self.commit.messages) / n + self.new.formation_messages()
