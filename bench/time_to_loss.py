"""Held-out loss against wall-clock time, for the ways one could train, on a link like the user's
(issue 37): how much sooner compressed communication reaches the same loss when the network is the
bottleneck.

    python bench/time_to_loss.py --quick                  # 2 hosts at 1 Gbit/s, tiny model (< 5 min here)
    python bench/time_to_loss.py --quick --hosts 1 --json ttl.jsonl --plot ttl.png   # one host
    python bench/time_to_loss.py --hosts 2 --rate 1gbit --steps 500 \\
        --variants gloo,pycoll,int8,int4,powersgd --json ttl.jsonl --plot ttl.png
    python bench/time_to_loss.py --hosts 1,2,4 --rate 1gbit,10gbit --seeds 0,1,2 --json ttl.jsonl
    python bench/time_to_loss.py --table ttl.jsonl --plot ttl.png      # tables and plot again, from JSON

**The model and data** are bench/_textlm.py's: a byte-level decoder-only transformer (3.3M parameters
at the defaults) trained from a fixed seed on the Python standard library's own source, split into
training and held-out parts by file. The held-out loss (nats per byte, the full-precision weights on a
fixed held-out set, every ``--eval-every`` steps and at the end) is what is reported.

**The links** (``--hosts``, ``--rate``: comma lists; one panel per link): H > 1 hosts are network
namespaces on one bridge (tests/netns.py), each host's link shaped both ways with tbf at the rate, one
``pycoll run`` launcher per host, ``--ranks / H`` ranks each; H = 1 is one host without namespaces
(shared memory; gloo on loopback), whatever the rate.

**The variants** (``--variants``), all in the same rank processes, from the same weights, on the same
batches, taking turns (bench/_fsdp_train.py's ``train_interleaved``: each of ``--turns`` turns trains
every variant's next 1/turns of its steps, the order rotated by one per turn):

- ``gloo``: DDP over a gloo group, the baseline;
- ``pycoll``: DDP over a ``pycoll`` group, uncompressed;
- ``int8``, ``int4``: DDP over a pycoll group with ``pycoll.torch.Options("int8")`` / ``("int4")``,
  error feedback on (the group's residual per bucket);
- ``powersgd``, ``powersgd4`` (and ``powersgd:R`` for any rank R): DDP with pycoll's PowerSGD hook
  (``pycoll.torch.PowerSGDState(rank=R)`` + ``powersgd_hook``, error feedback on), rank 2 and 4, its
  all-reduces uncompressed on the pycoll group's communicator;
- ``fsdp-gloo``, ``fsdp-pycoll``: FSDP2 (``fully_shard`` per block and the root) over gloo / pycoll;
- ``fsdp-int8``: FSDP2 over pycoll with int8 gradients (reduce-scatter) and int8 weights (all-gather),
  plus ``pycoll.torch.fsdp.keep_error_feedback``.

Besides them, always, ``local``: no communication (each rank trains its own copy on its own rows, at the
same time as the others), the compute floor of a step, for ``comm_s``.

**The clocks.** ``wall_s``: the variant's training time, the sum over its steps of the slowest rank's
step time (a step: zero_grad, forward, backward with its communication, optimizer step); only its own
turns, held-out evaluations excluded. The curve's wall time at step s is the same sum over the first s
steps. ``comm_s``: steps x (the variant's median step time - the ``local`` floor's median step time),
at least 0: the time a step spends communicating or waiting for it, the codec's CPU time included, and
without the part DDP hides behind the backward pass. ``bytes_sent``: per rank (mean over ranks), the
bytes its host's veth sent during the variant's steps (``pycoll.bench.link``'s counters: frames with
their headers, ACKs included; evaluations excluded); absent on one host.

**Time to target.** The target is gloo's final held-out loss on the same link and seed, or that loss
plus ``--within`` percent (a variant that ends a hair above gloo's would otherwise never "reach" it);
``--target`` sets one loss for every link instead. A variant's time to it is the first wall time its
curve reaches it, linearly interpolated between the evaluation points before and after (the first
point's time when that point is already at or below it); "not reached" when its curve stays above. The
speed-up is gloo's time to the target over the variant's.

``--json`` writes one line per variant, link and seed: ``variant``, ``hosts``, ``rate`` (null on one
host), ``steps``, ``final_loss`` (held-out), ``wall_s``, ``comm_s``, ``bytes_sent``, ``curve`` (``[step,
wall_s, loss]`` triples), and ``seed``, ``ranks``, ``describe``, ``step_s_median``, ``floor_step_s``,
``final_train_loss``, ``corpus``, ``train`` (the training's settings). ``--plot`` (needs matplotlib):
held-out loss against wall-clock seconds, one panel per link; per variant the mean curve over the seeds
(wall time and loss averaged at each evaluated step; the seeds' own curves faint behind it), the mean
of the seeds' targets dashed, the mean curve's time to it marked, and the table's speed-up (the median
over seeds) in the legend.

Needs root (namespaces), iproute2 (ip, tc) and CPU torch for H > 1; everything created is removed at
the end, also on errors, Ctrl-C and SIGTERM, and every job ends within ``--timeout``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
# bench/ goes last: its profile.py would otherwise shadow the standard library's, which torch imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import _links as links  # noqa: E402

#: A link: (hosts, tc rate; None on one host).
Link = tuple[int, Optional[str]]
#: name -> _fsdp_train.Variant's keyword arguments (besides the name). "powersgd:R" adds any rank R.
VARIANTS: dict[str, dict[str, Any]] = {
    "gloo": {"backend": "gloo", "parallel": "ddp"},
    "pycoll": {"backend": "pycoll", "parallel": "ddp"},
    "int8": {"backend": "pycoll", "compression": "int8", "parallel": "ddp"},
    "int4": {"backend": "pycoll", "compression": "int4", "parallel": "ddp"},
    "powersgd": {"backend": "pycoll", "parallel": "ddp", "powersgd_rank": 2},
    "powersgd4": {"backend": "pycoll", "parallel": "ddp", "powersgd_rank": 4},
    "fsdp-gloo": {"backend": "gloo", "parallel": "fsdp"},
    "fsdp-pycoll": {"backend": "pycoll", "parallel": "fsdp"},
    "fsdp-int8": {
        "backend": "pycoll",
        "parallel": "fsdp",
        "compression": "int8",
        "all_gather": "int8",
        "fsdp_error_feedback": True,
    },
}
DEFAULT_VARIANTS = ",".join(VARIANTS)
#: The no-communication floor, trained beside the variants.
FLOOR = "local"
BASELINE = "gloo"
#: The fields every --json line has (issue 37), before the extra ones.
JSON_FIELDS = ("variant", "hosts", "rate", "steps", "final_loss", "wall_s", "comm_s", "bytes_sent", "curve")


# ---------------------------------------------------------------------------------------------------------
# Arguments


def parse_variants(text: str) -> list[str]:
    """The variant names of a comma list, in order, without repeats; ``powersgd:2`` is ``powersgd``,
    ``powersgd:4`` ``powersgd4``. ValueError naming an unknown one and the known ones."""
    out: list[str] = []
    for name in links.split_list(text):
        name = {"powersgd:2": "powersgd", "powersgd:4": "powersgd4"}.get(name, name)
        variant_settings(name)  # raises for an unknown name
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("no variant given")
    return out


def variant_settings(name: str) -> dict[str, Any]:
    """_fsdp_train.Variant's keyword arguments for ``name``; ValueError when there is no such variant."""
    if name in VARIANTS:
        return VARIANTS[name]
    rank = name.removeprefix("powersgd:")
    if name.startswith("powersgd:") and rank.isdigit() and int(rank) >= 1:
        return {**VARIANTS["powersgd"], "powersgd_rank": int(rank)}
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}, or powersgd:R (R >= 1)")


