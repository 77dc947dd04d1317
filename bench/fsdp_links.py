"""FSDP2 over slow emulated links: gloo against pycoll, lossless and with compressed gradients and weights
(issue 36): step time and final loss of a small character-level transformer.

    python bench/fsdp_links.py --quick                    # 2 hosts, tiny model, 30 steps (under a minute)
    python bench/fsdp_links.py                            # 2 and 4 hosts, 4 ranks, 1 Gbit/s links
    python bench/fsdp_links.py --hosts 4 --steps 600 --turns 12 --json fsdp.jsonl
    python bench/fsdp_links.py --no-netns --quick         # 4 ranks on this host (shared memory), to debug
    python bench/fsdp_links.py --no-netns --seeds 1,2 --variants gloo,pycoll,int8,int4-ef   # losses only
    python bench/fsdp_links.py --table run1.jsonl run2.jsonl      # the tables again, seeds pooled

For each host count H (``--hosts``), H virtual hosts (tests/netns.py: network namespaces on one bridge,
each link shaped both ways with tbf at ``--rate``) run one ``pycoll run --nnodes H`` launcher each, with
``--ranks / H`` ranks per host (4 ranks: 2 hosts x 2, or 4 hosts x 1). The rank processes (this script
with ``--worker``) form a gloo default group for bookkeeping and one process group per variant, then
train bench/_textlm.py's model with FSDP2 (``fully_shard`` on each block and on the root, CPU, float32)
once per variant, all variants in the same processes and in memory at once, taking ``--turns`` turns:
in each turn every variant trains its next 1/turns of the steps, the order rotated by one each turn
(A B C, B C A, C A B, ...), so that the machine's changes of speed fall on every variant alike:

- ``gloo``: a gloo group, the baseline;
- ``pycoll``: a pycoll group, lossless;
- ``int8``: ``Options(compression="int8", all_gather_compression="int8")``: the gradients'
  reduce-scatter and the weights' all-gather in int8. The group's own error feedback is keyed by tensor
  storage, and FSDP2 reduce-scatters from a new buffer every step, so this variant has none in effect;
- ``int8-ef``: the same group, plus ``pycoll.torch.fsdp.keep_error_feedback(model)`` (a residual per
  FSDP module, carried from step to step);
- ``int4-ef``: int4 gradients with keep_error_feedback, int8 weights. Weights get no error feedback
  (an all-gather sends values, not increments, so there is nothing to carry over), and int4's error (a
  fifteenth of each block's largest magnitude, against int8's 1/254) would enter every forward pass
  directly; int8 weights keep that error small while the gradients, which error feedback corrects,
  take int4;
- ``int4-rot``: ``Int4(rotation="hadamard")`` gradients (no error feedback), int8 weights; skipped with
  a note where pycoll's Int4 has no ``rotation`` yet; ``int4-rot-ef`` (not by default): both;
- ``int4`` (not run by default): int4 gradients without error feedback, int8 weights: what error
  feedback buys int4; ``int4-ef-w4`` (not by default): int4-ef with int4 weights too;
- ``local``: no communication: every rank trains its own unsharded copy on its own rows, at the same
  time as the others (so with the same share of the CPUs): the compute floor of a step. Communication
  share of a variant = 1 - floor / its step time.

Every variant starts from the same weights and sees the same bytes in the same order. Measured per
variant: step time (the slowest rank's, median over the steps after the warm-up and the first step of
each turn; the range of the turns' medians; the speed-up over gloo turn by turn), training time, final
training loss (mean over the ranks and the last ``--last-k`` steps) and final held-out loss (the trained
shards gathered losslessly over gloo into a full-precision copy, so int8 weights in transit do not colour
the evaluation). A probe times FSDP2's all-gathers and reduce-scatters alone on each group, at the
model's unit sizes: which collective dominates, serialized.

Model size: on these 2-vCPU machines a rank computes at about 25-40 GFLOP/s when 4 share the cores, and
FSDP2 moves about 9 bytes per parameter per rank per step (2 all-gathers and 1 reduce-scatter of float32
at 3/4 of the model each); at 1 Gbit/s that makes communication / compute ~ 12e-9 * FLOP/s / tokens
per rank, whatever the parameter count. The default (3.3M parameters, 2 x 64 bytes per rank, 512
tokens per step) computes a step in ~120 ms here (``local``) against 235 ms of a ring's link time, and
gloo's step takes ~480 ms, three quarters of it communicating: communication-bound, as the issue asks,
with a batch that is small for a language model. (Compressed, the step becomes CPU-bound: see the CPU
ms column.)

Needs root (namespaces), iproute2 (ip, tc) and CPU torch. Everything created (namespaces, processes) is
removed at the end, also on errors, Ctrl-C and SIGTERM.

Losses hardly depend on the links: pycoll's results are the same bits on 1 host and on 4 hosts x 1 rank
(2 hosts x 2 ranks reduce-scatter hierarchically, another order of the sums), so ``--no-netns`` gives
the losses of a 4-host run in less time; use it to add seeds. Held-out losses of different variants
drift apart by tenths of a percent from rounding alone (lossless pycoll against gloo, which sums in
another order; measured -0.5% to +0.2% over 4 seeds at the defaults) and compressed variants by about
1%, so compare gaps over several seeds (``--seeds``) before reading a 0.2% target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# bench/ goes last: its profile.py would otherwise shadow the standard library's, which torch imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import _fsdp_train as ft  # noqa: E402
import _links as links  # noqa: E402
import _textlm as lm  # noqa: E402

VARIANTS = {
    v.name: v
    for v in [
        ft.Variant("gloo", "gloo"),
        ft.Variant("pycoll", "pycoll"),
        ft.Variant("int8", "pycoll", "int8", "int8"),
        ft.Variant("int8-ef", "pycoll", "int8", "int8", fsdp_error_feedback=True),
        ft.Variant("int4-ef", "pycoll", "int4", "int8", fsdp_error_feedback=True),
        ft.Variant("int4", "pycoll", "int4", "int8"),
        ft.Variant("int4-rot", "pycoll", "int4-hadamard", "int8"),
        ft.Variant("int4-rot-ef", "pycoll", "int4-hadamard", "int8", fsdp_error_feedback=True),
        ft.Variant("int4-ef-w4", "pycoll", "int4", "int4", fsdp_error_feedback=True),
        ft.Variant("local", "local"),
    ]
}
DEFAULT_VARIANTS = "gloo,pycoll,int8,int8-ef,int4-ef,int4-rot,local"
#: Issue 36's targets: step-time speed-up over gloo, and held-out loss at most this many % above gloo's.
TARGET_SPEEDUP = {"int8": 2.0, "int8-ef": 2.0}
TARGET_GAP_PCT = {
    "int8": 0.2,
    "int8-ef": 0.2,
    "int4-ef": 0.5,
    "int4-rot": 0.5,
    "int4-rot-ef": 0.5,
    "int4": 0.5,
    "int4-ef-w4": 0.5,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="FSDP2 step time and final loss over shaped links: gloo vs pycoll (compressed)",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--hosts", default="2,4", help="host counts, a comma list (2,4)")
    add("--ranks", type=int, default=4, help="ranks in all, spread evenly over the hosts (4)")
    add("--rate", default="1gbit", help="tbf rate of each link, each way, tc syntax (1gbit)")
    add(
        "--variants",
        default=DEFAULT_VARIANTS,
        help=f"comma list of {', '.join(VARIANTS)} ({DEFAULT_VARIANTS})",
    )
    links.add_training_arguments(p, eval_every=100)
    add("--probe-iters", type=int, default=3, help="timed calls of each collective in the probe (3)")
    add("--timeout", type=float, default=3600.0, help="seconds one host count's job may take (3600)")
    add("--json", default=None, metavar="FILE", help="one JSON line per variant (curves too)")
    add("--quick", action="store_true", help="2 hosts, a tiny model, 30 steps")
    add("--no-netns", action="store_true", help="all ranks on this host, no namespaces (to debug)")
    add("--verbose", action="store_true", help="show the launchers' output")
    add("--table", nargs="+", default=None, metavar="JSONL", help="print the tables of earlier --json files")
    add("--worker", default=None, metavar="CONFIG", help=argparse.SUPPRESS)
    return p


def apply_quick(args: argparse.Namespace) -> None:
    """--quick: 2 hosts, a tiny model, few steps."""
    if args.hosts == "2,4":
        args.hosts = "2"
    links.apply_quick_training(args)


def train_config(args: argparse.Namespace, seed: int = 0) -> ft.TrainConfig:
    settings = links.train_settings(args, seed, args.probe_iters, min(args.timeout, 1800.0))
    return ft.TrainConfig.from_dict(settings)


def usable_variants(names: Sequence[str]) -> tuple[list[ft.Variant], list[str]]:
    """The variants named that can run here, and a note for each left out (unknown, or a codec option
    pycoll does not have yet)."""
    out, notes = [], []
    for name in names:
        v = VARIANTS.get(name)
        if v is None:
            notes.append(f"{name}: no such variant (known: {', '.join(VARIANTS)})")
            continue
        try:
            v.options()
        except TypeError as exc:
            notes.append(f"{name}: skipped, pycoll cannot make its codec yet ({exc})")
            continue
        out.append(v)
    return out, notes


# ---------------------------------------------------------------------------------------------------------
# Rank side


def worker(config_path: str) -> int:
    """A rank: every variant, interleaved; rank 0 appends a progress line per turn, then one JSON line per
    variant and a last ``{"done": true}``."""
    import torch
    import torch.distributed as dist

    spec = json.loads(Path(config_path).read_text())
    torch.set_num_threads(1)
    cfg = ft.TrainConfig.from_dict(spec["train"])
    variants = [VARIANTS[n] for n in spec["variants"]]
    ft.init_default_group(cfg.timeout_s)
    groups = ft.make_groups(variants, cfg.timeout_s)
    corpus = lm.load_corpus()
    rank = dist.get_rank()
    progress = links.progress_writer(spec["out"], spec["turns"], rank)
    records = ft.train_interleaved(variants, groups, corpus, cfg, spec["turns"], progress)
    if rank == 0:
        for record in records:
            links.append_record(spec["out"], dict(record, corpus=corpus.fingerprint))
        links.append_record(spec["out"], {"done": True})
    dist.barrier()
    return 0


# ---------------------------------------------------------------------------------------------------------
# Launching


def run_host_count(
    h: int, seed: int, variants: list[ft.Variant], args: argparse.Namespace, work: Path
) -> list[dict[str, Any]]:
    """Trains every variant on ``h`` hosts from ``seed``; the records (one per variant)."""
    config = work / f"h{h}s{seed}.json"
    out = config.with_suffix(".jsonl")
    spec = {"train": train_config(args, seed).to_dict(), "variants": [v.name for v in variants],
            "turns": args.turns, "out": str(out)}  # fmt: skip
    config.write_text(json.dumps(spec))
    program = [str(HERE / "fsdp_links.py"), "--worker", str(config)]
    per_host = args.ranks // h
    rate = None if args.no_netns else args.rate
    ok = links.run_job(h, args.ranks, program, out, rate=rate, timeout=args.timeout, verbose=args.verbose,
                       work=work)  # fmt: skip
    records = links.read_records(out)
    done = any(r.get("done") for r in records)
    if not ok or not done:
        print(f"fsdp_links: the {h}-host job {'timed out' if not ok else 'did not finish'}; "
              f"{len(records)} results kept", file=sys.stderr)  # fmt: skip
    where = {
        "hosts": h,
        "ranks_per_host": per_host,
        "rate": None if args.no_netns else args.rate,
        "seed": seed,
    }
    return [dict(r, **where) for r in records if "variant" in r]


# ---------------------------------------------------------------------------------------------------------
# The table


def _paired(mine: Sequence[float | None], gloo: Sequence[float | None]) -> list[float]:
    """gloo's median / this variant's, turn by turn (turns where both have one)."""
    return [g / m for m, g in zip(mine, gloo) if m and g]


def _per_variant(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant, over its seeds: step ms (median of the seeds' medians), the range of the turns'
    medians, the speed-up over gloo overall and turn by turn (against gloo's run of the same seed), mean
    losses, the held-out gap to gloo's of the same seed (mean, min, max), and the first seed's probe."""
    gloo = {r["seed"]: r for r in records if r["variant"] == "gloo"}
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["variant"], []).append(r)
    return {name: _aggregate(by[name], gloo) for name in VARIANTS if name in by}


