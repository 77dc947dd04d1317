"""User codecs (pycoll.compression.user): the numba path into the native codec ABI.

The scaled-sign codec of examples/sign_codec.py is checked bit for bit against its numpy model through the
native encode/decode (the functions the executor calls): layout, fragments, accumulate, residuals. Then the
ways of defining a codec (Python functions, njit functions, cfuncs) and the definitions that must fail.
"""

from __future__ import annotations

import ctypes
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="user codecs are compiled with numba (pip install numba)")

from numba import types  # noqa: E402

import pycoll  # noqa: E402
from pycoll.compression import Int8  # noqa: E402
from pycoll.compression.user import UserCodec  # noqa: E402
from pycoll.errors import InvalidUsageError  # noqa: E402

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

import sign_codec  # noqa: E402
from sign_codec import SignCodec, numpy_decode, numpy_encode  # noqa: E402

SIZES = (1, 7, 8, 9, 255, 256, 257, 511, 1000, 4099)


@pytest.fixture(scope="module")
def codec() -> SignCodec:
    return SignCodec()


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, n]).standard_normal(n).astype(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _encode(codec, x: np.ndarray, **kwargs) -> np.ndarray:
    out = np.full(codec.encoded_bytes(x.size), 0xAB, dtype=np.uint8)
    codec.native().encode(x, out, **kwargs)
    return out


# ---- layout ------------------------------------------------------------------------------------------------
def test_layout(codec):
    assert pycoll.compression.UserCodec is UserCodec
    assert (codec.block_elems, codec.block_bytes) == (256, 36)
    native = codec.native()
    assert (native.block_elems, native.block_bytes, native.name) == (256, 36, "sign(block=256)")
    for n in (0,) + SIZES + (1 << 20,):
        want = (n // 256) * 36 + (4 + (n % 256 + 7) // 8 if n % 256 else 0)
        assert codec.encoded_bytes(n) == native.encoded_bytes(n) == want
        assert numpy_encode(_inputs(n)).size == want
    assert [codec.tail_bytes(r) for r in (0, 1, 8, 9, 255)] == [0, 5, 5, 6, 36]
    assert codec.bytes_per_element == 36 / 256
    assert repr(codec) == "sign(block=256)"


def test_wire_id_tells_codecs_apart(codec):
    assert SignCodec() == codec and SignCodec().wire_id == codec.wire_id
    assert SignCodec(128).wire_id != codec.wire_id
    assert codec.wire_id & 0xFFFF == 15  # the "user" kind code, as the native header expects
    assert codec.wire_id != Int8().wire_id
    enc, dec = sign_codec._kernels(256)
    args = ("sign(block=256)", 256, 36, sign_codec.tail_bytes, enc, dec)
    # without a version, the kernels' code identifies them
    other_enc, _ = sign_codec._kernels(128)  # same code, another block size frozen in
    assert UserCodec(*args).wire_id == UserCodec(*args).wire_id
    assert UserCodec(*args).wire_id != UserCodec(*args[:4], other_enc, dec).wire_id
    assert UserCodec(*args, version="a").wire_id != UserCodec(*args, version="b").wire_id
    assert UserCodec(*args, version="sign-v1/256").wire_id == codec.wire_id  # the same definition
    assert UserCodec("renamed", *args[1:], version="sign-v1/256").wire_id != codec.wire_id


def test_pickles_and_compiles_once(codec):
    again = pickle.loads(pickle.dumps(codec))
    assert again == codec and again.encode_address == codec.encode_address  # cached, not recompiled
    assert SignCodec().decode_address == codec.decode_address


# ---- encode / decode against the numpy model ------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_encode_decode_match_the_numpy_model(codec, n):
    x = _inputs(n)
    data = _encode(codec, x)
    assert np.array_equal(data, numpy_encode(x))
    dst = np.full(n, np.nan, dtype=np.float32)
    codec.native().decode(data, dst)
    assert np.array_equal(_bits(dst), _bits(numpy_decode(data, n)))
    # decoded values are +-(mean |x| of the block)
    for lo in range(0, n, 256):
        blk = x[lo:lo + 256]
        assert np.allclose(np.abs(dst[lo:lo + 256]), np.abs(blk.astype(np.float64)).mean(), rtol=1e-6)
        assert np.array_equal(dst[lo:lo + 256] >= 0, blk >= 0)


def test_special_values(codec):
    x = np.zeros(1000, dtype=np.float32)
    x[256:512] = -0.0                                   # -0.0 >= 0: a "+" sign, of scale 0
    x[512:768] = np.float32(3e38) * np.sign(_inputs(256, 1))  # mean |x| near FLT_MAX: still finite
    x[768:800] = np.float32(1e-45)                      # denormals
    x[900] = np.inf
    x[950] = np.nan
    data = _encode(codec, x)
    assert np.array_equal(data, numpy_encode(x))
    dst = codec.decode(data, x.size)
    assert np.array_equal(_bits(dst), _bits(numpy_decode(data, x.size)))
    assert np.all(dst[:512] == 0) and np.all(np.isfinite(dst[512:768]))
    assert np.all(np.isnan(dst[768:])), "a NaN or Inf in the block makes the whole block NaN (visible)"


def test_fragments_encode_like_whole_messages(codec):
    """The executor encodes and decodes fragments of whole blocks on their own (index = first element)."""
    x = _inputs(5 * 256 + 77)
    whole = _encode(codec, x)
    cut = [0, 256, 3 * 256, x.size]
    parts = [_encode(codec, x[a:b], index=a, key=12345) for a, b in zip(cut, cut[1:])]
    assert np.array_equal(np.concatenate(parts), whole)
    dst = np.empty_like(x)
    for a, b in zip(cut, cut[1:]):
        codec.native().decode(whole[codec.encoded_bytes(a):codec.encoded_bytes(b)], dst[a:b])
    assert np.array_equal(_bits(dst), _bits(codec.decode(whole, x.size)))


def test_accumulate(codec):
    n = 1000
    x, acc = _inputs(n), _inputs(n, 1)
    data = _encode(codec, x)
    decoded = numpy_decode(data, n)
    # through the native decode (dst = acc + decoded, in float32), out of place and in place
    dst = np.empty(n, dtype=np.float32)
    codec.native().decode(data, dst, acc=acc)
    assert np.array_equal(_bits(dst), _bits(acc + decoded))
    inplace = acc.copy()
    codec.native().decode(data, inplace, acc=inplace)
    assert np.array_equal(_bits(inplace), _bits(acc + decoded))
    # the finalize step of an average divides after the add
    codec.native().decode(data, dst, acc=acc, divisor=3)
    assert np.array_equal(_bits(dst), _bits((acc + decoded) / np.float32(3)))
    # the kernel itself, called through its C ABI with accumulate = 1 and 0
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32)(
        codec.decode_address)
    out = acc.copy()
    fn(data.ctypes.data, n, out.ctypes.data, 1)
    assert np.array_equal(_bits(out), _bits(acc + decoded))
    fn(data.ctypes.data, n, out.ctypes.data, 0)
    assert np.array_equal(_bits(out), _bits(decoded))


def test_residual(codec):
    """encode(residual=r) encodes x = src + r and leaves r = scale * (x - decoded) (0 where not finite)."""
    n = 1000
    src, res0 = _inputs(n), _inputs(n, 2) * np.float32(0.1)
    x = src + res0
    for scale in (1.0, 4.0):
        res = res0.copy()
        decoded = np.empty(n, dtype=np.float32)
        data = _encode(codec, src, residual=res, residual_scale=scale, decoded=decoded)
        assert np.array_equal(data, numpy_encode(x))
        want = numpy_decode(data, n)
        assert np.array_equal(_bits(decoded), _bits(want))
        assert np.array_equal(_bits(res), _bits((x - want) * np.float32(scale)))
    # a receive-reduce reading INPUT consumes the residual: dst = acc + residual + decoded, residual = 0
    acc, res = _inputs(n, 3), res0.copy()
    dst = np.empty(n, dtype=np.float32)
    codec.native().decode(data, dst, acc=acc, residual=res)
    assert np.array_equal(_bits(dst), _bits((acc + res0) + want)) and not res.any()
    # non-finite decoded values leave no residual
    bad = src.copy()
    bad[3] = np.inf
    res = np.ones(n, dtype=np.float32)
    _encode(codec, bad, residual=res)
    assert np.all(res[:256] == 0) and np.all(np.isfinite(res))


def test_decoded_values_of_encode_equal_decode(codec):
    """The owner keeps what it encoded decoded exactly as the others decode it, signs of zeros included."""
    x = np.zeros(256, dtype=np.float32)
    x[5] = -1e-45  # the block's mean |x| rounds to 0: x[5] decodes to -0.0
    decoded = np.empty_like(x)
    data = _encode(codec, x, decoded=decoded)
    assert np.signbit(numpy_decode(data, x.size)[5])
    assert np.array_equal(_bits(decoded), _bits(codec.decode(data, x.size)))


def test_error_feedback_averages_out(codec):
    """Repeated encodes of one vector with a residual: the sum of the decodes is steps * x minus the last
    residual, so the mean decode converges to x (slowly for the largest elements of a block: a spike is
    worth only 1/256 of its block's scale, so its residual takes many steps to pay out)."""
    x = _inputs(4096)
    res = np.zeros_like(x)
    total = np.zeros(x.size)
    plain = np.abs(codec.roundtrip(x) - x).mean()
    errors = {}
    for step in range(1, 101):
        decoded = np.empty_like(x)
        _encode(codec, x, residual=res, decoded=decoded)
        total += decoded
        errors[step] = np.abs(total / step - x).mean()
    assert np.allclose(total, 100 * x.astype(np.float64) - res, rtol=0, atol=1e-2)
    assert errors[10] < plain / 2 and errors[100] < errors[10] / 4 and errors[100] < plain / 10, errors


# ---- other ways to define a codec --------------------------------------------------------------------------
# int8 without scales: one byte per element, values clamped to [-127, 127] and rounded half away from zero.
def clamp_encode(src, out, index, key):
    for i in range(src.size):
        v = min(max(src[i], -127.0), 127.0)
        q = int(v + 0.5) if v >= 0 else -int(-v + 0.5)
        out[i] = q & 0xFF


def clamp_decode(data, out, accumulate):
    for i in range(out.size):
        q = np.int8(data[i])
        if accumulate:
            out[i] += np.float32(q)
        else:
            out[i] = np.float32(q)


def _clamp_model(x: np.ndarray) -> np.ndarray:
    v = np.clip(x.astype(np.float64), -127, 127)
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.float32)


