# Type stubs for the native module built from csrc/python/module.cc.
from typing import Any

import numpy as np

COLLECTIVES: list[str]
ALGORITHMS: list[str]
ERROR_KINDS: dict[str, int]

def reduce_isa() -> str: ...
def hardware_concurrency() -> int: ...
def array_address(obj: np.ndarray) -> int: ...

def codec_isa() -> str: ...
def rounding_key(seed: int, rank: int, seq: int) -> int: ...
def builtin_codec(kind: int, block: int, rounding: int) -> Codec: ...
def user_codec(
    name: str, block_elems: int, block_bytes: int, tail_bytes: list[int], encode: int, decode: int
) -> Codec: ...

class Codec:
    @property
    def block_elems(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def name(self) -> str: ...
    def encoded_bytes(self, n: int) -> int: ...
    def encode(
        self,
        src: np.ndarray,
        out: np.ndarray,
        residual: np.ndarray | None = None,
        residual_scale: float = 1.0,
        decoded: np.ndarray | None = None,
        index: int = 0,
        key: int = 0,
    ) -> None: ...
    def decode(
        self,
        data: np.ndarray,
        dst: np.ndarray,
        acc: np.ndarray | None = None,
        residual: np.ndarray | None = None,
        divisor: int = 0,
    ) -> None: ...

class NativePlan:
    def __init__(
        self,
        table: np.ndarray,
        starts: np.ndarray,
        itemsize: int,
        input_count: int,
        output_count: int,
        rank: int,
        world: int,
    ) -> None: ...
    @property
    def num_ops(self) -> int: ...
    @property
    def num_steps(self) -> int: ...

class GroupedProgram:
    def __init__(
        self,
        plan: NativePlan,
        actions: np.ndarray,
        msg_bytes: np.ndarray,
        recv_stage: np.ndarray,
        send_stage: np.ndarray,
        work_stage: np.ndarray,
        staging_bytes: int,
    ) -> None: ...
    @property
    def num_actions(self) -> int: ...
    @property
    def staging_bytes(self) -> int: ...

class NativeCommunicator:
    def __init__(
        self,
        rank: int,
        world: int,
        slot_bytes: int,
        slots: int,
        spin_ns: int,
        yield_ns: int,
        stream_min_bytes: int,
    ) -> None: ...
    @property
    def segment_fd(self) -> int: ...
    @property
    def segment_bytes(self) -> int: ...
    @property
    def fragment_bytes(self) -> int: ...
    @property
    def seq(self) -> int: ...
    def connect(self, pids: list[int], fds: list[int]) -> None: ...
    def close_segment_fd(self) -> None: ...
    def run(
        self,
        plan: NativePlan,
        input: int,
        output: int,
        dtype: int,
        op: int,
        collective: int,
        algorithm: int,
        count: int,
        root: int,
        codec: Codec | None,
        codec_id: int,
        residual: int,
        seed: int,
        timeout_s: float,
        program: GroupedProgram | None = None,
    ) -> None: ...
    def abort(self, kind: int, message: str) -> None: ...

class _GpuEvent:
    def __init__(self) -> None: ...
    def record(self, stream: int) -> None: ...
    def query(self) -> bool: ...
    def block(self, stream: int) -> None: ...

class _GpuCommunicator:
    def __init__(self, nccl_comm: Any) -> None: ...
    @property
    def seq(self) -> int: ...
    def run(
        self,
        plan: NativePlan,
        program: GroupedProgram,
        input: int,
        output: int,
        dtype: int,
        op: int,
        collective: int,
        algorithm: int,
        count: int,
        root: int,
        codec_id: int,
        codec_kind: int,
        codec_block: int,
        codec_rounding: int,
        block_elems: int,
        block_bytes: int,
        encoded_bytes: int,
        residual: int,
        seed: int,
        stream: int,
    ) -> None: ...

class _GpuModule:
    built: bool
    Event: type[_GpuEvent]
    GpuCommunicator: type[_GpuCommunicator]
    @staticmethod
    def pointer_device(ptr: int) -> int: ...

gpu: _GpuModule
