"""The CUDA kernels executed on the CPU (pycoll.testing.emulated_kernels): the real csrc/cuda sources run by
an emulation of the CUDA execution model, held to the CPU codecs and reduce loops bit for bit.

- Every check of tests/gpu/test_kernels.py that needs no real device (:class:`kernel_checks.KernelChecks`,
  the same assertions) runs here on two emulated devices: one block of 256 threads, which makes every
  grid-stride loop go round many times, and a large device in a seeded random order, which gives one
  work item per thread (so the grid's edges, the partial last block and the scalar tails meet there).
- The device shape reaches the kernels' launch code (grid sizes follow it; its per-device caches follow a
  change of shape), warp shuffles run as warp operations, and every schedule gives the same bits.
- A configuration the device cannot run raises pycoll's error naming the kernel and the configuration,
  and writes nothing.
- The Python calls take the CPU codecs' convention (codec, arrays) and check their arguments.

The emulation's own faults (a lane that exits or waits elsewhere, bad widths...) need deliberately broken
kernels: tests/kernels/selftest.cc has them, and the sanitizer sweep (tests/kernels/sweep.cc) runs the
kernels at every alignment against guard pages; .ci/run builds and runs both.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from kernel_checks import LARGE, POISON, HostBuf, KernelChecks, assert_same, codec_data, reduce_inputs

from pycoll import _C
from pycoll.arrays import DTYPE_CODES, OP_CODES
from pycoll.compression import BF16, FP16, Int4, Int8
from pycoll.errors import InvalidUsageError, PycollError
from pycoll.testing import emulated_kernels as ek


def cuda_headers() -> list[str]:
    """Where the build looks for cuda_runtime_api.h (cmake/PycollEmulation.cmake)."""
    roots = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")]
    roots += ["/usr/local/cuda", "/opt/cuda", "/usr"]
    subdirs = ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include")
    found = [os.path.join(r, d, "cuda_runtime_api.h") for r in roots if r for d in subdirs]
    return [h for h in found if os.path.exists(h)]


def test_built_wherever_cuda_was() -> None:
    """A build that found nvcc or the CUDA headers has the emulated kernels too: a silent build without them
    would turn every test below into a skip."""
    if not (_C.cuda.built() or cuda_headers()):
        pytest.skip("no CUDA headers on this machine, so no emulated kernels are expected")
    assert ek.available(), ek.why_unavailable()


needs_emulation = pytest.mark.skipif(not ek.available(), reason=ek.why_unavailable() or "available")

#: The emulated devices every kernel check runs on.
DEVICES: dict[str, dict[str, Any]] = {
    "one-block": {"sms": 1, "blocks_per_sm": 1, "order": "in_order"},
    "wide-random": {"sms": 4096, "blocks_per_sm": 8, "order": "random", "seed": 3},
}


class EmulatedKernels:
    """pycoll._emulated_kernels on host memory, on one emulated device (kernel_checks.Kernels)."""

    def __init__(self, device: dict[str, Any]) -> None:
        self.device = device

    def buf(self, nbytes: int, offset: int = 0, fill: np.ndarray | None = None,
            poison: int = POISON) -> HostBuf:
        return HostBuf(nbytes, offset, fill, poison)

    def reduce(self, dtype: int, op: int, dst: int, dst2: int, a: int, b: int, n: int,
               avg_divisor: int) -> None:
        ek.native(self.device).reduce(dtype, op, dst, dst2, a, b, n, avg_divisor)

    def encode(self, kind: int, block: int, rounding: int, src: int, out: int, n: int, **kw: Any) -> None:
        ek.native(self.device).encode(kind, block, rounding, src, out, n, **kw)

    def decode(self, kind: int, block: int, rounding: int, data: int, dst: int, n: int, **kw: Any) -> None:
        ek.native(self.device).decode(kind, block, rounding, data, dst, n, **kw)

    def rotate(self, x: int, n: int, part: int, block: int, inverse: bool) -> None:
        ek.native(self.device).rotate(x, n, part, block, inverse)


@needs_emulation
class TestEmulatedKernels(KernelChecks):
    @pytest.fixture(params=list(DEVICES))
    def kernels(self, request: pytest.FixtureRequest) -> EmulatedKernels:
        return EmulatedKernels(DEVICES[request.param])


# ---- the emulated device and schedule -------------------------------------------------------------------

def reduce_f32(n: int, device: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(n)
    a, b = reduce_inputs("float32", n, rng), reduce_inputs("float32", n, rng)
    out = np.empty_like(a)
    ek.reduce("sum", [a, b], out, device=device)
    want = np.empty_like(a)
    _C.testing.cpu_reduce(DTYPE_CODES["float32"], OP_CODES["sum"], want, a, b)
    assert_same(out, want, "f32", f"reduce of {n} on {device}")
    return ek.last_launch()


@needs_emulation
def test_the_device_shape_decides_the_grid() -> None:
    """One SM holding one block: a single block strides over a million elements. A large device: one
    work item (two 16-byte vectors of a and b) per thread. Shapes alternate, so launch.cuh's per-device
    caches of SM count and occupancy must follow the device (each shape is its own ordinal)."""
    items = -(-(LARGE // 4) // 2)  # vector pairs of float32
    for _ in range(2):
        small = reduce_f32(LARGE, {"sms": 1, "blocks_per_sm": 1})
        assert small["grid"] == (1, 1, 1) and small["block"] == (256, 1, 1) and small["threads"] == 256
        wide = reduce_f32(LARGE, {"sms": 1000, "blocks_per_sm": 8})
        assert wide["grid"] == (-(-items // 256), 1, 1)
        capped = reduce_f32(LARGE, {"sms": 3, "blocks_per_sm": 2})
        assert capped["grid"] == (6, 1, 1), "a full wave of resident blocks, no more"


@needs_emulation
@pytest.mark.parametrize("codec, shuffles", [(Int8(64), True), (Int4(4096), True), (Int8(8), False),
                                             (FP16(), False), (BF16(), False)])
def test_block_codecs_run_their_warp_shuffles(codec: Any, shuffles: bool) -> None:
    """int8 / int4 blocks of more than 4 quads take a group of lanes, which combine their absmax with
    __shfl_xor_sync: those run as warp operations (fibers switching); casts and one-lane groups have none."""
    x = codec_data(3000, 64, np.random.default_rng(2))
    assert np.array_equal(ek.encode(codec, x, device={"sms": 2}), codec.encode(x))
    launch = ek.last_launch()
    assert launch["ran"] and launch["threads"] == launch["grid"][0] * 256
    if shuffles:
        assert launch["warp_ops"] > 0 and launch["switches"] > 2 * launch["warp_ops"]
    else:
        assert launch["warp_ops"] == 0


@needs_emulation
def test_every_schedule_gives_the_same_bits() -> None:
    codec = Int4(32, rounding="stochastic", seed=9)
    x = codec_data(20011, 32, np.random.default_rng(4))
    want = codec.encode(x, index=32 * 7, key=99)
    for order in ek.ORDERS:
        for seed in (0, 1, 2):
            device = {"sms": 7, "blocks_per_sm": 3, "order": order, "seed": seed}
            got = ek.encode(codec, x, index=32 * 7, key=99, device=device)
            assert np.array_equal(got, want), (order, seed)


@needs_emulation
def test_a_configuration_the_device_cannot_run_raises_and_writes_nothing() -> None:
    """As on a GPU: cudaErrorInvalidConfiguration from the launch, turned into pycoll's error naming the
    kernel and its configuration; no thread ran."""
    n = 5000
    x = codec_data(n, 64, np.random.default_rng(6))
    src, out = HostBuf(4 * n, 0, x), HostBuf(Int8(64).encoded_bytes(n))
    small = ek.native({"max_threads_per_block": 128})
    with pytest.raises(PycollError, match=r"cudaErrorInvalidConfiguration.*encode\(int8\(block=64\)\) "
                                          r"with grid \(\d+, 1, 1\), block \(256, 1, 1\)") as info:
        small.encode(3, 64, 0, src.ptr, out.ptr, n)
    assert "more than the device's 128" in str(info.value)
    assert not ek.last_launch()["ran"]
    assert (out.get() == POISON).all(), "a refused launch wrote"
    with pytest.raises(PycollError, match=r"reduce\(float64, max\)"):
        small.reduce(DTYPE_CODES["float64"], OP_CODES["max"], src.ptr, 0, src.ptr, src.ptr, n // 2, 0)
    # the same call on a device that can run it
    ek.native({}).encode(3, 64, 0, src.ptr, out.ptr, n)
    assert np.array_equal(out.get(), Int8(64).encode(x))


# ---- the Python calls ------------------------------------------------------------------------------------

@needs_emulation
@pytest.mark.parametrize("codec", [FP16(), BF16(), Int8(64), Int4(24, rounding="stochastic", seed=5)],
                         ids=repr)
def test_calls_take_the_cpu_codecs_convention(codec: Any) -> None:
    rng = np.random.default_rng(8)
    n = 4099
    x = codec_data(n, 64, rng)
    res_cpu = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    res_emu = res_cpu.copy()
    wire = ek.encode(codec, x, res_emu, index=codec.block_elems * 3, key=5, device={"order": "reversed"})
    assert np.array_equal(wire, codec.encode(x, res_cpu, index=codec.block_elems * 3, key=5))
    assert np.array_equal(res_emu.view(np.uint32), res_cpu.view(np.uint32)), "the residual, updated in place"
    acc = rng.standard_normal(n).astype(np.float32)
    got = ek.decode(codec, wire, n, acc=acc, device={"sms": 1, "blocks_per_sm": 1})
    assert np.array_equal(got.view(np.uint32), codec.decode(wire, n, acc=acc).view(np.uint32))
    assert np.array_equal(ek.decode(codec, wire, n).view(np.uint32), codec.decode(wire, n).view(np.uint32))


@needs_emulation
def test_reduce_chains_inputs_and_averages_in_the_last_launch() -> None:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(1001).astype(np.float32) for _ in range(4)]
    out = np.empty(1001, dtype=np.float32)
    assert ek.reduce("avg", xs, out) is out
    want = np.empty_like(out)
    _C.testing.cpu_reduce(DTYPE_CODES["float32"], OP_CODES["sum"], want, xs[0], xs[1])
    _C.testing.cpu_reduce(DTYPE_CODES["float32"], OP_CODES["sum"], want, want, xs[2])
    _C.testing.cpu_reduce(DTYPE_CODES["float32"], OP_CODES["sum"], want, want, xs[3], 4)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    ints = [np.arange(10, dtype=np.int64) * k for k in (1, 2, 3)]
    ek.reduce("prod", ints, ints[0])
    assert (ints[0] == np.arange(10) ** 3 * 6).all(), "in place into the first input"
    ints = [np.arange(10, dtype=np.int64) * k for k in (1, 2, 3)]
    ek.reduce("sum", ints, ints[1])
    assert (ints[1] == np.arange(10) * 6).all(), "in place into the second input"


@needs_emulation
def test_reduce_refuses_an_out_that_later_inputs_share() -> None:
    """The first launch writes out before the third input is read: out may not be (part of) it, nor
    straddle the first two."""
    xs = [np.ones(8, dtype=np.float32) * k for k in (1, 2, 3)]
    with pytest.raises(InvalidUsageError, match=r"out overlaps inputs\[2\]"):
        ek.reduce("sum", xs, xs[2])
    whole = np.ones(9, dtype=np.float32)
    with pytest.raises(InvalidUsageError, match=r"out overlaps inputs\[0\]"):
        ek.reduce("sum", [whole[1:], xs[1]], whole[:-1])
    assert (xs[2] == 3).all() and (whole == 1).all(), "nothing was written"


@needs_emulation
def test_bad_arguments_name_what_was_expected() -> None:
    x = np.ones(16, dtype=np.float32)
    with pytest.raises(InvalidUsageError, match="unknown keys 'sm'"):
        ek.encode(Int8(64), x, device={"sm": 1})
    with pytest.raises(InvalidUsageError, match="order.*in_order, reversed, random"):
        ek.encode(Int8(64), x, device={"order": "backwards"})
    with pytest.raises(InvalidUsageError, match=r"device\['sms'\] must be an integer in \[1, "):
        ek.encode(Int8(64), x, device={"sms": 0})
    with pytest.raises(InvalidUsageError, match="max_threads_per_block must be in"):
        ek.encode(Int8(64), x, device={"max_threads_per_block": 2048})
    with pytest.raises(InvalidUsageError, match="implement the codecs fp16, bf16, int8, int4"):
        ek.encode(None, x)
    with pytest.raises(InvalidUsageError, match="residual must be a C-contiguous float32"):
        ek.encode(Int8(64), x, np.zeros(15, dtype=np.float32))
    with pytest.raises(InvalidUsageError, match="data holds 3 bytes, 16 elements need 20"):
        ek.decode(Int8(64), np.zeros(3, dtype=np.uint8), 16)
    with pytest.raises(InvalidUsageError, match=r"n must be an integer in \[0, "):
        ek.decode(Int8(64), np.zeros(40, dtype=np.uint8), 16.5)
    with pytest.raises(InvalidUsageError, match="acc must hold n = 16 values, got 15"):
        ek.decode(Int8(64), np.zeros(40, dtype=np.uint8), 16, acc=np.zeros(15))
    with pytest.raises(InvalidUsageError, match=r"key must be an integer in \[0, 4294967296\)"):
        ek.encode(Int8(64), x, key=2**32)
    with pytest.raises(InvalidUsageError, match="index must be an integer"):
        ek.encode(Int8(64), x, index=-64)
    with pytest.raises(InvalidUsageError, match=r"blocks_per_sm'\] must be an integer in \[1, 2\*\*31\)"):
        ek.encode(Int8(64), x, device={"blocks_per_sm": 2**31})
    with pytest.raises(InvalidUsageError, match="at least two arrays"):
        ek.reduce("sum", [x], x)
    with pytest.raises(InvalidUsageError, match="inputs.1. holds 8 float32 values, out holds 16"):
        ek.reduce("sum", [x, x[:8]], x)
    with pytest.raises(InvalidUsageError, match="op 'avg' needs a floating-point dtype"):
        ints = np.zeros(4, dtype=np.int32)
        ek.reduce("avg", [ints, ints], ints)
