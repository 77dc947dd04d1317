"""The CUDA kernels (pycoll._C.cuda) on a real GPU, against the CPU loops, bit for bit.

The checks themselves live in ``tests/kernel_checks.py`` (:class:`KernelChecks`), shared with the CPU
emulation of the same kernels (``tests/unit/test_emulated_kernels.py``, which runs in CI); here they run on
device memory from torch, every buffer poisoned and guarded as there. What only a GPU has stays here:
streams, device queries, and pointers that are not device memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kernel_checks import (
    F32,
    GUARD,
    LARGE,
    POISON,
    KernelChecks,
    assert_same,
    check_guards,
    reduce_inputs,
    run_reduce,
)

from pycoll import _C
from pycoll.arrays import DTYPE_CODES, OP_CODES
from pycoll.errors import InvalidUsageError

try:
    import torch
except ImportError:  # the conftest skips every test with the reason
    torch = None

pytestmark = pytest.mark.gpu


class DevBuf:
    """``nbytes`` of device memory at byte ``offset`` from a 256-byte aligned allocation, with poisoned
    guard bytes on both sides."""

    def __init__(self, nbytes: int, offset: int = 0, fill: np.ndarray | None = None, poison: int = POISON):
        assert torch is not None
        self.nbytes, self.offset, self.poison = nbytes, offset, poison
        self.lo = GUARD + offset
        self.t = torch.full((self.lo + nbytes + GUARD,), poison, dtype=torch.uint8, device="cuda")
        if fill is not None and nbytes:
            raw = np.ascontiguousarray(fill).view(np.uint8).reshape(-1)
            assert raw.size == nbytes
            self.t[self.lo:self.lo + nbytes].copy_(torch.from_numpy(raw.copy()))

    @property
    def ptr(self) -> int:
        return int(self.t.data_ptr()) + self.lo

    def get(self, dtype: Any = np.uint8) -> np.ndarray:
        torch.cuda.synchronize()
        return check_guards(self.t.cpu().numpy(), self.lo, self.nbytes, self.poison, self.offset).view(dtype)


def stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


class GpuKernels:
    """pycoll._C.cuda on torch's current stream (kernel_checks.Kernels)."""

    def buf(self, nbytes: int, offset: int = 0, fill: np.ndarray | None = None,
            poison: int = POISON) -> DevBuf:
        return DevBuf(nbytes, offset, fill, poison)

    def reduce(self, dtype: int, op: int, dst: int, dst2: int, a: int, b: int, n: int,
               avg_divisor: int) -> None:
        _C.cuda.reduce(dtype, op, dst, dst2, a, b, n, avg_divisor, stream())

    def encode(self, kind: int, block: int, rounding: int, src: int, out: int, n: int, **kw: Any) -> None:
        _C.cuda.encode(kind, block, rounding, src, out, n, stream=stream(), **kw)

    def decode(self, kind: int, block: int, rounding: int, data: int, dst: int, n: int, **kw: Any) -> None:
        _C.cuda.decode(kind, block, rounding, data, dst, n, stream=stream(), **kw)

    def rotate(self, x: int, n: int, part: int, block: int, inverse: bool) -> None:
        _C.cuda.rotate(x, n, part, block, inverse, stream())


GPU = GpuKernels()


class TestGpuKernels(KernelChecks):
    @pytest.fixture
    def kernels(self) -> GpuKernels:
        return GPU


# ---- streams and errors ----------------------------------------------------------------------------------

def test_kernels_run_on_the_given_stream() -> None:
    """Work goes on the stream it is handed: results are there after that stream's synchronize."""
    n = LARGE
    rng = np.random.default_rng(9)
    a, b = reduce_inputs("float32", n, rng), reduce_inputs("float32", n, rng)
    da, db, dd = DevBuf(4 * n, 0, a), DevBuf(4 * n, 0, b), DevBuf(4 * n, 0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    # The default stream is kept busy: work wrongly put there would still be waiting when the side
    # stream's copy below reads the result.
    torch.cuda._sleep(200_000_000)
    s = int(side.cuda_stream)
    _C.cuda.reduce(DTYPE_CODES["float32"], OP_CODES["sum"], dd.ptr, 0, da.ptr, db.ptr, n, 0, s)
    _C.cuda.synchronize(s)
    with torch.cuda.stream(side):
        got = dd.t[dd.lo:dd.lo + dd.nbytes].cpu().numpy().view(F32)
    want = np.empty_like(a)
    _C.testing.cpu_reduce(DTYPE_CODES["float32"], OP_CODES["sum"], want, a, b)
    assert_same(got, want, "f32", "reduce on a side stream")
    torch.cuda.synchronize()


def test_device_queries() -> None:
    assert _C.cuda.built()
    assert _C.cuda.device_count() == torch.cuda.device_count()
    assert _C.cuda.device_error() == ""
    dev = _C.cuda.get_device()
    assert 0 <= dev < _C.cuda.device_count()
    _C.cuda.set_device(dev)
    _C.cuda.synchronize(0)


def test_host_pointers_raise_and_leave_the_device_usable() -> None:
    n = 1024
    host = np.zeros(n, dtype=F32)
    dev = DevBuf(4 * n, 0, np.zeros(n, dtype=F32))
    with pytest.raises(InvalidUsageError, match="not device memory"):
        _C.cuda.reduce(0, 0, dev.ptr, 0, host.ctypes.data, dev.ptr, n, 0, stream())
    # the context is still good: a correct call after the error gives the right answer
    run_reduce(GPU, "float32", "sum", 4099, (0, 0, 0), with_dst2=False, divisor=0,
               rng=np.random.default_rng(1))
