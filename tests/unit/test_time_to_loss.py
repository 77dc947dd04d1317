"""bench/time_to_loss.py's pure parts (no torch, no processes): the time a loss curve takes to reach a
target (linear interpolation, reached at the first point, not reached), the curve's clock, comm_s, the
--json line's fields, the tables' speed-up, and the parsing of variants, hosts and rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _bench_scripts import BENCH, load

ttl = load("time_to_loss.py", "time_to_loss")


# ---------------------------------------------------------------------------------------------------------
# Time to a target


CURVE = [[10, 1.0, 3.0], [20, 2.0, 2.0], [30, 3.0, 1.0]]  # [step, wall_s, loss]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (2.5, 1.5),  # halfway between the first two points
        (1.5, 2.5),  # halfway between the last two
        (1.25, 2.75),
        (2.0, 2.0),  # exactly at a point
        (1.0, 3.0),  # reached at the last point
        (3.0, 1.0),  # reached at the first point
        (7.0, 1.0),  # already below at the first point: its time, no extrapolation
        (0.99, None),  # never reached
    ],
)
def test_time_to_target_interpolates_linearly(target: float, expected: float | None) -> None:
    got = ttl.time_to_target(CURVE, target)
    assert got == (None if expected is None else pytest.approx(expected))


def test_time_to_target_takes_the_first_crossing() -> None:
    bumpy = [[1, 1.0, 3.0], [2, 2.0, 1.0], [3, 3.0, 2.0], [4, 4.0, 0.5]]
    assert ttl.time_to_target(bumpy, 1.5) == pytest.approx(1.75)  # 1 + (3 - 1.5) / (3 - 1)
    assert ttl.time_to_target([], 1.0) is None


def test_curve_clock_is_the_sum_of_the_step_times_before_each_point() -> None:
    triples = ttl.curve_triples([1.0, 2.0, 3.0, 4.0], [[2, 5.0], [4, 4.0]])
    assert triples == [[2, 3.0, 5.0], [4, 10.0, 4.0]]


def test_comm_seconds_is_the_excess_over_the_floor() -> None:
    assert ttl.comm_seconds(10, 0.3, 0.1) == pytest.approx(2.0)
    assert ttl.comm_seconds(10, 0.1, 0.3) == 0.0  # faster than the floor (noise): no negative time
    assert ttl.comm_seconds(10, 0.3, None) is None


# ---------------------------------------------------------------------------------------------------------
# The JSON lines


def record(variant: str, losses: list[float], step_s: float, sent: float | None = 1e6) -> dict[str, Any]:
    """A rank-0 record as _fsdp_train's Run.finish makes it: one held-out point per step."""
    steps = len(losses)
    out = {
        "variant": variant, "describe": f"{variant} described", "steps": steps, "step_s_median": step_s,
        "step_times_s": [step_s] * steps, "heldout_curve": [[i + 1, x] for i, x in enumerate(losses)],
        "heldout_loss": losses[-1], "final_train_loss": losses[-1] + 0.1, "corpus": "py-test",
    }  # fmt: skip
    if sent is not None:
        out["bytes_sent"] = sent
    return out


MODEL = {"width": 64, "depth": 2, "heads": 2, "context": 32}
TRAIN = {"model": MODEL, "steps": 3, "batch": 2, "lr": 2e-3, "eval_batches": 8, "eval_rows": 8,
         "eval_every": 1}  # fmt: skip
WHERE = {"hosts": 2, "rate": "1gbit", "ranks": 4, "seed": 0, "train": TRAIN}


def test_json_line_has_the_issues_fields_first() -> None:
    records = [record("gloo", [3.0, 2.0, 1.5], 0.5), record("local", [9.0], 0.2), {"done": True}]
    lines = ttl.lines_of(records, WHERE)
    assert [ln["variant"] for ln in lines] == ["gloo"]  # not the floor, not the end marker
    line = json.loads(json.dumps(lines[0]))
    assert list(line)[: len(ttl.JSON_FIELDS)] == list(ttl.JSON_FIELDS)
    assert line["hosts"] == 2 and line["rate"] == "1gbit" and line["steps"] == 3
    assert line["final_loss"] == 1.5 and line["wall_s"] == pytest.approx(1.5)
    assert line["comm_s"] == pytest.approx(3 * (0.5 - 0.2)) and line["floor_step_s"] == 0.2
    assert line["bytes_sent"] == 1e6
    assert line["curve"] == [[1, 0.5, 3.0], [2, 1.0, 2.0], [3, 1.5, 1.5]]
    assert line["seed"] == 0 and line["ranks"] == 4 and line["corpus"] == "py-test"


