"""The derived error bounds of compressed all-reduce (pycoll/compression/bounds.py), on one process: the
algorithms' quantization steps are emulated with ``codec.roundtrip``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from pycoll.compression import BF16, FP16, Codec, Int4, Int8
from pycoll.compression.bounds import (
    CAST_ROUNDOFF,
    F32_U,
    SumBound,
    block_absmax,
    error_bound,
    quantization_bound,
)


def _native_available() -> bool:
    try:
        return importlib.util.find_spec("pycoll._C") is not None
    except ImportError:
        return False


needs_native = pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
CODECS = [FP16(), BF16(), Int8(), Int4(), Int4(block=16), Int8(block=32, rounding="stochastic", seed=3)]


def _inputs(world: int, count: int) -> list[np.ndarray]:
    rngs = [np.random.default_rng([9, r, count]) for r in range(world)]
    return [rng.standard_normal(count).astype(np.float32) for rng in rngs]


def test_block_absmax() -> None:
    x = np.array([1, -5, 2, 0, -3, 7, 0.5], dtype=np.float32)
    np.testing.assert_array_equal(block_absmax(x, 3), [5, 5, 5, 7, 7, 7, 0.5])
    assert block_absmax(np.zeros(0, np.float32), 8).size == 0


def test_quantization_bound() -> None:
    x = np.array([1.0, -2.0, 4.0], dtype=np.float32)
    np.testing.assert_allclose(quantization_bound(FP16(), x), 2.0**-11 * np.abs(x) + 2.0**-25, rtol=1e-12)
    # below fp16's normal range the absolute floor (half the subnormal spacing) holds the error
    tiny = np.array([1e-6, -3e-7, 2.9e-8, 7e-5], dtype=np.float32)
    err = np.abs(tiny.astype(np.float16).astype(np.float64) - tiny)
    assert np.all(err <= quantization_bound(FP16(), tiny)) and np.any(err > 2.0**-11 * np.abs(tiny))
    codec = Int8(block=8)
    np.testing.assert_allclose(quantization_bound(codec, x), 4.0 / 127 / 2, rtol=1e-4)  # half a step
    stochastic = Int8(block=8, rounding="stochastic")
    np.testing.assert_allclose(quantization_bound(stochastic, x), 4.0 / 127, rtol=1e-4)  # a whole step


def test_sum_bound_is_error_bound_and_auto_is_direct() -> None:
    xs = _inputs(3, 1000)
    result = np.sum(xs, axis=0)
    for codec in (FP16(), Int4()):
        for algorithm in ("direct", "ring", "tree"):
            sb = SumBound(codec, algorithm, 1000)
            for x in xs:
                sb.add(x)
            np.testing.assert_array_equal(sb.bound(result), error_bound(codec, algorithm, xs, result))
        direct = error_bound(codec, "direct", xs, result)
        np.testing.assert_array_equal(error_bound(codec, "auto", xs, result), direct)
        # ring and tree re-encode partial sums: a larger bound than two-shot's
        assert np.all(error_bound(codec, "ring", xs, result) > direct)


def test_cast_bound_by_hand() -> None:
    xs = _inputs(2, 50)
    result = np.sum(xs, axis=0)
    u = CAST_ROUNDOFF["bf16"]
    total_abs = np.abs(xs[0].astype(np.float64)) + np.abs(xs[1])
    direct = u * total_abs + 2e-38 + u * np.abs(result.astype(np.float64)) + 1e-38
    direct += 8 * F32_U * (total_abs + direct)
    np.testing.assert_allclose(error_bound(BF16(), "direct", xs, result), direct, rtol=1e-12)


def test_rejects_what_it_cannot_bound() -> None:
    class Opaque(Codec):
        name = kind = "user"

    with pytest.raises(TypeError):
        SumBound(Opaque(), "direct", 4)
    sb = SumBound(FP16(), "direct", 4)
    with pytest.raises(ValueError):
        sb.bound(np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        sb.add(np.zeros(5, np.float32))


def _two_shot(codec: Codec, xs: list[np.ndarray]) -> np.ndarray:
    """Every share quantized once on its way to its owner (the owner's own is not), the sum once more."""
    owner = 0
    total = xs[owner].copy()
    for r, x in enumerate(xs):
        if r != owner:
            total += codec.roundtrip(x)
    return codec.roundtrip(total)


def _ring(codec: Codec, xs: list[np.ndarray]) -> np.ndarray:
    """The reduce-scatter re-encodes the partial sum at every hop, then the final value once."""
    partial = xs[0].copy()
    for x in xs[1:]:
        partial = codec.roundtrip(partial) + x
    return codec.roundtrip(partial)


@needs_native
@pytest.mark.parametrize("codec", CODECS, ids=repr)
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_emulated_all_reduce_within_bound(codec: Codec, world: int) -> None:
    count = 3001  # a partial last block
    xs = _inputs(world, count)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for algorithm, emulate in (("direct", _two_shot), ("ring", _ring)):
        result = emulate(codec, xs)
        err = np.abs(result - exact)
        bound = error_bound(codec, algorithm, xs, result)
        assert np.all(err <= bound), (algorithm, float(np.max(err / bound)))
        # and not vacuous: the bound is within a modest factor of the worst error seen
        assert float(np.max(err)) > 0.05 * float(np.max(bound)), algorithm
