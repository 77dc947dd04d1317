"""The built-in codecs in numpy, bit for bit: the tests' oracle for the native loops.

Every function here repeats csrc/kernels/codec.h (the element code) and csrc/cpu/codec_loops.h (the loops
around it) in float32 numpy, one operation at a time and in the same order, so that its results are the
same *bits* as the native ones: never simplify an expression here (``(x - d) * s`` is not ``x*s - d*s``
in float32), and keep every intermediate float32. Readability wins over speed; it is used on test-sized
arrays only.

    encode(codec, x, residual=None, residual_scale=1.0, index=0, key=0) -> (encoded bytes, decoded values)
    decode(codec, data, n, acc=None, residual=None, divisor=0)           -> float32 values
    mix32, random_bits, uniform01, rounding_key                          -> the stochastic-rounding hash

``encode`` updates ``residual`` in place as the native encode does (``x = src + residual`` is encoded, then
``residual = residual_scale * (x - decoded)``, 0 where the decoded value is not finite); ``decode`` follows
DecodeArgs: ``dst = [acc (+ residual) +] decoded``, then ``/ divisor`` when ``divisor > 0``, and the
residual (allowed only with ``acc``) is set to 0.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np

from pycoll.compression.codecs import SCALE_BYTES
from pycoll.errors import InvalidUsageError

F32 = np.float32
U32 = np.uint32
FLT_MAX = F32(np.finfo(np.float32).max)
ABS_MASK = U32(0x7FFFFFFF)
EXP_MASK = U32(0x7F800000)  # abs bits >= this: Inf or NaN
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF

IntOrArray = Union[int, np.ndarray]


# ---- stochastic rounding: the counter-based hash -------------------------------------------------------

def mix32(x: IntOrArray) -> IntOrArray:
    """codec::mix32 on a Python int (returns an int) or on a uint32 array (returns a uint32 array)."""
    if isinstance(x, (int, np.integer)):
        v = int(x) & MASK32
        v ^= v >> 16
        v = (v * 0x7FEB352D) & MASK32
        v ^= v >> 15
        v = (v * 0x846CA68B) & MASK32
        v ^= v >> 16
        return v
    a = np.asarray(x, dtype=U32).copy()
    with np.errstate(over="ignore"):
        a ^= a >> U32(16)
        a *= U32(0x7FEB352D)
        a ^= a >> U32(15)
        a *= U32(0x846CA68B)
        a ^= a >> U32(16)
    return a


def random_bits(key: int, index: IntOrArray) -> IntOrArray:
    """codec::random_bits(key, index): 32 random bits of element ``index`` (an int or a uint64 array)."""
    if isinstance(index, (int, np.integer)):
        i = int(index)
        inner = mix32((i & MASK32) ^ (int(key) & MASK32))
        assert isinstance(inner, int)
        return mix32((inner + (i >> 32)) & MASK32)
    idx = np.asarray(index, dtype=np.uint64)
    lo = (idx & np.uint64(MASK32)).astype(U32)
    hi = (idx >> np.uint64(32)).astype(U32)
    with np.errstate(over="ignore"):
        return mix32(np.asarray(mix32(lo ^ U32(int(key) & MASK32))) + hi)


def uniform01(bits: np.ndarray) -> np.ndarray:
    """codec::uniform01: the top 24 bits as a float32 in [0, 1) (exact)."""
    return (np.asarray(bits, dtype=U32) >> U32(8)).astype(F32) * F32(5.9604644775390625e-08)


def rounding_key(seed: int, rank: int, seq: int) -> int:
    """codec::rounding_key: the key of one rank's encodes in one collective (equals ``_C.rounding_key``)."""
    seed, rank, seq = int(seed), int(rank) & MASK32, int(seq)
    k = mix32((seed & MASK32) ^ 0x9E3779B9)
    k = mix32(int(k) ^ ((seed >> 32) & MASK32))
    k = mix32((int(k) + rank * 0x85EBCA6B) & MASK32)
    return int(mix32(int(k) ^ (seq & MASK32) ^ ((((seq >> 32) & MASK32) * 0xC2B2AE35) & MASK32)))


# ---- fp16 / bf16 casts on raw bits (kernels/half.h) --------------------------------------------------------

