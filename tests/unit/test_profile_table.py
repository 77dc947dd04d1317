"""bench/profile.py's table, from made-up rank rows (no ranks needed): rounds and unfused variants."""

from __future__ import annotations

import _bench_scripts


def _row(rank: int, round_: int, algorithm: str, call: float, native: float, wait: float) -> dict:
    return {"rank": rank, "round": round_, "bytes": 64 << 20, "algorithm": algorithm, "call_us": call,
            "native_us": native, "wait_us": wait, "yields": 1.0, "sleeps": 0.0, "vcsw": 0.0, "ivcsw": 0.0,
            "syscalls": {}}


def test_call_is_the_median_over_rounds_of_the_slowest_rank_and_variants_get_their_own_line() -> None:
    profile = _bench_scripts.load("profile.py", "_bench_profile")
    rows = []
    for round_, calls in enumerate(((10.0, 30.0), (20.0, 25.0), (40.0, 90.0))):
        for rank, call in enumerate(calls):
            rows.append(_row(rank, round_, "direct", call, call - 1, 4.0))
            rows.append(_row(rank, round_, "direct/unfused", 2 * call, 2 * call - 1, 8.0))
    lines = profile._table(rows, syscalls=False)
    assert len(lines) == 3
    fused = next(line for line in lines[1:] if " direct " in line).split()
    unfused = next(line for line in lines[1:] if "direct/unfused" in line).split()
    assert float(fused[3]) == 30.0  # slowest ranks 30, 25, 90: median 30
    assert float(unfused[3]) == 60.0
    # wait: the mean over ranks and rounds; work = native - wait, also means.
    assert float(fused[6]) == 4.0 and float(unfused[6]) == 8.0
