"""pycoll's CUDA kernels, run on the CPU by an emulation of the CUDA execution model (for tests).

The kernels of ``csrc/cuda`` (reduce, the fp16 / bf16 / int8 / int4 codecs, the rotation) are compiled a
second time by the host compiler, unchanged, against a small emulation of CUDA threads, warps, blocks and
grids (``csrc/cuda/emulation``): grid-stride loops, head / vector / tail paths, vector loads and the warp
shuffles all execute, on every machine, GPU or not. The calling convention is the CPU codecs' (the
oracle the results must match bit for bit)::

    from pycoll.compression import Int8
    from pycoll.testing import emulated_kernels as ek

    codec = Int8(64)
    wire = ek.encode(codec, x, device={"sms": 1, "blocks_per_sm": 1, "order": "random", "seed": 3})
    assert (wire == codec.encode(x)).all()

``device`` is the emulated device and how its launches are scheduled (every key optional):

    sms, blocks_per_sm      what cudaDeviceGetAttribute / the occupancy calculator answer, so the grid
                            the kernels' launch code picks: {"sms": 1, "blocks_per_sm": 1} makes one
                            block loop over everything, a large device gives one item per thread
    max_threads_per_block   a device that refuses the kernels' 256 threads tests the launch's error
    order                   "in_order", "reversed" or "random": the order of blocks, of a block's threads,
                            and of the threads a warp operation releases
    seed                    of "random" (the same seed, the same schedule)

Defaults: 132 multiprocessors, 4 blocks each, 1024 threads per block, in order. A kernel that misuses a
warp operation (a lane of the mask exited or waits at another call site, a bad width or offset) raises
:class:`~pycoll.errors.PycollError` naming the threads and call sites, as does a configuration the device
cannot run. Launches run synchronously and one at a time per process.

The module exists where pycoll was built with the CUDA headers at hand (nvcc is not needed):
:func:`available` says whether it is, :func:`why_unavailable` why not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pycoll.arrays import as_buffer, op_code
from pycoll.codes import KIND_CODES, ROUNDING_CODES
from pycoll.compression.codecs import Codec, get_codec
from pycoll.errors import InvalidUsageError

#: Names of ``device["order"]``, in the native code's order (csrc/cuda/emulation/emulation.h ``Order``).
ORDERS = ("in_order", "reversed", "random")
#: The device and schedule when ``device`` leaves a key out.
DEFAULT_DEVICE: dict[str, Any] = {
    "sms": 132,
    "blocks_per_sm": 4,
    "max_threads_per_block": 1024,
    "order": "in_order",
    "seed": 0,
}
#: Codecs the GPU kernels implement.
KERNEL_CODECS = ("fp16", "bf16", "int8", "int4")

try:
    from pycoll import _emulated_kernels as _native_module
except ImportError as e:  # built without the CUDA headers
    _native_module = None  # type: ignore[assignment]
    _why = (
        f"pycoll was built without the emulated CUDA kernels ({e}): the CUDA toolkit's headers "
        "(cuda_runtime_api.h) were not found at build time; install the toolkit, or point CUDA_HOME at it, "
        "and rebuild"
    )
else:
    _why = ""


def available() -> bool:
    """Whether this pycoll was built with the emulated kernels."""
    return _native_module is not None


def why_unavailable() -> str:
    """Why :func:`available` is False (empty when it is True)."""
    return _why


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _count(x: Any, name: str, below: int) -> int:
    """An integer argument in [0, below), or InvalidUsageError naming it."""
    if not _is_int(x) or not 0 <= x < below:
        raise InvalidUsageError(f"{name} must be an integer in [0, {below}), got {x!r}")
    return int(x)


def device_config(device: Mapping[str, Any] | None) -> dict[str, Any]:
    """``device`` with the defaults filled in, checked (InvalidUsageError names what was expected)."""
    config = dict(DEFAULT_DEVICE)
    if device is not None:
        if not isinstance(device, Mapping):
            raise InvalidUsageError(f"device must be a dict of {', '.join(DEFAULT_DEVICE)}, got {device!r}")
        unknown = sorted(set(device) - set(DEFAULT_DEVICE))
        if unknown:
            raise InvalidUsageError(
                f"device has unknown keys {', '.join(map(repr, unknown))}; "
                f"expected {', '.join(DEFAULT_DEVICE)}"
            )
        config.update(device)
    for key in ("sms", "blocks_per_sm", "max_threads_per_block"):
        value = config[key]
        if not _is_int(value) or not 1 <= value < 2**31:
            raise InvalidUsageError(f"device[{key!r}] must be an integer in [1, 2**31), got {value!r}")
    if config["order"] not in ORDERS:
        raise InvalidUsageError(
            f"device['order'] must be one of {', '.join(ORDERS)}, got {config['order']!r}"
        )
    seed = config["seed"]
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise InvalidUsageError(f"device['seed'] must be an integer in [0, 2**64), got {seed!r}")
    return config


def native(device: Mapping[str, Any] | None = None) -> Any:
    """The native module (raw pointers, the calls of ``pycoll._C.cuda``) with ``device`` made this thread's
    emulated device."""
    if _native_module is None:
        raise InvalidUsageError(_why)
    c = device_config(device)
    _native_module.use_device(
        int(c["sms"]), int(c["blocks_per_sm"]), int(c["max_threads_per_block"]), ORDERS.index(c["order"]),
        int(c["seed"]),
    )
    return _native_module


def last_launch() -> dict[str, Any]:
    """This thread's last emulated launch: ``grid`` and ``block`` (x, y, z), ``ran``, and how many
    ``threads`` ran to the end, ``warp_ops`` and ``barriers`` completed and fiber ``switches`` made."""
    if _native_module is None:
        raise InvalidUsageError(_why)
    return dict(_native_module.last_launch())


def _kernel_codec(codec: Any) -> tuple[Codec, int, int, int]:
    c = get_codec(codec)
    if c is None or c.kind not in KERNEL_CODECS:
        raise InvalidUsageError(
            f"the CUDA kernels implement the codecs {', '.join(KERNEL_CODECS)}, got {codec!r}"
        )
    block = int(getattr(c, "block", 0))
    return c, KIND_CODES[c.kind], block, ROUNDING_CODES[c.rounding]


def _floats(x: Any, name: str, n: int, *, writable: bool) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous or x.size != n:
        raise InvalidUsageError(f"{name} must be a C-contiguous float32 numpy array of {n} elements")
    if writable and not x.flags.writeable:
        raise InvalidUsageError(f"{name} is read-only, but it is updated in place")
    return x


def encode(codec: Any, x: Any, residual: np.ndarray | None = None, *, index: int = 0, key: int = 0,
           device: Mapping[str, Any] | None = None) -> np.ndarray:
    """``codec.encode(x, residual, index=index, key=key)`` by the emulated kernels: the wire bytes (and
    ``residual`` updated in place when given)."""
    c, kind, block, rounding = _kernel_codec(codec)
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(c.encoded_bytes(src.size), dtype=np.uint8)
    res = None if residual is None else _floats(residual, "residual", src.size, writable=True)
    index, key = _count(index, "index", 2**64), _count(key, "key", 2**32)
    native(device).encode(kind, block, rounding, src.ctypes.data, out.ctypes.data, src.size,
                          residual=0 if res is None else res.ctypes.data, index=index, key=key)
    return out


def decode(codec: Any, data: Any, n: int, *, acc: np.ndarray | None = None,
           device: Mapping[str, Any] | None = None) -> np.ndarray:
    """``codec.decode(data, n, acc=acc)`` by the emulated kernels: ``n`` float32 values (added to ``acc``
    when given) in a new array."""
    c, kind, block, rounding = _kernel_codec(codec)
    n = _count(n, "n", 2**63)
    wire = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if wire.size < c.encoded_bytes(n):
        raise InvalidUsageError(f"data holds {wire.size} bytes, {n} elements need {c.encoded_bytes(n)}")
    dst = np.empty(n, dtype=np.float32)
    acc_in = None
    if acc is not None:
        acc_in = np.ascontiguousarray(acc, dtype=np.float32).reshape(-1)
        if acc_in.size != n:
            raise InvalidUsageError(f"acc must hold n = {n} values, got {acc_in.size}")
    native(device).decode(kind, block, rounding, wire.ctypes.data, dst.ctypes.data, n,
                          acc=0 if acc_in is None else acc_in.ctypes.data)
    return dst


def reduce(op: str, inputs: Sequence[Any], out: Any, *, device: Mapping[str, Any] | None = None) -> Any:
    """``out = inputs[0] (+) inputs[1] (+) ...`` by the emulated reduce kernel, one launch per input after
    the first two, as the executor chains them; ``avg`` divides by ``len(inputs)`` in the last launch (the
    finalize step of an average). Host arrays (numpy, torch CPU) of one dtype and size; ``out`` may be
    ``inputs[0]`` or ``inputs[1]`` (the first launch reads both before it writes), but may overlap no other
    input. Returns ``out``."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or len(inputs) < 2:
        raise InvalidUsageError("inputs must be a sequence of at least two arrays")
    dst = as_buffer(out, "out", writable=True)
    srcs = [as_buffer(x, f"inputs[{i}]", writable=False) for i, x in enumerate(inputs)]
    for name, buf in [("out", dst)] + [(f"inputs[{i}]", b) for i, b in enumerate(srcs)]:
        if buf.on_gpu:
            raise InvalidUsageError(f"{name} is on {buf.where()}; the emulated kernels run on host memory")
        if buf.dtype != dst.dtype or buf.count != dst.count:
            raise InvalidUsageError(
                f"{name} holds {buf.count} {buf.dtype} values, out holds {dst.count} {dst.dtype}: "
                "they must agree"
            )
    for i, b in enumerate(srcs):
        same = b.ptr == dst.ptr and i < 2
        if dst.overlaps(b) and not same:
            raise InvalidUsageError(
                f"out overlaps inputs[{i}]: out may be inputs[0] or inputs[1] itself, and no part of another "
                "input (the launches before would have written over it)"
            )
    code = op_code(op, dst)
    divisor = len(srcs) if op.lower() == "avg" else 0
    kernels = native(device)
    a = srcs[0].ptr
    for k, b in enumerate(srcs[1:], start=2):
        kernels.reduce(dst.code, code, dst.ptr, 0, a, b.ptr, dst.count, divisor if k == len(srcs) else 0)
        a = dst.ptr
    return out


def rotate(x: Any, part: int, block: int, *, inverse: bool = False,
           device: Mapping[str, Any] | None = None) -> np.ndarray:
    """``pycoll.compression.rotate(x, [part] * (x.size // part), block, inverse)`` by the emulated rotate
    kernel (parts of one size, as on GPU memory): a rotated copy of float32 ``x``."""
    out = np.array(x, dtype=np.float32, copy=True).reshape(-1)
    part, block = _count(part, "part", 2**63), _count(block, "block", 2**32)
    if out.size and (part < 1 or out.size % part):
        raise InvalidUsageError(f"x holds {out.size} values, not a whole number of parts of {part}")
    native(device).rotate(out.ctypes.data, out.size, max(part, 1), block, bool(inverse))
    return out
