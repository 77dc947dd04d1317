"""Derived error bounds of compressed all-reduce: how far a result may land from the exact sum.

One home for the bound that the distributed tests (tests/distributed/test_compression.py) and
``pycoll bench --compression`` check results against.

One encode moves an element by at most:

    int8 / int4     half a step (a whole step with stochastic rounding), step = block absmax / qmax
                    (``codec.step_bound``)
    fp16 / bf16     half an ulp: 2**-11 / 2**-8 of the magnitude (relative unit roundoff), and at least
                    half the subnormal spacing (2**-25 / 2**-134) for magnitudes too small to be normal

and the all-reduce of ``world`` float32 inputs x_r lands within, per element,

    sum_r q(x_r) + q(result)                                  every share encoded once, the final sum once
    + (world - 1) * q(partial) * 1.01       ring and tree     partial sums re-encoded on the way, each no
                                                              larger than sum_r |x_r| (block absmax of it)
    + 4 * world * 2**-24 * (sum_r |x_r| + bound)              float32 rounding of the additions

of the exact sum. For direct (two-shot) the owner's own share is not encoded; counting it keeps the
bound simple and still tight. ``SumBound`` accumulates the input terms one rank at a time (so a caller
need not hold every rank's input at once); ``error_bound`` is the one-call form.

A compressed reduce-scatter (direct: each share encoded once by its sender, summed in float32 by the
chunk's owner and kept there) lands within, per element of the owner's chunk c,

    sum_{s != owner} q(x_s[chunk c])                         every other rank's share encoded once
    + 2 * world * 2**-24 * (sum_s |x_s[chunk c]| + that)      float32 rounding of the world - 1 decodes,
                                                              the additions and avg's division

where each q is taken over the blocks of the chunk (they start at the chunk; its last may be short).
There is no term for the result: the owner does not encode its sum. ``reduce_scatter_bound`` computes
it; for avg the result times the world size is held to it.

With a rotation (``codec.rotation``, csrc/kernels/rotation.h) an encode quantizes y = 2^-ceil(k/2) H D x
over each piece of 2^k elements and the result is rotated back by D 2^-floor(k/2) H, whose entries are
2^-floor(k/2) in magnitude. A rotated-domain error of at most e per element of the piece (e: half a step
of the rotated block's absmax) moves element i by at most 2^-floor(k/2) * 2^k * e = 2^ceil(k/2) * e, and
the butterflies' roundings (k additions each way) by at most about 2k * 2**-24 * A, A the sum of |x| over
the piece. So ``quantization_bound`` is 2^ceil(k/2) * e + (2k + 4) * 2**-24 * (A + 2^k * that), and
the additions' rounding terms above count A (``magnitude``) instead of |x|: sums are taken in the
rotated domain, where an element carries its whole piece.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pycoll.compression.codecs import Codec, rotate

__all__ = [
    "CAST_ROUNDOFF",
    "F32_U",
    "SumBound",
    "block_absmax",
    "error_bound",
    "magnitude",
    "quantization_bound",
    "reduce_scatter_bound",
]

#: Relative unit roundoff (half an ulp) of the cast codecs.
CAST_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
#: Half the spacing of their subnormals: the absolute error floor of tiny magnitudes.
CAST_SUBNORMAL = {"fp16": 2.0**-25, "bf16": 2.0**-134}
#: float32's unit roundoff.
F32_U = 2.0**-24
#: Algorithms whose partial sums are encoded once only (the others re-encode them per hop / level).
_TWO_SHOT = ("direct",)


def block_absmax(x: np.ndarray, block: int) -> np.ndarray:
    """Per element: the largest |value| of its codec block (blocks of ``block`` from the start)."""
    x = np.asarray(x).reshape(-1)
    n = x.size
    if n == 0:
        return np.zeros(0)
    pad = (-n) % block
    a = np.abs(x.astype(np.float64))
    if pad:
        a = np.concatenate([a, np.zeros(pad)])
    return np.repeat(a.reshape(-1, block).max(axis=1), block)[:n]


def _check_codec(codec: Codec) -> None:
    if codec.kind not in CAST_ROUNDOFF and not hasattr(codec, "step_bound"):
        raise TypeError(f"no derived error bound for {codec!r}: it is neither a cast nor a block codec "
                        f"with step_bound()")


def _pieces(n: int, block: int) -> np.ndarray:
    """Per element of a part of n elements: the length 2^k of its rotation piece (csrc/kernels/rotation.h:
    each block of ``block`` elements cut into the binary digits of its length, the largest first)."""
    out = np.empty(n, dtype=np.int64)
    for b0 in range(0, n, block):
        at, m = b0, min(block, n - b0)
        while at < b0 + m:
            length = 1 << ((b0 + m - at).bit_length() - 1)
            out[at:at + length] = length
            at += length
    return out


def _piece_sums(a: np.ndarray, pieces: np.ndarray) -> np.ndarray:
    """Per element: the sum of ``a`` over its piece (``pieces`` from ``_pieces``)."""
    out = np.empty_like(a)
    at = 0
    while at < a.size:
        length = int(pieces[at])
        out[at:at + length] = a[at:at + length].sum()
        at += length
    return out


def magnitude(codec: Codec, x: np.ndarray) -> np.ndarray:
    """Per element: what float32 additions on it are relative to: |x|, and with a rotation the sum of |x|
    over its piece (the additions happen in the rotated domain; module docstring)."""
    a = np.abs(np.asarray(x, dtype=np.float64)).reshape(-1)
    if getattr(codec, "rotation", None) is None:
        return a
    return _piece_sums(a, _pieces(a.size, codec.block_elems))


def quantization_bound(codec: Codec, x: np.ndarray) -> np.ndarray:
    """Per element: the most one encode of ``x`` (float32; one part, its blocks from its start) can move
    each element (float64), the codec's rotation included."""
    _check_codec(codec)
    if codec.kind in CAST_ROUNDOFF:
        size = np.abs(np.asarray(x, dtype=np.float64)).reshape(-1)
        return CAST_ROUNDOFF[codec.kind] * size + CAST_SUBNORMAL[codec.kind]
    step_bound = getattr(codec, "step_bound")  # noqa: B009 (block codecs only; checked above)
    if getattr(codec, "rotation", None) is None:
        return np.asarray(step_bound(block_absmax(x, codec.block_elems)), dtype=np.float64)
    src = np.asarray(x, dtype=np.float32).reshape(-1)
    block = codec.block_elems
    pieces = _pieces(src.size, block)
    k = np.log2(np.maximum(pieces, 1)).astype(np.int64)
    rotated_absmax = block_absmax(rotate(src, [src.size], block), block)
    rotated_step = np.asarray(step_bound(rotated_absmax), dtype=np.float64)
    bound = 2.0 ** ((k + 1) // 2) * rotated_step
    return bound + (2 * k + 4) * F32_U * (magnitude(codec, src) + pieces * bound)


class SumBound:
    """The bound of a compressed all-reduce, built one rank's input at a time.

        sb = SumBound(codec, "direct", count)
        for x in inputs:                  # every rank's float32 input
            sb.add(x)
        ok = np.abs(result - exact) <= sb.bound(result)

    ``algorithm`` is the plan that ran (``"auto"`` with a codec runs direct).
    """

    def __init__(self, codec: Codec, algorithm: str, count: int) -> None:
        _check_codec(codec)
        self.codec = codec
        self.algorithm = "direct" if algorithm == "auto" else algorithm
        self.world = 0
        self.total_abs = np.zeros(int(count))  # sum_r |x_r|
        self.inputs = np.zeros(int(count))  # sum_r q(x_r)

    def add(self, x: np.ndarray) -> None:
        """Count one rank's input (float32, ``count`` elements)."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if x.size != self.total_abs.size:
            raise ValueError(f"expected {self.total_abs.size} elements, got {x.size}")
        self.total_abs += magnitude(self.codec, x)
        self.inputs += quantization_bound(self.codec, x)
        self.world += 1

    def bound(self, result: np.ndarray, algorithm: str | None = None) -> np.ndarray:
        """Per element: the largest |result - exact sum| the codec allows (``result`` is what the
        all-reduce returned, as the sum: for ``op="avg"`` multiply it by the world size first).
        ``algorithm`` overrides the one given at construction (the inputs' terms are the same)."""
        if self.world == 0:
            raise ValueError("SumBound.bound() before any input was added")
        algorithm = self.algorithm if algorithm is None else ("direct" if algorithm == "auto" else algorithm)
        bound = self.inputs + quantization_bound(self.codec, np.asarray(result, dtype=np.float32))
        if algorithm not in _TWO_SHOT:
            if self.codec.kind in CAST_ROUNDOFF:
                partial = CAST_ROUNDOFF[self.codec.kind] * self.total_abs + CAST_SUBNORMAL[self.codec.kind]
            elif getattr(self.codec, "rotation", None) is not None:
                partial = self._rotated_partial()
            else:
                partial = quantization_bound(self.codec, self.total_abs.astype(np.float32))
            bound += (self.world - 1) * 1.01 * partial
        bound += 4 * self.world * F32_U * (self.total_abs + bound)
        return bound

    def _rotated_partial(self) -> np.ndarray:
        """One re-encode of a partial sum with a rotation: a rotated element of a piece of 2^k is at most
        2^-ceil(k/2) times the piece's sum of |partial| <= total_abs (a piece sum already), so the block's
        rotated absmax is at most the largest of these over the block (module docstring)."""
        block = self.codec.block_elems
        pieces = _pieces(self.total_abs.size, block)
        k = np.log2(np.maximum(pieces, 1)).astype(np.int64)
        rotated_absmax = block_absmax(2.0 ** -((k + 1) // 2) * self.total_abs, block)
        step_bound = getattr(self.codec, "step_bound")  # noqa: B009 (a block codec: it has a rotation)
        bound = 2.0 ** ((k + 1) // 2) * np.asarray(step_bound(rotated_absmax), dtype=np.float64)
        return bound + (2 * k + 4) * F32_U * (self.total_abs + pieces * bound)


def error_bound(codec: Codec, algorithm: str, inputs: Iterable[np.ndarray], result: np.ndarray) -> np.ndarray:
    """Per element: how far the compressed all-reduce of ``inputs`` (one float32 array per rank) with
    ``algorithm`` may land from the exact sum, given the ``result`` it returned (see the module doc)."""
    result = np.asarray(result).reshape(-1)
    sb = SumBound(codec, algorithm, result.size)
    for x in inputs:
        sb.add(x)
    return sb.bound(result)


def reduce_scatter_bound(codec: Codec, inputs: Iterable[np.ndarray], owner: int) -> np.ndarray:
    """Per element of ``owner``'s chunk: how far its compressed reduce-scatter of ``inputs`` (every rank's
    float32 input, ``world`` chunks each) may land from the exact sum (see the module doc)."""
    _check_codec(codec)
    xs = [np.asarray(x, dtype=np.float32).reshape(-1) for x in inputs]
    world = len(xs)
    if world == 0 or xs[0].size % world or any(x.size != xs[0].size for x in xs):
        raise ValueError(f"need world inputs of world * m elements each, got sizes {[x.size for x in xs]}")
    m = xs[0].size // world
    chunks = [x[owner * m:(owner + 1) * m] for x in xs]
    bound = np.zeros(m)
    for s, chunk in enumerate(chunks):
        if s != owner:
            bound += quantization_bound(codec, chunk)
    total_abs = np.sum([magnitude(codec, c) for c in chunks], axis=0)
    if getattr(codec, "rotation", None) is not None:  # the owner's own share, rotated and rotated back
        k = np.log2(np.maximum(_pieces(m, codec.block_elems), 1))
        bound += (2 * k + 4) * F32_U * magnitude(codec, chunks[owner])
    return bound + 2 * world * F32_U * (total_abs + bound)
