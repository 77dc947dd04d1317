"""The skew report: per rank, how late it entered the collectives and how long the others waited for it.

Built from the native recorder's snapshot (csrc/engine/skew.h names the parts: stamps, clock, lateness,
wait, totals, recent); read it as docs/skew.md explains. Times are milliseconds.

- **run**: every recorded collective since the communicator was made (percentiles from a histogram of 16
  buckets per octave, read at a bucket's middle: within 3.2%).
- **window**: the most recent collectives (PYCOLL_SKEW_WINDOW, or the ``window`` asked for); exact.
- **kinds**: the run, one collective kind at a time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from pycoll import _C
from pycoll.codes import COLLECTIVE_NAMES

_NS_PER_MS = 1e6
# The smallest lateness of each histogram bucket, and one past the last (csrc/engine/skew.cc bucket()).
_BUCKETS = 512
_FLOORS = np.array([_C.skew_bucket_floor(b) for b in range(_BUCKETS)] + [1 << 42], dtype=np.float64)


@dataclass
class RankSkew:
    """One rank's line of a report section."""

    rank: int
    host: str
    count: int  # collectives recorded
    late_ms: dict[str, float]  # mean, p50, p99, max: how long after the first rank it entered
    wait_inflicted_ms: float  # the time the other ranks spent waiting for this rank, summed
    wait_suffered_ms: float  # the time this rank spent waiting for the last one, summed
    last: int  # collectives it entered last


@dataclass
class SkewSection:
    """The ranks over one span of collectives (the whole run, the recent window, or one kind)."""

    collectives: int
    ranks: list[RankSkew]
    #: The rank(s) that entered last most often (ties: all of them); empty when nothing was recorded.
    last_most_often: list[int]

    @property
    def wait_ms(self) -> float:
        """The time every rank spent waiting for the last one, summed over ranks and collectives."""
        return sum(r.wait_suffered_ms for r in self.ranks)