def parse_hosts(text: str) -> list[int]:
    """Host counts of a comma list (1: one host, no namespaces); ValueError unless each is an integer >= 1."""
    hosts = []
    for item in links.split_list(text):
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--hosts: {item!r} is not a host count (an integer >= 1)")
        hosts.append(int(item))
    if not hosts:
        raise ValueError("--hosts: no host count given")
    return list(dict.fromkeys(hosts))


def parse_rates(text: str) -> list[str]:
    """Link rates of a comma list, tc syntax (``1gbit``, ``10gbit``, ``500mbit``); ValueError otherwise."""
    rates = links.split_list(text)
    for rate in rates:
        try:
            ok = links.rate_bps(rate) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"--rate: {rate!r} is not a rate in tc's syntax (1gbit, 10gbit, 500mbit...)")
    if not rates:
        raise ValueError("--rate: no rate given")
    return list(dict.fromkeys(rates))


def link_list(hosts: Sequence[int], rates: Sequence[str]) -> list[Link]:
    """The links to run, (hosts, rate): one host once, without a rate; every other count at every rate."""
    return ([(1, None)] if 1 in hosts else []) + [(h, r) for h in hosts if h > 1 for r in rates]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="held-out loss against wall-clock time: DDP / FSDP2 on gloo and pycoll (compressed)",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--hosts", default="2", help="host counts, a comma list; 1: one host, no namespaces (2)")
    add("--ranks", type=int, default=None, help="ranks in all, spread evenly over the hosts (4; --quick: 2)")
    add("--rate", default="1gbit", help="tbf rates of the links, each way, a comma list, tc syntax (1gbit)")
    add("--variants", default=DEFAULT_VARIANTS, help=f"comma list of {DEFAULT_VARIANTS}, powersgd:R (all)")
    links.add_training_arguments(p, eval_every=25)
    add("--target", type=float, default=None, help="target held-out loss (default: gloo's final, per link)")
    add("--within", type=float, default=0.0, help="target: gloo's final loss + this many percent (0)")
    add("--timeout", type=float, default=3600.0, help="seconds one job (link and seed) may take (3600)")
    add("--json", default=None, metavar="FILE", help="one JSON line per variant, link and seed")
    add("--plot", default=None, metavar="PNG", help="loss against wall-clock time (needs matplotlib)")
    add("--quick", action="store_true", help="a tiny model, 30 steps, 2 ranks (one host if no namespaces)")
    add("--verbose", action="store_true", help="show the launchers' output")
    add("--table", nargs="+", default=None, metavar="JSONL", help="tables (and --plot) of --json files")
    add("--worker", default=None, metavar="CONFIG", help=argparse.SUPPRESS)
    return p


