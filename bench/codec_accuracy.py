"""Accuracy (and effective bandwidth) of compressed all-reduce, measured on real ranks: markdown tables.

    python bench/codec_accuracy.py                          # tables a, b and c (~2.5 min on 2 cores)
    python bench/codec_accuracy.py --tables a,b             # accuracy only (~1 min)
    python bench/codec_accuracy.py --tables c --bench-ranks 2 --bench-sizes 1M,64M --rounds 3
    python bench/codec_accuracy.py --json raw.json          # also keep the raw measurements
    python bench/codec_accuracy.py --tables d               # reduce-scatter (~1 min)

(a) Relative error ||out - exact|| / ||exact|| (exact: the float64 sum) of op sum over 1M float32
    elements of fresh Gaussian inputs (mean over ``--trials``), for codec {fp16, bf16, int8, int4} x
    algorithm {direct, ring, tree} x world {2, 4, 8}, against the two-shot (direct) targets
    int8 <= 1%, int4 <= 15%, fp16 <= 1e-3, bf16 <= 8e-3 (ring and tree, which re-encode partial sums
    per hop / level, are held to the same numbers for comparison only). "out of bound" counts elements
    outside the codec's derived bound (pycoll/compression/bounds.py); it must be 0.
(b) Choosing block sizes: int8 and int4 with blocks {16, ..., 512}: wire bytes per element (scales
    included), compression ratio vs float32, and the two-shot relative error at worlds 4 and 8, with
    nearest and stochastic rounding, and the error as a fraction of the target.
(c) Effective bandwidth on shared memory: ``pycoll bench`` (the nccl-tests loop of pycoll/bench/timing.py)
    with ``--compression none,fp16,bf16,int8,int4`` (variants interleaved size by size) at 1, 16 and
    64 MiB on 2 and 4 ranks, repeated ``--rounds`` times; time is the median over rounds (bandwidths
    are derived from it), and "x none" the median over rounds of the per-round ratio of the codec's
    effective busbw to the uncompressed one (these vCPUs change speed every few minutes and the host
    may be shared: only same-round ratios compare).
    The same numbers by hand, one round:
        pycoll bench --ranks 4 -b 1M -e 64M -f 4 --compression none,fp16,bf16,int8,int4
(d) Compressed reduce-scatter (each element quantized once, by its sender): relative error of the
    concatenated chunks for codec x world {2, 4, 8}, beside a reference ring reduce-scatter that
    re-quantizes the partial sum at every hop (pycoll.compression.reference, computed on rank 0), and
    the elements outside the derived per-element bound (bounds.reduce_scatter_bound), which must be 0.

Ranks are started with pycoll's launcher (``python -m pycoll.run -n W bench/codec_accuracy.py --worker``);
rank 0 rebuilds every rank's input (a pure function of rank, count and seed) and writes its figures
to a JSON file this process reads. Inputs are ``pycoll.bench.inputs.gaussian_input``, as ``pycoll bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pycoll.bench import jobs

REPO = Path(__file__).resolve().parents[1]
CODECS = ("fp16", "bf16", "int8", "int4")
ALGORITHMS = ("direct", "ring", "tree")
#: Two-shot targets of the relative error.
TARGETS = {"fp16": 1e-3, "bf16": 8e-3, "int8": 0.01, "int4": 0.15}
BLOCKS = (16, 32, 64, 128, 256, 512)
BENCH_CODECS = ("none", "fp16", "bf16", "int8", "int4")


def _make_codec(kind: str, block: int | None = None, rounding: str = "nearest", seed: int = 0) -> Any:
    from pycoll.compression import Int4, Int8, get_codec

    if block is None and rounding == "nearest":
        return get_codec(kind)
    cls = {"int8": Int8, "int4": Int4}[kind]
    return cls(block=block, rounding=rounding, seed=seed)


# ---------------------------------------------------------------------------------------------------
# The rank side


def _cases(world: int, parts: str, block_worlds: list[int]) -> list[tuple[str, str, str, Any, Any]]:
    """(part, label, algorithm, codec kind, block / rounding) of every all-reduce a trial runs."""
    cases: list[tuple[str, str, str, Any, Any]] = []
    if "a" in parts:
        for kind in CODECS:
            for algorithm in ALGORITHMS:
                cases.append(("a", f"{kind}/{algorithm}", algorithm, kind, (None, "nearest")))
    if "b" in parts and world in block_worlds:
        for kind in ("int8", "int4"):
            for block in BLOCKS:
                for rounding in ("nearest", "stochastic"):
                    cases.append(("b", f"{kind}/{block}/{rounding}", "direct", kind, (block, rounding)))
    if "d" in parts:
        for kind in CODECS:
            cases.append(("d", f"rs/{kind}", "direct", kind, (None, "nearest")))
    return cases


def _ring_reduce_scatter(codec: Any, inputs: list[np.ndarray], m: int) -> np.ndarray:
    """Every chunk as a ring reduce-scatter that re-encodes its partial sum at every hop computes it."""
    from pycoll.compression import reference as codec_ref

    world = len(inputs)
    chunks = []
    for owner in range(world):
        order = [(owner + k) % world for k in range(1, world + 1)]  # the owner adds last, exactly
        partial = inputs[order[0]][owner * m:(owner + 1) * m].copy()
        for r in order[1:]:
            _, decoded = codec_ref.encode(codec, partial)
            partial = decoded + inputs[r][owner * m:(owner + 1) * m]
        chunks.append(partial)
    return np.concatenate(chunks)


def _reduce_scatter_case(codec: Any, x: np.ndarray, inputs: list[np.ndarray] | None, rank: int,
                         world: int) -> tuple[float, float, int] | None:
    """One compressed reduce-scatter of x; on rank 0: (its relative error, the ring reference's,
    elements outside the bound)."""
    import pycoll
    from pycoll.compression.bounds import reduce_scatter_bound

    m = x.size // world
    out = np.empty(m, dtype=np.float32)
    pycoll.reduce_scatter(x[:world * m], out, compression=codec, timeout=120)
    full = np.empty(world * m, dtype=np.float32)
    pycoll.all_gather(out, full, timeout=120)  # every chunk to rank 0, exactly
    if rank != 0:
        return None
    assert inputs is not None
    ins = [v[:world * m] for v in inputs]
    exact = np.sum([v.astype(np.float64) for v in ins], axis=0)
    norm = _l2(exact)
    err = np.abs(full.astype(np.float64) - exact)
    bound = np.concatenate([reduce_scatter_bound(codec, ins, owner) for owner in range(world)])
    ring = _l2(_ring_reduce_scatter(codec, ins, m).astype(np.float64) - exact) / norm
    return _l2(err) / norm, ring, int(np.count_nonzero(~(err <= bound)))


def _l2(a: np.ndarray) -> float:
    """||a||_2 without BLAS: OpenBLAS threads spin after a call and would slow the waiting ranks."""
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


def worker(args: argparse.Namespace) -> int:
    import pycoll
    from pycoll.bench.inputs import gaussian_input
    from pycoll.compression.bounds import SumBound

    comm = pycoll.init()
    rank, world = comm.rank, comm.world_size
    count = args.count
    cases = _cases(world, args.parts, args.block_worlds)
    errors: dict[str, list[float]] = {label: [] for _, label, *_ in cases}
    ring: dict[str, list[float]] = {label: [] for _, label, *_ in cases}  # table d's reference
    outside: dict[str, int] = {label: 0 for _, label, *_ in cases}
    try:
        for trial in range(args.trials):
            seed = 1000 + trial
            x = gaussian_input(rank, count, seed)
            exact = None
            sum_bounds: dict[str, Any] = {}
            if rank == 0:
                inputs = [gaussian_input(r, count, seed) for r in range(world)]
                exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
                norm = _l2(exact)
            for part, label, algorithm, kind, (block, rounding) in cases:
                codec = _make_codec(kind, block, rounding, seed=trial + 1)
                if part == "d":
                    got = _reduce_scatter_case(codec, x, inputs if rank == 0 else None, rank, world)
                    if got is not None:
                        errors[label].append(got[0])
                        ring[label].append(got[1])
                        outside[label] += got[2]
                    continue
                y = x.copy()
                pycoll.allreduce(y, algorithm=algorithm, compression=codec, timeout=120)
                if rank != 0:
                    continue
                assert exact is not None
                key = repr(codec)
                if key not in sum_bounds:  # the input terms of the bound depend on the codec only
                    sb = SumBound(codec, "direct", count)
                    for v in inputs:
                        sb.add(v)
                    sum_bounds[key] = sb
                err = np.abs(y.astype(np.float64) - exact)
                errors[label].append(_l2(err) / norm)
                bound = sum_bounds[key].bound(y, algorithm)
                outside[label] += int(np.count_nonzero(~(err <= bound)))
    finally:
        pycoll.finalize(comm)
    if rank == 0:
        out = {"world": world, "count": count, "trials": args.trials, "cases": []}
        for part, label, algorithm, kind, (block, rounding) in cases:
            out["cases"].append({
                "part": part, "label": label, "algorithm": algorithm, "codec": kind, "block": block,
                "rounding": rounding, "errors": errors[label], "ring_errors": ring[label],
                "outside": outside[label],
            })
        Path(args.out).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------------------
# The driver


def _launch_accuracy(world: int, parts: str, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    out = os.path.join(tmp, f"accuracy-{world}.json")
    worker = [str(Path(__file__).resolve()), "--worker", "--out", out, "--count", str(args.count),
              "--trials", str(args.trials), "--parts", parts,
              "--block-worlds", ",".join(map(str, args.block_worlds))]
    cmd = jobs.script_command(world, worker[0], worker[1:])
    subprocess.run(cmd, cwd=REPO, check=True)
    return json.loads(Path(out).read_text())


def _mark(error: float, target: float) -> str:
    return "pass" if error <= target else "**FAIL**"


def table_a(runs: dict[int, dict[str, Any]]) -> str:
    worlds = sorted(runs)
    head = "| codec | target | algorithm | " + " | ".join(f"world {w}" for w in worlds) + " |"
    lines = [head, "|" + "---|" * (3 + len(worlds))]
    outside = 0
    for kind in CODECS:
        for algorithm in ALGORITHMS:
            cells = []
            for w in worlds:
                case = next(c for c in runs[w]["cases"] if c["label"] == f"{kind}/{algorithm}")
                mean = statistics.fmean(case["errors"])
                outside += case["outside"]
                cells.append(f"{mean:.3g} {_mark(mean, TARGETS[kind])}")
            lines.append(f"| {kind} | {TARGETS[kind]:g} | {algorithm} | " + " | ".join(cells) + " |")
    any_run = runs[worlds[0]]
    lines.append("")
    lines.append(f"Relative L2 error, mean of {any_run['trials']} trials of fresh Gaussian inputs, "
                 f"{any_run['count']} float32 elements, op sum; targets are for two-shot (direct). "
                 f"Elements outside the derived bound, all cases: {outside}.")
    return "\n".join(lines)


def table_b(runs: dict[int, dict[str, Any]], block_worlds: list[int]) -> str:
    worlds = [w for w in block_worlds if w in runs]
    cols = []
    for w in worlds:
        cols += [f"err w{w} nearest", f"x target w{w}", f"err w{w} stochastic"]
    lines = ["| codec | block | bytes/elem | ratio vs fp32 | " + " | ".join(cols) + " |",
             "|" + "---|" * (4 + len(cols))]
    outside = 0
    for kind in ("int8", "int4"):
        for block in BLOCKS:
            codec = _make_codec(kind, block)
            default = block == _make_codec(kind).block
            cells = []
            for w in worlds:
                by = {c["rounding"]: c for c in runs[w]["cases"] if c["label"].startswith(f"{kind}/{block}/")}
                near = statistics.fmean(by["nearest"]["errors"])
                stoch = statistics.fmean(by["stochastic"]["errors"])
                outside += by["nearest"]["outside"] + by["stochastic"]["outside"]
                cells += [f"{near:.4f}", f"{near / TARGETS[kind]:.2f}", f"{stoch:.4f}"]
            name = f"**{block}** (default)" if default else str(block)
            lines.append(f"| {kind} | {name} | {codec.bytes_per_element:.4f} | "
                         f"{4 / codec.bytes_per_element:.2f}x | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Two-shot (direct) relative error, mean over trials; \"x target\": nearest-rounding "
                 f"error / target (int8 1%, int4 15%). Elements outside the derived bound: {outside}.")
    return "\n".join(lines)


def table_d(runs: dict[int, dict[str, Any]]) -> str:
    worlds = sorted(runs)
    cols = []
    for w in worlds:
        cols += [f"world {w}", f"ring w{w}"]
    lines = ["| codec | " + " | ".join(cols) + " |", "|" + "---|" * (1 + len(cols))]
    outside = 0
    for kind in CODECS:
        cells = []
        for w in worlds:
            case = next(c for c in runs[w]["cases"] if c["label"] == f"rs/{kind}")
            outside += case["outside"]
            mine, ring = statistics.fmean(case["errors"]), statistics.fmean(case["ring_errors"])
            cells += [f"{mine:.3g}", f"{ring:.3g}"]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    any_run = runs[worlds[0]]
    lines.append("")
    lines.append(f"Compressed reduce-scatter, relative L2 error of all chunks against the float64 sum, "
                 f"mean of {any_run['trials']} trials of {any_run['count']} float32 elements per rank; "
                 f"\"ring\": a reference ring reduce-scatter that re-quantizes the partial sum at every "
                 f"hop. Elements "
                 f"outside the derived per-element bound: {outside}.")
    return "\n".join(lines)


def _run_bench(ranks: int, size: int, out: str) -> list[dict[str, Any]]:
    job = jobs.Job(ranks=ranks, minbytes=size, maxbytes=size, compression=BENCH_CODECS, json=out)
    cmd = jobs.job_command(job)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]


def table_c(args: argparse.Namespace, tmp: str) -> tuple[str, list[dict[str, Any]]]:
    from pycoll.bench.report import format_size
    from pycoll.bench.timing import memcpy_bandwidth

    records: list[dict[str, Any]] = []
    memcpy = []
    for rnd in range(args.rounds):
        memcpy.append(memcpy_bandwidth(64 << 20, repeats=5)["rw_GBps"])
        for ranks in args.bench_ranks:
            for size in args.bench_sizes:
                for rec in _run_bench(ranks, size, os.path.join(tmp, "bench.jsonl")):
                    rec["round"] = rnd
                    records.append(rec)
    lines = ["| ranks | size | codec | time (us) | algbw eff. (GB/s) | busbw eff. (GB/s) | x none (rounds) "
             "| rel. error | #wrong |", "|" + "---|" * 9]
    for ranks in args.bench_ranks:
        for size in args.bench_sizes:
            rows = [r for r in records if r["world"] == ranks and r["bytes"] == size]
            base = {r["round"]: r["busbw_GBps"] for r in rows if r["codec"] == "none"}
            for codec in BENCH_CODECS:
                mine = [r for r in rows if r["codec"] == codec]
                ratios = [r["busbw_GBps"] / base[r["round"]] for r in mine]
                ratio = f"{statistics.median(ratios):.2f}"
                if codec != "none" and len(ratios) > 1:
                    ratio += " (" + ", ".join(f"{v:.2f}" for v in ratios) + ")"
                errors = [r["rel_error"] for r in mine]
                error = "N/A" if None in errors else f"{max(errors):.2e}"
                t_us = statistics.median(r["time_us"] for r in mine)
                algbw = size / (t_us * 1e-6) / 1e9
                busbw = algbw * 2 * (ranks - 1) / ranks
                lines.append(
                    f"| {ranks} | {format_size(size)} | {codec} | {t_us:.1f} | {algbw:.2f} | {busbw:.2f} "
                    f"| {ratio} | {error} | {sum(r['wrong'] for r in mine)} |"
                )
    lines.append("")
    lines.append(f"pycoll bench, shared memory, median time over {args.rounds} round(s) (each round runs "
                 f"every codec interleaved per size), bandwidths from it; effective = uncompressed bytes / "
                 f"time; x none = median (and per round) of the ratios of effective busbw to the "
                 f"uncompressed one in the same round (> 1: the codec is faster). Single-process memcpy of "
                 f"64 MiB beside it: "
                 f"{statistics.median(memcpy):.1f} GB/s (read + write).")
    return "\n".join(lines), records


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _size_list(text: str) -> list[int]:
    from pycoll.bench.options import parse_size

    return [parse_size(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tables", default="a,b,c,d", help="which tables: a, b, c, d or a comma list (a,b,c,d)")
    ap.add_argument("--worlds", type=_int_list, default=[2, 4, 8], help="world sizes of table a (2,4,8)")
    ap.add_argument("--block-worlds", type=_int_list, default=[4, 8], help="world sizes of table b (4,8)")
    ap.add_argument("--count", type=int, default=1 << 20, help="float32 elements (1M = 1048576)")
    ap.add_argument("--trials", type=int, default=3, help="fresh inputs per case (3)")
    ap.add_argument("--bench-ranks", type=_int_list, default=[2, 4], help="ranks of table c (2,4)")
    ap.add_argument("--bench-sizes", type=_size_list, default=[1 << 20, 16 << 20, 64 << 20],
                    help="sizes of table c (1M,16M,64M)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of table c (3)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw measurements to FILE")
    # rank side
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--parts", default="ab", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    tables = set(args.tables.replace(",", ""))
    raw: dict[str, Any] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="codec_accuracy-") as tmp:
        if tables & {"a", "b", "d"}:
            parts = {w: "" for w in (args.worlds + args.block_worlds)}
            for w in args.worlds if "a" in tables else []:
                parts[w] += "a"
            for w in args.worlds if "d" in tables else []:
                parts[w] += "d"
            for w in args.block_worlds if "b" in tables else []:
                parts[w] += "b"
            runs = {w: _launch_accuracy(w, p, args, tmp) for w, p in sorted(parts.items()) if p}
            raw["accuracy"] = runs
            if "a" in tables:
                print("### (a) Relative error by codec, algorithm and world size\n")
                print(table_a({w: r for w, r in runs.items() if w in args.worlds}), "\n", flush=True)
            if "b" in tables:
                print("### (b) Choosing block sizes (two-shot)\n")
                print(table_b(runs, args.block_worlds), "\n", flush=True)
            if "d" in tables:
                print("### (d) Compressed reduce-scatter: one quantization against a re-quantizing ring\n")
                print(table_d({w: r for w, r in runs.items() if w in args.worlds}), "\n", flush=True)
        if "c" in tables:
            text, records = table_c(args, tmp)
            raw["bench"] = records
            print("### (c) Effective bandwidth, pycoll bench on shared memory\n")
            print(text, "\n", flush=True)
    print(f"_{time.perf_counter() - t0:.0f} s_")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
