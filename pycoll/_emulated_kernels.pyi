# Type stubs for the native module built from csrc/python/emulated/module.cc (pycoll.testing.emulated_kernels
# is its Python face). Pointers and streams are ints; the stream is accepted and not used.
from typing import Any

def use_device(sms: int, blocks_per_sm: int, max_threads_per_block: int, order: int, seed: int) -> int: ...
def last_launch() -> dict[str, Any]: ...
def reduce(
    dtype: int, op: int, dst: int, dst2: int, a: int, b: int, n: int, avg_divisor: int = 0, stream: int = 0
) -> None: ...
def encode(
    kind: int,
    block: int,
    rounding: int,
    src: int,
    out: int,
    n: int,
    residual: int = 0,
    residual_scale: float = 1.0,
    decoded: int = 0,
    out2: int = 0,
    index: int = 0,
    key: int = 0,
    stream: int = 0,
) -> None: ...
def decode(
    kind: int,
    block: int,
    rounding: int,
    data: int,
    dst: int,
    n: int,
    acc: int = 0,
    residual: int = 0,
    divisor: int = 0,
    stream: int = 0,
) -> None: ...
def rotate(x: int, n: int, part: int, block: int, inverse: bool = False, stream: int = 0) -> None: ...