@dataclass
class SkewReport:
    """Who arrived late at this communicator's collectives, and what it cost the others.

    ``ranks`` (the whole run, every kind) is the headline; ``window`` the same over the recent collectives,
    ``kinds`` per collective kind. ``to_dict()`` gives JSON; ``str(report)`` a table; ``plot()`` a figure.
    """

    world: int
    hosts: list[str]
    run: SkewSection
    window: SkewSection
    kinds: dict[str, SkewSection]
    #: Collectives left out: their stamps did not all arrive (or a rank records nothing), or the clocks
    #: of other hosts were not estimated yet.
    unmatched: int = 0
    unsynced: int = 0
    #: Per rank: the offset from its clock to rank 0's (ms), and how far it may be off (-1: unknown).
    clock_offset_ms: list[float] = field(default_factory=list)
    clock_uncertainty_ms: list[float] = field(default_factory=list)

    @property
    def ranks(self) -> list[RankSkew]:
        return self.run.ranks

    @property
    def last_most_often(self) -> list[int]:
        return self.run.last_most_often

    # ---- JSON ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """``{"world", "hosts", "collectives", "ranks": [{"rank", "host", "count", "late_ms": {"mean",
        "p50", "p99", "max"}, "wait_inflicted_ms", "wait_suffered_ms", "last"}, ...], "last_most_often",
        "window": {...}, "kinds": {kind: {...}}, "unmatched", "unsynced", "clock": {...}}``: ranks in
        rank order; plain JSON types."""
        d: dict[str, Any] = {"world": self.world, "hosts": list(self.hosts)}
        d.update(_section_dict(self.run))
        d["window"] = _section_dict(self.window)
        d["kinds"] = {k: _section_dict(s) for k, s in self.kinds.items()}
        d["unmatched"] = self.unmatched
        d["unsynced"] = self.unsynced
        d["clock"] = {"offset_ms": self.clock_offset_ms, "uncertainty_ms": self.clock_uncertainty_ms}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SkewReport:
        clock = d.get("clock", {})
        return cls(
            world=int(d["world"]),
            hosts=list(d["hosts"]),
            run=_section_from(d),
            window=_section_from(d["window"]),
            kinds={k: _section_from(s) for k, s in d.get("kinds", {}).items()},
            unmatched=int(d.get("unmatched", 0)),
            unsynced=int(d.get("unsynced", 0)),
            clock_offset_ms=list(clock.get("offset_ms", [])),
            clock_uncertainty_ms=list(clock.get("uncertainty_ms", [])),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    # ---- text ---------------------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"# skew: {self.run.collectives} collectives on {self.world} ranks" + self._left_out()]
        lines += _table(self.run, "whole run")
        if self.window.collectives and self.window.collectives != self.run.collectives:
            lines += _table(self.window, f"last {self.window.collectives} collectives")
        if len(self.kinds) > 1:
            for kind, s in self.kinds.items():
                lines.append(f"#   {kind}: {_verdict(s)}")
        return "\n".join(lines)

    def _left_out(self) -> str:
        parts = []
        if self.unmatched:
            parts.append(f"{self.unmatched} not matched")
        if self.unsynced:
            parts.append(f"{self.unsynced} before the clocks were estimated")
        return f" ({', '.join(parts)} left out)" if parts else ""

    # ---- figure -------------------------------------------------------------------------------------
    def plot(self, path: str | None = None) -> Any:
        """A figure (matplotlib): mean and p99 lateness per rank, and the wait each rank inflicted, over
        the whole run and the window. Saved to ``path`` when given; returns the Figure."""
        from pycoll.skew.plot import plot_report

        return plot_report(self, path)


def _section_dict(s: SkewSection) -> dict[str, Any]:
    return {
        "collectives": s.collectives,
        "ranks": [asdict(r) for r in s.ranks],
        "last_most_often": list(s.last_most_often),
    }


def _section_from(d: Mapping[str, Any]) -> SkewSection:
    return SkewSection(
        collectives=int(d["collectives"]),
        ranks=[RankSkew(**r) for r in d["ranks"]],
        last_most_often=list(d["last_most_often"]),
    )


def _verdict(s: SkewSection) -> str:
    """Who kept the others waiting: the rank that inflicted the most wait, when it stands out (at least
    twice its fair share of all the waiting, or 90% of it with two ranks), else "balanced"."""
    total = sum(r.wait_inflicted_ms for r in s.ranks)
    if not s.collectives or total <= 0:
        return "nothing recorded" if not s.collectives else "no rank kept the others waiting"
    top = max(s.ranks, key=lambda r: r.wait_inflicted_ms)
    world = len(s.ranks)
    share = top.wait_inflicted_ms / total
    if share < min(0.9, 2.0 / world):
        return (
            f"balanced: no rank stands out (the most, rank {top.rank} ({top.host}), caused "
            f"{100 * share:.0f}% "
            f"of the {total:.3f} ms the ranks waited; an even share is {100 / world:.0f}%)"
        )
    return (
        f"rank {top.rank} ({top.host}) kept the others waiting: {top.wait_inflicted_ms:.3f} ms of the "
        f"{total:.3f} ms they waited ({100 * share:.0f}%); last in {100 * top.last / s.collectives:.0f}% of "
        f"{s.collectives}, {top.late_ms['mean']:.3f} ms late on average"
    )


def _table(s: SkewSection, title: str) -> list[str]:
    head = (
        f"# {'rank':>4}  {'host':<16} {'count':>7}  {'late mean':>10} {'p50':>9} {'p99':>9} {'max':>9}  "
        f"{'inflicted':>11} {'suffered':>11} {'last':>6}"
    )
    lines = [f"# {title} (ms)", head]
    for r in s.ranks:
        m = r.late_ms
        share = f"{100.0 * r.last / s.collectives:.0f}%" if s.collectives else "-"
        lines.append(
            f"  {r.rank:>4}  {r.host[:16]:<16} {r.count:>7}  {m['mean']:>10.3f} {m['p50']:>9.3f} "
            f"{m['p99']:>9.3f} {m['max']:>9.3f}  {r.wait_inflicted_ms:>11.3f} {r.wait_suffered_ms:>11.3f} "
            f"{share:>6}"
        )
    lines.append(f"# {_verdict(s)}")
    return lines


# ---- from the native snapshot ------------------------------------------------------------------------
def _most_often(last: np.ndarray, collectives: int) -> list[int]:
    if collectives == 0 or last.size == 0 or last.max() == 0:
        return []
    return [int(r) for r in np.flatnonzero(last == last.max())]


def _hist_percentile(hist: np.ndarray, q: float, top_ns: float) -> float:
    """The q-quantile (ns) of a lateness histogram: the middle of its bucket, at most the maximum."""
    total = int(hist.sum())
    if total == 0:
        return 0.0
    b = int(np.searchsorted(np.cumsum(hist), q * total, side="left"))
    b = min(b, _BUCKETS - 1)
    return float(min((_FLOORS[b] + _FLOORS[b + 1]) / 2, top_ns))


def _rank_line(
    rank: int,
    host: str,
    n: int,
    late_ns: tuple[float, float, float, float],
    inflicted: Any,
    suffered: Any,
    last: Any,
) -> RankSkew:
    """A rank's line from nanoseconds: lateness (mean, p50, p99, max), wait inflicted and suffered."""
    late = {k: float(v) / _NS_PER_MS for k, v in zip(("mean", "p50", "p99", "max"), late_ns)}
    return RankSkew(
        rank, host, n, late, float(inflicted) / _NS_PER_MS, float(suffered) / _NS_PER_MS, int(last)
    )


