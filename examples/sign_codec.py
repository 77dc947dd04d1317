"""A user codec written with numba: scaled sign, about 1.1 bits per element (29x smaller than float32).

Each block of BLOCK elements is sent as one float32 scale, the mean |x| of the block, followed by one sign
bit per element (8 per byte, element i of the block in bit i % 8 of byte i // 8; 1 means x >= 0); it
decodes to +scale or -scale. The mean (not the max) keeps the block's L1 norm: scaled sign is the
compressor of signSGD / EF-SignSGD. It is very lossy on its own, so use it with error feedback, which
carries what each step lost into the next one (the residual is kept by the executor, not the codec).

    pycoll run -n 2 examples/sign_codec.py

    from sign_codec import SignCodec
    ef = pycoll.compression.ErrorFeedback()
    pycoll.allreduce(grad, "avg", compression=SignCodec(), residual=ef)

``numpy_encode`` / ``numpy_decode`` are the same format in plain numpy: a readable spec of the wire format
and the oracle the tests compare the numba kernels against, bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from pycoll.compression.user import UserCodec
from pycoll.errors import InvalidUsageError

BLOCK = 256
SCALE_BYTES = 4


def block_bytes(block: int) -> int:
    return SCALE_BYTES + block // 8


def tail_bytes(r: int) -> int:
    """A last, partial block of r elements: its scale and ceil(r / 8) bytes of signs."""
    return SCALE_BYTES + (r + 7) // 8 if r else 0


@functools.cache
def _kernels(block: int):
    """The kernels for one block size. Cached: the same function objects give the same compiled code, so
    numba compiles them once per process however many codecs are made."""
    bb = block_bytes(block)

    def encode(src, out, index, key):
        # The scale goes through a 4-byte array viewed as bytes: the output need not be 4-byte aligned.
        scale = np.empty(1, np.float32)
        scale_bytes = scale.view(np.uint8)
        n = src.size
        for b in range((n + block - 1) // block):
            lo = b * block
            m = min(block, n - lo)
            total = 0.0  # float64, summed in element order: the numpy model can repeat it bit for bit
            for i in range(lo, lo + m):
                total += abs(src[i])
            scale[0] = total / m  # NaN/Inf in the block make the scale NaN/Inf: visible, not hidden
            pos = b * bb
            for j in range(SCALE_BYTES):  # (a loop: slice assignment takes numba seconds to compile)
                out[pos + j] = scale_bytes[j]
            pos += SCALE_BYTES
            for j in range(0, m, 8):
                bits = 0
                for k in range(min(8, m - j)):
                    if src[lo + j + k] >= 0:
                        bits |= 1 << k
                out[pos + j // 8] = bits
        # index and key are unused: this codec rounds deterministically.

    def decode(data, out, accumulate):
        scale = np.empty(1, np.float32)
        scale_bytes = scale.view(np.uint8)
        n = out.size
        for b in range((n + block - 1) // block):
            lo = b * block
            m = min(block, n - lo)
            pos = b * bb
            for j in range(SCALE_BYTES):
                scale_bytes[j] = data[pos + j]
            s = scale[0]
            pos += SCALE_BYTES
            if accumulate:  # the fused decode-and-add of a receive-reduce step (float32 adds)
                for i in range(m):
                    out[lo + i] += s if (data[pos + i // 8] >> (i % 8)) & 1 else -s
            else:
                for i in range(m):
                    out[lo + i] = s if (data[pos + i // 8] >> (i % 8)) & 1 else -s

    return encode, decode


class SignCodec(UserCodec):
    """Scaled sign: per block of ``block`` elements (a multiple of 8), a float32 mean |x| and 1 bit each."""

    def __init__(self, block: int = BLOCK) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not 8 <= block <= 8 * 1024 or block % 8:
            raise InvalidUsageError(f"block must be a multiple of 8 in [8, 8192], got {block!r}")
        encode, decode = _kernels(block)
        # version= names the format in wire_id, so ranks with different code for it are told apart too.
        super().__init__(f"sign(block={block})", block, block_bytes(block), tail_bytes, encode, decode,
                         version=f"sign-v1/{block}")
        self.block = block

    def __reduce__(self):
        return (SignCodec, (self.block,))


def make_sign_codec(block: int = BLOCK) -> SignCodec:
    return SignCodec(block)


# ---- the format in numpy (spec and test oracle) -----------------------------------------------------------
def numpy_encode(x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    full = x.size // block * block
    parts = [_encode_blocks(x[:full].reshape(-1, block))]
    if full < x.size:
        parts.append(_encode_blocks(x[full:].reshape(1, -1)))
    return np.concatenate(parts)


def _encode_blocks(blocks: np.ndarray) -> np.ndarray:
    # np.add.accumulate adds in order, as the kernel does (np.sum would add pairwise)
    total = np.add.accumulate(np.abs(blocks).astype(np.float64), axis=1)[:, -1:]
    scale = (total / blocks.shape[1]).astype("<f4")
    signs = np.packbits(blocks >= 0, axis=1, bitorder="little")
    return np.concatenate([scale.view(np.uint8), signs], axis=1).reshape(-1)


def numpy_decode(data: np.ndarray, n: int, block: int = BLOCK) -> np.ndarray:
    data = np.asarray(data, dtype=np.uint8)
    full = n // block
    bb = block_bytes(block)
    out = [_decode_blocks(data[:full * bb].reshape(full, bb), block)]
    if full * block < n:
        out.append(_decode_blocks(data[full * bb:].reshape(1, -1), n - full * block))
    return np.concatenate(out, axis=None)


def _decode_blocks(rows: np.ndarray, m: int) -> np.ndarray:
    scale = np.ascontiguousarray(rows[:, :SCALE_BYTES]).view("<f4")
    bits = np.unpackbits(rows[:, SCALE_BYTES:], axis=1, bitorder="little")[:, :m]
    return np.where(bits == 1, scale, -scale).astype(np.float32)


def _demo() -> None:
    import pycoll
    from pycoll.compression import ErrorFeedback

    comm = pycoll.init()
    rank, world = comm.rank, comm.world_size
    codec = SignCodec()
    n, steps = 1 << 16, 20
    ef = ErrorFeedback()
    run_ef = np.zeros(n)
    run_plain = np.zeros(n)
    run_exact = np.zeros(n)
    for step in range(steps):
        # every rank can rebuild every rank's input, so each knows the exact sum
        inputs = [np.random.default_rng([step, r]).standard_normal(n).astype(np.float32)
                  for r in range(world)]
        run_exact += np.sum([v.astype(np.float64) for v in inputs], axis=0)
        x = inputs[rank].copy()
        pycoll.allreduce(x, compression=codec, residual=ef)
        run_ef += x
        y = inputs[rank].copy()
        pycoll.allreduce(y, compression=codec)
        run_plain += y
    if rank == 0:
        scale = np.abs(run_exact).mean()
        with_ef = np.abs(run_ef - run_exact).mean() / scale
        without = np.abs(run_plain - run_exact).mean() / scale
        print(f"{codec!r}: {codec.encoded_bytes(n)} bytes for {4 * n} "
              f"({4 * n / codec.encoded_bytes(n):.1f}x smaller)", flush=True)
        print(f"after {steps} all-reduces of {n} floats on {world} ranks, mean |running-sum error| / "
              f"mean |running sum|: {with_ef:.3f} with error feedback, {without:.3f} without", flush=True)
    pycoll.finalize()


if __name__ == "__main__":
    _demo()