def apply_quick(args: argparse.Namespace) -> None:
    """--quick: the tiny model of ``links.apply_quick_training``, a held-out point every 5 steps, 2 ranks
    (as many as hosts where more)."""
    links.apply_quick_training(args)
    args.eval_every = 5
    if args.ranks is None:
        args.ranks = max(2, *parse_hosts(args.hosts))


def check_args(args: argparse.Namespace) -> tuple[list[str], list[Link]]:
    """(variant names, links); SystemExit with the reason on arguments that cannot work."""
    try:
        names, hosts, rates = parse_variants(args.variants), parse_hosts(args.hosts), parse_rates(args.rate)
    except ValueError as exc:
        raise SystemExit(f"time_to_loss: {exc}") from None
    args.ranks = 4 if args.ranks is None else args.ranks
    if any(args.ranks % h for h in hosts) or args.steps <= args.timing_warmup:
        raise SystemExit(f"time_to_loss: --ranks {args.ranks} must split evenly over --hosts {args.hosts}, "
                         "and --steps must exceed --timing-warmup")  # fmt: skip
    return names, link_list(hosts, rates)


# ---------------------------------------------------------------------------------------------------------
# Rank side


def worker(config_path: str) -> int:
    """A rank: every variant and the floor, interleaved, counting the link's bytes where it can; rank 0
    appends a progress line per turn, then one JSON line per variant and a last ``{"done": true}``."""
    import _fsdp_train as ft
    import _textlm as lm
    import torch
    import torch.distributed as dist

    spec = json.loads(Path(config_path).read_text())
    torch.set_num_threads(1)
    cfg = ft.TrainConfig.from_dict(spec["train"])
    variants = [ft.Variant(n, **variant_settings(n)) for n in spec["variants"]] + [ft.Variant(FLOOR, FLOOR)]
    ft.init_default_group(cfg.timeout_s)
    groups = ft.make_groups(variants, cfg.timeout_s)
    corpus = lm.load_corpus()
    rank = dist.get_rank()
    progress = links.progress_writer(spec["out"], spec["turns"], rank)
    records = ft.train_interleaved(
        variants, groups, corpus, cfg, spec["turns"], progress, count_link_bytes=True
    )
    if rank == 0:
        for record in records:
            keep = {k: v for k, v in record.items() if k not in ("loss_curve", "probe")}
            if record["variant"] != FLOOR and variant_settings(record["variant"])["parallel"] == "fsdp":
                keep["describe"] = f"FSDP2, {record['describe']}"
            links.append_record(spec["out"], dict(keep, corpus=corpus.fingerprint))
        links.append_record(spec["out"], {"done": True})
    dist.barrier()
    return 0