def float_to_half_bits(x: np.ndarray) -> np.ndarray:
    """float_to_half: round to nearest even (numpy's cast), NaN made quiet keeping the top payload bits."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    bits = x.view(U32)
    ax = bits & ABS_MASK
    nan = ax > EXP_MASK
    if nan.any():  # half.h: sign | 0x7e00 | payload >> 13 (numpy's own cast may keep a signaling NaN)
        sign = ((bits >> U32(16)) & U32(0x8000)).astype(np.uint16)
        quiet = (U32(0x7E00) | ((ax >> U32(13)) & U32(0x3FF))).astype(np.uint16)
        h = np.where(nan, sign | quiet, h)
    return np.asarray(h, dtype=np.uint16)


def half_bits_to_float(h: np.ndarray) -> np.ndarray:
    """half_to_float: exact; a NaN keeps its payload (sign | 0x7f800000 | mant << 13)."""
    h = np.asarray(h, dtype=np.uint16)
    out = h.view(np.float16).astype(F32)
    nan = (h & np.uint16(0x7C00)) == np.uint16(0x7C00)
    nan &= (h & np.uint16(0x3FF)) != 0
    if nan.any():
        h32 = h.astype(U32)
        bits = ((h32 & U32(0x8000)) << U32(16)) | EXP_MASK | ((h32 & U32(0x3FF)) << U32(13))
        out = np.where(nan, bits.view(F32), out)
    return np.asarray(out, dtype=F32)


def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float_to_bf16: round to nearest even on the bits; NaN -> (bits >> 16) | 0x40 (quiet)."""
    bits = np.asarray(x, dtype=F32).view(U32)
    with np.errstate(over="ignore"):
        rounded = (bits + U32(0x7FFF) + ((bits >> U32(16)) & U32(1))) >> U32(16)
    nan = (bits & ABS_MASK) > EXP_MASK
    return np.where(nan, (bits >> U32(16)) | U32(0x40), rounded).astype(np.uint16)


def bf16_bits_to_float(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(U32) << U32(16)).view(F32)


# ---- block-quantization element code -----------------------------------------------------------------------

def abs_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(U32) & ABS_MASK


def quant_step(absmax: np.ndarray, qmax: int) -> np.ndarray:
    return absmax / F32(qmax)


def quant_inv_step(absmax: np.ndarray, qmax: int) -> np.ndarray:
    """qmax / absmax; 0 unless absmax > 0; clamped to FLT_MAX where the reciprocal overflows."""
    inv = F32(qmax) / absmax
    inv = np.where(inv < FLT_MAX, inv, FLT_MAX)
    return np.where(absmax > F32(0), inv, F32(0)).astype(F32)


def clamp_code(v: np.ndarray, qmax: int) -> np.ndarray:
    q = F32(qmax)
    return np.where(v > q, q, np.where(v < -q, -q, v))


def dequantize(q: np.ndarray, absmax: np.ndarray, step: np.ndarray, qmax: int) -> np.ndarray:
    """q * step, except +-qmax, which decode to exactly +-absmax."""
    scaled = q.astype(F32) * step
    return np.where(q == qmax, absmax, np.where(q == -qmax, -absmax, scaled)).astype(F32)


def residual_of(x: np.ndarray, decoded: np.ndarray, scale: np.float32) -> np.ndarray:
    """(x - decoded) * scale, and 0 where the decoded value is NaN or Inf."""
    return np.where(abs_bits(decoded) < EXP_MASK, (x - decoded) * scale, F32(0)).astype(F32)


def _payload_bytes(kind: str, m: int) -> int:
    return (m + 1) // 2 if kind == "int4" else m


def _encode_blocks(codec: Any, x: np.ndarray, index: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """Encodes k blocks of m elements each (x is [k, m]); returns (bytes [k, 4 + payload], decoded [k, m])."""
    k, m = x.shape
    qmax = int(codec.qmax)
    amax_bits = abs_bits(x).max(axis=1, initial=0)  # the integer max of |x| bits: NaN > Inf > finite
    absmax = amax_bits.view(F32)[:, None]
    finite = (amax_bits < EXP_MASK)[:, None]
    inv = quant_inv_step(absmax, qmax)
    scaled = x * inv
    if codec.rounding == "nearest":
        codes = np.rint(scaled)
    else:
        with np.errstate(over="ignore"):  # uint64 element indices wrap as in C
            elems = np.uint64(index & MASK64) + np.arange(k * m, dtype=np.uint64).reshape(k, m)
        codes = np.floor(scaled + uniform01(np.asarray(random_bits(key, elems))))
    q = np.where(finite, clamp_code(codes, qmax), F32(0)).astype(np.int8)

    if codec.kind == "int8":
        payload = q.view(np.uint8)
    else:
        nib = q.astype(np.uint8) & np.uint8(0xF)
        if m % 2:
            nib = np.concatenate([nib, np.zeros((k, 1), dtype=np.uint8)], axis=1)
        payload = nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4))
    scale = np.ascontiguousarray(absmax.reshape(k)).view(np.uint8).reshape(k, SCALE_BYTES)
    out = np.concatenate([scale, payload], axis=1)

    decoded = dequantize(q.astype(np.int32), absmax, quant_step(absmax, qmax), qmax)
    return out, decoded


