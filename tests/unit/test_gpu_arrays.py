"""GPU memory as pycoll sees it, and the errors of the GPU path that need no GPU to check.

Objects with ``__cuda_array_interface__`` are faked here (CuPy and numba are not needed): what is
checked is how pycoll reads the interface and what it refuses before anything is enqueued. The GPU runs
themselves are in tests/gpu/.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycoll import _C
from pycoll.arrays import HOST, as_buffer
from pycoll.errors import InvalidUsageError


class _Device:
    def __init__(self, id: int) -> None:
        self.id = id


class FakeDeviceArray:
    """What CuPy exposes: the interface (version 3) and ``.device.id``."""

    def __init__(
        self,
        shape=(10,),
        typestr="<f4",
        ptr=0x7F0000000000,
        readonly=False,
        strides=None,
        stream=None,
        device: int | None = 0,
    ) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, readonly),
            "strides": strides,
            "version": 3,
        }
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream
        if device is not None:
            self.device = _Device(device)


needs_cuda_build = pytest.mark.skipif(not _C.gpu.built, reason="this pycoll was built without CUDA (no nvcc)")


@needs_cuda_build
def test_device_array_is_described_without_touching_its_memory():
    buf = as_buffer(FakeDeviceArray(shape=(3, 4), typestr="<f2", device=1), "x", writable=True)
    assert (buf.ptr, buf.count, buf.dtype, buf.itemsize, buf.device, buf.stream) == (
        0x7F0000000000,
        12,
        "float16",
        2,
        1,
        0,
    )
    assert buf.on_gpu and buf.where() == "cuda:1"


@needs_cuda_build
@pytest.mark.parametrize("stream,handle", [(None, 0), (1, 0), (2, 2), (0x55AA00, 0x55AA00)])
def test_the_interfaces_stream_becomes_the_stream_work_is_enqueued_on(stream, handle):
    assert as_buffer(FakeDeviceArray(stream=stream), "x", writable=True).stream == handle


@needs_cuda_build
def test_a_pointer_that_is_not_device_memory_is_refused():
    # No device attribute: pycoll asks CUDA where the pointer lives; host (or no driver) is refused.
    fake = FakeDeviceArray(ptr=np.zeros(4, np.float32).ctypes.data, device=None)
    with pytest.raises(InvalidUsageError, match="not on a CUDA device"):
        as_buffer(fake, "x", writable=True)


@pytest.mark.skipif(_C.gpu.built, reason="checks the build without CUDA")
def test_without_cuda_build_gpu_memory_is_refused_with_the_reason():
    with pytest.raises(InvalidUsageError, match="built without CUDA"):
        as_buffer(FakeDeviceArray(), "x", writable=True)


@needs_cuda_build
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"typestr": "<c8"}, "supported dtypes are"),
        ({"shape": (4, 4), "strides": (4, 16)}, "C-contiguous"),
        ({"readonly": True}, "read-only"),
    ],
)
def test_bad_device_arrays_are_refused_before_anything_runs(kwargs, match):
    with pytest.raises(InvalidUsageError, match=match):
        as_buffer(FakeDeviceArray(**kwargs), "x", writable=True)


@needs_cuda_build
def test_contiguous_strides_and_readonly_inputs_are_accepted():
    buf = as_buffer(FakeDeviceArray(shape=(4, 4), strides=(16, 4), readonly=True), "x", writable=False)
    assert buf.count == 16 and buf.device == 0


def test_host_arrays_stay_host():
    buf = as_buffer(np.zeros(3, np.float32), "x", writable=True)
    assert buf.device == HOST and not buf.on_gpu and buf.where() == "cpu"


def test_torch_tensors_on_other_devices_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidUsageError, match="CPU and CUDA memory only"):
        as_buffer(torch.empty(4, device="meta"), "x", writable=True)


@pytest.fixture
def one_rank(one_rank_comm):
    return one_rank_comm


def test_nccl_algorithm_needs_gpu_memory(one_rank):
    import pycoll

    with pytest.raises(InvalidUsageError, match="algorithm='nccl' runs on GPU memory"):
        pycoll.allreduce(np.ones(4, np.float32), algorithm="nccl", comm=one_rank)
    assert pycoll.allreduce(np.ones(4, np.float32), comm=one_rank).tolist() == [1.0] * 4  # still usable


@needs_cuda_build
def test_gpu_collective_without_a_usable_device_says_why(one_rank):
    import pycoll

    if _C.cuda.device_count() > 0:
        pytest.skip("a GPU is present: tests/gpu covers this path")
    with pytest.raises(InvalidUsageError, match="no CUDA device is usable"):
        pycoll.allreduce(FakeDeviceArray(), comm=one_rank)
    x = np.arange(4, dtype=np.float32)
    with pytest.raises(InvalidUsageError, match="same place"):
        pycoll.all_gather(FakeDeviceArray(shape=(4,)), x, comm=one_rank)
    assert pycoll.allreduce(x, comm=one_rank) is x  # an InvalidUsageError leaves the communicator usable
