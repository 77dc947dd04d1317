"""Rank-dependent inputs with closed-form (exact) expected results, and the helpers around them.

Every input is a pure function of (dtype, op, rank, world, count), so rank 0 can rebuild every rank's
input and compute the exact expected result; the other ranks only report a digest of theirs (every rank
must end bitwise identical, which the parent checks).

* Integers: 64-bit hash values cut to the dtype (so sums and products wrap, in every dtype); prod uses
  odd values (a product of odd numbers is odd, never 0 mod 2^k, so wrapping is really exercised).
  Integer sums and products mod 2^k do not depend on the order of operations, so the expected result
  is numpy's reduction in the same dtype, which wraps the same way.
* Floats, sum/avg/min/max: x_r[i] = c_i + d_i * (2r - world + 1) with c_i, d_i multiples of 0.5 in
  [-2, 2]: every partial sum of any subset of ranks is a multiple of 0.5 below 64 in magnitude, hence
  exact even in bfloat16 (8 significant bits), in any order; sum = world * c_i, and avg = c_i exactly
  (the deviations cancel), whatever the algorithm.
* Floats, prod: values in {1, 2, -1, 0.5, -2}: every partial product is a power of two below 2^9 in
  magnitude, exact in every float dtype.

bfloat16 arrays come from ml_dtypes when it is installed, else from torch (a bfloat16 tensor);
``bf16_backend()`` says which, or why neither.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64", "uint8", "int8")
OPS = ("sum", "avg", "min", "max", "prod")
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1,
            "int8": 1}
#: unit roundoff u = 2^-p (p significant bits) and the smallest subnormal of each float dtype
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
SMALLEST_SUBNORMAL = {"float64": 2.0**-1074, "float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def ops_for(dtype: str) -> tuple[str, ...]:
    return OPS if dtype in FLOATS else tuple(o for o in OPS if o != "avg")


# ---- bfloat16 ------------------------------------------------------------------------------------------
def bf16_backend() -> tuple[str | None, str]:
    """("ml_dtypes" | "torch" | None, reason when None)."""
    try:
        import ml_dtypes  # noqa: F401

        return "ml_dtypes", ""
    except ImportError:
        pass
    try:
        import torch  # noqa: F401

        return "torch", ""
    except ImportError:
        return None, "bfloat16 needs ml_dtypes or torch, and neither is installed"


def f64_to_bf16_bits(v: np.ndarray) -> np.ndarray:
    """Round float64 values to bfloat16 (round to nearest even via float32; no NaNs here)."""
    b = np.asarray(v, dtype=np.float64).astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return b.astype(np.uint16)


def bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def bf16_from_bits(bits: np.ndarray) -> Any:
    backend, reason = bf16_backend()
    if backend == "ml_dtypes":
        import ml_dtypes

        return np.ascontiguousarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16)
    if backend == "torch":
        import torch

        raw = np.ascontiguousarray(bits, dtype=np.uint16).view(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16)
    raise RuntimeError(reason)


# ---- arrays of any backend -----------------------------------------------------------------------------
def bits_of(x: Any) -> np.ndarray:
    """The bytes of a numpy array or CPU tensor, as a flat uint8 numpy array (a view where possible)."""
    if isinstance(x, np.ndarray):
        return x.reshape(-1).view(np.uint8)
    import torch

    flat = x.reshape(-1)
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.view(torch.int16)
    elif flat.dtype == torch.float32:
        flat = flat.view(torch.int32)
    elif flat.dtype == torch.float64:
        flat = flat.view(torch.int64)
    return flat.numpy().view(np.uint8)


def digest(x: Any) -> str:
    return hashlib.blake2b(bits_of(x).tobytes(), digest_size=16).hexdigest()


def values_of(x: Any, dtype: str) -> np.ndarray:
    """float64 (floats) or int64 (ints) values of a result, for messages and tolerance checks."""
    raw = bits_of(x)
    if dtype == "bfloat16":
        return bf16_bits_to_f64(raw.view(np.uint16))
    v = raw.view(np.dtype(dtype))
    return v.astype(np.float64 if dtype in FLOATS else np.int64)


def from_values(values: np.ndarray, dtype: str, backend: str = "numpy") -> Any:
    """An array of ``dtype`` holding ``values`` (float64 / int64 / uint64), numpy or torch."""
    if dtype == "bfloat16":
        bits = f64_to_bf16_bits(values)
        if backend == "torch":
            import torch

            return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        return bf16_from_bits(bits)
    arr = np.asarray(values).astype(np.dtype(dtype))  # integer narrowing wraps (keeps the low bits)
    if backend == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr))
    return np.ascontiguousarray(arr)


def array_from_bits(bits: np.ndarray, dtype: str, backend: str = "numpy", shape: tuple | None = None) -> Any:
    """A fresh, writable array of ``dtype`` (numpy, ml_dtypes or torch) holding a copy of ``bits``."""
    raw = np.array(bits, dtype=np.uint8, copy=True)
    shape = (raw.size // ITEMSIZE[dtype],) if shape is None else shape
    if dtype == "bfloat16":
        if backend == "torch":
            import torch

            return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16).reshape(shape)
        return bf16_from_bits(raw.view(np.uint16)).reshape(shape)
    arr = raw.view(np.dtype(dtype)).reshape(shape)
    if backend == "torch":
        import torch

        return torch.from_numpy(arr)
    return arr


def expected_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Exact results (float64 / int64 / uint64 values representable in ``dtype``) as uint8 bytes."""
    if dtype == "bfloat16":
        return f64_to_bf16_bits(values).view(np.uint8)
    return np.asarray(values).astype(np.dtype(dtype)).view(np.uint8)