def _decode_blocks(codec: Any, data: np.ndarray, m: int) -> np.ndarray:
    """Decodes k blocks of m elements (data is [k, 4 + payload]) into [k, m] float32."""
    k = data.shape[0]
    qmax = int(codec.qmax)
    absmax = np.ascontiguousarray(data[:, :SCALE_BYTES]).view(F32).reshape(k, 1)
    payload = data[:, SCALE_BYTES:]
    if codec.kind == "int8":
        q = payload.view(np.int8).astype(np.int32)
    else:
        lo = (payload << np.uint8(4)).view(np.int8).astype(np.int32) >> 4  # sign-extended low nibble
        hi = payload.view(np.int8).astype(np.int32) >> 4                     # sign-extended high nibble
        q = np.stack([lo, hi], axis=2).reshape(k, -1)[:, :m]
    return dequantize(q, absmax, quant_step(absmax, qmax), qmax)


# ---- the codec interface -----------------------------------------------------------------------------------

def _kind(codec: Any) -> str:
    kind = getattr(codec, "kind", None)
    if kind not in ("fp16", "bf16", "int8", "int4"):
        raise InvalidUsageError(f"the reference implements the built-in codecs only, not {codec!r}")
    return str(kind)


def encoded_bytes(codec: Any, n: int) -> int:
    kind = _kind(codec)
    if kind in ("fp16", "bf16"):
        return 2 * n
    full, rest = divmod(n, int(codec.block))
    block_bytes = SCALE_BYTES + _payload_bytes(kind, int(codec.block))
    return full * block_bytes + (SCALE_BYTES + _payload_bytes(kind, rest) if rest else 0)