def _run_section(snap: Mapping[str, Any], hosts: Sequence[str], kinds: Sequence[int]) -> SkewSection:
    """Totals summed over ``kinds``."""
    world = int(snap["world"])
    count = snap["count"][kinds].sum(axis=0)
    sums = snap["sum_ns"][kinds].sum(axis=0)
    tops = snap["max_ns"][kinds].max(axis=0) if len(kinds) else np.zeros(world)
    hist = snap["hist"][kinds].sum(axis=0)
    last = snap["last"][kinds].sum(axis=0)
    inflicted = snap["inflicted_ns"][kinds].sum(axis=0)
    suffered = snap["suffered_ns"][kinds].sum(axis=0)
    collectives = int(count[0]) if world else 0
    ranks = []
    for r in range(world):
        n = int(count[r])
        top = float(tops[r])
        late = (
            float(sums[r]) / n if n else 0.0,
            _hist_percentile(hist[r], 0.50, top),
            _hist_percentile(hist[r], 0.99, top),
            top,
        )
        ranks.append(_rank_line(r, hosts[r], n, late, inflicted[r], suffered[r], last[r]))
    return SkewSection(collectives, ranks, _most_often(last, collectives))


def _window_section(snap: Mapping[str, Any], hosts: Sequence[str], window: int | None) -> SkewSection:
    """The most recent collectives, exact: lateness [n, world] in ns."""
    late = np.asarray(snap["recent_late_ns"], dtype=np.float64)
    last_rank = np.asarray(snap["recent_last"])
    if window is not None:
        keep = slice(len(late) - min(window, len(late)), None)
        late, last_rank = late[keep], last_rank[keep]
    n, world = late.shape[0], int(snap["world"])
    last: Any
    suffered: Any
    inflicted: Any
    if n:
        latest = late[np.arange(n), last_rank]
        suffered = (latest[:, None] - late).sum(axis=0)
        per = latest * world - late.sum(axis=1)  # what each collective's last rank inflicted
        inflicted = np.bincount(last_rank, weights=per, minlength=world)
        last = np.bincount(last_rank, minlength=world)
    else:
        suffered = inflicted = np.zeros(world)
        last = np.zeros(world, dtype=np.float64)
    ranks = []
    for r in range(world):
        col = late[:, r]
        stats = (
            (
                float(col.mean()),
                float(np.percentile(col, 50)),
                float(np.percentile(col, 99)),
                float(col.max()),
            )
            if n
            else (0.0, 0.0, 0.0, 0.0)
        )
        ranks.append(_rank_line(r, hosts[r], n, stats, inflicted[r], suffered[r], last[r]))
    return SkewSection(n, ranks, _most_often(last, n))


def from_snapshot(snap: Mapping[str, Any], hosts: Sequence[str], window: int | None = None) -> SkewReport:
    """A report of one rank's native recorder (``NativeCommunicator.skew_snapshot()``)."""
    world = int(snap["world"])
    used = [k for k in range(len(COLLECTIVE_NAMES)) if snap["count"][k].any()]
    return SkewReport(
        world=world,
        hosts=list(hosts),
        run=_run_section(snap, hosts, used),
        window=_window_section(snap, hosts, window),
        kinds={COLLECTIVE_NAMES[k]: _run_section(snap, hosts, [k]) for k in used},
        unmatched=int(snap["unmatched"]),
        unsynced=int(snap["unsynced"]),
        clock_offset_ms=[float(x) / _NS_PER_MS for x in snap["offset_ns"]],
        clock_uncertainty_ms=[float(x) / _NS_PER_MS if x >= 0 else -1.0 for x in snap["uncertainty_ns"]],
    )