# ---- the inputs ----------------------------------------------------------------------------------------
def _hash(rank: int, start: int, stop: int, salt: int) -> np.ndarray:
    """Pseudo-random uint64 words [start, stop) of a stream keyed by (rank, salt): Philox is a counter-based
    generator (4 words per counter value), so any slice costs only its own length."""
    bits = np.random.Philox(counter=start // 4, key=np.array([rank + 1, salt], dtype=np.uint64))
    return bits.random_raw(max(0, stop - start) + start % 4)[start % 4:]


def input_values(dtype: str, op: str, rank: int, world: int, count: int, start: int = 0,
                 stop: int | None = None) -> np.ndarray:
    """Rank ``rank``'s input as float64 (floats) or uint64 (ints, cut to the dtype by ``from_values``);
    ``start``/``stop``: only elements [start, stop) of it."""
    stop = count if stop is None else stop
    if dtype in INTS:
        h = _hash(rank, start, stop, salt=OPS.index(op))
        if op == "prod":
            h |= np.uint64(1)
        if dtype in ("int32", "int64"):
            # full-width values wrap for sum/prod; min/max see negatives and positives
            return h
        return h >> np.uint64(7)
    if op == "prod":
        table = np.array([1.0, 2.0, -1.0, 0.5, -2.0])
        return _periodic(start, stop, lambda i: table[(i * 3 + rank * 7 + (i >> 3)) % 5])
    return _periodic(start, stop, lambda i: _float_c(i) + _float_d(i) * (2 * rank - world + 1))


def _float_c(i: np.ndarray) -> np.ndarray:
    return ((i * 7 + (i >> 4)) % 9 - 4) * 0.5


def _float_d(i: np.ndarray) -> np.ndarray:
    return ((i * 5 + 3) % 5 - 2) * 0.5


#: The float inputs repeat every 720 elements (c every 144, the prod table's index every 40).
_FLOAT_PERIOD = 720


def _periodic(start: int, stop: int, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """f over the element indices [start, stop), for an f of period _FLOAT_PERIOD: one period is
    computed and repeated (large counts cost one copy instead of a dozen passes of integer arithmetic)."""
    first = f(np.arange(start, start + min(stop - start, _FLOAT_PERIOD), dtype=np.int64))
    return np.resize(first, stop - start)


def make_input(dtype: str, op: str, rank: int, world: int, count: int, backend: str = "numpy") -> Any:
    return from_values(input_values(dtype, op, rank, world, count), dtype, backend)


def expected_values(dtype: str, op: str, world: int, count: int, start: int = 0,
                    stop: int | None = None) -> np.ndarray:
    """The exact reduction of every rank's ``input_values`` (see the module docstring), elements
    [start, stop). Float sums, averages, minima and maxima in closed form (rank r's input is
    c + d * (2r - world + 1), so the sum is world * c, exactly); the rest reduced rank by rank."""
    stop = count if stop is None else stop
    if dtype not in INTS and op != "prod":
        sign = {"sum": 0, "avg": 0, "min": -1, "max": 1}[op]
        scale = world if op == "sum" else 1
        spread = world - 1
        return _periodic(start, stop, lambda i: _float_c(i) * scale + sign * np.abs(_float_d(i)) * spread)
    dt = np.dtype(dtype) if dtype in INTS else np.dtype(np.float64)
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    acc = input_values(dtype, op, 0, world, count, start, stop).astype(dt)
    with np.errstate(over="ignore"):  # integer sums and products wrap, as the reduction's do
        for r in range(1, world):
            ufunc(acc, input_values(dtype, op, r, world, count, start, stop).astype(dt), out=acc)
    return acc


def random_values(dtype: str, rank: int, count: int, seed: int) -> np.ndarray:
    """Random normal inputs, rounded to ``dtype`` (as float64)."""
    rng = np.random.default_rng([seed, rank, count])
    v = rng.standard_normal(count) * 3.0
    if dtype == "bfloat16":
        return bf16_bits_to_f64(f64_to_bf16_bits(v))
    return v.astype(np.dtype(dtype)).astype(np.float64)


def float_error_bound(dtype: str, op: str, world: int, abs_sum: np.ndarray) -> np.ndarray:
    """Per-element bound on |result - exact| for a float sum/avg over ``world`` ranks, in any order.

    Summing ``world`` numbers in any order (ring, tree or direct) takes world-1 additions, each rounded
    once to the dtype: |err| <= (world-1) * u * sum_r |x_r| (u = 2^-p, to first order; the 1.01 factor
    covers the second-order terms and float16/bfloat16 being added in float32 and rounded back), plus
    half the smallest subnormal spacing per addition for results in the subnormal range. avg divides
    the computed sum by world, one more rounding of |S|/world <= sum|x_r|/world: the bound of avg is
    ((world-1) * u * sum|x_r| + u * sum|x_r|) / world + the subnormal term.
    """
    u = UNIT_ROUNDOFF[dtype]
    tiny = SMALLEST_SUBNORMAL[dtype] / 2
    if op == "sum":
        return 1.01 * (world - 1) * u * abs_sum + (world - 1) * tiny
    if op == "avg":
        return 1.01 * world * u * abs_sum / world + world * tiny
    raise ValueError(op)


def refusals(call: Callable[..., Any], cases: list[tuple[tuple, dict, str]]) -> list[str]:
    """Each ``call(*args, **kwargs)`` of ``cases`` (args, kwargs, pattern) must raise InvalidUsageError
    matching ``pattern`` and leave its output (``args[1]``, an array) untouched; what went otherwise."""
    import re

    import pycoll

    failures = []
    for args, kwargs, pattern in cases:
        keep = np.array(args[1], copy=True)
        try:
            call(*args, **kwargs)
            failures.append(f"{pattern}: nothing was raised")
        except pycoll.InvalidUsageError as e:
            if not re.search(pattern, str(e)):
                failures.append(f"{pattern}: raised {e}")
        if not np.array_equal(args[1], keep):
            failures.append(f"{pattern}: out was written")
    return failures