def encode(codec: Any, x: np.ndarray, residual: np.ndarray | None = None, residual_scale: float = 1.0,
           index: int = 0, key: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(encoded bytes, decoded values) of float32 ``x``; ``residual`` (float32, like x) is added to x
    first and then overwritten with what the encoding lost, times ``residual_scale``."""
    kind = _kind(codec)
    src = np.asarray(x, dtype=F32).reshape(-1)
    n = src.size
    with np.errstate(all="ignore"):
        if residual is not None:
            if residual.dtype != F32 or residual.size != n:
                raise InvalidUsageError("residual must be float32 with as many elements as x")
            src = src + residual.reshape(-1)
        if kind == "fp16":
            wire16 = float_to_half_bits(src)
            out, decoded = wire16.view(np.uint8), half_bits_to_float(wire16)
        elif kind == "bf16":
            wire16 = float_to_bf16_bits(src)
            out, decoded = wire16.view(np.uint8), bf16_bits_to_float(wire16)
        else:
            block = int(codec.block)
            full = n // block
            pieces, values = [], []
            if full:
                b, d = _encode_blocks(codec, src[:full * block].reshape(full, block), index, key)
                pieces.append(b.reshape(-1))
                values.append(d.reshape(-1))
            if n % block:
                tail = src[full * block:].reshape(1, n % block)
                b, d = _encode_blocks(codec, tail, index + full * block, key)
                pieces.append(b.reshape(-1))
                values.append(d.reshape(-1))
            out = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
            decoded = np.concatenate(values) if values else np.zeros(0, F32)
        if residual is not None:
            residual.reshape(-1)[:] = residual_of(src, decoded, F32(residual_scale))
    return np.ascontiguousarray(out, dtype=np.uint8), np.ascontiguousarray(decoded, dtype=F32)


def decode(codec: Any, data: np.ndarray, n: int, acc: np.ndarray | None = None,
           residual: np.ndarray | None = None, divisor: int = 0) -> np.ndarray:
    """The ``n`` values encoded in ``data``: ``[acc (+ residual) +] decoded``, then ``/ divisor`` when
    ``divisor > 0``; ``residual`` (only with ``acc``) is added and then set to 0."""
    kind = _kind(codec)
    raw = np.asarray(data, dtype=np.uint8).reshape(-1)
    need = encoded_bytes(codec, n)
    if raw.size < need:
        raise InvalidUsageError(f"{raw.size} bytes given, {n} elements need {need}")
    if residual is not None and acc is None:
        raise InvalidUsageError("residual needs acc")
    raw = raw[:need]
    with np.errstate(all="ignore"):
        if kind == "fp16":
            d = half_bits_to_float(raw.view(np.uint16))
        elif kind == "bf16":
            d = bf16_bits_to_float(raw.view(np.uint16))
        else:
            block = int(codec.block)
            full, rest = divmod(n, block)
            block_bytes = SCALE_BYTES + _payload_bytes(kind, block)
            parts = []
            if full:
                parts.append(_decode_blocks(codec, raw[:full * block_bytes].reshape(full, block_bytes),
                                            block).reshape(-1))
            if rest:
                parts.append(_decode_blocks(codec, raw[full * block_bytes:].reshape(1, -1), rest).reshape(-1))
            d = np.concatenate(parts) if parts else np.zeros(0, F32)
        v = d
        if acc is not None:
            a = np.asarray(acc, dtype=F32).reshape(-1)
            if residual is not None:
                a = a + residual.reshape(-1)
            v = a + v
        if divisor > 0:
            v = v / F32(divisor)
        if residual is not None:
            residual.reshape(-1)[:] = 0
    return np.array(v, dtype=F32, copy=True).reshape(-1)


# ---- the randomized Hadamard rotation (csrc/kernels/rotation.h) ------------------------------------------

ROTATION_KEY = 0x2545F491


def _piece_signs(length: int) -> np.ndarray:
    """D of a piece: True where position j is negated (mix32(j ^ key) odd)."""
    return (mix32(np.arange(length, dtype=U32) ^ U32(ROTATION_KEY)) & U32(1)).astype(bool)


def _rotate_pieces(x: np.ndarray, inverse: bool) -> np.ndarray:
    """rotate_piece on each row of x ([r, 2^k] float32): the butterflies stage by stage, then the scale."""
    r, length = x.shape
    k = length.bit_length() - 1
    flips = _piece_signs(length)
    v = np.where(flips, -x, x) if not inverse else x.copy()
    h = 1
    while h < length:
        pairs = v.reshape(r, length // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        v = np.stack([a + b, a - b], axis=2).reshape(r, length)
        h *= 2
    v = v * F32(2.0 ** -(k // 2 if inverse else (k + 1) // 2))
    return np.where(flips, -v, v) if inverse else v


def _rotate_blocks(x: np.ndarray, inverse: bool) -> np.ndarray:
    """rotate_block on each row of x ([r, m]): its pieces, the binary digits of m from the largest."""
    out, at, m = np.empty_like(x), 0, x.shape[1]
    while at < m:
        length = 1 << ((m - at).bit_length() - 1)
        out[:, at:at + length] = _rotate_pieces(x[:, at:at + length], inverse)
        at += length
    return out


def rotate(x: np.ndarray, parts: Any, block: int, inverse: bool = False) -> np.ndarray:
    """A rotated copy of float32 ``x``: ``parts`` (element counts, summing to x.size) one after another,
    each cut in blocks of ``block`` from its start; forward, or back with ``inverse``."""
    src = np.asarray(x, dtype=F32).reshape(-1)
    if sum(parts) != src.size:
        raise InvalidUsageError(f"parts {list(parts)} do not add up to {src.size} elements")
    out = np.empty_like(src)
    at = 0
    with np.errstate(all="ignore"):
        for n in parts:
            full, rest = divmod(int(n), block)
            if full:
                rows = src[at:at + full * block].reshape(full, block)
                out[at:at + full * block] = _rotate_blocks(rows, inverse).reshape(-1)
            if rest:
                tail = src[at + full * block:at + n].reshape(1, rest)
                out[at + full * block:at + n] = _rotate_blocks(tail, inverse).reshape(-1)
            at += int(n)
    return out


def roundtrip(codec: Any, x: np.ndarray, parts: Any = None) -> np.ndarray:
    """What one quantization does to float32 ``x`` (round to nearest): decode(encode(x)) per message, and
    with the codec's rotation on ``parts`` (default: x is one part), rotated first and rotated back."""
    src = np.asarray(x, dtype=F32).reshape(-1)
    if getattr(codec, "rotation", None) is None:
        return encode(codec, src)[1]
    parts = [src.size] if parts is None else list(parts)
    block = int(codec.block)
    rotated = rotate(src, parts, block)
    at, decoded = 0, np.empty_like(src)
    for n in parts:  # each part is a message of its own, encoded in blocks from its start
        decoded[at:at + n] = encode(codec, rotated[at:at + n])[1]
        at += n
    return rotate(decoded, parts, block, inverse=True)
