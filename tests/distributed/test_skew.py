"""Load-imbalance visibility (issue 19) on real rank processes: scripted delays, straggler notices, clock
offsets, the report at finalize, skew recording turned off.

 1. scripted delays: one rank sleeps D before most all-reduces (two of every three, so that the schedule
    alone makes it the rank most often last), over shared memory (2, 4 and, with SKEW_FULL=1, 8 ranks) and
    TCP (3 ranks); then the delayed rank changes half-way, and the recent window names the second one
    while the whole run shows both;
 2. straggler notices: no false alarm over 3000 undisturbed all-reduces; with one rank 10 ms late at
    every collective, the callback fires on every rank once per window, naming it, and rank 0 logs one
    WARNING; PYCOLL_STRAGGLER_MS logs without a callback;
 3. clocks seconds apart (PYCOLL_FAKE_CLOCK_OFFSET_S): the offsets are estimated to within their stated
    uncertainty and the lateness is still right;
 4. PYCOLL_SKEW_REPORT files at finalize; PYCOLL_SKEW=0 everywhere (empty reports, on_straggler refused)
    and on one rank only (the others count its collectives as unmatched, nothing hangs);
 5. a small PYCOLL_SKEW_WINDOW (the windows on_straggler takes, skew(window=)), asynchronous collectives
    counted, and a callback that raises (it reaches the caller; the communicator stays usable).

How the lateness is checked. Each body stamps, with the clock the recorder uses (CLOCK_MONOTONIC, which
every process of this host shares), the moment it calls each all-reduce: the ground truth of who entered
when (``truth``). The recorder's own per-collective lateness (the recent window of rank 0's native
recorder, exact) must match it, and the report's figures must match what the truth makes of them, within
the issue's tolerance: 10% or 2 ms. The scripted delay D is what the schedule intends; what the ranks
really did is the truth, which on this 2-core machine is D plus a few milliseconds now and then (a rank
descheduled, or woken late after a wait): that is where the noise margin goes, not into the tolerances.
The first all-reduce of a fresh communicator is not compared: it builds its plan inside the call, before
the native entry, so its truth stamp is early by a varying amount (a rank's lateness is measured at the
native entry, docs/skew.md).

Runtime: about 15 s by default; SKEW_FULL=1 (about 30 s) adds 8 ranks, TCP with 2 and 4 ranks, rank 0
as the straggler, the changing straggler over TCP, clocks of two ranks sharing a domain, shifted clocks on
shared memory, and skew off on one rank over TCP.
"""

from __future__ import annotations

import json
import os
from typing import Any

import _skew
import numpy as np
import pytest

#: Every case (SKEW_FULL=1); CI runs one of each kind (``cases``).
FULL = os.environ.get("SKEW_FULL", "") not in ("", "0")
#: The recorder processes collectives this many at a time (csrc/engine/skew.h kBatch).
BATCH = 4
#: The harness deadline of one run.
RUN_TIMEOUT = 90.0
#: All-reduces of a scripted schedule, and the delay (ms).
N = 60
D_MS = 20.0

REPORT_KEYS = {
    "world",
    "hosts",
    "collectives",
    "ranks",
    "last_most_often",
    "window",
    "kinds",
    "unmatched",
    "unsynced",
    "clock",
}
RANK_KEYS = {"rank", "host", "count", "late_ms", "wait_inflicted_ms", "wait_suffered_ms", "last"}


def cases(every: list, ci: list) -> list:
    """``every`` case with SKEW_FULL=1, the ``ci`` subset for CI's time budget."""
    return every if FULL else ci


def tol(x_ms: float) -> float:
    """The issue's tolerance: 10% or 2 ms, whichever is more."""
    return max(0.1 * abs(x_ms), 2.0)


def near(got: float, want: float, tolerance: float, what: str) -> None:
    assert abs(got - want) <= tolerance, f"{what}: {got:.3f} ms, want {want:.3f} +- {tolerance:.3f} ms"


