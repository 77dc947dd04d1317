"""pycoll._C.cuda where there is no GPU (every CPU machine, CI included), and the CPU reduce loop that the
GPU tests compare the kernels with (``_C.testing.cpu_reduce``) against numpy closed forms.

- Where nvcc exists the module must have been built with CUDA (a silent CPU-only build would make every
  GPU test skip on a GPU machine later).
- Without a device, ``device_count()`` is 0 without raising and ``device_error()`` says why; every kernel
  and device function raises a pycoll error instead of crashing; argument errors are InvalidUsageError
  before any CUDA call; n == 0 does nothing.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from pycoll import _C
from pycoll.arrays import DTYPE_CODES, OP_CODES
from pycoll.compression import reference as ref
from pycoll.errors import InvalidUsageError, PycollError

cuda = _C.cuda
FAKE = 0x10000  # a plausible device address: never dereferenced, every call must fail before a launch


def nvcc_present() -> bool:
    cudacxx = os.environ.get("CUDACXX")
    if cudacxx and os.path.exists(cudacxx):
        return True
    return shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")


def test_built_with_cuda_where_nvcc_exists() -> None:
    if os.environ.get("PYCOLL_CUDA", "auto").lower() == "off":
        pytest.skip("PYCOLL_CUDA=off: built without CUDA on purpose")
    if not nvcc_present():
        pytest.skip("no nvcc on this machine, so no CUDA build is expected")
    assert cuda.built(), "nvcc exists but pycoll._C was built without CUDA (CMake did not find the toolkit?)"


no_device = pytest.mark.skipif(cuda.device_count() > 0,
                               reason="a CUDA device is present (tests/gpu covers it)")


@no_device
def test_device_count_is_zero_and_explained() -> None:
    assert cuda.device_count() == 0
    why = cuda.device_error()
    assert isinstance(why, str) and why, "device_error() must say why there is no device"
    if cuda.built():
        assert why.startswith("cuda") or "CUDA" in why, why
    else:
        assert "without CUDA" in why


def device_calls() -> list[tuple[str, object]]:
    return [
        ("get_device", lambda: cuda.get_device()),
        ("set_device", lambda: cuda.set_device(0)),
        ("synchronize", lambda: cuda.synchronize(0)),
        ("reduce", lambda: cuda.reduce(0, 0, FAKE, 0, FAKE, FAKE, 16, 0, 0)),
        ("encode", lambda: cuda.encode(3, 64, 0, FAKE, FAKE, 100)),
        ("decode", lambda: cuda.decode(4, 32, 0, FAKE, FAKE, 100, acc=FAKE)),
        ("encode fp16", lambda: cuda.encode(1, 0, 0, FAKE, FAKE, 100, decoded=FAKE)),
    ]


@no_device
@pytest.mark.parametrize("name,call", device_calls(), ids=[c[0] for c in device_calls()])
def test_device_functions_raise_without_a_device(name: str, call) -> None:
    with pytest.raises(PycollError) as info:
        call()
    if cuda.built():
        assert "CUDA error" in str(info.value), f"{name}: {info.value}"
    else:
        assert isinstance(info.value, InvalidUsageError)
        assert "built without CUDA" in str(info.value)


@pytest.mark.skipif(not cuda.built(), reason="pycoll was built without CUDA")
def test_argument_errors_come_before_any_cuda_call() -> None:
    with pytest.raises(InvalidUsageError, match="dtype"):
        cuda.reduce(99, 0, FAKE, 0, FAKE, FAKE, 16)
    with pytest.raises(InvalidUsageError, match="op code"):
        cuda.reduce(0, 9, FAKE, 0, FAKE, FAKE, 16)
    with pytest.raises(InvalidUsageError, match="block"):
        cuda.encode(3, 12, 0, FAKE, FAKE, 100)
    with pytest.raises(InvalidUsageError, match="block"):
        cuda.decode(4, 8192, 0, FAKE, FAKE, 100)
    with pytest.raises(InvalidUsageError, match="kind"):
        cuda.encode(15, 64, 0, FAKE, FAKE, 100)
    with pytest.raises(InvalidUsageError, match="rounding"):
        cuda.encode(3, 64, 7, FAKE, FAKE, 100)
    with pytest.raises(InvalidUsageError, match="residual needs acc"):
        cuda.decode(3, 64, 0, FAKE, FAKE, 100, residual=FAKE)


@pytest.mark.skipif(not cuda.built(), reason="pycoll was built without CUDA")
def test_zero_elements_enqueue_nothing() -> None:
    # n == 0 returns before any CUDA call, so it works without a device too
    cuda.reduce(0, 0, 0, 0, 0, 0, 0, 0, 0)
    cuda.encode(3, 64, 1, 0, 0, 0)
    cuda.decode(2, 0, 0, 0, 0, 0)


# ---- cpu_reduce against numpy -----------------------------------------------------------------------

N = 1003  # not a multiple of any vector width


def inputs(dtype: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Small integers (so every sum, product, min, max and the averages below are exact), plus for the
    integer types their extremes (so sums and products wrap)."""
    if dtype == "uint8":
        a, b = rng.integers(0, 13, N), rng.integers(0, 13, N)
    else:
        a, b = rng.integers(-6, 7, N), rng.integers(-6, 7, N)
    if dtype in ("int8", "uint8", "int32", "int64"):
        info = np.iinfo(dtype)
        a[:4] = [info.max, info.min, info.max, info.min]
        b[:4] = [1, -1 if info.min < 0 else 0, info.max, info.min]
    return a, b


