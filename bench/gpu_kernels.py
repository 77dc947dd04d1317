"""Bandwidth of pycoll's CUDA kernels on one GPU, against a device-to-device copy measured in the same run.

    python bench/gpu_kernels.py                 # 16 MiB, 256 MiB and 1 GiB of float32
    python bench/gpu_kernels.py --quick         # 16 MiB and 256 MiB, fewer calls
    python bench/gpu_kernels.py --sizes 64M,2G --rounds 7 --iters 20

For each size (of float32 data, n = size / 4 elements) it times: torch's ``dst.copy_(src)`` (the
baseline), reduce float32, bfloat16 and float16 sum (n elements each), fp16 encode, int8 and int4 encode
(nearest rounding, pycoll's default blocks) and int8 / int4 decode-accumulate in place
(dst = dst + decode(msg)).
GB/s = (bytes read + bytes written) / time, 1 GB = 1e9 bytes: copy 2 x 4n, reduce 3 x itemsize x n,
encode 4n + encoded bytes, decode-accumulate encoded bytes + 2 x 4n. Each call is timed by its own pair
of CUDA events, with the stream kept busy (torch.cuda._sleep) while the calls are enqueued, so host
overhead is not counted. Rounds interleave the kernels (copy first in each); the table gives the median
over rounds of each kernel's median GB/s, and the median over rounds of its ratio to that round's copy.
(At 16 MiB the data fits in the 50-60 MB L2 of an H100 / H200, so every number there is L2 bandwidth.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Callable

from pycoll import _C
from pycoll.arrays import DTYPE_CODES, OP_CODES
from pycoll.compression.codecs import DEFAULT_INT4_BLOCK, DEFAULT_INT8_BLOCK, KIND_CODES, ROUNDING_CODES

SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in SIZES:
        return int(float(text[:-1]) * SIZES[text[-1]])
    return int(text)


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def time_calls(torch, fn: Callable[[], None], iters: int) -> float:
    """Median seconds of one call of fn, over ``iters`` calls each between its own CUDA events."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    torch.cuda._sleep(50_000_000)  # the GPU waits on this while the host enqueues every call below
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3


