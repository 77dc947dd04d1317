"""Turning the caller's arrays (numpy arrays, torch CPU tensors) into what the native core needs:
an address, an element count and a dtype code, after checking everything that could go wrong, so
that bad input is reported before any byte is sent."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from pycoll._C import array_address
from pycoll.errors import InvalidUsageError

# Codes shared with csrc/kernels/types.h (DType).
DTYPE_CODES = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "bfloat16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "int8": 7,
}
FLOAT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})
# Codes shared with csrc/kernels/types.h (RedOp).
OP_CODES = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}
SUPPORTED_DTYPES = ", ".join(DTYPE_CODES)


class Buffer:
    """A contiguous array as the native core sees it (a plain class: this sits on the per-call path)."""

    __slots__ = ("ptr", "count", "dtype", "itemsize", "obj")

    def __init__(self, ptr: int, count: int, dtype: str, itemsize: int, obj: Any) -> None:
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.itemsize = itemsize
        self.obj = obj  # keeps the caller's array alive while the native core uses ptr

    @property
    def code(self) -> int:
        return DTYPE_CODES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def overlaps(self, other: Buffer) -> bool:
        if self.nbytes == 0 or other.nbytes == 0:
            return False
        return self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes


# numpy dtype -> pycoll dtype name, filled lazily (bfloat16 comes from ml_dtypes when it is used).
_NUMPY_DTYPES: dict[np.dtype, str] = {np.dtype(name): name for name in DTYPE_CODES if name != "bfloat16"}


def _numpy_dtype(x: np.ndarray, name: str) -> str:
    dtype = x.dtype
    if dtype.name == "bfloat16" and dtype.itemsize == 2 and dtype.byteorder in "=|<":
        _NUMPY_DTYPES[dtype] = "bfloat16"
        return "bfloat16"
    if dtype.byteorder == ">":
        raise InvalidUsageError(f"{name} is big-endian ({dtype}); convert it to native byte order first")
    raise InvalidUsageError(
        f"{name} has dtype {dtype}; supported dtypes are {SUPPORTED_DTYPES} (bfloat16 via ml_dtypes or torch)"
    )


def _torch_buffer(x: Any, name: str) -> Buffer:
    if x.device.type != "cpu":
        raise InvalidUsageError(
            f"{name} is on {x.device} but this communicator moves CPU memory; pass a CPU tensor "
            f"(GPU tensors need the CUDA transport)"
        )
    if x.is_sparse if hasattr(x, "is_sparse") else False:
        raise InvalidUsageError(f"{name} is a sparse tensor; pycoll needs a dense, contiguous tensor")
    if not x.is_contiguous():
        raise InvalidUsageError(
            f"{name} must be contiguous, got a tensor with strides {tuple(x.stride())}; "
            f"call .contiguous() first (and copy the result back)"
        )
    dtype = str(x.dtype).replace("torch.", "")
    if dtype not in DTYPE_CODES:
        raise InvalidUsageError(f"{name} has dtype torch.{dtype}; supported dtypes are {SUPPORTED_DTYPES}")
    if x.is_conj() if hasattr(x, "is_conj") else False:
        raise InvalidUsageError(f"{name} is a lazily conjugated tensor; call .resolve_conj() first")
    return Buffer(int(x.data_ptr()), int(x.numel()), dtype, int(x.element_size()), x)


def as_buffer(x: Any, name: str, *, writable: bool) -> Buffer:
    """Validates ``x`` and describes it; raises InvalidUsageError naming what was expected."""
    if isinstance(x, np.ndarray):
        dtype = _NUMPY_DTYPES.get(x.dtype) or _numpy_dtype(x, name)
        flags = x.flags
        if not flags.c_contiguous:
            raise InvalidUsageError(
                f"{name} must be C-contiguous, got an array with strides {x.strides}; "
                f"use numpy.ascontiguousarray (and copy the result back)"
            )
        if writable and not flags.writeable:
            raise InvalidUsageError(f"{name} is read-only, but the result is written into it in place")
        return Buffer(array_address(x), x.size, dtype, x.itemsize, x)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_buffer(x, name)
    raise InvalidUsageError(f"{name} must be a numpy.ndarray or a torch CPU tensor, got {type(x).__name__}")


def op_code(op: str, buf: Buffer) -> int:
    if not isinstance(op, str) or op.lower() not in OP_CODES:
        raise InvalidUsageError(f"op must be one of {', '.join(OP_CODES)}, got {op!r}")
    op = op.lower()
    if op == "avg" and buf.dtype not in FLOAT_DTYPES:
        raise InvalidUsageError(f"op 'avg' needs a floating-point dtype, got {buf.dtype}")
    return OP_CODES[op]