def _check_clamp_codec(c: UserCodec) -> None:
    x = (_inputs(300) * 60).astype(np.float32)
    x[:4] = [200, -200, 2.5, -2.5]
    data = c.encode(x)
    assert data.size == 300 and np.array_equal(data.view(np.int8), _clamp_model(x).astype(np.int8))
    assert np.array_equal(c.decode(data, x.size), _clamp_model(x))
    acc = _inputs(300, 4)
    assert np.array_equal(_bits(c.decode(data, x.size, acc=acc)), _bits(acc + _clamp_model(x)))


def test_python_functions():
    _check_clamp_codec(UserCodec("clamp", 1, 1, [0], clamp_encode, clamp_decode))
    _check_clamp_codec(UserCodec.from_numba("clamp", 1, 1, lambda r: 0, clamp_encode, clamp_decode))


def test_njit_functions():
    enc, dec = numba.njit(clamp_encode), numba.njit(clamp_decode)
    _check_clamp_codec(UserCodec("clamp-njit", 1, 1, [0], enc, dec))


ENC_SIG = types.void(types.CPointer(types.float32), types.int64, types.CPointer(types.uint8), types.int64,
                     types.uint32)
DEC_SIG = types.void(types.CPointer(types.uint8), types.int64, types.CPointer(types.float32), types.int32)
_clamp_encode_jit = numba.njit(clamp_encode)
_clamp_decode_jit = numba.njit(clamp_decode)


