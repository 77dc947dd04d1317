"""Throughput of the native codec kernels on one core, against a memcpy measured beside them.

    python bench/codec_throughput.py                  # 64 MiB of float32, 7 interleaved rounds
    python bench/codec_throughput.py --mib 16 --rounds 11 --codecs int8,int4

Every round times, one after the other, a plain memcpy of the float32 data and then each kernel on the
same data; the table gives each kernel's median GB/s and the median over rounds of its per-round ratio to
the memcpy (these vCPUs change speed every few minutes, so only ratios from the same round compare).
GB/s counts the float32 bytes a kernel consumes or produces (4 bytes per element), not the encoded ones:
"encode" reads n floats, "decode+acc" writes dst = acc + decode(msg) for n floats. "encode+ef" also adds
and updates an error-feedback residual.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pycoll import _C
from pycoll.compression import BF16, FP16, Int4, Int8, get_codec


def _best_of(fn, repeats: int) -> float:
    """Shortest of ``repeats`` timings of fn(), in seconds (the least disturbed one)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="float32 MiB per kernel call (default 64)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3, help="timings per kernel per round (best is kept)")
    ap.add_argument("--codecs", default="int8,int4,fp16,bf16")
    args = ap.parse_args(argv)

    n = args.mib * (1 << 20) // 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    copy_dst = np.empty_like(x)
    acc = rng.standard_normal(n).astype(np.float32)
    dst = np.empty_like(x)
    residual = np.zeros_like(x)
    named = {"int8": Int8(), "int4": Int4(), "fp16": FP16(), "bf16": BF16(),
             "int8-stochastic": Int8(rounding="stochastic"), "int4-stochastic": Int4(rounding="stochastic")}
    codecs = [named[c] if c in named else get_codec(c) for c in args.codecs.split(",")]

    kernels: dict[str, object] = {}
    for c in codecs:
        nat = c.native()
        enc = np.empty(c.encoded_bytes(n), dtype=np.uint8)
        nat.encode(x, enc)
        kernels[f"{c.name} encode"] = lambda nat=nat, enc=enc: nat.encode(x, enc)
        kernels[f"{c.name} encode+ef"] = lambda nat=nat, enc=enc: nat.encode(x, enc, residual=residual)
        kernels[f"{c.name} decode"] = lambda nat=nat, enc=enc: nat.decode(enc, dst)
        kernels[f"{c.name} decode+acc"] = lambda nat=nat, enc=enc: nat.decode(enc, dst, acc=acc)

    copy_gbs: list[float] = []
    gbs: dict[str, list[float]] = {k: [] for k in kernels}
    ratios: dict[str, list[float]] = {k: [] for k in kernels}
    nbytes = 4 * n
    for _ in range(args.rounds):
        t_copy = _best_of(lambda: np.copyto(copy_dst, x), args.repeats)
        copy_gbs.append(nbytes / t_copy / 1e9)
        for name, fn in kernels.items():
            t = _best_of(fn, args.repeats)
            gbs[name].append(nbytes / t / 1e9)
            ratios[name].append(t_copy / t)

    print(f"# codec kernels on one core, {args.mib} MiB of float32, {args.rounds} rounds, "
          f"loops: {_C.codec_isa()}")
    print(f"# memcpy (numpy copyto) median {statistics.median(copy_gbs):.1f} GB/s "
          f"(min {min(copy_gbs):.1f}, max {max(copy_gbs):.1f})")
    print(f"| {'kernel':34s} | {'GB/s':>6s} | {'x memcpy':>8s} |")
    print(f"|{'-' * 36}|{'-' * 8}|{'-' * 10}|")
    for name in kernels:
        gb, ratio = statistics.median(gbs[name]), statistics.median(ratios[name])
        print(f"| {name:34s} | {gb:6.1f} | {ratio:8.2f} |")


if __name__ == "__main__":
    main()
