"""pycoll against Open MPI and Gloo, measured in the same run, interleaved (docs/benchmarking.md#measuring).

The host moves these vCPUs between placements every few minutes, which changes results 2-4x, so a
comparison only means something between runs made close together. This script therefore runs the
libraries in rounds, A B C A B C ..., each round going through every world size and, within it, every
library, and quotes for each size the median over rounds of the *per-round* ratio. Before every round
it also measures a single-process 64 MiB memcpy (the memory-bandwidth ceiling beside the run) and how
busy the CPUs are with other work (anything but ~0% means the figures are disturbed). A run that fails
is re-run once at once (--retries), and the failure is reported.

    python bench/compare.py                                  # pycoll, mpi, gloo; 2 and 4 ranks; 3 rounds
    python bench/compare.py --rounds 5 --json compare.json --markdown compare.md
    python bench/compare.py --libs mpi,gloo -e 1M            # baselines only (ratios are mpi/gloo)
    python bench/compare.py --libs pycoll,before --before /venv-old/bin/python -b 4K -e 64M
                                                             # this pycoll against another install of it

The first library of --libs is the subject: ratios are subject/other. busbw ratio > 1 means the subject
moves data faster; the latency ratio (time of subject / time of other, given for the smallest size) < 1
means it finishes sooner. Every run uses the same timing loop (pycoll/bench/timing.py); runs are
separate processes and each writes JSON lines, which this script reads back.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from pycoll.bench import jobs, options, report, timing  # noqa: E402  (no native module needed here)
from pycoll.bench.baselines import mpirun_command  # noqa: E402

LIBRARIES = ("pycoll", "mpi", "gloo", "before")
DEFAULT_LIBRARIES = ("pycoll", "mpi", "gloo")
LABELS = {"pycoll": "pycoll", "mpi": "Open MPI", "gloo": "Gloo", "before": "pycoll before"}

# Targets of issue 2 ("Benchmark"): (bytes, other library, kind, bound). kind "busbw": subject's busbw
# must be >= bound x other's; kind "latency": subject's time must be <= bound x other's.
TARGETS: tuple[tuple[int, str, str, float], ...] = (
    (64 << 20, "mpi", "busbw", 3.0),
    (64 << 20, "gloo", "busbw", 5.0),
    (1 << 20, "mpi", "busbw", 1.0),
    (4 << 10, "mpi", "latency", 3.0),
    (4 << 10, "gloo", "latency", 0.2),
)


@dataclass
class Run:
    """One library at one world size in one round."""

    library: str
    world: int
    round: int
    command: list[str]
    ok: bool = False
    wall_s: float = 0.0
    error: str = ""
    records: list[dict[str, Any]] = field(default_factory=list)
    failed_attempts: list[str] = field(default_factory=list)  # errors of attempts that were retried
    steal_s: float = 0.0  # CPU time the hypervisor took from this VM while the run ran

    @property
    def summary(self) -> str:
        """One line saying why the run failed (the exception line when there is one)."""
        return error_summary(self.error)

    def by_size(self) -> dict[int, dict[str, Any]]:
        return {int(r["bytes"]): r for r in self.records}


def sweep_flags(args: argparse.Namespace) -> list[str]:
    flags = ["-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", repr(args.stepfactor)]
    flags += ["-c", str(args.check)]
    if args.iters is not None:
        flags += ["-n", str(args.iters)]
    if args.warmup_iters is not None:
        flags += ["-w", str(args.warmup_iters)]
    return flags


def command_for(library: str, world: int, json_path: str, args: argparse.Namespace) -> list[str]:
    py = sys.executable
    flags = [*sweep_flags(args), "--json", json_path]
    if library in ("pycoll", "before"):
        job = jobs.Job(
            ranks=world,
            minbytes=args.minbytes,
            maxbytes=args.maxbytes,
            stepfactor=args.stepfactor,
            iters=args.iters,
            warmup_iters=args.warmup_iters,
            check=args.check,
            algorithm=tuple(options.parse_algorithms(args.algorithm)),
            json=json_path,
            progress="off",  # what `pycoll bench` picks when its stderr is captured
        )
        if library == "before":  # the same job in another install's interpreter, which imports its pycoll
            return [args.before, "-m", "pycoll.bench.jobs", "--job", job.to_json()]
        return jobs.job_command(job)
    if library == "mpi":
        script = str(HERE / "baselines" / "mpi_allreduce.py")
        return mpirun_command(world, [py, script, *flags])
    if library == "gloo":
        script = str(HERE / "baselines" / "gloo_allreduce.py")
        launcher = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
        return [*launcher, script, *flags]
    raise ValueError(f"unknown library {library!r}; expected one of {LIBRARIES}")


def steal_seconds() -> float:
    """Cumulative time the hypervisor ran something else on this VM's CPUs (/proc/stat "steal").

    Runs that suffered steal are slowed by the host, not by the library: the summary lists it."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_busy_fraction(seconds: float = 1.0) -> float:
    """Share of all CPUs' time spent busy over ``seconds`` while this script runs nothing: how much
    other work shares the machine with the benchmark (Linux /proc/stat; NaN elsewhere)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle  # user nice system idle iowait irq softirq steal

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return float("nan")
    elapsed = total1 - total0
    return 1.0 - (idle1 - idle0) / elapsed if elapsed > 0 else float("nan")


def error_summary(error: str) -> str:
    """The most telling line of a failed run's output: the last exception line, else the first line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
            return line
    return lines[0] if lines else "unknown error"