@numba.cfunc(ENC_SIG)
def clamp_encode_c(src, n, out, index, key):
    _clamp_encode_jit(numba.carray(src, (n,)), numba.carray(out, (n,)), index, key)


@numba.cfunc(DEC_SIG)
def clamp_decode_c(data, n, out, accumulate):
    _clamp_decode_jit(numba.carray(data, (n,)), numba.carray(out, (n,)), accumulate != 0)


def test_cfuncs():
    c = UserCodec("clamp-c", 1, 1, [0], clamp_encode_c, clamp_decode_c, version="1")
    assert c.encode_address == clamp_encode_c.address
    _check_clamp_codec(c)


# ---- bad definitions ---------------------------------------------------------------------------------------
@numba.cfunc(types.void(types.CPointer(types.float64), types.int64, types.CPointer(types.uint8), types.int64,
                        types.uint32))
def float64_encode_c(src, n, out, index, key):
    pass


def _two_args(src, out):
    pass


def _untypable_encode(src, out, index, key):
    out[0] = "text"


GOOD = dict(name="x", block_elems=1, block_bytes=1, tail_bytes=[0], encode=clamp_encode, decode=clamp_decode)


@pytest.mark.parametrize("change,message", [
    (dict(name=""), "non-empty name"),
    (dict(block_elems=0), "block_elems"),
    (dict(block_elems=True), "block_elems"),
    (dict(block_elems=2.0), "block_elems"),
    (dict(block_bytes=0), "block_bytes"),
    (dict(block_bytes=5000), "block_bytes"),
    (dict(tail_bytes=[0, 1]), "one size per r"),
    (dict(tail_bytes=[1]), r"tail_bytes\[0\] must be 0"),
    (dict(tail_bytes="0"), "tail_bytes must be"),
    (dict(block_elems=4, block_bytes=2, tail_bytes=[0, 1, 3, 2]), r"tail_bytes\[2\]"),
    (dict(block_elems=4, block_bytes=2, tail_bytes=[0, 1, 0, 2]), r"tail_bytes\[2\]"),
    (dict(block_elems=4, block_bytes=2, tail_bytes=lambda r: r), r"tail_bytes\(3\)"),
    (dict(block_elems=4, block_bytes=2, tail_bytes=lambda r: 1 // 0), "ZeroDivisionError"),
    (dict(encode=42), "encode must be a Python function"),
    (dict(decode=_two_args), "decode must take 3 arguments"),
    (dict(encode=clamp_encode_c), "both be numba cfuncs"),
    (dict(encode=float64_encode_c, decode=clamp_decode_c), "signature"),
    (dict(encode=clamp_decode_c, decode=clamp_decode_c), "signature"),
    (dict(encode=_untypable_encode), "numba could not compile encode"),
])
def test_bad_definitions(change, message):
    kwargs = {**GOOD, **change}
    with pytest.raises(InvalidUsageError, match=message):
        UserCodec(kwargs.pop("name"), kwargs.pop("block_elems"), kwargs.pop("block_bytes"),
                  kwargs.pop("tail_bytes"), kwargs.pop("encode"), kwargs.pop("decode"))


def test_bad_seed_and_version():
    with pytest.raises(InvalidUsageError, match="seed"):
        UserCodec("x", 1, 1, [0], clamp_encode, clamp_decode, seed=-1)
    with pytest.raises(InvalidUsageError, match="version"):
        UserCodec("x", 1, 1, [0], clamp_encode, clamp_decode, version=3)
    with pytest.raises(InvalidUsageError, match="block"):
        SignCodec(12)


def test_without_numba():
    """pycoll.compression imports without numba; building a codec from Python functions says what to do."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import pycoll.compression as c\n"
        "assert c.Int8().encoded_bytes(10) > 0\n"
        "from pycoll.errors import InvalidUsageError\n"
        "def enc(src, out, index, key): pass\n"
        "def dec(data, out, accumulate): pass\n"
        "try:\n"
        "    c.UserCodec('x', 1, 1, [0], enc, dec)\n"
        "except InvalidUsageError as e:\n"
        "    assert 'pip install numba' in str(e), e\n"
        "    print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