def _aggregate(rs: list[dict[str, Any]], gloo: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One variant's runs (one per seed) summed up: see _per_variant."""
    turns = [t * 1e3 for r in rs for t in r["turn_medians_s"] if t]
    paired: list[float] = []
    for r in rs:
        if r["seed"] in gloo:
            paired += _paired(r["turn_medians_s"], gloo[r["seed"]]["turn_medians_s"])
    gaps = [
        100 * (r["heldout_loss"] / gloo[r["seed"]]["heldout_loss"] - 1)
        for r in rs if "heldout_loss" in r and r["seed"] in gloo
    ]  # fmt: skip
    step_ms = statistics.median(r["step_s_median"] * 1e3 for r in rs)
    gloo_ms = statistics.median(g["step_s_median"] * 1e3 for g in gloo.values()) if gloo else None
    held = [r["heldout_loss"] for r in rs if "heldout_loss" in r]
    cpu = [r["cpu_s_per_step"] * 1e3 for r in rs if "cpu_s_per_step" in r]
    return {
        "step_ms": step_ms, "spread": (min(turns), max(turns)) if turns else (0.0, 0.0),
        "speedup": gloo_ms / step_ms if gloo_ms else None,
        "paired": (min(paired), max(paired)) if paired else None,
        "train_s": statistics.mean(r["train_s"] for r in rs),
        "train_loss": statistics.mean(r["final_train_loss"] for r in rs),
        "heldout": statistics.mean(held) if held else None,
        "gap": statistics.mean(gaps) if gaps else None, "gap_range": (min(gaps), max(gaps)) if gaps else None,
        "seeds": len(rs), "probe": rs[0].get("probe"),
        "cpu_ms": statistics.median(cpu) if cpu else None,
    }  # fmt: skip


def _f(value: Any, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{fmt}}".rjust(width)


def header_lines(cfg: ft.TrainConfig, hosts: int, per_host: int, rate: str | None, world: int) -> list[str]:
    """What was run: topology, model, data, the bytes FSDP2 moves."""
    m = cfg.model
    params = m.parameter_count()
    units = ft.fsdp_units(m, world)
    moved = sum((gathers + 1) * numel for _, numel, gathers in units) * (world - 1) * 4  # ring: per rank
    link = f"links shaped to {rate} each way" if rate else "one host, no namespaces"
    floor = f" = {moved * 8 / links.rate_bps(rate) * 1e3:.0f} ms at {rate}" if rate else ""
    tokens = cfg.batch * m.context
    return [
        f"== FSDP2, {hosts} host{'s' if hosts > 1 else ''} x {per_host} rank{'s' if per_host > 1 else ''} "
        f"({world} ranks), {link} ==",
        f"model: width {m.width}, depth {m.depth}, heads {m.heads}, context {m.context}: {params / 1e6:.2f}M "
        f"parameters ({params * 4 / 1e6:.1f} MB float32); batch {cfg.batch} x {m.context} bytes per rank = "
        f"{tokens * world} tokens/step; {cfg.steps} steps, AdamW lr {cfg.lr:g} (cosine); step time: slowest "
        f"rank, median after {cfg.timing_warmup} warm-up steps",
        f"FSDP2 sends per step, per rank (ring; 2 all-gathers per block, 1 for the root, 1 reduce-scatter "
        f"per unit, float32): {moved / 1e6:.1f} MB{floor}",
        f"held-out: {cfg.eval_batches} x {cfg.eval_rows} x {m.context} bytes, full-precision weights; "
        f"train loss: mean of the last {cfg.last_k} steps",
    ]


def _row(name: str, v: dict[str, Any], floor: dict[str, Any] | None) -> str:
    """One variant's line of the table."""
    share = 100 * (1 - floor["step_ms"] / v["step_ms"]) if floor and name != "local" else None
    p = v["probe"]
    probe = f"{p['all_gather_ms']:.0f}+{p['reduce_scatter_ms']:.0f}" if p else "-"
    lo, hi = v["spread"]
    paired = f"{v['paired'][0]:.2f}-{v['paired'][1]:.2f}" if v["paired"] and name != "gloo" else "-"
    train_loss = "-" if name == "local" else f"{v['train_loss']:.4f}"
    gaps = (
        "-"
        if v["gap_range"] is None or v["seeds"] < 2
        else f"{v['gap_range'][0]:+.2f}..{v['gap_range'][1]:+.2f}"
    )
    return (
        f"{name:<12}{VARIANTS[name].describe():<38}{v['step_ms']:8.1f} {f'{lo:.0f}-{hi:.0f}':>10}"
        f"{_f(v['speedup'], '.2f', 7)}{paired:>11}{v['train_s']:8.1f}{probe:>15}{_f(share, '.0f', 7)}"
        f"{_f(v['cpu_ms'], '.0f', 7)}{train_loss:>11}{_f(v['heldout'], '.4f', 9)}{_f(v['gap'], '+.3f', 8)}"
        f"{gaps:>14}"
    )


def format_table(records: Sequence[dict[str, Any]], cfg: ft.TrainConfig, notes: Sequence[str]) -> str:
    """The table of one host count (every seed), then the issue's targets."""
    r0 = records[0]
    world = r0["hosts"] * r0["ranks_per_host"]
    rows = _per_variant(records)
    seeds = sorted({r["seed"] for r in records})
    lines = header_lines(cfg, r0["hosts"], r0["ranks_per_host"], r0["rate"], world)
    lines.append(
        f"seeds {', '.join(map(str, seeds))}: times are the median over seeds, losses the mean; gap % = "
        "held-out loss over gloo's of the same seed, mean (and range) over seeds"
    )
    lines.append(
        f"CPU ms: CPU time per step of a rank (all its threads); {world} ranks on {os.cpu_count()} cores "
        f"cannot step faster than CPU ms x {world / (os.cpu_count() or 1):g}. comm %: 1 - local / ms/step"
    )
    lines.append(
        f"{'variant':<12}{'what':<38}{'ms/step':>8} {'turns ms':>10}{'x gloo':>7}{'per turn':>11}"
        f"{'train s':>8}{'probe AG+RS':>15}{'comm %':>7}{'CPU ms':>7}{'train loss':>11}{'held-out':>9}"
        f"{'gap %':>8}{'gap range':>14}"
    )
    lines += [_row(name, v, rows.get("local")) for name, v in rows.items()]
    lines += [f"# {n}" for n in notes] + verdicts(rows)
    return "\n".join(lines)


def verdicts(rows: dict[str, dict[str, Any]]) -> list[str]:
    """PASS / MISS for issue 36's targets (a held-out loss below gloo's passes)."""
    gloo = rows.get("gloo")
    if gloo is None:
        return ["targets: no gloo baseline in this run"]
    out = ["targets (issue 36): step time >= 2x gloo's for int8; held-out loss within 0.2% of gloo's (int8), "
           "0.5% (int4)"]  # fmt: skip
    for name, v in rows.items():
        parts = []
        if name in TARGET_SPEEDUP:
            x, want = v["speedup"], TARGET_SPEEDUP[name]
            turns = f", {v['paired'][0]:.2f}-{v['paired'][1]:.2f}x turn by turn" if v["paired"] else ""
            parts.append(f"speed-up {x:.2f}x{turns} (>= {want:g}x: {'PASS' if x >= want else 'MISS'})")
        if name in TARGET_GAP_PCT and v["gap"] is not None:
            gap, want = v["gap"], TARGET_GAP_PCT[name]
            parts.append(f"held-out gap {gap:+.3f}% (<= {want:g}%: {'PASS' if gap <= want else 'MISS'})")
        if parts:
            out.append(f"  {name:<12}" + "; ".join(parts))
    return out


# ---------------------------------------------------------------------------------------------------------


def check_args(args: argparse.Namespace) -> list[int]:
    """The host counts; raises SystemExit on arguments that cannot work."""
    hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
    if args.no_netns:
        hosts = [1]
    bad = [h for h in hosts if h < 1 or args.ranks % h]
    if bad or args.steps <= args.timing_warmup:
        raise SystemExit(f"fsdp_links: --ranks {args.ranks} must split evenly over --hosts {args.hosts}, and "
                         f"--steps must exceed --timing-warmup")  # fmt: skip
    return hosts


def print_tables(paths: Sequence[str]) -> int:
    """The tables of the records in ``paths`` (--json files), one per setting (hosts, ranks, rate, model,
    steps, batch), seeds pooled."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for r in links.read_records(Path(path)):
            setting = {k: v for k, v in r["train"].items() if k != "seed"}
            key = json.dumps([r["hosts"], r["ranks_per_host"], r["rate"], setting], sort_keys=True)
            groups.setdefault(key, []).append(r)
    for records in groups.values():
        print(format_table(records, ft.TrainConfig.from_dict(records[0]["train"]), []) + "\n")
    return 0 if groups else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.table:
        return print_tables(args.table)
    links.interrupt_on_signals()
    if args.quick:
        apply_quick(args)
    host_counts = check_args(args)
    problem = None if args.no_netns else links.why_no_netns(args.rate)
    if problem:
        print(f"fsdp_links: {problem}", file=sys.stderr)
        return 2
    variants, notes = usable_variants([n.strip() for n in args.variants.split(",") if n.strip()])
    for note in notes:
        print(f"fsdp_links: {note}", file=sys.stderr)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    cfg, everything = train_config(args), []
    try:
        with tempfile.TemporaryDirectory(prefix="pycoll-fsdp-links-") as tmp:
            for h in host_counts:
                t0 = time.monotonic()
                records = []
                for seed in seeds:
                    names = ", ".join(v.name for v in variants)
                    print(
                        f"{h} host(s), {args.ranks} ranks, seed {seed}: {names}, {args.turns} turns",
                        flush=True,
                    )
                    records += run_host_count(h, seed, variants, args, Path(tmp))
                if records:
                    print(format_table(records, cfg, notes), flush=True)
                print(f"({h} hosts: {time.monotonic() - t0:.0f} s)\n", flush=True)
                everything += records
    except KeyboardInterrupt:
        print("fsdp_links: interrupted; namespaces and processes removed", file=sys.stderr)
        return 130
    if args.json:
        with open(args.json, "w") as f:
            for r in everything:
                f.write(json.dumps(dict(r, train=train_config(args, r["seed"]).to_dict())) + "\n")
    return 0 if everything else 1


if __name__ == "__main__":
    sys.exit(main())