def execute(run: Run, json_path: str, timeout: float, verbose: bool, retries: int = 0) -> None:
    """Run ``run.command``; a failed attempt is retried up to ``retries`` times (its error is kept)."""
    for attempt in range(retries + 1):
        run.error, run.records, run.ok = "", [], False
        _execute_once(run, json_path, timeout, verbose)
        if run.ok:
            return
        if attempt < retries:
            run.failed_attempts.append(run.error)
            print(f"  ({LABELS[run.library]}, {run.world} ranks failed: {run.summary}; retrying)", flush=True)


def _execute_once(run: Run, json_path: str, timeout: float, verbose: bool) -> None:
    env = dict(os.environ)
    # pycoll's module is run from the repository root; the baselines need nothing from the package. The
    # other install ("before") runs away from this checkout, so that it imports its own pycoll.
    cwd: Path | str = REPO
    if run.library == "before":
        cwd = tempfile.gettempdir()
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    steal0 = steal_seconds()
    try:
        proc = subprocess.run(
            run.command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        run.wall_s = time.monotonic() - t0
        run.error = f"timed out after {timeout:.0f} s"
        return
    run.wall_s = time.monotonic() - t0
    run.steal_s = steal_seconds() - steal0
    if verbose:
        print(proc.stdout.rstrip(), flush=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        run.error = f"exit code {proc.returncode}: {tail}"
        return
    try:
        run.records = report.read_json_lines(Path(json_path).read_text())
    except (OSError, ValueError) as e:
        run.error = f"no results: {e}"
        return
    run.ok = bool(run.records)
    if not run.ok:
        run.error = "no results written"


# ---------------------------------------------------------------------------------------------------
# Summary


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(
    runs: list[Run], libraries: Sequence[str], worlds: Sequence[int]
) -> dict[int, list[dict[str, Any]]]:
    """Per world size, per message size: medians over rounds, and median per-round ratios."""
    subject = libraries[0]
    table: dict[tuple[str, int, int], dict[int, dict[str, Any]]] = {
        (r.library, r.world, r.round): r.by_size() for r in runs if r.ok
    }
    rounds = sorted({r.round for r in runs})
    summary: dict[int, list[dict[str, Any]]] = {}
    for world in worlds:
        sizes = sorted({b for (_, w, _), recs in table.items() if w == world for b in recs})
        rows = []
        for nbytes in sizes:
            row: dict[str, Any] = {"bytes": nbytes, "busbw_GBps": {}, "time_us": {}, "wrong": {}}
            for lib in libraries:
                recs = [
                    table[(lib, world, k)][nbytes] for k in rounds if nbytes in table.get((lib, world, k), {})
                ]
                row["busbw_GBps"][lib] = _median([r["busbw_GBps"] for r in recs])
                row["time_us"][lib] = _median([r["time_us"] for r in recs])
                known = [r["wrong"] for r in recs if r.get("wrong") is not None]
                row["wrong"][lib] = sum(known) if known else None
            row["busbw_ratio"], row["latency_ratio"], row["busbw_ratio_range"] = {}, {}, {}
            for other in libraries[1:]:
                ratios, lat = [], []
                for k in rounds:
                    a = table.get((subject, world, k), {}).get(nbytes)
                    b = table.get((other, world, k), {}).get(nbytes)
                    if a and b and a["time_us"] > 0 and b["time_us"] > 0:
                        ratios.append(b["time_us"] / a["time_us"])  # = busbw ratio (same bytes, ranks)
                        lat.append(a["time_us"] / b["time_us"])
                row["busbw_ratio"][other] = _median(ratios)
                row["latency_ratio"][other] = _median(lat)
                row["busbw_ratio_range"][other] = [min(ratios), max(ratios)] if ratios else None
            rows.append(row)
        summary[world] = rows
    return summary


def check_targets(summary: dict[int, list[dict[str, Any]]], subject: str) -> list[dict[str, Any]]:
    """Issue 2's targets, evaluated on the median per-round ratios (only for pycoll as subject)."""
    if subject != "pycoll":
        return []
    out = []
    for world, rows in summary.items():
        by_size = {row["bytes"]: row for row in rows}
        for nbytes, other, kind, bound in TARGETS:
            row = by_size.get(nbytes)
            if row is None or row["busbw_ratio"].get(other) is None:
                continue
            if kind == "busbw":
                value = row["busbw_ratio"][other]
                met = value >= bound
                text = f"busbw >= {bound:g}x {LABELS[other]}"
            else:
                value = row["latency_ratio"][other]
                met = value <= bound
                text = f"latency <= {bound:g}x {LABELS[other]}"
            out.append({"world": world, "bytes": nbytes, "target": text, "value": value, "met": met})
    return out


# ---------------------------------------------------------------------------------------------------
# Output


def _num(value: float | None) -> str:
    """Two decimals, or two significant digits for values below 0.1 (Gloo's small-message busbw)."""
    if value is None:
        return "—"
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.2g}"


def _time(us: float | None) -> str:
    if us is None:
        return "—"
    if us < 1000:
        return f"{us:.1f} µs"
    return f"{us / 1000:.2f} ms"


def _ratio(value: float | None, span: list[float] | None = None) -> str:
    if value is None:
        return "—"
    text = f"{_num(value)}×"
    if span is not None and span[0] != span[1]:
        text += f" ({_num(span[0])}–{_num(span[1])})"
    return text


def markdown(
    summary: dict[int, list[dict[str, Any]]],
    libraries: Sequence[str],
    memcpy: list[dict[str, float]],
    runs: list[Run],
    targets: list[dict[str, Any]],
    meta: dict[str, Any],
) -> str:
    subject, others = libraries[0], list(libraries[1:])
    names = [LABELS[lib] for lib in libraries]
    n_rounds = meta["rounds"]
    lines = [
        f"### All-reduce, float32 sum: {' vs '.join(names)} (same run, interleaved)",
        "",
        f"{meta['host']}, {meta['cpus']} CPUs, {meta['date']}. {n_rounds} rounds, each running every "
        f"library at every world size in turn ({' '.join(names)} ...); figures are medians over rounds, "
        "ratios the median of the per-round ratio (min–max over rounds in brackets). busbw = "
        "algbw·2(n−1)/n; time = slowest rank, median over iterations. Versions: "
        + "; ".join(sorted(meta["versions"].values()))
        + ".",
        "",
    ]
    if memcpy:
        rw = [m["rw_GBps"] for m in memcpy]
        lines += [
            f"Single-process memcpy of {report.format_size(int(memcpy[0]['bytes']))} (numpy copy, bytes "
            f"read + written): median {statistics.median(rw):.1f} GB/s (rounds: "
            + ", ".join(f"{v:.1f}" for v in rw)
            + "). CPUs busy with other work just before each round: "
            + ", ".join(f"{m.get('other_cpu_busy', float('nan')):.0%}" for m in memcpy)
            + " (well above 0% means the figures are disturbed).",
            "",
        ]
    stolen = [r for r in runs if r.steal_s >= 0.05]
    if stolen:
        lines += [
            "Hypervisor steal time during runs (the host ran something else on these CPUs; such a run is "
            "slowed by the host, not by the library): "
            + "; ".join(
                f"{LABELS[r.library]} {r.world} ranks round {r.round + 1}: {r.steal_s:.2f} s" for r in stolen
            )
            + ".",
            "",
        ]
    for world, rows in summary.items():
        head = ["size"]
        head += [f"{LABELS[lib]} busbw (GB/s)" for lib in libraries]
        head += [f"{LABELS[lib]} time" for lib in libraries]
        head += [f"{LABELS[subject]}/{LABELS[o]} busbw" for o in others]
        lines += [f"**{world} ranks**", "", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for row in rows:
            cells = [report.format_size(row["bytes"])]
            cells += [_num(row["busbw_GBps"][lib]) for lib in libraries]
            cells += [_time(row["time_us"][lib]) for lib in libraries]
            cells += [_ratio(row["busbw_ratio"][o], row["busbw_ratio_range"][o]) for o in others]
            lines.append("| " + " | ".join(cells) + " |")
        if rows and others:
            first = rows[0]
            lat = ", ".join(
                f"{LABELS[subject]}/{LABELS[o]} {_ratio(first['latency_ratio'][o])}" for o in others
            )
            lines += [
                "",
                f"Latency ratio at {report.format_size(first['bytes'])} (time, lower is better): {lat}.",
            ]
        wrong = {lib: sum(r["wrong"][lib] or 0 for r in rows) for lib in libraries}
        if any(wrong.values()):
            lines += ["", "**Wrong results:** " + ", ".join(f"{LABELS[k]} {v}" for k, v in wrong.items())]
        lines.append("")
    if targets:
        lines += [
            "**Targets (issue 2)**",
            "",
            "| ranks | size | target | measured | met |",
            "|---:|---:|---|---:|:-:|",
        ]
        for t in targets:
            lines.append(
                f"| {t['world']} | {report.format_size(t['bytes'])} | {t['target']} | {t['value']:.2f}× | "
                f"{'yes' if t['met'] else '**no**'} |"
            )
        lines.append("")
    retried = [r for r in runs if r.failed_attempts]
    if retried:
        lines += ["Runs that failed once and were re-run:", ""]
        lines += [
            f"- round {r.round + 1}, {r.world} ranks, {LABELS[r.library]}: "
            + "; ".join(error_summary(e) for e in r.failed_attempts)
            for r in retried
        ]
        lines.append("")
    failed = [r for r in runs if not r.ok]
    if failed:
        lines += ["**Failed runs:**", ""]
        lines += [f"- round {r.round + 1}, {r.world} ranks, {LABELS[r.library]}: {r.summary}" for r in failed]
        lines.append("")
    return "\n".join(lines)


def host_meta(args: argparse.Namespace, libraries: Sequence[str], runs: list[Run]) -> dict[str, Any]:
    versions = {}
    for r in runs:
        if r.ok and r.records:
            versions[r.library] = str(r.records[0].get("library_version", r.library))
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "rounds": args.rounds,
        "ranks": list(args.ranks),
        "libraries": list(libraries),
        "algorithm": args.algorithm,
        "versions": versions,
        "sweep": sweep_flags(args),
    }


# ---------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_sweep_arguments(parser)  # its --json is this script's summary file
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (2 4)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--libs", default=",".join(DEFAULT_LIBRARIES), help="comma-separated, subject first (pycoll,mpi,gloo)"
    )
    parser.add_argument("--algorithm", default="auto", help="pycoll's --algorithm (auto)")
    parser.add_argument(
        "--before", metavar="PYTHON", help="the interpreter of another pycoll install: library 'before'"
    )
    parser.add_argument("--markdown", metavar="FILE", help="also write the markdown table to FILE")
    parser.add_argument("--memcpy-bytes", type=options.parse_size, default=64 << 20, help="memcpy size (64M)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run (600)")
    parser.add_argument(
        "--retries", type=int, default=1, help="re-run a failed run this many times at once (1)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print every run's table")
    args = parser.parse_args(argv)
    args.libraries = [s.strip() for s in args.libs.split(",") if s.strip()]
    if "before" in args.libraries and not args.before:
        parser.error("--libs before needs --before PYTHON (the interpreter of the other pycoll install)")
    unknown = [lib for lib in args.libraries if lib not in LIBRARIES]
    if unknown or not args.libraries:
        parser.error(f"--libs: unknown {unknown}; choose from {','.join(LIBRARIES)}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    libraries: list[str] = args.libraries
    runs: list[Run] = []
    memcpy: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="pycoll-compare-") as tmp:
        for k in range(args.rounds):
            busy = cpu_busy_fraction()
            memcpy.append({**timing.memcpy_bandwidth(args.memcpy_bytes), "other_cpu_busy": busy})
            print(
                f"round {k + 1}/{args.rounds}: memcpy {memcpy[-1]['rw_GBps']:.1f} GB/s (r+w), "
                f"CPUs busy with other work {busy:.0%}",
                flush=True,
            )
            for world in args.ranks:
                for lib in libraries:
                    path = os.path.join(tmp, f"{lib}-{world}-{k}.jsonl")
                    run = Run(lib, world, k, command_for(lib, world, path, args))
                    execute(run, path, args.timeout, args.verbose, args.retries)
                    runs.append(run)
                    status = "ok" if run.ok else f"FAILED ({run.summary})"
                    print(
                        f"  {world} ranks {LABELS[lib]:8s} {run.wall_s:6.1f} s  "
                        f"steal {run.steal_s:5.2f} s  {status}",
                        flush=True,
                    )
    summary = summarize(runs, libraries, args.ranks)
    targets = check_targets(summary, libraries[0])
    meta = host_meta(args, libraries, runs)
    text = markdown(summary, libraries, memcpy, runs, targets, meta)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    if args.json:
        document = {
            "meta": meta,
            "memcpy": memcpy,
            "summary": {str(w): rows for w, rows in summary.items()},
            "targets": targets,
            "runs": [
                {
                    "library": r.library,
                    "world": r.world,
                    "round": r.round,
                    "command": r.command,
                    "ok": r.ok,
                    "wall_s": r.wall_s,
                    "steal_s": r.steal_s,
                    "error": r.error,
                    "failed_attempts": r.failed_attempts,
                    "results": r.records,
                }
                for r in runs
            ],
        }
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
