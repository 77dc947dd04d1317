"""The skew report (pycoll/skew/report.py) from synthetic snapshots: no processes.

``snapshot()`` below builds what the native recorder's ``skew_snapshot()`` returns (csrc/python/bind_skew.cc:
the same keys, shapes and dtypes) from a matrix of entry times, doing per collective what
``SkewRecorder::record`` does (csrc/engine/skew.cc): lateness against the earliest entry, the last rank
(the lowest of a tie), waits suffered and inflicted, per-kind totals with the histogram buckets of
``_C.skew_bucket``, and the recent window of the last ``capacity`` collectives.

Checked: the window's statistics equal numpy's exactly; the whole run's mean and max are exact and its
p50 / p99 (from the histogram) within 3.5% of numpy's on lognormal lateness; the run and the window agree
when every collective fits the window; wait is conserved; per-kind sections; to_dict / from_dict / JSON;
str() (a row per rank, the verdict naming the rank that kept the others waiting, or "balanced"); ties of
``last_most_often``; an empty window and an empty snapshot; the histogram's buckets; plot().
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from pycoll import _C
from pycoll.codes import COLLECTIVE_NAMES
from pycoll.skew import RankSkew, SkewReport, SkewSection
from pycoll.skew import report as report_module
from pycoll.skew.report import from_snapshot

KINDS = len(COLLECTIVE_NAMES)
BUCKETS = 512
NS_PER_MS = 1e6
ALLREDUCE = COLLECTIVE_NAMES.index("allreduce")
BARRIER = COLLECTIVE_NAMES.index("barrier")
#: The keys of a section in to_dict() (docs/skew.md), and of the whole report.
SECTION_KEYS = {"collectives", "ranks", "last_most_often"}
RANK_KEYS = {"rank", "host", "count", "late_ms", "wait_inflicted_ms", "wait_suffered_ms", "last"}
REPORT_KEYS = {"world", "hosts", "window", "kinds", "unmatched", "unsynced", "clock"} | SECTION_KEYS


def hosts_of(world: int) -> list[str]:
    return [f"host{chr(ord('a') + r)}" for r in range(world)]


def snapshot(
    entries_ns: np.ndarray,
    kinds: np.ndarray | None = None,
    *,
    capacity: int = 1000,
    unmatched: int = 0,
    unsynced: int = 0,
    offset_ns: list[int] | None = None,
    uncertainty_ns: list[int] | None = None,
    world: int | None = None,
) -> dict[str, Any]:
    """A native snapshot of the collectives whose entries (ns, any origin) are ``entries_ns`` [n, world]."""
    entries_ns = np.asarray(entries_ns, dtype=np.int64)
    world = entries_ns.shape[1] if world is None else world
    n = entries_ns.shape[0]
    entries_ns = entries_ns.reshape(n, world)
    kinds = np.full(n, ALLREDUCE) if kinds is None else np.asarray(kinds)
    count = np.zeros((KINDS, world), np.uint64)
    last = np.zeros((KINDS, world), np.uint64)
    sum_ns = np.zeros((KINDS, world), np.int64)
    max_ns = np.zeros((KINDS, world), np.int64)
    inflicted = np.zeros((KINDS, world), np.int64)
    suffered = np.zeros((KINDS, world), np.int64)
    hist = np.zeros((KINDS, world, BUCKETS), np.uint32)
    late = entries_ns - entries_ns.min(axis=1, keepdims=True) if n else entries_ns
    # the last rank: the first of the latest (SkewRecorder::record keeps the lowest rank of a tie)
    lasts = np.argmax(late, axis=1).astype(np.int32) if n else np.zeros(0, np.int32)
    waited = late[np.arange(n), lasts][:, None] - late
    buckets = np.array([_C.skew_bucket(int(v)) for v in late.ravel()], dtype=np.int64).reshape(late.shape)
    ranks = np.broadcast_to(np.arange(world), late.shape)
    for k in range(KINDS):
        mask = kinds == k
        if not mask.any():
            continue
        count[k] = mask.sum()
        sum_ns[k] = late[mask].sum(axis=0)
        max_ns[k] = late[mask].max(axis=0)
        suffered[k] = waited[mask].sum(axis=0)
        np.add.at(inflicted[k], lasts[mask], waited[mask].sum(axis=1))
        last[k] = np.bincount(lasts[mask], minlength=world)
        np.add.at(hist[k], (ranks[mask].ravel(), buckets[mask].ravel()), 1)
    keep = slice(n - min(n, capacity), None)
    return {
        "world": world,
        "recorded": n,
        "unmatched": unmatched,
        "unsynced": unsynced,
        "count": count,
        "last": last,
        "sum_ns": sum_ns,
        "max_ns": max_ns,
        "inflicted_ns": inflicted,
        "suffered_ns": suffered,
        "hist": hist,
        "recent_seq": np.arange(n, dtype=np.uint64)[keep] + 5,
        "recent_kind": kinds[keep].astype(np.int32),
        "recent_last": lasts[keep],
        "recent_late_ns": np.ascontiguousarray(late[keep]).reshape(-1, world),
        "offset_ns": np.array(offset_ns if offset_ns is not None else [0] * world, np.int64),
        "uncertainty_ns": np.array(uncertainty_ns if uncertainty_ns is not None else [0] * world, np.int64),
    }


def lognormal_entries(
    n: int,
    world: int,
    seed: int,
    median_ms: float = 1.0,
    sigma: float = 1.0,
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.lognormal(np.log(median_ms * NS_PER_MS), sigma, size=(n, world))).astype(np.int64)


def straggler_entries(n: int, world: int, slow: int, late_ms: float, seed: int = 0) -> np.ndarray:
    """Every rank within 50 us of the others, but ``slow``, ``late_ms`` behind."""
    rng = np.random.default_rng(seed)
    e = rng.integers(0, 50_000, size=(n, world))
    e[:, slow] += int(late_ms * NS_PER_MS)
    return e


def late_ms_of(snap: dict[str, Any]) -> np.ndarray:
    return np.asarray(snap["recent_late_ns"], dtype=np.float64) / NS_PER_MS


# ---- the histogram ---------------------------------------------------------------------------------------
def test_every_value_falls_in_its_bucket():
    rng = np.random.default_rng(1)
    edges = [0, 1, 1023, 1024, 1025, 1087, 1088, 2047, 2048, 2049]
    edges += [v + d for e in range(10, 41) for v in (1 << e,) for d in (-1, 0, 1)]
    spread = np.exp(rng.uniform(0, np.log(float(1 << 41)), 5000)).astype(np.int64).tolist()
    values = sorted(set(edges + spread))
    previous = 0
    for v in values:
        b = _C.skew_bucket(v)
        assert 0 <= b < BUCKETS
        assert _C.skew_bucket_floor(b) <= v < _C.skew_bucket_floor(b + 1), (v, b)
        assert b >= previous, f"buckets out of order at {v}"  # values sorted: buckets never go down
        previous = b
    assert _C.skew_bucket(1023) == 0 and _C.skew_bucket(1024) == 1
    # 16 buckets per octave: the relative width of a bucket is at most 1/16, so a bucket's middle is
    # within 1/32 (3.1%) of every value in it.
    for b in range(1, BUCKETS - 1):
        lo, hi = _C.skew_bucket_floor(b), _C.skew_bucket_floor(b + 1)
        assert hi > lo and (hi - lo) / lo <= 1 / 16 + 1e-12, b


def test_values_past_the_histogram_go_in_the_last_bucket():
    top = _C.skew_bucket_floor(BUCKETS - 1)
    for v in (top, top + 1, 1 << 42, 1 << 50, (1 << 62) - 1):
        assert _C.skew_bucket(v) == BUCKETS - 1
    assert _C.skew_bucket(top - 1) == BUCKETS - 2


def test_the_python_floors_mirror_the_native_ones():
    floors = report_module._FLOORS
    assert len(floors) == BUCKETS + 1
    assert [int(f) for f in floors[:BUCKETS]] == [_C.skew_bucket_floor(b) for b in range(BUCKETS)]
    assert floors[BUCKETS] > floors[BUCKETS - 1]


# ---- the window: exact ------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [None, 1, 37, 400, 5000])
def test_window_statistics_equal_numpys(window):
    n, world, capacity = 700, 5, 400
    snap = snapshot(lognormal_entries(n, world, seed=2), capacity=capacity)
    rep = from_snapshot(snap, hosts_of(world), window)
    late = late_ms_of(snap)
    if window is not None:
        late = late[-window:]
    kept = min(n, capacity, window if window is not None else n)
    assert rep.window.collectives == kept == late.shape[0]
    for r, row in enumerate(rep.window.ranks):
        col = late[:, r]
        assert row.count == kept
        assert row.late_ms["mean"] == pytest.approx(col.mean(), rel=1e-12)
        assert row.late_ms["p50"] == pytest.approx(np.percentile(col, 50), rel=1e-12)
        assert row.late_ms["p99"] == pytest.approx(np.percentile(col, 99), rel=1e-12)
        assert row.late_ms["max"] == pytest.approx(col.max(), rel=1e-12)
    # last, suffered and inflicted over the window, per collective
    last = np.argmax(late, axis=1)
    waited = late.max(axis=1, keepdims=True) - late
    for r, row in enumerate(rep.window.ranks):
        assert row.last == int((last == r).sum())
        assert row.wait_suffered_ms == pytest.approx(waited[:, r].sum(), rel=1e-9)
        assert row.wait_inflicted_ms == pytest.approx(waited[last == r].sum(), rel=1e-9, abs=1e-9)
    # the whole run is not cut by the window
    assert rep.run.collectives == n and all(row.count == n for row in rep.run.ranks)


def test_run_and_window_agree_when_every_collective_fits_the_window():
    n, world = 300, 4
    snap = snapshot(lognormal_entries(n, world, seed=3), capacity=1000)
    rep = from_snapshot(snap, hosts_of(world))
    assert rep.run.collectives == rep.window.collectives == n
    assert rep.run.last_most_often == rep.window.last_most_often
    for a, b in zip(rep.run.ranks, rep.window.ranks):
        assert (a.rank, a.host, a.count, a.last) == (b.rank, b.host, b.count, b.last)
        assert a.late_ms["mean"] == pytest.approx(b.late_ms["mean"], rel=1e-9)
        assert a.late_ms["max"] == pytest.approx(b.late_ms["max"], rel=1e-12)
        assert a.wait_inflicted_ms == pytest.approx(b.wait_inflicted_ms, rel=1e-9, abs=1e-9)
        assert a.wait_suffered_ms == pytest.approx(b.wait_suffered_ms, rel=1e-9)


# ---- the whole run: exact mean and max, histogram percentiles ---------------------------------------------
@pytest.mark.parametrize("seed,sigma", [(4, 1.0), (5, 0.3), (6, 2.0)])
def test_run_percentiles_are_within_3_5_percent_of_numpys(seed, sigma):
    n, world = 20000, 4
    entries = lognormal_entries(n, world, seed=seed, sigma=sigma)
    rep = from_snapshot(snapshot(entries, capacity=100), hosts_of(world))
    late = (entries - entries.min(axis=1, keepdims=True)) / NS_PER_MS
    assert rep.run.collectives == n
    for r, row in enumerate(rep.run.ranks):
        col = late[:, r]
        assert row.count == n
        assert row.late_ms["mean"] == pytest.approx(col.mean(), rel=1e-9)
        assert row.late_ms["max"] == pytest.approx(col.max(), rel=1e-12)
        for q in (50, 99):
            want = np.percentile(col, q)
            got = row.late_ms[f"p{q}"]
            assert abs(got - want) <= 0.035 * want, f"rank {r} p{q}: {got} vs numpy's {want}"
        assert row.late_ms["p50"] <= row.late_ms["p99"] <= row.late_ms["max"]


def test_a_rank_never_late_has_zero_percentiles():
    n, world = 500, 3
    e = straggler_entries(n, world, slow=1, late_ms=3.0)
    e[:, 0] = e.min(axis=1) - 10  # rank 0 always enters first: lateness exactly 0
    rep = from_snapshot(snapshot(e), hosts_of(world))
    r0 = rep.run.ranks[0]
    assert r0.late_ms == {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    assert r0.last == 0 and r0.wait_inflicted_ms == 0.0
    # the straggler's percentiles sit in its 3 ms (within the histogram's accuracy)
    r1 = rep.run.ranks[1]
    assert r1.late_ms["p50"] == pytest.approx(3.0, rel=0.035)
    assert r1.late_ms["p99"] <= r1.late_ms["max"] <= 3.0 + 0.05


def test_wait_is_conserved():
    n, world = 1000, 6
    snap = snapshot(lognormal_entries(n, world, seed=7), capacity=250)
    rep = from_snapshot(snap, hosts_of(world))
    for section in [rep.run, rep.window, *rep.kinds.values()]:
        inflicted = sum(r.wait_inflicted_ms for r in section.ranks)
        suffered = sum(r.wait_suffered_ms for r in section.ranks)
        assert inflicted == pytest.approx(suffered, rel=1e-9)
        assert section.wait_ms == pytest.approx(suffered, rel=1e-12)
        assert sum(r.last for r in section.ranks) == section.collectives


def test_sections_per_kind():
    n, world = 600, 3
    rng = np.random.default_rng(8)
    kinds = rng.choice([ALLREDUCE, BARRIER], size=n, p=[0.7, 0.3])
    e = straggler_entries(n, world, slow=2, late_ms=1.0)
    e[kinds == BARRIER, 0] += int(5 * NS_PER_MS)  # at barriers rank 0 is the slow one
    snap = snapshot(e, kinds)
    rep = from_snapshot(snap, hosts_of(world))
    assert set(rep.kinds) == {"allreduce", "barrier"}
    n_ar, n_ba = int((kinds == ALLREDUCE).sum()), int((kinds == BARRIER).sum())
    assert rep.kinds["allreduce"].collectives == n_ar and rep.kinds["barrier"].collectives == n_ba
    assert rep.kinds["allreduce"].last_most_often == [2]
    assert rep.kinds["barrier"].last_most_often == [0]
    assert rep.run.collectives == n
    for r in range(world):
        parts = [rep.kinds[k].ranks[r] for k in ("allreduce", "barrier")]
        whole = rep.run.ranks[r]
        assert whole.count == sum(p.count for p in parts)
        assert whole.last == sum(p.last for p in parts)
        assert whole.wait_inflicted_ms == pytest.approx(sum(p.wait_inflicted_ms for p in parts), rel=1e-9)
        assert whole.late_ms["max"] == max(p.late_ms["max"] for p in parts)
        mean = sum(p.late_ms["mean"] * p.count for p in parts) / whole.count
        assert whole.late_ms["mean"] == pytest.approx(mean, rel=1e-9)
    text = str(rep)
    assert "#   allreduce: rank 2 (hostc) kept the others waiting" in text
    assert "#   barrier: rank 0 (hosta) kept the others waiting" in text


def test_clock_offsets_are_in_ms_and_unknown_is_minus_one():
    snap = snapshot(
        straggler_entries(10, 3, 1, 1.0),
        offset_ns=[0, -3_700_000_123, 7_400_000_000],
        uncertainty_ns=[0, 250_000, -1],
    )
    rep = from_snapshot(snap, hosts_of(3))
    assert rep.clock_offset_ms == pytest.approx([0.0, -3700.000123, 7400.0])
    assert rep.clock_uncertainty_ms == [0.0, 0.25, -1.0]


# ---- last_most_often --------------------------------------------------------------------------------------
def test_last_most_often_names_every_rank_of_a_tie():
    world = 4
    rows = []
    for i in range(12):
        slow = (1, 3, 1, 3, 0, 1, 3, 2, 1, 3, 1, 3)[i]  # 1 and 3: five times each
        row = [0] * world
        row[slow] = 2_000_000
        rows.append(row)
    rep = from_snapshot(snapshot(np.array(rows)), hosts_of(world))
    assert [r.last for r in rep.run.ranks] == [1, 5, 1, 5]
    assert rep.last_most_often == rep.run.last_most_often == [1, 3]
    assert rep.window.last_most_often == [1, 3]
    # the last two collectives: rank 1 and rank 3 once each; the last three: rank 3 twice
    assert from_snapshot(snapshot(np.array(rows)), hosts_of(world), 2).window.last_most_often == [1, 3]
    assert from_snapshot(snapshot(np.array(rows)), hosts_of(world), 3).window.last_most_often == [3]


def test_a_tie_at_entry_counts_the_lowest_rank_last():
    rep = from_snapshot(snapshot(np.array([[5, 7, 7], [5, 7, 7]])), hosts_of(3))
    assert [r.last for r in rep.run.ranks] == [0, 2, 0]
    assert rep.last_most_often == [1]


# ---- empty ------------------------------------------------------------------------------------------------
def test_a_window_of_zero():
    n, world = 50, 3
    rep = from_snapshot(snapshot(straggler_entries(n, world, 1, 2.0)), hosts_of(world), 0)
    assert rep.window.collectives == 0 and rep.window.last_most_often == []
    zero = {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    for r in rep.window.ranks:
        assert (r.count, r.late_ms, r.wait_inflicted_ms, r.wait_suffered_ms, r.last) == (0, zero, 0.0, 0.0, 0)
    assert rep.window.wait_ms == 0.0
    assert rep.run.collectives == n and rep.last_most_often == [1]
    text = str(rep)  # the window table is left out; the run's is there
    assert "last 0 collectives" not in text and "whole run" in text
    assert SkewReport.from_dict(json.loads(rep.to_json())) == rep


def test_an_empty_snapshot():
    world = 3
    snap = snapshot(np.zeros((0, world), np.int64))
    assert snap["recent_late_ns"].shape == (0, world) and snap["hist"].shape == (KINDS, world, BUCKETS)
    rep = from_snapshot(snap, hosts_of(world))
    assert rep.world == world and rep.kinds == {}
    for section in (rep.run, rep.window):
        assert section.collectives == 0 and section.last_most_often == []
        assert [r.count for r in section.ranks] == [0] * world
        assert all(r.late_ms == {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0} for r in section.ranks)
    text = str(rep)
    assert "0 collectives on 3 ranks" in text and "nothing recorded" in text
    d = rep.to_dict()
    assert d["collectives"] == 0 and d["last_most_often"] == [] and d["kinds"] == {}
    assert SkewReport.from_dict(json.loads(json.dumps(d))) == rep


def test_only_unmatched_collectives():
    snap = snapshot(np.zeros((0, 2), np.int64), unmatched=17, uncertainty_ns=[0, -1])
    rep = from_snapshot(snap, hosts_of(2))
    assert rep.unmatched == 17 and rep.run.collectives == 0
    assert "(17 not matched left out)" in str(rep).splitlines()[0]


# ---- JSON -------------------------------------------------------------------------------------------------
def _plain(x: Any) -> bool:
    """JSON's own types only (no numpy scalars)."""
    if isinstance(x, dict):
        return all(type(k) is str and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    return x is None or type(x) in (bool, int, float, str)


def test_to_dict_has_the_documented_schema_and_round_trips():
    n, world = 400, 4
    rng = np.random.default_rng(9)
    kinds = rng.choice([ALLREDUCE, BARRIER, COLLECTIVE_NAMES.index("all_gather")], size=n)
    snap = snapshot(
        lognormal_entries(n, world, seed=9),
        kinds,
        capacity=150,
        unmatched=3,
        unsynced=2,
        offset_ns=[0, 0, -2_500_000_000, -2_500_000_000],
        uncertainty_ns=[0, 0, 120_000, 90_000],
    )
    rep = from_snapshot(snap, hosts_of(world), 100)
    d = rep.to_dict()
    assert _plain(d), "to_dict() must hold plain JSON types"
    assert set(d) == REPORT_KEYS
    assert set(d["window"]) == SECTION_KEYS
    assert set(d["kinds"]) == {"allreduce", "barrier", "all_gather"}
    assert all(set(s) == SECTION_KEYS for s in d["kinds"].values())
    assert set(d["clock"]) == {"offset_ms", "uncertainty_ms"}
    for section in [d, d["window"], *d["kinds"].values()]:
        assert [r["rank"] for r in section["ranks"]] == list(range(world))
        for r in section["ranks"]:
            assert set(r) == RANK_KEYS and set(r["late_ms"]) == {"mean", "p50", "p99", "max"}
    assert (d["world"], d["hosts"], d["collectives"]) == (world, hosts_of(world), n)
    assert d["window"]["collectives"] == 100
    assert (d["unmatched"], d["unsynced"]) == (3, 2)
    # the round trips: dataclasses, JSON text, to_json
    back = SkewReport.from_dict(d)
    assert back == rep and back.to_dict() == d
    assert SkewReport.from_dict(json.loads(json.dumps(d))) == rep
    assert json.loads(rep.to_json()) == d
    assert isinstance(back.run, SkewSection) and all(isinstance(r, RankSkew) for r in back.ranks)
    assert back.ranks is back.run.ranks and back.last_most_often == rep.run.last_most_often


# ---- text -------------------------------------------------------------------------------------------------
def _rows(text: str, world: int) -> dict[int, list[str]]:
    rows: dict[int, list[str]] = {r: [] for r in range(world)}
    for line in text.splitlines():
        m = re.match(r"^\s+(\d+)\s+(\S+)\s+(\d+)\s", line)
        if m and not line.startswith("#"):
            rows[int(m.group(1))].append(line)
    return rows


@pytest.mark.parametrize("world,slow", [(2, 1), (4, 2), (8, 5)])
def test_str_has_a_row_per_rank_and_names_the_straggler(world, slow):
    n = 200
    rep = from_snapshot(snapshot(straggler_entries(n, world, slow, 4.0, seed=world)), hosts_of(world))
    text = str(rep)
    assert text.splitlines()[0] == f"# skew: {n} collectives on {world} ranks"
    rows = _rows(text, world)
    for r in range(world):
        assert len(rows[r]) == 1, f"rank {r}: {rows[r]} in\n{text}"
        assert hosts_of(world)[r] in rows[r][0] and f" {n} " in rows[r][0]
    assert rows[slow][0].rstrip().endswith("100%")
    host = hosts_of(world)[slow]
    verdict = [line for line in text.splitlines() if "kept the others waiting" in line]
    assert len(verdict) == 1, text
    assert verdict[0].startswith(f"# rank {slow} ({host}) kept the others waiting"), text
    assert "last in 100% of 200" in verdict[0]
    assert "balanced" not in text


def test_str_with_a_window_shows_both_tables_each_with_its_verdict():
    n, world = 300, 3
    e = straggler_entries(n, world, slow=0, late_ms=2.0)
    e[250:, 0] -= int(2 * NS_PER_MS)  # rank 0 the straggler for the first 250, rank 2 for the last 50
    e[250:, 2] += int(2 * NS_PER_MS)
    rep = from_snapshot(snapshot(e), hosts_of(world), 50)
    text = str(rep)
    assert "# whole run (ms)" in text and "# last 50 collectives (ms)" in text
    rows = _rows(text, world)
    assert all(len(rows[r]) == 2 for r in range(world)), text
    verdicts = [line for line in text.splitlines() if "kept the others waiting" in line]
    assert [v.split(" (")[0] for v in verdicts] == ["# rank 0", "# rank 2"], text


def test_str_says_balanced_when_nobody_stands_out():
    n, world = 400, 4
    rows = np.zeros((n, world), np.int64)
    rows[np.arange(n), np.arange(n) % world] = 1_000_000  # every rank last, as long, as often
    text = str(from_snapshot(snapshot(rows), hosts_of(world)))
    assert "balanced: no rank stands out" in text and "kept the others waiting" not in text
    # all at once: nobody waited
    text = str(from_snapshot(snapshot(np.zeros((10, world), np.int64)), hosts_of(world)))
    assert "no rank kept the others waiting" in text


def test_the_verdict_names_the_rank_that_inflicted_the_wait_not_the_one_most_often_last():
    """Rank 0 is last in 80% of the collectives by a microsecond, rank 3 in 20% by 10 ms: the others
    waited for rank 3, and the verdict says so (docs/skew.md), while last_most_often is rank 0."""
    n, world = 100, 4
    rows = np.zeros((n, world), np.int64)
    rows[:80, 0] = 1_000
    rows[80:, 3] = 10_000_000
    rep = from_snapshot(snapshot(rows), hosts_of(world))
    assert rep.last_most_often == [0]
    verdict = [line for line in str(rep).splitlines() if "kept the others waiting" in line]
    assert len(verdict) == 1 and verdict[0].startswith("# rank 3 (hostd)"), verdict


@pytest.mark.parametrize("share,named", [(0.95, True), (0.85, False)])
def test_two_ranks_need_90_percent_of_the_wait_to_stand_out(share, named):
    n = 100
    rows = np.zeros((n, 2), np.int64)
    k = int(n * share)
    rows[:k, 1] = 1_000_000
    rows[k:, 0] = 1_000_000
    text = str(from_snapshot(snapshot(rows), hosts_of(2)))
    assert ("# rank 1 (hostb) kept the others waiting" in text) == named, text
    assert ("balanced" in text) == (not named), text


def test_unmatched_and_unsynced_are_said_in_the_header():
    rep = from_snapshot(snapshot(straggler_entries(20, 2, 1, 1.0), unmatched=3, unsynced=2), hosts_of(2))
    first = str(rep).splitlines()[0]
    assert first == (
        "# skew: 20 collectives on 2 ranks (3 not matched, 2 before the clocks were estimated left out)"
    )


# ---- figure -----------------------------------------------------------------------------------------------
def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    n, world = 300, 5
    rep = from_snapshot(snapshot(straggler_entries(n, world, 3, 2.0), capacity=100), hosts_of(world))
    path = tmp_path / "skew.png"
    fig = rep.plot(str(path))
    assert fig is not None
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    # an empty report still plots (its ranks are all zero)
    empty = from_snapshot(snapshot(np.zeros((0, world), np.int64)), hosts_of(world))
    empty.plot(str(tmp_path / "empty.png"))
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


# ---- the synthetic snapshot is the native one's shape -----------------------------------------------------
def test_the_synthetic_snapshot_has_the_native_keys_shapes_and_dtypes(one_rank_comm):
    """What ``snapshot()`` above builds against a real recorder's (one rank: lateness is always 0)."""
    import pycoll

    n = 7
    for _ in range(n):
        pycoll.allreduce(np.ones(8, np.float32), comm=one_rank_comm)
    native = one_rank_comm.native()
    native.skew_flush()
    real = native.skew_snapshot()
    fake = snapshot(np.zeros((n, 1), np.int64))
    assert set(real) == set(fake)
    for key, value in real.items():
        if isinstance(value, np.ndarray):
            assert isinstance(fake[key], np.ndarray), key
            assert (value.shape, value.dtype) == (fake[key].shape, fake[key].dtype), key
            if key != "recent_seq":  # the communicator numbers its own set-up collectives too
                assert np.array_equal(value, fake[key]), key
        else:
            assert value == fake[key], key
    rep = one_rank_comm.skew_local()
    assert rep == from_snapshot(fake, rep.hosts)
    assert rep.run.collectives == n and rep.last_most_often == [0]
    assert "no rank kept the others waiting" in str(rep)