def test_json_line_on_one_host_has_no_bytes_and_no_floor_without_one() -> None:
    where = dict(WHERE, hosts=1, rate=None)
    (line,) = ttl.lines_of([record("int8", [2.0, 1.0], 0.1, sent=None)], where)
    assert line["bytes_sent"] is None and line["comm_s"] is None and line["rate"] is None


def test_summary_speedup_and_gap_against_gloo() -> None:
    gloo = ttl.json_line(record("gloo", [3.0, 2.0], 1.0), 0.1, WHERE)  # reaches 2.0 at 2 s
    fast = ttl.json_line(record("int8", [2.5, 1.9], 0.5), 0.1, WHERE)  # 0.5 + 0.5 * 0.5 / 0.6
    slow = ttl.json_line(record("int4", [3.0, 2.2], 0.25), 0.1, WHERE)  # never reaches 2.0
    rows = ttl.summarize([gloo, fast, slow], ttl.Goal())
    assert rows["gloo"]["to_target_s"] == pytest.approx(2.0) and rows["gloo"]["speedup"] == pytest.approx(1.0)
    assert rows["int8"]["to_target_s"] == pytest.approx(0.5 + 0.5 * 0.5 / 0.6)
    assert rows["int8"]["speedup"] == pytest.approx(2.0 / (0.5 + 0.5 * 0.5 / 0.6))
    assert rows["int8"]["gap_pct"] == pytest.approx(100 * (1.9 / 2.0 - 1))
    assert rows["int4"]["reached"] == 0 and rows["int4"]["to_target_s"] is None
    assert rows["int4"]["speedup"] is None
    table = ttl.format_table([gloo, fast, slow], ttl.Goal())
    assert "not reached" in table and "2 hosts x 2 ranks" in table
    # a target given for every link instead of gloo's final loss
    fixed = ttl.summarize([gloo, slow], ttl.Goal(loss=2.5))
    assert fixed["int4"]["to_target_s"] == pytest.approx(0.25 + 0.25 * 0.5 / 0.8)
    # gloo's final loss + 10%: 2.2, which int4 reaches at its last point
    within = ttl.summarize([gloo, slow], ttl.Goal(within_pct=10.0))
    assert within["int4"]["to_target_s"] == pytest.approx(0.5)
    assert within["gloo"]["to_target_s"] == pytest.approx(1.0 + 0.8)  # 3.0 -> 2.0 over 1 s, 2.2 at 0.8
    assert "+ 10%" in ttl.format_table([gloo, slow], ttl.Goal(within_pct=10.0))


def test_summary_over_seeds_gives_the_gap_spread_and_how_many_seeds_reached() -> None:
    gloo = [ttl.json_line(record("gloo", [3.0, 2.0], 1.0), 0.1, {**WHERE, "seed": s}) for s in (0, 1)]
    int8 = [
        ttl.json_line(record("int8", [2.5, 1.9], 0.5), 0.1, {**WHERE, "seed": 0}),  # -5%, reached
        ttl.json_line(record("int8", [2.5, 2.1], 0.5), 0.1, {**WHERE, "seed": 1}),  # +5%, not reached
    ]
    row = ttl.summarize([*gloo, *int8], ttl.Goal())["int8"]
    assert row["gap_pct"] == pytest.approx(0.0) and row["gap_sd"] == pytest.approx(5 * 2**0.5)
    assert row["seeds"] == 2 and row["reached"] == 1
    assert row["to_target_s"] == pytest.approx(0.5 + 0.5 * 0.5 / 0.6)
    table = ttl.format_table([*gloo, *int8], ttl.Goal())
    line = next(ln for ln in table.splitlines() if ln.startswith("int8"))
    assert "+0.00+-7.07" in line and " 1/2 " in line


def test_mean_curve_averages_wall_time_and_loss_at_the_steps_every_seed_has() -> None:
    a = [[1, 1.0, 3.0], [2, 2.0, 2.0], [3, 3.0, 1.0]]
    b = [[1, 2.0, 4.0], [2, 3.0, 3.0]]
    assert ttl.mean_curve([a, b]) == [[1, 1.5, 3.5], [2, 2.5, 2.5]]
    assert ttl.mean_curve([a]) == a and ttl.mean_curve([]) == []


