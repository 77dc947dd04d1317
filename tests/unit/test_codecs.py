"""The built-in codecs: native loops vs the numpy reference, bit for bit, and the codecs' promises.

Every comparison is bitwise (uint32 views of float32, raw bytes of encodings), on fresh random data of
awkward sizes and scales, and native output buffers are poisoned first, so a loop that skips writing an
element, writes past the end or rounds one value differently fails. Properties checked on top: layouts
and sizes, constant / zero / NaN / Inf blocks, fragment independence, error bounds of nearest and
stochastic rounding, unbiasedness of stochastic rounding, reproducibility from the key, error feedback.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np
import pytest

import pycoll
from pycoll import _C
from pycoll.compression import BF16, FP16, Int4, Int8
from pycoll.compression import reference as ref
from pycoll.compression.codecs import Codec

F32 = np.float32
POISON_BYTE = 0xAB
GUARD = 16  # poisoned bytes / floats after every native output, which must stay untouched

BLOCKS = (8, 32, 64, 128, 256, 4096)
NEAREST = [Int8(b) for b in BLOCKS] + [Int4(b) for b in BLOCKS]
STOCHASTIC = [Int8(b, rounding="stochastic", seed=3) for b in (8, 128, 4096)] + [
    Int4(b, rounding="stochastic", seed=5) for b in (8, 64, 256)]
CODECS = [FP16(), BF16()] + NEAREST + STOCHASTIC
DISTRIBUTIONS = ("gaussian", "tiny", "huge", "mixed", "denormal", "ties")
LARGE = 100_003


def ids(codec: Codec) -> str:
    return codec.name


def block_of(codec: Codec) -> int:
    return int(getattr(codec, "block", 1))


def sizes(codec: Codec) -> list[int]:
    b = block_of(codec)
    small = {0, 1, 7, 255, 257, 3 * 256 + 5} if b == 1 else {0, 1, 7, b - 1, b + 1, 3 * b + 5}
    return sorted(small) + [LARGE]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == F32:
        a, b = a.view(np.uint32), np.asarray(b, dtype=F32).view(np.uint32)
    return a.shape == b.shape and np.array_equal(a, b)


def assert_same_bits(native: np.ndarray, reference: np.ndarray, what: str) -> None:
    if same_bits(native, reference):
        return
    native, reference = np.asarray(native), np.asarray(reference)
    if native.shape != reference.shape:
        raise AssertionError(f"{what}: native shape {native.shape} != reference {reference.shape}")
    view = np.uint32 if native.dtype == F32 else native.dtype
    bad = np.flatnonzero(native.view(view) != reference.view(view))
    i = int(bad[0])
    raise AssertionError(f"{what}: {bad.size} of {native.size} differ; first at {i}: native {native[i]!r} "
                         f"vs reference {reference[i]!r}")


# ---- data -----------------------------------------------------------------------------------------------

def make_data(dist: str, n: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """Fresh float32 data of one kind; ``block`` sets where per-block magnitudes change."""
    g = rng.standard_normal(n)
    if dist == "gaussian":
        x = g
    elif dist == "tiny":
        x = g * 1e-30
    elif dist == "huge":
        x = g * 1e30
    elif dist == "mixed":  # every block (every 8 elements for the casts) with its own magnitude
        per = max(block, 8)
        scale = 10.0 ** rng.uniform(-35, 35, size=-(-n // per) if n else 0)
        scale[rng.random(scale.size) < 0.1] = 0.0  # some all-zero blocks
        x = g * np.repeat(scale, per)[:n]
    elif dist == "denormal":  # float32 subnormals, and normals just above FLT_MIN
        x = g * 1e-39
        bits = rng.integers(1, 1 << 12, size=n, dtype=np.uint32)
        small = rng.random(n) < 0.3
        x = np.where(small, bits.view(F32) * np.where(g < 0, -1, 1), x)
    elif dist == "ties":  # values exactly halfway between two codes / two fp16 or bf16 numbers
        if block == 1:
            bits = (rng.integers(0x38800000, 0x47000000, size=n, dtype=np.uint32) & ~np.uint32(0x1FFF))
            half_tie = bits | np.uint32(0x1000)
            bf_tie = (bits & ~np.uint32(0xFFFF)) | np.uint32(0x8000)
            x = np.where(rng.random(n) < 0.5, half_tie, bf_tie).view(F32) * np.where(g < 0, -1, 1)
        else:
            qmax = 127 if block % 2 == 0 and rng.random() < 0.5 else 7
            x = rng.integers(-2 * qmax, 2 * qmax + 1, size=n) / 2.0
            x[::block] = qmax  # absmax = qmax in every block: step 1, codes land on exact halves
    else:
        raise ValueError(dist)
    out = np.asarray(x, dtype=F32)
    if n > 3:
        out[rng.integers(0, n, size=2)] = F32(-0.0)
    return out


# ---- native calls with poisoned buffers --------------------------------------------------------------------

def native_encode(codec: Codec, x: np.ndarray, residual: np.ndarray | None = None,
                  residual_scale: float = 1.0, index: int = 0, key: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n = x.size
    nbytes = codec.encoded_bytes(n)
    out = np.full(nbytes + GUARD, POISON_BYTE, dtype=np.uint8)
    decoded = np.full(n + GUARD, np.nan, dtype=F32)
    codec.native().encode(x, out[:nbytes], residual=residual, residual_scale=residual_scale,
                          decoded=decoded[:n], index=index, key=key)
    assert (out[nbytes:] == POISON_BYTE).all(), "encode wrote past the encoding"
    assert np.isnan(decoded[n:]).all(), "encode wrote past the decoded values"
    return out[:nbytes], decoded[:n]


def native_decode(codec: Codec, data: np.ndarray, n: int, acc: np.ndarray | None = None,
                  residual: np.ndarray | None = None, divisor: int = 0) -> np.ndarray:
    dst = np.full(n + GUARD, np.nan, dtype=F32)
    codec.native().decode(data, dst[:n], acc=acc, residual=residual, divisor=divisor)
    assert np.isnan(dst[n:]).all(), "decode wrote past its destination"
    return dst[:n]


def key_for(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**32))


# ---- native == reference, bit for bit ----------------------------------------------------------------------

@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_encode_matches_reference(codec: Codec, dist: str) -> None:
    rng = np.random.default_rng([block_of(codec), len(dist), hash(codec.name) % 1000])
    for n in sizes(codec):
        x = make_data(dist, n, block_of(codec), rng)
        index = int(rng.integers(0, 3)) * block_of(codec) if n < LARGE else 0
        key = key_for(rng)
        where = f"{codec.name} {dist} n={n}"

        data, decoded = native_encode(codec, x, index=index, key=key)
        want, want_decoded = ref.encode(codec, x, index=index, key=key)
        assert data.size == codec.encoded_bytes(n) == want.size
        assert_same_bits(data, want, f"{where}: encoded bytes")
        assert_same_bits(decoded, want_decoded, f"{where}: decoded")
        bare = np.full(data.size + GUARD, POISON_BYTE, dtype=np.uint8)  # no decoded values asked for
        codec.native().encode(x, bare[:data.size], index=index, key=key)
        assert_same_bits(bare[:data.size], want, f"{where}: encoded bytes without decoded=")
        assert (bare[data.size:] == POISON_BYTE).all()

        # with a residual (error feedback), scaled as an average's finalize would scale it
        residual = (make_data(dist, n, block_of(codec), rng) * F32(0.01)).astype(F32)
        scale = float(rng.choice([1.0, 4.0, 3.0]))
        r_native, r_ref = residual.copy(), residual.copy()
        data, decoded = native_encode(codec, x, r_native, scale, index=index, key=key)
        want, want_decoded = ref.encode(codec, x, r_ref, scale, index=index, key=key)
        assert_same_bits(data, want, f"{where}: encoded bytes with residual")
        assert_same_bits(decoded, want_decoded, f"{where}: decoded with residual")
        assert_same_bits(r_native, r_ref, f"{where}: updated residual")


@pytest.mark.parametrize("dist", ("gaussian", "mixed", "huge"))
@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_decode_matches_reference(codec: Codec, dist: str) -> None:
    rng = np.random.default_rng([7, block_of(codec), len(dist)])
    for n in sizes(codec):
        x = make_data(dist, n, block_of(codec), rng)
        data, decoded = ref.encode(codec, x, index=0, key=key_for(rng))
        where = f"{codec.name} {dist} n={n}"
        assert_same_bits(native_decode(codec, data, n), ref.decode(codec, data, n), f"{where}: decode")
        assert_same_bits(ref.decode(codec, data, n), decoded, f"{where}: decode == encode's decoded")

        acc = make_data("gaussian", n, block_of(codec), rng) * F32(float(np.abs(x).max(initial=1.0)))
        acc = acc.astype(F32)
        for divisor in (0, 3):
            assert_same_bits(native_decode(codec, data, n, acc=acc, divisor=divisor),
                             ref.decode(codec, data, n, acc=acc, divisor=divisor),
                             f"{where}: decode-accumulate divisor={divisor}")
            residual = make_data("gaussian", n, block_of(codec), rng)
            r_native, r_ref = residual.copy(), residual.copy()
            assert_same_bits(native_decode(codec, data, n, acc=acc, residual=r_native, divisor=divisor),
                             ref.decode(codec, data, n, acc=acc, residual=r_ref, divisor=divisor),
                             f"{where}: decode-accumulate with residual, divisor={divisor}")
            assert not r_native.view(np.uint32).any() and not r_ref.view(np.uint32).any(), \
                "a consumed residual must be +0"
        # the accumulator may be the destination itself
        inplace = acc.copy()
        codec.native().decode(data, inplace, acc=inplace)
        assert_same_bits(inplace, ref.decode(codec, data, n, acc=acc), f"{where}: decode-accumulate in place")


@pytest.mark.parametrize("codec", [FP16(), Int8(32), Int4(64), Int8(64, rounding="stochastic")], ids=ids)
def test_decoded_may_alias_src(codec: Codec) -> None:
    rng = np.random.default_rng(11)
    x = make_data("mixed", 1000, block_of(codec), rng)
    residual = make_data("gaussian", 1000, 1, rng) * F32(1e-3)
    r_ref = residual.copy()
    want, want_decoded = ref.encode(codec, x, r_ref, 2.0, index=64, key=9)
    y = x.copy()
    out = np.full(codec.encoded_bytes(y.size), POISON_BYTE, np.uint8)
    codec.native().encode(y, out, residual=residual, residual_scale=2.0, decoded=y, index=64, key=9)
    assert_same_bits(out, want, "bytes")
    assert_same_bits(y, want_decoded, "decoded written over src")
    assert_same_bits(residual, r_ref, "residual")


def test_stochastic_index_above_32_bits() -> None:
    """random_bits mixes the high half of the element index in too: exercised beyond 2**32."""
    codec = Int8(32, rounding="stochastic")
    x = np.random.default_rng(2).standard_normal(3 * 32 + 5).astype(F32)
    for index in (2**32 - 64, 2**32 - 40, 2**32, 2**40 + 32, 2**63, 2**64 - 50):  # some blocks cross 2**32
        data, _ = native_encode(codec, x, index=index, key=123)
        assert_same_bits(data, ref.encode(codec, x, index=index, key=123)[0], f"index {index}")
    low, _ = native_encode(codec, x, index=0, key=123)
    high, _ = native_encode(codec, x, index=2**32, key=123)
    assert not np.array_equal(low, high), "the index's high 32 bits must change the random bits"


def test_rounding_key_matches_native() -> None:
    rng = np.random.default_rng(3)
    cases = [(0, 0, 0), (0, 0, 1), (1, 2, 3), (2**64 - 1, 2**32 - 1, 2**64 - 1), (2**32, 7, 2**32 + 1)]
    cases += [(int(rng.integers(0, 2**63)) * 2 + 1, int(rng.integers(0, 2**32)), int(rng.integers(0, 2**63)))
              for _ in range(200)]
    for seed, rank, seq in cases:
        assert ref.rounding_key(seed, rank, seq) == _C.rounding_key(seed, rank, seq), (seed, rank, seq)
    keys = {ref.rounding_key(1, r, s) for r in range(8) for s in range(1, 9)}
    assert len(keys) == 64, "rank and collective number must both change the key"


def test_hash_on_arrays_equals_hash_on_ints() -> None:
    idx = np.array([0, 1, 2**32 - 1, 2**32, 2**40 + 7, 2**64 - 1], dtype=np.uint64)
    bits = ref.random_bits(99, idx)
    assert isinstance(bits, np.ndarray)
    assert [int(b) for b in bits] == [ref.random_bits(99, int(i)) for i in idx]
    assert [int(v) for v in np.asarray(ref.mix32(idx.astype(np.uint32)))] == [
        ref.mix32(int(i) & 0xFFFFFFFF) for i in idx]


# ---- layout ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_encoded_bytes_layout(codec: Codec) -> None:
    b = block_of(codec)
    for n in sorted({0, 1, 2, 3, 7, 8, 9, b - 1, b, b + 1, 2 * b + 3, 3 * b + 5, 10 * b}):
        if n < 0:
            continue
        if codec.kind in ("fp16", "bf16"):
            expected = 2 * n
        else:
            full, rest = divmod(n, b)
            per_block = 4 + (b if codec.kind == "int8" else b // 2)
            tail = 4 + (rest if codec.kind == "int8" else (rest + 1) // 2) if rest else 0
            expected = full * per_block + tail
        assert codec.encoded_bytes(n) == expected == int(codec.native().encoded_bytes(n)), n
        assert ref.encoded_bytes(codec, n) == expected
    per_element = {"fp16": 2.0, "bf16": 2.0, "int8": 1 + 4 / b, "int4": 0.5 + 4 / b}[codec.kind]
    assert codec.bytes_per_element == pytest.approx(per_element)
    assert (codec.block_elems, codec.block_bytes) == (int(codec.native().block_elems),
                                                        int(codec.native().block_bytes))


def test_wire_format_by_hand() -> None:
    """int8: absmax float32 then one code per byte; int4: absmax then element 2i low nibble, 2i+1 high,
    a short odd block padded with a zero nibble; fp16/bf16: little-endian 16-bit values."""
    x4 = np.array([7, -7, 1, 2, 3, -1, 0, 6, -3, 5, 4], dtype=F32)  # a block of 8, then a tail of 3
    data, decoded = native_encode(Int4(8), x4)
    # block 0: absmax 7, step 1, codes = x. Tail: absmax 5, codes -3 * 7/5 -> -4 (0xC), 5 -> 7, 4 * 7/5 -> 6,
    # and a zero pad nibble
    assert data.tobytes() == (np.float32(7).tobytes() + bytes([0x97, 0x21, 0xF3, 0x60])
                              + np.float32(5).tobytes() + bytes([0x7C, 0x06]))
    step = F32(5) / F32(7)
    assert decoded.tolist() == [*x4[:8].tolist(), F32(-4) * step, 5.0, F32(6) * step]

    x8 = np.array([-127, 0, 1, 127, 5], dtype=F32)
    data, _ = native_encode(Int8(8), x8)
    assert data.tobytes() == np.float32(127).tobytes() + bytes([0x81, 0, 1, 0x7F, 5])

    x16 = np.array([1.0, -2.0, 65504.0, 1e-8], dtype=F32)
    data, _ = native_encode(FP16(), x16)
    assert data.tobytes() == x16.astype("<f2").tobytes()
    data, _ = native_encode(BF16(), x16)
    assert data.view("<u2").tolist() == [0x3F80, 0xC000, 0x4780, 0x322C]


# ---- special values ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [Int8(8), Int8(128), Int4(8), Int4(64), Int8(32, rounding="stochastic"),
                                   Int4(16, rounding="stochastic")], ids=ids)
def test_constant_blocks_decode_exactly(codec: Codec) -> None:
    b = block_of(codec)
    # (below ~3.7e-37 the reciprocal step is clamped and constants are not exact: see the next test)
    values = [1.0, -1.0, 3.7, -3.7, 1e-20, -1e-20, 1e30, -1e30, 3e38, -3e38, 1e-36, 65504.0, 0.1]
    x = np.repeat(np.array(values, dtype=F32), b)
    x = np.concatenate([x, np.full(b // 2 + 1, F32(-2.5))])  # and a constant short tail
    data, decoded = native_encode(codec, x, key=77)
    if codec.rounding == "nearest":
        assert_same_bits(decoded, x, "constant blocks")
    else:
        # floor(x * (qmax / x) + u) is qmax unless x * (qmax / x) rounds below qmax and u is tiny
        hits = decoded == x
        assert hits.mean() > 0.999
    assert_same_bits(native_decode(codec, data, x.size), decoded, "decode")


@pytest.mark.parametrize("codec", [Int8(8), Int4(16), Int8(64, rounding="stochastic")], ids=ids)
def test_tiny_blocks_have_error_below_absmax(codec: Codec) -> None:
    """Where qmax / absmax overflows float32 the reciprocal is clamped to FLT_MAX: the error stays below
    absmax (so below ~3.7e-37) and nothing turns into Inf or NaN."""
    b = block_of(codec)
    x = np.repeat(np.array([1e-40, -1e-40, 1e-38, 2e-37, -3e-37, 1.4e-45], dtype=F32), b)
    x[::3] *= F32(0.5)
    data, decoded = native_encode(codec, x, key=3)
    assert np.isfinite(decoded).all()
    assert (np.abs(decoded.astype(np.float64) - x) <= block_absmax(codec, x)).all()
    assert_same_bits(data, ref.encode(codec, x, key=3)[0], "bytes")


@pytest.mark.parametrize("codec", NEAREST[:3] + NEAREST[6:9] + STOCHASTIC[:2], ids=ids)
def test_zero_blocks_decode_to_positive_zero(codec: Codec) -> None:
    b = block_of(codec)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(5 * b + 3).astype(F32)
    x[b:2 * b] = 0.0
    x[3 * b:4 * b] = -0.0
    x[5 * b:] = -0.0  # tail
    residual = np.zeros_like(x)
    data, decoded = native_encode(codec, x, residual, key=1)
    for lo, hi in ((b, 2 * b), (3 * b, 4 * b), (5 * b, x.size)):
        assert not decoded[lo:hi].view(np.uint32).any(), "a zero block must decode to +0"
        assert not residual[lo:hi].view(np.uint32).any()
        at, end = ref.encoded_bytes(codec, lo), ref.encoded_bytes(codec, hi)
        assert data[at:end].max() == 0, "a zero block encodes to zero bytes"


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("codec", [Int8(8), Int8(256), Int4(8), Int4(64), Int8(32, rounding="stochastic")],
                         ids=ids)
def test_nonfinite_block_decodes_to_nan_and_spares_others(codec: Codec, poison: float) -> None:
    b = block_of(codec)
    rng = np.random.default_rng(6)
    n = 4 * b + 3
    for bad_block in (0, 2, 4):  # first, middle, the short tail
        x = rng.standard_normal(n).astype(F32)
        lo, hi = bad_block * b, min((bad_block + 1) * b, n)
        x[rng.integers(lo, hi)] = poison
        residual = (rng.standard_normal(n) * 1e-3).astype(F32)
        r_ref = residual.copy()
        clean = np.delete(np.arange(n), np.arange(lo, hi))
        data, decoded = native_encode(codec, x, residual, key=8)
        assert np.isnan(decoded[lo:hi]).all(), "every element of a poisoned block decodes to NaN"
        assert np.isfinite(decoded[clean]).all(), "other blocks are unaffected"
        assert not residual[lo:hi].view(np.uint32).any(), "the poisoned block's residual becomes +0"
        assert np.isfinite(residual).all()
        want, want_decoded = ref.encode(codec, x, r_ref, key=8)
        assert_same_bits(data, want, "bytes")
        assert_same_bits(decoded, want_decoded, "decoded")
        assert_same_bits(residual, r_ref, "residual")
        assert_same_bits(native_decode(codec, data, n), decoded, "decode")
        # the other blocks encode exactly as they do on their own
        plain, _ = native_encode(codec, x, key=8)
        for lo_ok, hi_ok in ((0, lo), (hi, n)):
            alone, _ = native_encode(codec, x[lo_ok:hi_ok], index=lo_ok, key=8)
            at = ref.encoded_bytes(codec, lo_ok)
            assert np.array_equal(plain[at:at + alone.size], alone)


@pytest.mark.parametrize("codec", [FP16(), BF16()], ids=ids)
def test_casts_special_values(codec: Codec) -> None:
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e38, -3e38, 65504, 65520, 65519.99,
                  5.96e-8, 2.98e-8, 2.99e-8, 1e-7], dtype=F32)
    signaling = np.array([0x7F800001, 0xFF800001, 0x7FA00000, 0x7F801000], dtype=np.uint32).view(F32)
    x = np.concatenate([x, signaling])
    data, decoded = native_encode(codec, x)
    want, want_decoded = ref.encode(codec, x)
    assert_same_bits(data, want, "bytes")
    assert_same_bits(decoded, want_decoded, "decoded")
    residual = np.linspace(-1, 1, x.size).astype(F32)
    r_ref = residual.copy()
    data, decoded = native_encode(codec, x, residual, 3.0)
    want, want_decoded = ref.encode(codec, x, r_ref, 3.0)
    assert_same_bits(data, want, "bytes with residual")
    assert_same_bits(decoded, want_decoded, "decoded with residual")
    assert_same_bits(residual, r_ref, "residual")
    assert np.isnan(decoded[[0, 1]]).all() and np.isnan(decoded[-4:]).all()
    assert not residual[np.isnan(decoded) | np.isinf(decoded)].any(), "no residual from non-finite values"
    # decoding arbitrary 16-bit patterns: every one of them, quiet NaN payloads included
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    native = native_decode(codec, every.view(np.uint8), 2**16)
    want = ref.decode(codec, every.view(np.uint8), 2**16)
    signaling = np.zeros(2**16, dtype=bool)
    if codec.kind == "fp16":
        # Signaling half NaNs (never produced by an encoder) are the one known difference: half.h's
        # half_to_float keeps them as they are, F16C's vcvtph2ps (the AVX2 loop, 8 at a time) makes them
        # quiet, so the native result depends on the element's position. Both are NaN.
        signaling = ((every & 0x7C00) == 0x7C00) & ((every & 0x3FF) != 0) & ((every & 0x200) == 0)
        assert np.isnan(native[signaling]).all() and np.isnan(want[signaling]).all()
    assert_same_bits(native[~signaling], want[~signaling], "all 16-bit patterns")


@pytest.mark.parametrize("codec", [Int8(8), Int4(8)], ids=ids)
def test_decode_arbitrary_bytes(codec: Codec) -> None:
    """Bytes no encoder produces (codes -128 / -8, negative or NaN scales) still decode identically."""
    rng = np.random.default_rng(9)
    n = 8 * 200 + 5
    data = rng.integers(0, 256, size=codec.encoded_bytes(n), dtype=np.uint8)
    assert_same_bits(native_decode(codec, data, n), ref.decode(codec, data, n), "random bytes")


# ---- fragments ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [FP16(), BF16(), Int8(8), Int8(128), Int4(64),
                                   Int8(32, rounding="stochastic"), Int4(8, rounding="stochastic")], ids=ids)
def test_fragments_encode_like_the_whole(codec: Codec) -> None:
    """Encoding in pieces cut at block boundaries (each with its element index) is encoding at once."""
    b = block_of(codec)
    rng = np.random.default_rng(10)
    n = 37 * b + 5
    x = make_data("mixed", n, b, rng)
    residual = make_data("gaussian", n, 1, rng) * F32(1e-2)
    r_whole, r_pieces = residual.copy(), residual.copy()
    whole, whole_decoded = native_encode(codec, x, r_whole, 2.0, index=0, key=42)
    cuts = sorted({0, n, *(int(c) * b for c in rng.integers(1, 37, size=6))})
    pieces, decoded_pieces = [], []
    for lo, hi in itertools.pairwise(cuts):
        d, dd = native_encode(codec, x[lo:hi], r_pieces[lo:hi], 2.0, index=lo, key=42)
        pieces.append(d)
        decoded_pieces.append(dd)
        assert_same_bits(native_decode(codec, d, hi - lo), whole_decoded[lo:hi], "a piece decodes on its own")
    assert_same_bits(np.concatenate(pieces), whole, "pieces' bytes")
    assert_same_bits(np.concatenate(decoded_pieces), whole_decoded, "pieces' decoded values")
    assert_same_bits(r_pieces, r_whole, "pieces' residuals")


# ---- error bounds and rounding -----------------------------------------------------------------------------

def block_absmax(codec: Codec, x: np.ndarray) -> np.ndarray:
    """Per element, the absmax of its block (float64)."""
    b = block_of(codec)
    pad = np.zeros(-(-x.size // b) * b)
    pad[:x.size] = np.abs(x.astype(np.float64))
    return np.repeat(pad.reshape(-1, b).max(axis=1), b)[:x.size]


@pytest.mark.parametrize("dist", ("gaussian", "mixed", "tiny", "denormal"))
@pytest.mark.parametrize("codec", NEAREST + STOCHASTIC, ids=ids)
def test_error_within_step_bound(codec: Codec, dist: str) -> None:
    """Nearest: |error| <= half a step; stochastic: < one step (``step_bound`` adds float32 slack)."""
    rng = np.random.default_rng([12, block_of(codec), len(dist)])
    x = make_data(dist, 20 * block_of(codec) + 3, block_of(codec), rng)
    _, decoded = native_encode(codec, x, key=key_for(rng))
    err = np.abs(decoded.astype(np.float64) - x)
    bound = codec.step_bound(block_absmax(codec, x))  # type: ignore[attr-defined]
    assert (err <= bound).all(), f"max error / bound {np.max(err / bound)}"


@pytest.mark.parametrize("codec", [FP16(), BF16()], ids=ids)
def test_cast_error_is_half_an_ulp(codec: Codec) -> None:
    rng = np.random.default_rng(13)
    x = (rng.standard_normal(10_000) * 100).astype(F32)
    _, decoded = native_encode(codec, x)
    mantissa = 10 if codec.kind == "fp16" else 7
    ulp = 2.0 ** (np.floor(np.log2(np.abs(x.astype(np.float64)))) - mantissa)
    ulp = np.maximum(ulp, 2.0**-24 if codec.kind == "fp16" else 0)
    assert (np.abs(decoded.astype(np.float64) - x) <= ulp / 2).all()


@pytest.mark.parametrize("codec", [Int8(64, rounding="stochastic"), Int4(32, rounding="stochastic")], ids=ids)
def test_stochastic_rounding_is_reproducible_and_unbiased(codec: Codec) -> None:
    rng = np.random.default_rng(14)
    n = 16 * block_of(codec)
    x = rng.standard_normal(n).astype(F32)
    a, _ = native_encode(codec, x, key=1234)
    b, _ = native_encode(codec, x, key=1234)
    c, _ = native_encode(codec, x, key=1235)
    assert np.array_equal(a, b), "same key, same bits"
    assert not np.array_equal(a, c), "a different key must change the rounding"
    assert not np.array_equal(a, native_encode(codec, x, index=block_of(codec), key=1234)[0])

    keys = 400
    total = np.zeros(n)
    for k in range(keys):
        total += native_encode(codec, x, key=ref.rounding_key(7, 0, k + 1))[1]
    mean = total / keys
    step = block_absmax(codec, x) / codec.qmax  # type: ignore[attr-defined]
    # one decode is within a step of x with variance <= step^2 / 4, so the mean of `keys` independent ones
    # has standard deviation <= step / (2 sqrt(keys)); allow 6 of them, per element
    tolerance = 6 * step / (2 * math.sqrt(keys)) + 1e-6 * step
    assert (np.abs(mean - x) <= tolerance).all(), f"worst bias {np.max(np.abs(mean - x) / step)} steps"
    # and overall no bias: the mean error over all elements is far below a step
    assert abs(np.mean((mean - x) / step)) < 6 / (2 * math.sqrt(keys * n))


# ---- invalid use -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: Int8(block=12), lambda: Int8(block=4), lambda: Int8(block=0), lambda: Int4(block=8192),
    lambda: Int4(block=4104), lambda: Int8(block=True), lambda: Int8(block=16.0),  # type: ignore[arg-type]
    lambda: Int8(rounding="up"), lambda: Int4(rounding="Nearest"), lambda: Int8(seed=-1),
    lambda: Int8(seed=2**64), lambda: Int4(seed=True), lambda: Int4(seed=1.5),  # type: ignore[arg-type]
    lambda: _C.builtin_codec(3, 12, 0), lambda: _C.builtin_codec(4, 0, 0),
    lambda: _C.builtin_codec(4, 8192, 0),
    lambda: _C.builtin_codec(3, 16, 7), lambda: _C.builtin_codec(9, 16, 0),
    lambda: pycoll.compression.get_codec("int7"),
])
def test_invalid_codecs_raise(make: Callable[[], object]) -> None:
    with pytest.raises(pycoll.InvalidUsageError):
        make()


def test_invalid_calls_raise() -> None:
    codec = Int8(8)
    x = np.ones(20, dtype=F32)
    with pytest.raises(pycoll.InvalidUsageError):
        codec.native().encode(x, np.zeros(codec.encoded_bytes(20) - 1, np.uint8))
    with pytest.raises(pycoll.InvalidUsageError):
        codec.native().decode(np.zeros(codec.encoded_bytes(20) - 1, np.uint8), np.zeros(20, F32))
    with pytest.raises(pycoll.InvalidUsageError):
        codec.native().decode(np.zeros(codec.encoded_bytes(20), np.uint8), np.zeros(20, F32),
                              residual=np.zeros(20, F32))
    with pytest.raises(pycoll.InvalidUsageError):
        ref.decode(codec, np.zeros(codec.encoded_bytes(20), np.uint8), 20, residual=np.zeros(20, F32))
    with pytest.raises(pycoll.InvalidUsageError):
        ref.encode(object(), x)
