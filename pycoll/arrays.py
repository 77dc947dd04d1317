"""Turning the caller's arrays into what the native core needs: an address, an element count, a dtype
code and, for GPU memory, the device and the stream the caller's work is ordered on, after checking
everything that could go wrong, so that bad input is reported before any byte is sent.

Host memory: numpy arrays and torch CPU tensors. GPU memory: torch CUDA tensors (on torch's current
stream of their device), and any object with ``__cuda_array_interface__`` (CuPy, numba device arrays;
on the stream the interface names, else the legacy default stream). Nothing is copied to the host.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from pycoll._C import array_address
from pycoll.codes import DTYPE_CODES as DTYPE_CODES  # (re-exported: the codes live in pycoll.codes)
from pycoll.codes import OP_CODES as OP_CODES
from pycoll.errors import InvalidUsageError

FLOAT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})
SUPPORTED_DTYPES = ", ".join(DTYPE_CODES)


#: ``Buffer.device`` of host memory.
HOST = -1


class Buffer:
    """A contiguous array as the native core sees it (a plain class: this sits on the per-call path).

    ``device``: HOST, or the CUDA device index of GPU memory; ``stream``: the CUDA stream (a handle as an
    int) the caller's work on it is ordered on, for GPU memory.
    """

    __slots__ = ("ptr", "count", "dtype", "itemsize", "obj", "device", "stream")

    def __init__(
        self, ptr: int, count: int, dtype: str, itemsize: int, obj: Any, device: int = HOST, stream: int = 0
    ) -> None:
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.itemsize = itemsize
        self.obj = obj  # keeps the caller's array alive while the native core uses ptr
        self.device = device
        self.stream = stream

    @property
    def on_gpu(self) -> bool:
        return self.device != HOST

    def where(self) -> str:
        return "cpu" if self.device == HOST else f"cuda:{self.device}"

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
    if x.device.type not in ("cpu", "cuda"):
        raise InvalidUsageError(f"{name} is on {x.device}; pycoll moves CPU and CUDA memory only")
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
    if x.device.type == "cuda":
        import torch

        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        stream = int(torch.cuda.current_stream(device).cuda_stream)
        return Buffer(int(x.data_ptr()), int(x.numel()), dtype, int(x.element_size()), x, device, stream)
    return Buffer(int(x.data_ptr()), int(x.numel()), dtype, int(x.element_size()), x)


# __cuda_array_interface__ typestr -> pycoll dtype (bfloat16 has no typestr of its own there).
_CAI_DTYPES = {
    "<f4": "float32",
    "<f8": "float64",
    "<f2": "float16",
    "<i4": "int32",
    "<i8": "int64",
    "|u1": "uint8",
    "<u1": "uint8",
    "|i1": "int8",
    "<i1": "int8",
}
# CUDA's special stream handles in the interface's "stream" entry: 1 is the legacy default stream
# (handle 0), 2 the per-thread default stream (cudaStreamPerThread, handle 2).
_CAI_LEGACY_STREAM = 1


def _cuda_interface_buffer(x: Any, name: str, writable: bool) -> Buffer:
    """CuPy arrays, numba device arrays and anything else with ``__cuda_array_interface__``."""
    cai = x.__cuda_array_interface__
    shape = tuple(int(n) for n in cai["shape"])
    typestr = cai["typestr"]
    dtype = _CAI_DTYPES.get(typestr)
    if dtype is None:
        raise InvalidUsageError(
            f"{name} has element type {typestr!r}; supported dtypes are {SUPPORTED_DTYPES} "
            f"(bfloat16 as a torch tensor)"
        )
    itemsize = int(typestr[2:])
    count = int(np.prod(shape)) if shape else 1
    strides = cai.get("strides")
    if strides is not None and count > 1:
        expect, step = [], itemsize
        for n in reversed(shape):
            expect.append(step)
            step *= n
        if any(n > 1 and s != e for n, s, e in zip(shape, strides, reversed(expect))):
            raise InvalidUsageError(
                f"{name} must be C-contiguous, got strides {tuple(strides)}; make a contiguous copy first"
            )
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise InvalidUsageError(f"{name} is read-only, but the result is written into it in place")
    from pycoll import _C

    if not _C.gpu.built:
        raise InvalidUsageError(
            f"{name} is GPU memory, but pycoll was built without CUDA (nvcc was not found when it was "
            f"installed); reinstall it where the CUDA toolkit is present"
        )
    owner = getattr(getattr(x, "device", None), "id", None)  # CuPy names its device; numba does not
    device = int(owner) if owner is not None else (_C.gpu.pointer_device(int(ptr)) if ptr else HOST)
    if device == HOST and ptr:
        raise InvalidUsageError(f"{name} has __cuda_array_interface__ but its memory is not on a CUDA device")
    stream = cai.get("stream")
    stream = 0 if stream is None or stream == _CAI_LEGACY_STREAM else int(stream)
    return Buffer(int(ptr or 0), count, dtype, itemsize, x, device, stream)


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
    if hasattr(x, "__cuda_array_interface__"):
        return _cuda_interface_buffer(x, name, writable)
    raise InvalidUsageError(
        f"{name} must be a numpy.ndarray, a torch tensor (CPU or CUDA) or a GPU array with "
        f"__cuda_array_interface__ (CuPy, numba), got {type(x).__name__}"
    )


def op_code(op: str, buf: Buffer) -> int:
    if not isinstance(op, str) or op.lower() not in OP_CODES:
        raise InvalidUsageError(f"op must be one of {', '.join(OP_CODES)}, got {op!r}")
    op = op.lower()
    if op == "avg" and buf.dtype not in FLOAT_DTYPES:
        raise InvalidUsageError(f"op 'avg' needs a floating-point dtype, got {buf.dtype}")
    return OP_CODES[op]
