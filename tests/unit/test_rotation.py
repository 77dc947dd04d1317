"""The randomized Hadamard rotation (csrc/kernels/rotation.h): the CPU loop against the numpy reference
bit for bit, what the transform is (closed form on unit vectors, its inverse, its norm), the codec
option that turns it on, and the derived bound of a rotated quantization."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pycoll.compression import Int4, Int8, get_codec
from pycoll.compression import reference as codec_ref
from pycoll.compression.bounds import quantization_bound
from pycoll.compression.codecs import rotate
from pycoll.errors import InvalidUsageError

F32 = np.float32
CASES = [  # (block, parts)
    (32, [1000]),
    (64, [64, 0, 129]),
    (24, [300, 7]),
    (8, [5, 8, 9]),
    (256, [1000, 256]),
    (96, [4099]),
]


def data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-20, 20, n)).astype(F32)


@pytest.mark.parametrize("block,parts", CASES)
def test_the_cpu_loop_is_the_reference_bit_for_bit(block: int, parts: list[int]) -> None:
    x = data(sum(parts), block)
    for inverse in (False, True):
        got = rotate(x, parts, block, inverse)
        want = codec_ref.rotate(x, parts, block, inverse)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"inverse={inverse}"


@pytest.mark.parametrize("block,parts", CASES)
def test_rotating_back_gives_the_input_to_rounding(block: int, parts: list[int]) -> None:
    """back(forward(x)) = x up to k additions each way, k = log2 of the piece (12 at most here)."""
    x = data(sum(parts), block + 1)
    back = rotate(rotate(x, parts, block), parts, block, inverse=True).astype(np.float64)
    scale = np.zeros_like(back)
    at = 0
    for n in parts:  # sum of |x| over each block: what the additions' rounding is relative to
        for b0 in range(at, at + n, block):
            b1 = min(b0 + block, at + n)
            scale[b0:b1] = np.abs(x[b0:b1].astype(np.float64)).sum()
        at += n
    assert (np.abs(back - x) <= 2 * 9 * 2.0**-24 * scale).all()


@pytest.mark.parametrize("k", [0, 1, 3, 5, 6, 8])
def test_a_piece_is_a_signed_hadamard_matrix(k: int) -> None:
    """Rotating the unit vector e_j of a piece of 2^k elements gives column j of 2^-ceil(k/2) H D: every
    entry +-2^-ceil(k/2), the columns orthogonal, and D's sign on position j fixed across calls."""
    length = 1 << k
    eye = np.eye(length, dtype=F32)
    columns = np.stack([rotate(eye[j], [length], length) for j in range(length)], axis=1)
    assert (np.abs(columns) == F32(2.0 ** -((k + 1) // 2))).all()
    gram = columns.astype(np.float64).T @ columns
    assert np.allclose(gram, np.eye(length) * length * 2.0 ** -(2 * ((k + 1) // 2)))
    ones = rotate(np.ones(length, dtype=F32), [length], length)
    assert np.array_equal(ones, rotate(np.ones(length, dtype=F32), [length], length)), "signs must be fixed"


def test_parts_and_blocks_are_independent() -> None:
    """Each part's blocks start at the part: rotating parts one by one is rotating them together."""
    x = data(1000, 3)
    whole = rotate(x, [300, 700], 64)
    apart = np.concatenate([rotate(x[:300], [300], 64), rotate(x[300:], [700], 64)])
    assert np.array_equal(whole, apart)
    with pytest.raises(InvalidUsageError, match="do not add up to 1000"):
        rotate(x, [300, 600], 64)


# ---- the codec option ------------------------------------------------------------------------------------
def test_the_codec_option_names_itself_and_changes_the_wire_id() -> None:
    plain, rotated = Int4(), Int4(rotation="hadamard")
    assert repr(rotated) == "int4(block=32, rotation='hadamard')"
    assert rotated.wire_id != plain.wire_id and rotated != plain
    assert rotated.wire_id == Int4(rotation="hadamard").wire_id and rotated.block_bytes == plain.block_bytes
    assert pickle.loads(pickle.dumps(rotated)) == rotated
    assert get_codec("int4").rotation is None
    with pytest.raises(InvalidUsageError, match="rotation must be None or 'hadamard'"):
        Int8(rotation="fourier")
    with pytest.raises(InvalidUsageError, match="blocks of at most 256 elements, got 512"):
        Int8(block=512, rotation="hadamard")


@pytest.mark.parametrize("codec", [Int4(rotation="hadamard"), Int8(rotation="hadamard"),
                                   Int4(block=24, rotation="hadamard"),
                                   Int8(block=128, rounding="stochastic", seed=5, rotation="hadamard")],
                         ids=repr)
def test_a_rotated_quantization_stays_within_its_derived_bound(codec) -> None:
    rng = np.random.default_rng(codec.block)
    for n in (1, 7, codec.block - 1, codec.block, codec.block + 1, 1000, 4099):
        x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6)).astype(F32)
        x[::17] *= 50  # outliers, what the rotation spreads
        got = codec.roundtrip(x)
        if codec.rounding == "nearest":
            assert np.array_equal(got, codec_ref.roundtrip(codec, x))
        err = np.abs(got.astype(np.float64) - x)
        assert (err <= quantization_bound(codec, x)).all(), f"n={n}"


def test_the_rotation_shrinks_int4_error_on_blocks_with_outliers() -> None:
    """One large value per block sets the absmax; rotated, it is spread over the block: int4's error on
    the other values falls by more than half."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal(32 * 512).astype(F32)
    x[::32] *= 40
    rms = {}
    for codec in (Int4(), Int4(rotation="hadamard")):
        rms[codec.rotation] = float(np.sqrt(np.mean((codec.roundtrip(x) - x) ** 2)))
    assert rms["hadamard"] < 0.5 * rms[None], rms