# ---- the truth and what the recorder made of it -----------------------------------------------------------
def truth_of(results: list[dict[str, Any]]) -> np.ndarray:
    """[collective, rank] ms: each rank's entry (its own stamp) minus the collective's earliest."""
    entered = np.array([r["entered_ns"] for r in results], dtype=np.float64).T / 1e6
    return entered - entered.min(axis=1, keepdims=True)


def waits_of(late: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank, from a lateness matrix: times last, wait inflicted, wait suffered (ms)."""
    world = late.shape[1]
    last = np.argmax(late, axis=1)
    waited = late.max(axis=1, keepdims=True) - late
    inflicted = np.bincount(last, weights=waited.sum(axis=1), minlength=world)
    return np.bincount(last, minlength=world), inflicted, waited.sum(axis=0)


def check_recorder_matches_truth(raw: np.ndarray, truth: np.ndarray, slack_ms: float = 0.0) -> None:
    """The recorder's per-collective lateness against the ranks' own stamps (from the second collective)."""
    diff = np.abs(raw[1:] - truth[1:])
    close = diff <= 1.0 + slack_ms
    assert close.mean() >= 0.95, (
        f"the recorder's lateness differs from the ranks' own stamps by more than {1 + slack_ms:.2f} ms in "
        f"{(~close).sum()} of {close.size} (collective, rank) entries; worst {diff.max():.3f} ms at "
        f"{np.unravel_index(diff.argmax(), diff.shape)} (row 0 = collective 1)"
    )
    assert np.median(diff) <= 0.2 + slack_ms, f"median |recorder - truth| {np.median(diff):.3f} ms"


def check_common(
    results: list[dict[str, Any]], world: int, n: int, transport: str, *, same_clock: bool = True
) -> dict[str, Any]:
    """What holds for every scripted run: it ran over ``transport``, one report everywhere, n collectives
    counted (the library's own are not), nothing unmatched or unsynced, wait conserved. The report (rank
    0's, as every rank got)."""
    assert [r["transport"] for r in results] == [transport] * len(results)
    rep = results[0]["report"]
    texts = {r["json"] for r in results}
    assert len(texts) == 1, "skew() gave different reports on different ranks"
    assert all(r["report"] == rep for r in results)
    if same_clock:  # one clock: every rank recorded the same stamps, so its own view is rank 0's
        assert rep["clock"] == {"offset_ms": [0.0] * world, "uncertainty_ms": [0.0] * world}
        for r, res in enumerate(results):
            assert res["local"] == rep, f"rank {r}'s skew_local() differs from rank 0's report"
    assert set(rep) == REPORT_KEYS
    assert rep["world"] == world and len(rep["hosts"]) == world
    assert rep["collectives"] == n, f"{rep['collectives']} collectives counted, {n} made"
    assert [r["count"] for r in rep["ranks"]] == [n] * world
    assert [r["rank"] for r in rep["ranks"]] == list(range(world))
    assert all(set(r) == RANK_KEYS for r in rep["ranks"])
    assert list(rep["kinds"]) == ["allreduce"] and rep["kinds"]["allreduce"]["collectives"] == n
    assert rep["window"]["collectives"] == n  # the default window (1000) holds them all
    assert (rep["unmatched"], rep["unsynced"]) == (0, 0)
    assert sum(r["last"] for r in rep["ranks"]) == n
    inflicted = sum(r["wait_inflicted_ms"] for r in rep["ranks"])
    suffered = sum(r["wait_suffered_ms"] for r in rep["ranks"])
    assert inflicted == pytest.approx(suffered, rel=1e-9, abs=1e-6), "wait inflicted != wait suffered"
    for key in ("inflicted", "suffered"):
        w = sum(r[f"wait_{key}_ms"] for r in rep["window"]["ranks"])
        assert w == pytest.approx(sum(r[f"wait_{key}_ms"] for r in rep["ranks"]), rel=1e-9, abs=1e-6)
    raw = np.array(results[0]["raw_ms"])
    assert raw.shape == (n, world)
    for r, row in enumerate(rep["ranks"]):  # the whole run's exact mean and max are the raw lateness's
        assert row["late_ms"]["mean"] == pytest.approx(raw[:, r].mean(), rel=1e-9, abs=1e-9)
        assert row["late_ms"]["max"] == pytest.approx(raw[:, r].max(), rel=1e-9, abs=1e-9)
        assert row["late_ms"]["p50"] <= row["late_ms"]["p99"] <= row["late_ms"]["max"]
    return rep


def check_straggler(
    rep_ranks: list[dict[str, Any]],
    raw: np.ndarray,
    expected: np.ndarray,
    rank: int,
    delayed: list[int],
    what: str,
) -> None:
    """One rank delayed by D before the collectives ``delayed`` (rows of ``raw`` / ``expected``, whose
    rows are the collectives of the section ``rep_ranks`` describes)."""
    k, n = len(delayed), raw.shape[0]
    world = raw.shape[1]
    # the schedule held: the rank really was D late there (by its own stamps), give or take the machine
    truly = expected[delayed, rank].mean()
    assert 0.9 * D_MS <= truly <= 1.5 * D_MS, (
        f"{what}: rank {rank} was {truly:.2f} ms late on average at its delayed collectives by its own "
        f"stamps, not about {D_MS} ms: this machine is too loaded to script delays"
    )
    # the recorder's lateness at the delayed collectives (exact, per collective)
    near(raw[delayed, rank].mean(), truly, tol(D_MS), f"{what}: rank {rank}'s mean lateness when delayed")
    row = rep_ranks[rank]
    # the report: its mean over the section is the delayed collectives' k * D (+ the others, ~0)
    near(
        row["late_ms"]["mean"] * n / k,
        expected[:, rank].sum() / k,
        tol(D_MS),
        f"{what}: rank {rank}'s late_ms mean * {n} / {k}",
    )
    assert row["late_ms"]["mean"] * n / k >= 0.9 * D_MS
    assert row["late_ms"]["max"] >= 0.9 * D_MS, f"{what}: rank {rank}'s late_ms max {row['late_ms']['max']}"
    assert row["late_ms"]["p99"] >= 0.9 * D_MS
    # it inflicted (world - 1) * k * D on the others
    _, inflicted, _ = waits_of(expected)
    want = (world - 1) * k * D_MS
    near(
        row["wait_inflicted_ms"],
        inflicted[rank],
        max(0.1 * inflicted[rank], 2.0 * (world - 1)),
        f"{what}: rank {rank}'s wait inflicted (by the ranks' stamps)",
    )
    assert row["wait_inflicted_ms"] >= 0.9 * want, f"{what}: inflicted {row['wait_inflicted_ms']:.1f} ms"
    assert row["last"] >= 0.9 * k
    # the others: hardly late (2 ms, plus what their own stamps say they were)
    for other in range(world):
        if other == rank:
            continue
        mean = rep_ranks[other]["late_ms"]["mean"]
        assert mean < 2.0 + expected[:, other].mean(), (
            f"{what}: rank {other} (not delayed) is {mean:.3f} ms late on average "
            f"(its stamps say {expected[:, other].mean():.3f} ms)"
        )


def expected_of(results: list[dict[str, Any]]) -> np.ndarray:
    """The truth, but for the first collective (the recorder's there: see the module docstring)."""
    expected = truth_of(results)
    expected[0] = np.array(results[0]["raw_ms"])[0]
    return expected


def two_of_three(n: int, rank: int, start: int = 0) -> dict[int, int]:
    """Rank ``rank`` delayed before collectives start..n-1 but every third (so the first is not)."""
    return {i: rank for i in range(start, n) if (i - start) % 3 != 0}


# ---- 1. scripted delays -----------------------------------------------------------------------------------
SCRIPTED = cases(
    [("shm", 2, 1), ("tcp", 3, 1), ("shm", 4, 2), ("shm", 4, 0), ("tcp", 4, 3), ("tcp", 2, 0), ("shm", 8, 5)],
    [("shm", 2, 1), ("tcp", 3, 1), ("shm", 4, 2)],
)


@pytest.mark.parametrize(
    "transport,world,delayed", SCRIPTED, ids=[f"{t}-w{w}-late{d}" for t, w, d in SCRIPTED]
)
def test_scripted_delays_find_the_late_rank(rank_pool, transport, world, delayed):
    delays = two_of_three(N, delayed)
    results = rank_pool(world).run(
        _skew.scripted, n=N, delays=delays, delay_s=D_MS / 1000, transport=transport, timeout=RUN_TIMEOUT
    )
    rep = check_common(results, world, N, transport)
    raw = np.array(results[0]["raw_ms"])
    check_recorder_matches_truth(raw, truth_of(results))
    assert rep["last_most_often"] == [delayed], f"last: {[r['last'] for r in rep['ranks']]}"
    check_straggler(rep["ranks"], raw, expected_of(results), delayed, sorted(delays), f"{transport} w{world}")
    # the exact window (it holds the whole run here) says the same
    check_straggler(rep["window"]["ranks"], raw, expected_of(results), delayed, sorted(delays), "window")
    assert rep["window"]["last_most_often"] == [delayed]


@pytest.mark.parametrize(
    "transport,world,first,second", cases([("shm", 4, 1, 3), ("tcp", 3, 2, 0)], [("shm", 4, 1, 3)])
)
def test_the_window_names_the_rank_that_is_late_now(rank_pool, transport, world, first, second):
    """Rank ``first`` delayed in the first half, ``second`` in the second: the window of the second half
    names ``second`` only; the whole run shows both."""
    half = N // 2
    delays = {**two_of_three(half, first), **two_of_three(N, second, start=half)}
    results = rank_pool(world).run(
        _skew.scripted,
        n=N,
        delays=delays,
        delay_s=D_MS / 1000,
        window=half,
        transport=transport,
        timeout=RUN_TIMEOUT,
    )
    rep = check_common(results, world, N, transport)
    raw = np.array(results[0]["raw_ms"])
    expected = expected_of(results)
    check_recorder_matches_truth(raw, truth_of(results))
    windowed = results[0]["windowed"]
    assert all(r["windowed"] == windowed for r in results)
    # skew(window=) changes the window only
    assert {**windowed, "window": None} == {**rep, "window": None}
    win = windowed["window"]
    assert win["collectives"] == half and [r["count"] for r in win["ranks"]] == [half] * world
    assert win["last_most_often"] == [second], f"window last: {[r['last'] for r in win['ranks']]}"
    late_second = [i - half for i in delays if i >= half]
    check_straggler(win["ranks"], raw[half:], expected[half:], second, sorted(late_second), "window")
    assert win["ranks"][first]["late_ms"]["max"] < 0.5 * D_MS + expected[half:, first].max(), (
        f"rank {first} (delayed in the first half only) is late in the window of the second half"
    )
    # the whole run: both
    assert set(rep["last_most_often"]) <= {first, second}, f"last: {[r['last'] for r in rep['ranks']]}"
    for rank in (first, second):
        k = sum(1 for r in delays.values() if r == rank)
        row = rep["ranks"][rank]
        assert row["last"] >= 0.9 * k
        assert row["late_ms"]["max"] >= 0.9 * D_MS
        assert row["wait_inflicted_ms"] >= 0.9 * (world - 1) * k * D_MS
        near(row["late_ms"]["mean"] * N / k, expected[:, rank].sum() / k, tol(D_MS), f"rank {rank}'s mean")
    inflicted = [r["wait_inflicted_ms"] for r in rep["ranks"]]
    assert sorted(range(world), key=inflicted.__getitem__)[-2:] in ([first, second], [second, first])


# ---- 2. straggler notices ---------------------------------------------------------------------------------
def test_no_false_alarm_over_3000_undisturbed_collectives(rank_pool):
    n = 3000
    results = rank_pool(4).run(
        _skew.stragglers,
        n=n,
        delayed=None,
        delay_s=0.0,
        late_ms=5.0,
        window=100,
        straggler_ms=5.0,
        timeout=RUN_TIMEOUT,
    )
    for r, res in enumerate(results):
        assert res["events"] == [], f"rank {r}: straggler events with nobody delayed: {res['events'][:3]}"
        assert res["warnings"] == [], f"rank {r} logged: {res['warnings']}"
        assert res["report"]["collectives"] == n + 101 and res["report"]["unmatched"] == 0


def test_a_straggler_is_reported_once_per_window_on_every_rank(rank_pool):
    # 150 collectives and one batch more: the recorder processes collectives BATCH at a time, so an
    # event comes after the collective that completed its window or at most BATCH - 1 later
    world, delayed, n, window, late_ms, delay_ms = 4, 2, 150 + BATCH, 50, 5.0, 10.0
    results = rank_pool(world).run(
        _skew.stragglers,
        n=n,
        delayed=delayed,
        delay_s=delay_ms / 1000,
        late_ms=late_ms,
        window=window,
        timeout=RUN_TIMEOUT,
    )
    events = results[0]["events"]
    for r, res in enumerate(results):
        assert res["events"] == events, f"rank {r} got other events than rank 0"
        assert res["after_remove"] == 0, f"rank {r}: {res['after_remove']} events after notice.remove()"
    # the mean is above the threshold all along: one event per window, after the collective completing it
    # (or the end of its batch)
    assert len(events) == 3, events
    for k, e in enumerate(events, 1):
        assert 0 <= e["after"] - (k * window - 1) < BATCH, events
    assert [b["seq"] - a["seq"] for a, b in zip(events, events[1:])] == [window] * (len(events) - 1)
    truth = truth_of(results)
    host = results[0]["report"]["hosts"][delayed]
    for e in events:
        assert (e["rank"], e["window"], e["threshold_ms"], e["host"]) == (delayed, window, late_ms, host), e
        rows = slice(e["after"] + 1 - window, e["after"] + 1)
        truly = truth[rows, delayed].mean()
        assert 0.9 * delay_ms <= truly <= 1.5 * delay_ms, f"rank {delayed}: {truly:.2f} ms late by its stamps"
        near(e["mean_late_ms"], truly, tol(delay_ms), f"event after {e['after']}: mean lateness")
        assert e["mean_late_ms"] >= 0.9 * delay_ms
        _, inflicted, _ = waits_of(truth[rows])
        near(e["wait_inflicted_ms"], inflicted[delayed], 0.1 * inflicted[delayed], "event: wait inflicted")
        assert e["wait_inflicted_ms"] >= 0.9 * (world - 1) * window * delay_ms
    # rank 0 logs one WARNING (the next ones, within a minute, are held back); the others none
    warnings = results[0]["warnings"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"straggler: rank {delayed} (host {host})"), warnings
    assert f"last {window} (threshold 5 ms)" in warnings[0], warnings
    for r, res in enumerate(results[1:], 1):
        assert res["warnings"] == [], f"rank {r} logged: {res['warnings']}"


def test_pycoll_straggler_ms_logs_without_a_callback(rank_pool):
    world, delayed, n = 3, 1, 100 + BATCH
    results = rank_pool(world).run(
        _skew.stragglers,
        n=n,
        delayed=delayed,
        delay_s=0.008,
        late_ms=5.0,
        window=100,
        callback=False,
        straggler_ms=4.0,
        timeout=RUN_TIMEOUT,
    )
    warnings = results[0]["warnings"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"straggler: rank {delayed} "), warnings
    assert "last 100 (threshold 4 ms)" in warnings[0], warnings
    assert all(res["warnings"] == [] for res in results[1:])


# ---- 3. clocks seconds apart ------------------------------------------------------------------------------
CLOCKS = cases(
    [("tcp", [0.0, 3.7, -7.4]), ("tcp", [1.25, -2.5, 6.0, 6.0]), ("shm", [0.0, 3.7, -7.4])],
    [("tcp", [0.0, 3.7, -7.4])],
)


@pytest.mark.parametrize("transport,offsets", CLOCKS, ids=[f"{t}-{len(o)}" for t, o in CLOCKS])
def test_clock_offsets_are_estimated_and_lateness_stays_right(rank_pool, transport, offsets):
    world = len(offsets)
    delayed = int(np.argmin(offsets))  # the rank whose clock is furthest behind
    delays = two_of_three(N, delayed)
    results = rank_pool(world).run(
        _skew.clocks,
        n=N,
        delays=delays,
        delay_s=D_MS / 1000,
        offsets_s=offsets,
        transport=transport,
        timeout=RUN_TIMEOUT,
    )
    # every rank's own estimate of every rank's offset to rank 0's clock
    for r, res in enumerate(results):
        est, unc = res["offset_ms"], res["uncertainty_ms"]
        for q in range(world):
            want = -(offsets[q] - offsets[0]) * 1000
            if offsets[q] == offsets[0]:
                assert (est[q], unc[q]) == (0.0, 0.0), f"rank {r}'s view of rank {q}: same clock as rank 0"
                continue
            assert 0 <= unc[q] < 2.0, f"rank {r}'s view of rank {q}: uncertainty {unc[q]} ms"
            assert abs(est[q] - want) <= unc[q] + 0.05, (
                f"rank {r}'s view of rank {q}: offset {est[q]:.4f} ms, truly {want:.4f} ms "
                f"(uncertainty {unc[q]:.4f} ms)"
            )
    rep = check_common(results, world, N, transport, same_clock=False)
    slack = max(u for u in rep["clock"]["uncertainty_ms"])
    raw = np.array(results[0]["raw_ms"])
    check_recorder_matches_truth(raw, truth_of(results), slack_ms=2 * slack)
    assert rep["last_most_often"] == [delayed], f"last: {[r['last'] for r in rep['ranks']]}"
    check_straggler(rep["ranks"], raw, expected_of(results), delayed, sorted(delays), f"offsets {offsets}")


# ---- 4. the report at finalize, and skew off --------------------------------------------------------------
def test_pycoll_skew_report_writes_every_ranks_view_at_finalize(rank_pool, tmp_path):
    world, n = 3, 20
    pattern = str(tmp_path / "per-rank" / "skew-{rank}.json")
    results = rank_pool(world).run(_skew.report_files, n=n, path=pattern, timeout=RUN_TIMEOUT)
    for r in range(world):
        path = tmp_path / "per-rank" / f"skew-{r}.json"
        assert path.exists(), f"rank {r} wrote no {path.name}"
        data = json.loads(path.read_text())
        assert set(data) == REPORT_KEYS
        assert all(set(row) == RANK_KEYS for row in data["ranks"])
        assert data["world"] == world and data["collectives"] == n
        assert data == results[r]["local"], f"rank {r}'s file is not its own view at finalize"
    written = sorted(p.name for p in (tmp_path / "per-rank").iterdir())
    assert written == [f"skew-{r}.json" for r in range(world)]
    # without {rank}: rank 0 alone writes it
    single = tmp_path / "one" / "skew.json"
    results = rank_pool(world).run(_skew.report_files, n=n, path=str(single), timeout=RUN_TIMEOUT)
    assert json.loads(single.read_text()) == results[0]["local"]
    assert [p.name for p in single.parent.iterdir()] == ["skew.json"]


def test_skew_off_everywhere(rank_pool):
    world, n = 3, 20
    results = rank_pool(world).run(_skew.skew_off, n=n, off=list(range(world)), timeout=RUN_TIMEOUT)
    for res in results:
        assert res["enabled"] is False
        assert res["refused"] is not None and "PYCOLL_SKEW=0" in res["refused"], res["refused"]
        for view in (res["report"], res["local"]):
            assert view["collectives"] == 0 and view["unmatched"] == 0 and view["unsynced"] == 0
            assert [row["count"] for row in view["ranks"]] == [0] * world
            assert view["last_most_often"] == [] and view["kinds"] == {}
            assert view["window"]["collectives"] == 0
    assert len({res["json"] for res in results}) == 1


OFF_ONE = cases([("shm", 2), ("shm", 0), ("tcp", 1)], [("shm", 2), ("shm", 0)])


@pytest.mark.parametrize("transport,off", OFF_ONE)
def test_skew_off_on_one_rank_makes_its_collectives_unmatched(rank_pool, transport, off):
    world, n = 3, 20
    made = n + 2  # and a barrier, a broadcast
    results = rank_pool(world).run(_skew.skew_off, n=n, off=[off], transport=transport, timeout=RUN_TIMEOUT)
    assert [res["transport"] for res in results] == [transport] * world
    for r, res in enumerate(results):
        assert res["enabled"] is (r != off)
        assert (res["refused"] is not None) is (r == off), res["refused"]
        local = res["local"]
        assert local["collectives"] == 0 and [row["count"] for row in local["ranks"]] == [0] * world
        assert local["unmatched"] == (0 if r == off else made), f"rank {r}: {local['unmatched']} unmatched"
    rep = results[0]["report"]  # rank 0's view, on every rank
    assert all(res["report"] == rep for res in results)
    assert rep["collectives"] == 0 and rep["unmatched"] == (0 if off == 0 else made)


def test_limits_of_the_window_and_the_notices(rank_pool):
    world, n, capacity = 3, 30, 10
    results = rank_pool(world).run(_skew.limits, n=n, capacity=capacity, timeout=RUN_TIMEOUT)
    refused = {"too long", "zero", "not an int", "late_ms 0", "not callable"}
    for r, res in enumerate(results):
        assert set(res["errors"]) == refused, (
            f"rank {r}: on_straggler accepted {refused - set(res['errors'])}"
        )
        assert f"1..{capacity}" in res["errors"]["too long"], res["errors"]["too long"]
        assert res["bad_window"] is not None
    rep, small, zero = results[0]["report"], results[0]["small"], results[0]["zero"]
    assert all(res["report"] == rep for res in results)
    # asynchronous all-reduces count as well; the window keeps `capacity`
    assert rep["collectives"] == n and [r["count"] for r in rep["ranks"]] == [n] * world
    assert rep["window"]["collectives"] == capacity
    assert small["window"]["collectives"] == 3 and zero["window"]["collectives"] == 0
    assert zero["window"]["last_most_often"] == [] and zero["collectives"] == n
    assert rep["unmatched"] == 0


def test_a_raising_callback_reaches_the_caller_and_the_communicator_stays_usable(rank_pool):
    world, delayed, window, extra = 3, 1, 5, BATCH
    results = rank_pool(world).run(
        _skew.raising_callback, delayed=delayed, window=window, extra=extra, timeout=RUN_TIMEOUT
    )
    for r, res in enumerate(results):
        assert 0 <= res["raised_at"] - (window - 1) < BATCH and res["message"] == f"boom on rank {r}", res
        assert res["raised_at"] == results[0]["raised_at"]  # after the same collective on every rank
        assert res["complete"], f"rank {r}: the all-reduce whose callback raised is not complete"
        assert res["after_ok"] and res["seen"] == [delayed]
        assert res["count"] == window + extra + 1
