"""Validate the cost model on this machine: calibrate, then predict a fresh measurement, and check auto.

    python bench/validate_model.py                         # worlds 2,3,4; 3 rounds each phase
    python bench/validate_model.py --rounds 5 --markdown validate.md --json validate.json

1. Calibration and held-out check: ``pycoll.tuning.calibrate.measure_rounds`` times ring, direct and
   tree, uncompressed and int8, 4 KiB..64 MiB, on each world size, in 2 x --rounds interleaved rounds.
   ``fit`` fits the shared-memory parameters to the median of the even rounds; the odd rounds (the
   same minutes of this noisy machine, docs/benchmarking.md#measuring, but not used by the fit) are predicted:
   predicted / measured - 1 for every (world, algorithm, codec, size). The issue's target is within
   +-25% for sizes of 1 MiB and more. The fit goes to a temporary tuning file (``--save`` also saves it
   as this machine's calibration).
2. auto: a second measurement of the same grid plus ``algorithm="auto"`` and ``compression="auto"``
   (error budget 1e-2), the ranks choosing by the fitted model (``PYCOLL_TUNING_FILE``), interleaved
   size by size with the fixed choices. Per world and size: auto's time / the fastest of ring, direct,
   tree (uncompressed), and compression="auto" against the fastest of every fixed algorithm x {none,
   the codecs within the budget}. Target: never more than 1.10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from pycoll.bench import options, report
from pycoll.tuning.calibrate import Measurement, fit, format_fit, measure_rounds, median_of
from pycoll.tuning.model import expected_error
from pycoll.tuning.persist import save_model, shm_fragment_bytes, shm_segment_bytes

FIXED = ("ring", "direct", "tree")
CODECS = ("none", "int8")
MEASURED_CODECS = tuple(c for c in CODECS if c != "none")  # compression=auto's candidates in _choices
LARGE = 1 << 20
TOLERANCE = 0.25
AUTO_SLACK = 1.10


def _predict(model, m: Measurement) -> float:
    """The model's time for ``m``, with the transport's message sizes on ``m.world`` ranks."""
    at = replace(
        model, segment_bytes=shm_segment_bytes(m.world), fragment_bytes=shm_fragment_bytes(m.world), _cache={}
    )
    codec = None if m.codec == "none" else m.codec
    return at.predict("allreduce", m.algorithm, m.world, m.bytes, codec=codec).time_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worlds", default="2,3,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-b", "--minbytes", type=options.parse_size, default=4096)
    parser.add_argument("-e", "--maxbytes", type=options.parse_size, default=64 << 20)
    parser.add_argument("--error-budget", type=float, default=1e-2)
    parser.add_argument("--save", action="store_true", help="also save the fit as this machine's calibration")
    parser.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    parser.add_argument("--json", metavar="FILE", help="write every point as JSON")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    grid = dict(min_bytes=args.minbytes, max_bytes=args.maxbytes, log=log)
    rounds = measure_rounds(worlds, algorithms=FIXED, codecs=CODECS, rounds=2 * args.rounds, **grid)
    calibration, held_out = median_of(rounds[0::2]), median_of(rounds[1::2])
    model, report = fit(calibration)
    print(format_fit(report).split("\nworld")[0])
    with tempfile.TemporaryDirectory(prefix="pycoll-validate-") as tmp:
        tuning = Path(tmp) / "tuning.json"
        save_model(model, report, tuning)
        if args.save:
            print(f"saved to {save_model(model, report)}")
        validation_rounds = measure_rounds(
            worlds,
            algorithms=(*FIXED, "auto"),
            codecs=(*CODECS, "auto"),
            error_budget=args.error_budget,
            env={"PYCOLL_TUNING_FILE": str(tuning)},
            rounds=args.rounds,
            **grid,
        )
    validation = median_of(validation_rounds)
    lines = _predictions(model, held_out) + _choices(model, held_out, args.error_budget)
    lines += _auto(model, validation_rounds, args.error_budget)
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    if args.json:
        points = []
        for m in validation:
            fixed = "auto" not in (m.algorithm, m.codec)
            points.append({**m.__dict__, "predicted_s": _predict(model, m) if fixed else None})
        held = [{**m.__dict__, "predicted_s": _predict(model, m)} for m in held_out]
        data = {"fit": report, "held_out": held, "validation": points}
        Path(args.json).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0


def _predictions(model, held_out: list[Measurement]) -> list[str]:
    by_key = {(m.world, m.algorithm, m.codec, m.bytes): m.time_s for m in held_out}
    worlds = sorted({m.world for m in held_out})
    sizes = sorted({m.bytes for m in held_out})
    lines = ["", "## Predicted vs measured (held-out rounds), predicted / measured - 1", ""]
    header = "| world | size | " + " | ".join(f"{a} {c}" for c in CODECS for a in FIXED) + " |"
    lines += [header, "|" + "---|" * (2 + len(FIXED) * len(CODECS))]
    errors_large: list[float] = []
    for w in worlds:
        for b in sizes:
            cells = []
            for c in CODECS:
                for a in FIXED:
                    t = by_key.get((w, a, c, b))
                    if t is None:
                        cells.append("")
                        continue
                    err = _predict(model, Measurement(w, a, c, b, t)) / t - 1
                    if b >= LARGE:
                        errors_large.append(err)
                    cells.append(f"{err:+.0%}")
            lines.append(f"| {w} | {report.format_size(b)} | " + " | ".join(cells) + " |")
    within = sum(abs(e) <= TOLERANCE for e in errors_large)
    if errors_large:
        lines += [
            "",
            f"Sizes >= 1 MiB: {within} of {len(errors_large)} predictions within +-{TOLERANCE:.0%}; "
            f"median |error| {statistics.median(abs(e) for e in errors_large):.0%}, "
            f"worst {max(errors_large, key=abs):+.0%}.",
        ]
    return lines


def _choices(model, held_out: list[Measurement], budget: float) -> list[str]:
    """auto's choices (the model's: auto runs exactly the chosen plan) timed by the held-out rounds,
    against the fastest fixed choice there: the same minutes as the fit, free of the machine's drift."""
    t = {(m.world, m.algorithm, m.codec, m.bytes): m.time_s for m in held_out}
    worlds = sorted({k[0] for k in t})
    sizes = sorted({k[3] for k in t})
    lines = ["", "## auto's choices timed by the held-out rounds, / the fastest fixed choice there", ""]
    lines += ["| world | " + " | ".join(report.format_size(b) for b in sizes) + " |"]
    lines += ["|---|" + "---|" * len(sizes)]
    ratios: list[float] = []
    for w in worlds:
        at = replace(
            model, segment_bytes=shm_segment_bytes(w), fragment_bytes=shm_fragment_bytes(w), _cache={}
        )
        cells = []
        for b in sizes:
            choice = at.choose_algorithm("allreduce", w, b)
            best = min(t[(w, a, "none", b)] for a in FIXED)
            codec, calgo = at.choose_compression(w, b, error_budget=budget, codecs=MEASURED_CODECS)
            every = min(
                t[(w, a, c, b)]
                for a in FIXED
                for c in CODECS
                if c == "none" or expected_error(c, a, w) <= budget
            )
            r1, r2 = t[(w, choice, "none", b)] / best, t[(w, calgo, codec, b)] / every
            ratios += [r1, r2]
            label = choice if (codec, calgo) == ("none", choice) else f"{choice} / {calgo}+{codec}"
            cells.append(f"{label} {r1:.2f} / {r2:.2f}")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    over = sum(r > AUTO_SLACK for r in ratios)
    lines += [
        "",
        "Cells: algorithm=auto's choice, then its time / the fastest fixed algorithm's; compression=auto's",
        f"time / the fastest fixed (algorithm, codec within the budget). Worst {max(ratios):.2f}, median "
        f"{statistics.median(ratios):.2f}; {over} of {len(ratios)} over {AUTO_SLACK:.2f}.",
    ]
    return lines