# ---------------------------------------------------------------------------------------------------------
# The lines


def curve_triples(step_times: Sequence[float], heldout: Sequence[Sequence[float]]) -> list[list[float]]:
    """``[step, wall_s, loss]`` of each held-out point ``[step, loss]``: wall_s is the sum of the first
    ``step`` step times."""
    wall = list(itertools.accumulate(step_times, initial=0.0))
    return [[int(step), wall[int(step)], float(loss)] for step, loss in heldout]


def comm_seconds(steps: int, step_s: float, floor_step_s: float | None) -> float | None:
    """steps x (median step - the floor's median step), at least 0; None without a floor."""
    return None if floor_step_s is None else steps * max(0.0, step_s - floor_step_s)


def json_line(record: dict[str, Any], floor_step_s: float | None, where: dict[str, Any]) -> dict[str, Any]:
    """One --json line (JSON_FIELDS, then the extras) from a rank-0 record of _fsdp_train's ``Run.finish``
    and ``where`` (hosts, rate, ranks, seed, train)."""
    curve = curve_triples(record["step_times_s"], record["heldout_curve"])
    line = {
        "variant": record["variant"], "hosts": where["hosts"], "rate": where["rate"],
        "steps": record["steps"], "final_loss": record["heldout_loss"],
        "wall_s": sum(record["step_times_s"]),
        "comm_s": comm_seconds(record["steps"], record["step_s_median"], floor_step_s),
        "bytes_sent": record.get("bytes_sent"), "curve": curve,
    }  # fmt: skip
    line.update(
        seed=where["seed"], ranks=where["ranks"], describe=record["describe"],
        step_s_median=record["step_s_median"], floor_step_s=floor_step_s,
        final_train_loss=record["final_train_loss"], corpus=record.get("corpus"), train=where["train"],
    )  # fmt: skip
    return line


def lines_of(records: Sequence[dict[str, Any]], where: dict[str, Any]) -> list[dict[str, Any]]:
    """The --json lines of one job's records: the variants' (not the floor's, whose step time each
    carries)."""
    floor = next((r["step_s_median"] for r in records if r.get("variant") == FLOOR), None)
    return [json_line(r, floor, where) for r in records if r.get("variant") not in (None, FLOOR)]