def test_legend_label_gives_the_speedup_and_the_seeds_that_reached() -> None:
    row = {"speedup": 1.754, "reached": 3, "seeds": 3}
    assert ttl.legend_label("int8", row) == "int8 (1.75x)"
    assert ttl.legend_label("int8", {**row, "reached": 2}) == "int8 (1.75x in 2/3)"
    assert ttl.legend_label("int4", {"speedup": None, "reached": 0, "seeds": 2}) == "int4 (not reached)"
    # reached, but never in a seed where gloo reached it too: no speed-up to give
    assert ttl.legend_label("int4", {"speedup": None, "reached": 1, "seeds": 2}) == "int4 (reached in 1/2)"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    gloo = ttl.json_line(record("gloo", [3.0, 2.0], 1.0), 0.1, WHERE)
    alone = ttl.json_line(record("gloo", [3.0, 2.5], 1.0), 0.1, dict(WHERE, hosts=1, rate=None))
    out = tmp_path / "ttl.png"
    ttl.plot([gloo, alone], str(out), ttl.Goal())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # several seeds and variants: the mean curves, one of them reaching the target in one seed of two
    runs = [(s, v, ls) for s in (0, 1) for v, ls in (("gloo", [3.0, 2.0]), ("int8", [2.5, 1.9 + 0.2 * s]))]
    seeds = [ttl.json_line(record(v, ls, 0.5), 0.1, {**WHERE, "seed": s}) for s, v, ls in runs]
    out.unlink()
    ttl.plot(seeds, str(out), ttl.Goal(within_pct=1.0))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------
# Arguments


def test_variants_parse_in_order_with_powersgd_ranks() -> None:
    assert ttl.parse_variants("gloo, int8,int8 ,powersgd:2,powersgd:4,powersgd:8") == [
        "gloo", "int8", "powersgd", "powersgd4", "powersgd:8",
    ]  # fmt: skip
    assert ttl.parse_variants(ttl.DEFAULT_VARIANTS) == list(ttl.VARIANTS)
    assert ttl.variant_settings("powersgd:8")["powersgd_rank"] == 8
    assert ttl.variant_settings("fsdp-int8")["fsdp_error_feedback"] is True


@pytest.mark.parametrize("bad", ["gloo,nccl", "powersgd:0", "powersgd:x", "local", ","])
def test_an_unknown_variant_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown variant|no variant") as err:
        ttl.parse_variants(bad)
    if "nccl" in bad:
        assert "'nccl'" in str(err.value) and "fsdp-int8" in str(err.value)


def test_check_args_exits_with_the_reason() -> None:
    args = ttl.build_parser().parse_args(["--variants", "gloo,nope"])
    with pytest.raises(SystemExit, match="unknown variant 'nope'"):
        ttl.check_args(args)
    args = ttl.build_parser().parse_args(["--hosts", "1,4", "--ranks", "6"])
    with pytest.raises(SystemExit, match="must split evenly"):
        ttl.check_args(args)


def test_hosts_rates_and_links() -> None:
    assert ttl.parse_hosts("1,2,4,2") == [1, 2, 4]
    for bad in ("0", "two", ""):
        with pytest.raises(ValueError, match="--hosts"):
            ttl.parse_hosts(bad)
    assert ttl.parse_rates("1gbit, 10gbit") == ["1gbit", "10gbit"]
    with pytest.raises(ValueError, match="'fast' is not a rate"):
        ttl.parse_rates("1gbit,fast")
    assert ttl.link_list([1, 2, 4], ["1gbit", "10gbit"]) == [
        (1, None), (2, "1gbit"), (2, "10gbit"), (4, "1gbit"), (4, "10gbit"),
    ]  # fmt: skip
    assert ttl.link_list([2], ["1gbit"]) == [(2, "1gbit")]


def test_quick_uses_two_ranks_unless_told() -> None:
    args = ttl.build_parser().parse_args(["--quick", "--hosts", "1"])
    ttl.apply_quick(args)
    assert args.ranks == 2 and args.steps == 30 and args.eval_every == 5
    args = ttl.build_parser().parse_args(["--quick", "--ranks", "4"])
    ttl.apply_quick(args)
    assert args.ranks == 4


def test_the_script_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # import torch now raises ImportError
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from _bench_scripts import load\n"
        "ttl = load('time_to_loss.py', 'time_to_loss')\n"
        "print(ttl.parse_variants('gloo,int8'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=BENCH)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['gloo', 'int8']"