def _auto(model, rounds: list[list[Measurement]], budget: float) -> list[str]:
    """auto's time over the best fixed choice's, per round (the same minutes), median over rounds."""
    per_round = [{(m.world, m.algorithm, m.codec, m.bytes): m.time_s for m in points} for points in rounds]
    medians = {(m.world, m.algorithm, m.codec, m.bytes): m.time_s for m in median_of(rounds)}
    worlds = sorted({k[0] for k in medians})
    sizes = sorted({k[3] for k in medians})
    lines = ["", "## auto against the best fixed choice, time ratio (per round, median over rounds)", ""]
    lines += [
        "| world | size | auto's choice | auto | best fixed | ratio | compression=auto's choice | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios: list[float] = []

    def allowed(c: str, a: str, w: int) -> bool:
        return c == "none" or expected_error(c, a, w) <= budget

    for w in worlds:
        at = replace(
            model, segment_bytes=shm_segment_bytes(w), fragment_bytes=shm_fragment_bytes(w), _cache={}
        )
        for b in sizes:
            if (w, "auto", "none", b) not in medians:
                continue
            r1, r2 = [], []
            for t in per_round:
                fixed = min(t[(w, a, "none", b)] for a in FIXED)
                every = min(t[(w, a, c, b)] for a in FIXED for c in CODECS if allowed(c, a, w))
                r1.append(t[(w, "auto", "none", b)] / fixed)
                r2.append(t[(w, "auto", "auto", b)] / every)
            ratio, cratio = statistics.median(r1), statistics.median(r2)
            ratios += [ratio, cratio]
            best = min(FIXED, key=lambda a: medians[(w, a, "none", b)])
            codec, calgo = at.choose_compression(w, b, error_budget=budget)
            chosen_c = calgo if codec == "none" else f"{calgo}+{codec}"
            auto_us, best_us = medians[(w, "auto", "none", b)] * 1e6, medians[(w, best, "none", b)] * 1e6
            lines.append(
                f"| {w} | {report.format_size(b)} | {at.choose_algorithm('allreduce', w, b)} "
                f"| {auto_us:.0f} us | {best} {best_us:.0f} us | {ratio:.2f} | {chosen_c} | {cratio:.2f} |"
            )
    if ratios:
        over = sum(r > AUTO_SLACK for r in ratios)
        lines += [
            "",
            f"auto vs best fixed: worst ratio {max(ratios):.2f}, median {statistics.median(ratios):.2f}; "
            f"{over} of {len(ratios)} cases over {AUTO_SLACK:.2f}.",
        ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
