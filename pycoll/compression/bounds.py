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
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pycoll.compression.codecs import Codec

__all__ = [
    "CAST_ROUNDOFF",
    "F32_U",
    "SumBound",
    "block_absmax",
    "error_bound",
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


def quantization_bound(codec: Codec, x: np.ndarray) -> np.ndarray:
    """Per element: the most one encode of ``x`` (float32) can move each element (float64)."""
    _check_codec(codec)
    if codec.kind in CAST_ROUNDOFF:
        magnitude = np.abs(np.asarray(x, dtype=np.float64)).reshape(-1)
        return CAST_ROUNDOFF[codec.kind] * magnitude + CAST_SUBNORMAL[codec.kind]
    step_bound = getattr(codec, "step_bound")  # noqa: B009 (block codecs only; checked above)
    return np.asarray(step_bound(block_absmax(x, codec.block_elems)), dtype=np.float64)


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
        self.total_abs += np.abs(x)
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
            else:
                partial = quantization_bound(self.codec, self.total_abs.astype(np.float32))
            bound += (self.world - 1) * 1.01 * partial
        bound += 4 * self.world * F32_U * (self.total_abs + bound)
        return bound


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
    total_abs = np.sum([np.abs(c.astype(np.float64)) for c in chunks], axis=0)
    return bound + 2 * world * F32_U * (total_abs + bound)