def kernels(torch, n: int, int8_block: int, int4_block: int) -> list[tuple[str, int, Callable[[], None]]]:
    """(name, bytes moved per call, call) for n float32 elements; the copy comes first."""
    cuda = _C.cuda
    stream = int(torch.cuda.current_stream().cuda_stream)
    f32 = DTYPE_CODES["float32"]
    bf16 = DTYPE_CODES["bfloat16"]
    f16 = DTYPE_CODES["float16"]
    total = OP_CODES["sum"]
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.randn(n, device="cuda", dtype=torch.float32)
    out = torch.empty(n, device="cuda", dtype=torch.float32)
    xb, yb = x.to(torch.bfloat16), y.to(torch.bfloat16)
    outb = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    xh, yh = x.to(torch.float16), y.to(torch.float16)
    outh = torch.empty(n, device="cuda", dtype=torch.float16)
    rn = ROUNDING_CODES["nearest"]
    int8 = (KIND_CODES["int8"], int8_block, rn)
    int4 = (KIND_CODES["int4"], int4_block, rn)
    e8 = _C.builtin_codec(*int8).encoded_bytes(n)
    e4 = _C.builtin_codec(*int4).encoded_bytes(n)
    msg8 = torch.empty(e8, device="cuda", dtype=torch.uint8)
    msg4 = torch.empty(e4, device="cuda", dtype=torch.uint8)
    cuda.encode(*int8, x.data_ptr(), msg8.data_ptr(), n, stream=stream)
    cuda.encode(*int4, x.data_ptr(), msg4.data_ptr(), n, stream=stream)
    acc = y.clone()  # decode-accumulate in place: acc = acc + decode(msg), growing by a few ulps per call

    def reduce_f32() -> None:
        cuda.reduce(f32, total, out.data_ptr(), 0, x.data_ptr(), y.data_ptr(), n, 0, stream)

    def reduce_bf16() -> None:
        cuda.reduce(bf16, total, outb.data_ptr(), 0, xb.data_ptr(), yb.data_ptr(), n, 0, stream)

    def reduce_f16() -> None:
        cuda.reduce(f16, total, outh.data_ptr(), 0, xh.data_ptr(), yh.data_ptr(), n, 0, stream)

    def encode16() -> None:
        cuda.encode(KIND_CODES["fp16"], 0, rn, x.data_ptr(), outh.data_ptr(), n, stream=stream)

    def encode8() -> None:
        cuda.encode(*int8, x.data_ptr(), msg8.data_ptr(), n, stream=stream)

    def encode4() -> None:
        cuda.encode(*int4, x.data_ptr(), msg4.data_ptr(), n, stream=stream)

    def decode8() -> None:
        cuda.decode(*int8, msg8.data_ptr(), acc.data_ptr(), n, acc=acc.data_ptr(), stream=stream)

    def decode4() -> None:
        cuda.decode(*int4, msg4.data_ptr(), acc.data_ptr(), n, acc=acc.data_ptr(), stream=stream)

    return [
        ("copy (torch .copy_)", 8 * n, lambda: out.copy_(x)),
        ("reduce float32 sum", 12 * n, reduce_f32),
        ("reduce bfloat16 sum", 6 * n, reduce_bf16),
        ("reduce float16 sum", 6 * n, reduce_f16),
        ("fp16 encode", 6 * n, encode16),
        (f"int8 encode (block {int8_block})", 4 * n + e8, encode8),
        (f"int4 encode (block {int4_block})", 4 * n + e4, encode4),
        (f"int8 decode-accumulate (block {int8_block})", e8 + 8 * n, decode8),
        (f"int4 decode-accumulate (block {int4_block})", e4 + 8 * n, decode4),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 MiB and 256 MiB, 3 rounds of 5 calls")
    ap.add_argument("--sizes", help="float32 sizes, e.g. 16M,256M,1G (default: 16M,256M,1G)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5)")
    ap.add_argument("--iters", type=int, help="timed calls per kernel per round (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per kernel first (default 3)")
    ap.add_argument("--int8-block", type=int, default=DEFAULT_INT8_BLOCK)
    ap.add_argument("--int4-block", type=int, default=DEFAULT_INT4_BLOCK)
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in (args.sizes or ("16M,256M" if args.quick else "16M,256M,1G")).split(",")]
    rounds = args.rounds or (3 if args.quick else 5)
    iters = args.iters or (5 if args.quick else 10)

    try:
        import torch
    except ImportError:
        print("gpu_kernels: torch is not installed (device memory comes from torch CUDA tensors)",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_kernels: torch.cuda is not available: no GPU to measure", file=sys.stderr)
        return 2
    if not _C.cuda.built() or _C.cuda.device_count() == 0:
        why = "pycoll was built without CUDA" if not _C.cuda.built() else _C.cuda.device_error()
        print(f"gpu_kernels: pycoll's CUDA kernels cannot run: {why}", file=sys.stderr)
        return 2

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    rows = []
    for size in sizes:
        n = size // 4
        ks = kernels(torch, n, args.int8_block, args.int4_block)
        for _, _, fn in ks:
            for _ in range(args.warmup):
                fn()
        torch.cuda.synchronize()
        gbps: dict[str, list[float]] = {name: [] for name, _, _ in ks}
        ratio: dict[str, list[float]] = {name: [] for name, _, _ in ks}
        for _ in range(rounds):
            this_round = {name: nbytes / time_calls(torch, fn, iters) / 1e9 for name, nbytes, fn in ks}
            copy = this_round[ks[0][0]]
            for name, value in this_round.items():
                gbps[name].append(value)
                ratio[name].append(value / copy)
        for name, _, _ in ks:
            rows.append((human(size), name, statistics.median(gbps[name]),
                         100 * statistics.median(ratio[name])))
        del ks
        torch.cuda.empty_cache()

    print(f"pycoll CUDA kernels on {props.name} ({props.multi_processor_count} SMs), "
          f"median of {rounds} rounds x {iters} calls; GB/s = (bytes read + written) / time")
    print(f"{'size':>8}  {'kernel':<36} {'GB/s':>9} {'% of copy':>10}")
    for size_text, name, value, pct in rows:
        print(f"{size_text:>8}  {name:<36} {value:9.1f} {pct:9.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