# ---------------------------------------------------------------------------------------------------------
# Time to a target loss


@dataclass(frozen=True)
class Goal:
    """The target loss: ``loss`` for every link, or (None) gloo's final held-out loss on each link and
    seed, raised by ``within_pct`` percent."""

    loss: float | None = None
    within_pct: float = 0.0

    def of(self, baseline_final: float) -> float:
        """The target where gloo's final held-out loss is ``baseline_final``."""
        return self.loss if self.loss is not None else baseline_final * (1 + self.within_pct / 100)

    def describe(self) -> str:
        if self.loss is not None:
            return f"{self.loss:g}"
        within = f" + {self.within_pct:g}%" if self.within_pct else ""
        return f"gloo's final held-out loss{within} (same seed)"


def time_to_target(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The first wall time at which ``curve`` (``[step, wall_s, loss]``, in step order) reaches ``target``:
    the first point's time when it is already at or below; else interpolated linearly between the last
    point above and the first at or below; None when no point reaches it."""
    for i, (_, wall, loss) in enumerate(curve):
        if loss > target:
            continue
        if i == 0:
            return float(wall)
        _, wall0, loss0 = curve[i - 1]
        return float(wall0 + (loss0 - target) / (loss0 - loss) * (wall - wall0))
    return None


def link_key(line: dict[str, Any]) -> tuple[int, str | None, int]:
    return (line["hosts"], line["rate"], line["ranks"])


def targets_of(lines: Sequence[dict[str, Any]], goal: Goal) -> dict[tuple[Any, ...], float]:
    """The target per (link, seed) of ``goal``: where gloo ran, or everywhere for a fixed loss."""
    out = {}
    for line in lines:
        if goal.loss is not None or line["variant"] == BASELINE:
            out[(*link_key(line), line["seed"])] = goal.of(line["final_loss"])
    return out


def summarize(lines: Sequence[dict[str, Any]], goal: Goal) -> dict[str, dict[str, Any]]:
    """Per variant of one link (its seeds pooled): medians of step, wall and comm seconds and bytes; the
    mean final loss and gap to gloo's (%, same seed) with the gap's standard deviation over the seeds; time
    to target per seed, its median and range, and in how many seeds it was reached; the speed-up (gloo's time
    to the target over the variant's, median over the seeds where both reach it)."""
    targets = targets_of(lines, goal)
    gloo = {ln["seed"]: ln for ln in lines if ln["variant"] == BASELINE}
    names = dict.fromkeys(ln["variant"] for ln in lines)
    return {name: _summary([ln for ln in lines if ln["variant"] == name], targets, gloo) for name in names}


def _summary(
    mine: list[dict[str, Any]], targets: dict[tuple[Any, ...], float], gloo: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """One variant's lines (one per seed) summed up: see ``summarize``."""
    times, speedups, gaps = [], [], []
    for ln in mine:
        goal = targets.get((*link_key(ln), ln["seed"]))
        mine_t = time_to_target(ln["curve"], goal) if goal is not None else None
        times.append(mine_t)
        base = gloo.get(ln["seed"])
        if base is None:
            continue
        gaps.append(100 * (ln["final_loss"] / base["final_loss"] - 1))
        base_t = time_to_target(base["curve"], goal) if goal is not None else None
        if mine_t and base_t:
            speedups.append(base_t / mine_t)
    reached = [t for t in times if t is not None]
    return {
        "describe": mine[0]["describe"], "seeds": len(mine), "reached": len(reached),
        "step_ms": 1e3 * statistics.median(ln["step_s_median"] for ln in mine),
        "wall_s": _median([ln["wall_s"] for ln in mine]),
        "comm_s": _median([ln["comm_s"] for ln in mine]),
        "bytes_sent": _median([ln["bytes_sent"] for ln in mine]),
        "final_loss": statistics.mean(ln["final_loss"] for ln in mine),
        "gap_pct": statistics.mean(gaps) if gaps else None,
        "gap_sd": statistics.stdev(gaps) if len(gaps) > 1 else None,
        "to_target_s": _median(reached),
        "to_target_range": (min(reached), max(reached)) if reached else None,
        "speedup": _median(speedups),
    }  # fmt: skip


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# ---------------------------------------------------------------------------------------------------------
# Tables


def _f(value: Any, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{fmt}}".rjust(width)


def header_lines(lines: Sequence[dict[str, Any]], goal: Goal) -> list[str]:
    """What the table is of: the link, the model, the training, the target."""
    first = lines[0]
    h, rate, ranks = link_key(first)
    t, m = first["train"], first["train"]["model"]
    link = f"{where_text(h, rate, ranks)} each way" if rate else "one host"
    seeds = sorted({ln["seed"] for ln in lines})
    return [
        f"== time to loss: {link} ({ranks} ranks) ==",
        f"model: width {m['width']}, depth {m['depth']}, heads {m['heads']}, context {m['context']}; batch "
        f"{t['batch']} per rank; {t['steps']} steps in turns, AdamW lr {t['lr']:g}; held-out "
        f"{t['eval_batches']} x {t['eval_rows']} x {m['context']} bytes every {t['eval_every']} steps",
        f"seeds {', '.join(map(str, seeds))} ({len(seeds)} run{'s' if len(seeds) > 1 else ''}): medians over "
        f"seeds, losses the mean (gap: mean+-s.d. over seeds); wall s: training only (slowest rank per "
        f"step); comm s: steps x (ms/step - no-communication floor's); MB/rank: bytes on the rank's link; "
        f"target: {goal.describe()}",
    ]


def format_table(lines: Sequence[dict[str, Any]], goal: Goal) -> str:
    """One link's table: a row per variant, with its time to the target and the speed-up over gloo."""
    rows = summarize(lines, goal)
    out = header_lines(lines, goal)
    floor = lines[0]["floor_step_s"]
    counted = "" if lines[0]["rate"] else "; MB/rank: - (one host: no link to count)"
    out.append(f"no-communication floor: {_f(floor and floor * 1e3, '.1f', 0)} ms/step{counted}")
    out.append(
        f"{'variant':<12}{'what':<37}{'ms/step':>8}{'wall s':>8}{'comm s':>8}{'MB/rank':>9}{'held-out':>9}"
        f"{'gap %':>13}{'to target s':>12}{'reached':>8}{'range':>13}{'x gloo':>7}"
    )
    for name, v in rows.items():
        rng = v["to_target_range"]
        spread = f"{rng[0]:.1f}-{rng[1]:.1f}" if rng and v["seeds"] > 1 else "-"
        reached = _f(v["to_target_s"], ".1f", 12) if v["reached"] else f"{'not reached':>12}"
        mb = v["bytes_sent"] / 1e6 if v["bytes_sent"] is not None else None
        out.append(
            f"{name:<12}{v['describe'][:36]:<37}{v['step_ms']:8.1f}{_f(v['wall_s'], '.1f', 8)}"
            f"{_f(v['comm_s'], '.1f', 8)}{_f(mb, '.1f', 9)}{v['final_loss']:9.4f}"
            f"{_gap(v['gap_pct'], v['gap_sd']):>13}"
            f"{reached}{str(v['reached']) + '/' + str(v['seeds']):>8}{spread:>13}{_f(v['speedup'], '.2f', 7)}"
        )
    return "\n".join(out)


def _gap(mean: float | None, sd: float | None) -> str:
    """The gap column: the mean over seeds, and its standard deviation where there are several."""
    if mean is None:
        return "-"
    return f"{mean:+.2f}" if sd is None else f"{mean:+.2f}+-{sd:.2f}"


def where_text(h: int, rate: str | None, ranks: int) -> str:
    """``2 hosts x 2 ranks, links shaped to 1gbit``."""
    per_host = ranks // h
    return f"{h} hosts x {per_host} rank{'s' if per_host > 1 else ''}, links shaped to {rate}"


def by_link(lines: Sequence[dict[str, Any]]) -> dict[tuple[int, str | None, int], list[dict[str, Any]]]:
    """The lines grouped by link (hosts, rate, ranks), in the order they come."""
    groups: dict[tuple[int, str | None, int], list[dict[str, Any]]] = {}
    for line in lines:
        groups.setdefault(link_key(line), []).append(line)
    return groups


# ---------------------------------------------------------------------------------------------------------
# The plot


def require_matplotlib() -> None:
    """SystemExit naming ``pip install matplotlib`` when it is missing (before any run, for --plot)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("time_to_loss: --plot needs matplotlib: pip install matplotlib") from None


def plot(lines: Sequence[dict[str, Any]], path: str, goal: Goal) -> None:
    """Held-out loss against wall-clock seconds, one panel per link: per variant the mean curve over the
    seeds (each seed faint behind it), the mean target dashed, and the speed-up over gloo in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_link(lines)
    names = list(dict.fromkeys(ln["variant"] for ln in lines))
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.2 * rows), squeeze=False)
    for ax, (key, mine) in zip(axes.flat, groups.items()):
        _panel(ax, key, mine, goal, colors)
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """The seeds' curves averaged point by point (wall time and loss at each evaluated step), over the
    steps every curve has."""
    steps = set.intersection(*({c[0] for c in curve} for curve in curves)) if curves else set()
    points = [{c[0]: c for c in curve} for curve in curves]
    return [
        [s, statistics.mean(p[s][1] for p in points), statistics.mean(p[s][2] for p in points)]
        for s in sorted(steps)
    ]


def legend_label(name: str, row: dict[str, Any]) -> str:
    """A variant's legend entry from its ``summarize`` row: the speed-up over gloo, and in how many seeds
    the target was reached where not in all."""
    some = f" in {row['reached']}/{row['seeds']}" if row["reached"] < row["seeds"] else ""
    if row["speedup"] is not None:
        return f"{name} ({row['speedup']:.2f}x{some})"
    return f"{name} (not reached)" if not row["reached"] else f"{name} (reached{some})"


def _panel(ax: Any, key: tuple[Any, ...], lines: Sequence[dict[str, Any]], goal: Goal,
           colors: dict[str, Any]) -> None:  # fmt: skip
    """One link's panel."""
    h, rate, ranks = key
    targets = targets_of(lines, goal)
    target = statistics.mean(targets.values()) if targets else None
    rows = summarize(lines, goal)
    seeds = len({ln["seed"] for ln in lines})
    for name, row in rows.items():
        mine = [ln for ln in lines if ln["variant"] == name]
        if seeds > 1:
            for ln in mine:
                ax.plot([c[1] for c in ln["curve"]], [c[2] for c in ln["curve"]], color=colors[name], lw=0.6,
                        alpha=0.3)  # fmt: skip
        curve = mean_curve([ln["curve"] for ln in mine])
        ax.plot([c[1] for c in curve], [c[2] for c in curve], color=colors[name], lw=1.5,
                label=legend_label(name, row))  # fmt: skip
        reached = time_to_target(curve, target) if target is not None else None
        if reached is not None:
            ax.plot([reached], [target], "o", color=colors[name], ms=5)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=0.8)
    where = where_text(h, rate, ranks) if rate else f"one host, {ranks} ranks"
    runs = f", mean of {seeds} seeds" if seeds > 1 else ""
    ax.set_title(f"{where}{runs}\n(dashed: target; o: reached; legend: speed-up to it over gloo)", fontsize=9)
    ax.set_xlabel("training wall-clock s")
    ax.set_ylabel("held-out loss (nats/byte)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


# ---------------------------------------------------------------------------------------------------------
# Driver


def run_link(link: Link, seed: int, names: list[str], args: argparse.Namespace,
             work: Path) -> list[dict[str, Any]]:  # fmt: skip
    """Every variant (and the floor) on one link from ``seed``; the --json lines."""
    h, rate = link
    out = work / f"h{h}-{rate or 'local'}-s{seed}.jsonl"
    train = links.train_settings(args, seed, 0, min(args.timeout, 1800.0))
    spec = {"train": train, "variants": names, "turns": args.turns, "out": str(out)}
    config = out.with_suffix(".json")
    config.write_text(json.dumps(spec))
    program = [str(HERE / "time_to_loss.py"), "--worker", str(config)]
    ok = links.run_job(h, args.ranks, program, out, rate=rate, timeout=args.timeout, verbose=args.verbose,
                       work=work)  # fmt: skip
    records = links.read_records(out)
    if not ok or not any(r.get("done") for r in records):
        print(f"time_to_loss: the job on {h} host(s) {'timed out' if not ok else 'did not finish'}; "
              f"{len(records)} results kept", file=sys.stderr)  # fmt: skip
    where = {"hosts": h, "rate": rate, "ranks": args.ranks, "seed": seed, "train": train}
    return lines_of(records, where)


def resolve_links(args: argparse.Namespace, wanted: list[Link]) -> list[Link]:
    """``wanted``, or one host where namespaces cannot be made and --quick allows it; SystemExit if not."""
    rates = {r for h, r in wanted if h > 1}
    problem = next((p for r in rates if (p := links.why_no_netns(r))), None)
    if problem is None:
        return wanted
    if args.quick:
        print(f"time_to_loss: {problem}; --quick runs on one host instead", file=sys.stderr)
        return [(1, None)]
    raise SystemExit(f"time_to_loss: {problem}")


def run_all(args: argparse.Namespace, names: list[str], link_plan: list[Link]) -> list[Any]:
    """Every link and seed, one job each; each link's table as it completes. The lines."""
    seeds = [int(x) for x in links.split_list(args.seeds)]
    everything: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pycoll-time-to-loss-") as tmp:
        for link in link_plan:
            t0, lines = time.monotonic(), []
            for seed in seeds:
                where = f"{link[0]} hosts at {link[1]}" if link[1] else "one host"
                print(f"{where}, {args.ranks} ranks, seed {seed}: "
                      f"{', '.join(names)} + {FLOOR}, {args.turns} turns", flush=True)  # fmt: skip
                lines += run_link(link, seed, names, args, Path(tmp))
            if lines:
                print(format_table(lines, goal_of(args)), flush=True)
            print(f"({time.monotonic() - t0:.0f} s)\n", flush=True)
            everything += lines
    return everything


def goal_of(args: argparse.Namespace) -> Goal:
    return Goal(args.target, args.within)


def from_tables(args: argparse.Namespace) -> int:
    """--table: the tables (and --plot) of earlier --json files."""
    lines = [ln for path in args.table for ln in links.read_records(Path(path)) if "variant" in ln]
    for group in by_link(lines).values():
        print(format_table(group, goal_of(args)) + "\n")
    if args.plot and lines:
        plot(lines, args.plot, goal_of(args))
    return 0 if lines else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.plot:
        require_matplotlib()
    if args.table:
        return from_tables(args)
    links.interrupt_on_signals()
    if args.quick:
        apply_quick(args)
    names, wanted = check_args(args)
    try:
        lines = run_all(args, names, resolve_links(args, wanted))
    except KeyboardInterrupt:
        print("time_to_loss: interrupted; namespaces and processes removed", file=sys.stderr)
        return 130
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    if args.plot and lines:
        plot(lines, args.plot, goal_of(args))
        print(f"plot: {args.plot}")
    return 0 if lines else 1


if __name__ == "__main__":
    sys.exit(main())