def to_native(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return ref.float_to_bf16_bits(np.asarray(x, dtype=np.float32))
    if dtype == "float16":
        return np.asarray(x, dtype=np.float16).view(np.uint16)
    return np.asarray(x).astype(dtype)


def from_native(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return ref.bf16_bits_to_float(x).astype(np.float64)
    if dtype == "float16":
        return x.view(np.float16).astype(np.float64)
    return x


@pytest.mark.parametrize("op", list(OP_CODES))
@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
def test_cpu_reduce_matches_closed_forms(dtype: str, op: str) -> None:
    rng = np.random.default_rng(abs(hash((dtype, op))) % 2**32)
    a, b = inputs(dtype, rng)
    floating = dtype in ("float32", "float64", "float16", "bfloat16")
    divisor = (4 if floating else 3) if op == "avg" else 0
    na, nb = to_native(a, dtype), to_native(b, dtype)
    dst = np.full_like(na, 0x5A)
    dst2 = np.full_like(na, 0x5A)
    _C.testing.cpu_reduce(DTYPE_CODES[dtype], OP_CODES[op], dst, na, nb, divisor, dst2)
    assert np.array_equal(dst, dst2), "dst2 must receive the same values as dst"
    if floating:
        x, y = a.astype(np.float64), b.astype(np.float64)
        want = {"sum": x + y, "avg": (x + y) / 4, "min": np.minimum(x, y), "max": np.maximum(x, y),
                "prod": x * y}[op]
        np.testing.assert_array_equal(from_native(dst, dtype), want)
    else:
        x, y = na, nb  # numpy's own integer arithmetic wraps like the native loop
        with np.errstate(over="ignore"):
            exact = {"sum": x + y, "avg": x + y, "min": np.minimum(x, y), "max": np.maximum(x, y),
                     "prod": x * y}[op]
        if op == "avg":  # C division truncates toward zero; numpy's // floors
            q = exact // 3
            exact = np.where((exact % 3 != 0) & (exact < 0), q + 1, q).astype(dtype)
        np.testing.assert_array_equal(dst, exact)


def test_cpu_reduce_propagates_nan_like_numpy() -> None:
    a = np.array([np.nan, 1.0, -0.0, np.inf, 2.0], dtype=np.float32)
    b = np.array([1.0, np.nan, 0.0, -np.inf, np.nan], dtype=np.float32)
    for op, fn in (("min", np.minimum), ("max", np.maximum), ("sum", np.add)):
        dst = np.empty_like(a)
        _C.testing.cpu_reduce(DTYPE_CODES["float32"], OP_CODES[op], dst, a, b)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(np.isnan(dst), np.isnan(fn(a, b)), err_msg=op)


def test_cpu_reduce_checks_its_arguments() -> None:
    x = np.zeros(8, dtype=np.float32)
    with pytest.raises(InvalidUsageError, match="as many bytes"):
        _C.testing.cpu_reduce(0, 0, x, x, np.zeros(4, dtype=np.float32))
    with pytest.raises(InvalidUsageError, match="items of 2 bytes"):
        _C.testing.cpu_reduce(DTYPE_CODES["float16"], 0, x, x, x)
    with pytest.raises(InvalidUsageError, match="dtype"):
        _C.testing.cpu_reduce(42, 0, x, x, x)
