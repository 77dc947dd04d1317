# Type stubs for the native module built from csrc/python/module.cc.
from typing import Any

import numpy as np

COLLECTIVE_NAMES: list[str]
ALGORITHM_NAMES: list[str]
ERROR_KINDS: dict[str, int]

def reduce_isa() -> str: ...
def array_address(obj: np.ndarray) -> int: ...
def codec_isa() -> str: ...

# The flight recorder and probes (csrc/python/bind_trace.cc; pycoll/flight/).
TRACE_WITH_STACKS: int
TRACE_WITH_MEMBERS: int
def trace_configure(capacity: int) -> None: ...
def trace_set_on(on: bool) -> None: ...
def trace_on() -> bool: ...
def trace_comm_id(info: str, members: str) -> int: ...
def trace_enqueue(comm: NativeCommunicator, call: Call) -> int: ...
def trace_begin(
    comm: int, collective: int, algorithm: int, dtype: int, op: int, count: int, root: int, codec: int,
    seq: int,
) -> int: ...
def trace_end(ticket: int, ok: bool) -> None: ...
def trace_call_site() -> str: ...
def trace_internal_paths(prefixes: list[str]) -> None: ...
def trace_report(records: int, flags: int = 0) -> str: ...
def trace_start_stacks(main_tid: int, main_ident: int) -> None: ...
def trace_stop_stacks() -> None: ...
def probe_body(records: int, flags: int, secret: bytes, challenge: str) -> bytes: ...
def skew_bucket(ns: int) -> int: ...
def skew_bucket_floor(bucket: int) -> int: ...
def rounding_key(seed: int, rank: int, seq: int) -> int: ...
def rotate(x: np.ndarray, parts: np.ndarray, block: int, inverse: bool) -> None: ...
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
        coded: bool = False,
        distinct: bool = False,
        result_off: int = 0,
        result_count: int = 0,
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
    def staging_bytes(self) -> int: ...

class Call:
    """One collective on host memory (csrc/engine/communicator.h Call)."""

    plan: NativePlan | None
    input: int
    output: int
    dtype: int
    op: int
    collective: int
    algorithm: int
    count: int
    root: int
    codec: Codec | None
    codec_id: int
    residual: int
    seed: int
    rotation_block: int
    rotate_input: list[int]
    rotate_output: list[int]
    exact_src: int
    exact_dst: int
    exact_count: int
    timeout_s: float
    program: GroupedProgram | None
    skew: bool
    gpu: _GpuCommunicator | None  # builds with CUDA only: a host-staged collective on GPU memory
    device: _GpuCall
    def __init__(
        self,
        *,
        plan: NativePlan | None = None,
        input: int = 0,
        output: int = 0,
        dtype: int = 0,
        op: int = 0,
        collective: int = 0,
        algorithm: int = 0,
        count: int = 0,
        root: int = 0,
        codec: Codec | None = None,
        codec_id: int = 0,
        residual: int = 0,
        seed: int = 0,
        rotation_block: int = 0,
        rotate_input: list[int] | None = None,
        rotate_output: list[int] | None = None,
        exact_src: int = 0,
        exact_dst: int = 0,
        exact_count: int = 0,
        timeout_s: float = 0.0,
        program: GroupedProgram | None = None,
        skew: bool = True,
        gpu: _GpuCommunicator | None = None,
        device: _GpuCall | None = None,
    ) -> None: ...

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
        tcp_bind: str = "",
        local: list[bool] = ...,
        skew: bool = True,
        skew_window: int = 1024,
        clock_offset_ns: int = 0,
    ) -> None: ...
    @property
    def segment_fd(self) -> int: ...
    fuse: bool
    @property
    def tcp_port(self) -> int: ...
    def set_tcp_peers(self, addresses: list[str], key: bytes, dial_timeout_s: float) -> None: ...
    @property
    def segment_bytes(self) -> int: ...
    @property
    def fragment_bytes(self) -> int: ...
    @property
    def seq(self) -> int: ...
    def set_shm_peers(self, pids: list[int], fds: list[int]) -> None: ...
    def shm_mapped_peers(self) -> list[int]: ...
    def run(self, call: Call, input: int, output: int, ticket: int = 0) -> int: ...
    def ranks_not_entered(self, seq: int) -> list[int]: ...
    trace_comm: int
    def run_in_place(self, call: Call, array: Any) -> int: ...
    def wait_stats(self) -> dict[str, int]: ...
    def skew_snapshot(self) -> dict[str, Any]: ...
    def skew_flush(self) -> None: ...
    def skew_set_domains(self, domains: list[int]) -> None: ...
    def skew_add_notice(self, late_ns: int, window: int) -> int: ...
    def skew_remove_notice(self, id: int) -> None: ...
    def skew_take_events(self) -> list[tuple[int, int, int, int, int, int]]: ...
    @property
    def skew_enabled(self) -> bool: ...
    def skew_set_recording(self, on: bool) -> None: ...
    def abort(self, kind: int, message: str) -> None: ...

class _GpuEvent:
    def __init__(self) -> None: ...
    def record(self, stream: int) -> None: ...
    def query(self) -> bool: ...
    def block(self, stream: int) -> None: ...

class _GpuCall:
    input: int
    output: int
    dtype: int
    op: int
    collective: int
    algorithm: int
    count: int
    root: int
    codec_id: int
    codec_kind: int
    codec_block: int
    codec_rounding: int
    block_elems: int
    block_bytes: int
    residual: int
    seed: int
    rotation_block: int
    rotate_input_part: int
    rotate_output_part: int
    exact_src: int
    exact_dst: int
    exact_count: int
    stream: int
    def __init__(self) -> None: ...

class _GpuCommunicator:
    def __init__(self, nccl_comm: Any = ...) -> None: ...
    def run(self, plan: NativePlan, program: GroupedProgram, call: _GpuCall) -> None: ...

class _GpuModule:
    built: bool
    Event: type[_GpuEvent]
    Call: type[_GpuCall]
    GpuCommunicator: type[_GpuCommunicator]
    @staticmethod
    def pointer_device(ptr: int) -> int: ...

gpu: _GpuModule

class _NcclComm:
    """pycoll._C.nccl.Comm: one rank of a (non-blocking) NCCL communicator on the current CUDA device."""

    def __init__(self, unique_id: bytes, world: int, rank: int, timeout_s: float) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def aborted(self) -> bool: ...
    @property
    def destroyed(self) -> bool: ...
    def all_reduce(self, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> None: ...
    def reduce_scatter(
        self, send: int, recv: int, recv_count: int, dtype: int, op: int, stream: int
    ) -> None: ...
    def all_gather(self, send: int, recv: int, send_count: int, dtype: int, stream: int) -> None: ...
    def broadcast(self, send: int, recv: int, count: int, dtype: int, root: int, stream: int) -> None: ...
    def send(self, buf: int, bytes: int, peer: int, stream: int) -> None: ...
    def recv(self, buf: int, bytes: int, peer: int, stream: int) -> None: ...
    def check_async(self) -> None: ...
    def abort(self) -> None: ...
    def destroy(self) -> None: ...

class _NcclModule:
    """pycoll._C.nccl (csrc/python/bind_nccl.cc); without CUDA, built() is False and the rest raises."""

    Comm: type[_NcclComm]
    @staticmethod
    def built() -> bool: ...
    @staticmethod
    def load(path: str) -> None: ...
    @staticmethod
    def is_loaded() -> bool: ...
    @staticmethod
    def loaded_path() -> str: ...
    @staticmethod
    def version() -> int: ...
    @staticmethod
    def unique_id() -> bytes: ...
    @staticmethod
    def group_start() -> None: ...
    @staticmethod
    def group_end() -> None: ...

nccl: _NcclModule

class ControlListener:
    """csrc/fault/listener.h: the process's control socket (pycoll/fault/listener.py)."""

    def __init__(self, bind: str, secret: bytes) -> None: ...
    @property
    def port(self) -> int: ...
    def forget(self, plane: str) -> None: ...
    def next_join(self, timeout_s: float) -> tuple[int, str, bytes] | None: ...

class ControlLinks:
    """csrc/fault/links.h: one rank's links of a fault plane (pycoll/fault/plane.py)."""

    def __init__(
        self,
        listener: ControlListener,
        rank: int,
        world: int,
        plane: str,
        token: str,
        heartbeat_timeout_s: float,
        addresses: list[str],
        answer_timeout_s: float = 0.0,
        peers: list[int] = ...,
    ) -> None: ...
    def wait_formed(self, timeout_s: float) -> list[int]: ...
    def failures(self) -> list[tuple[int, str]]: ...
    def send(self, peer: int, body: bytes) -> int: ...
    def drop(self, peer: int) -> None: ...
    def take(self, timeout_s: float) -> list[tuple[int, str, bytes]]: ...
    def settle(self) -> int: ...
    def close(self, flush_s: float) -> None: ...
    def _hold_for_testing(self, seconds: float) -> None: ...

class _TestingModule:
    """pycoll._C.testing (csrc/python/testing.cc): what only the tests ask of the native core."""

    @staticmethod
    def plan_dependencies(plan: NativePlan) -> list[tuple[list[int], int]]: ...
    @staticmethod
    def compressible(dtype: int, op: int) -> bool: ...
    @staticmethod
    def plan_chains(plan: NativePlan) -> list[tuple[list[int], list[int]]]: ...
    @staticmethod
    def cpu_reduce(
        dtype: int,
        op: int,
        dst: np.ndarray,
        a: np.ndarray,
        b: np.ndarray,
        avg_divisor: int = 0,
        dst2: np.ndarray | None = None,
    ) -> None: ...
    @staticmethod
    def hmac_sha256(key: bytes, message: bytes) -> bytes: ...
    @staticmethod
    def tcp_rejected(comm: NativeCommunicator) -> int: ...
    @staticmethod
    def hold_gil(seconds: float) -> None: ...
    @staticmethod
    def tcp_link_now(comm: NativeCommunicator, peer: int, timeout_s: float) -> None: ...
    @staticmethod
    def tcp_linked(comm: NativeCommunicator) -> list[int]: ...
    @staticmethod
    def flight_recorder_race(seconds: float, capacity: int) -> dict[str, int]: ...

testing: _TestingModule

class _CudaModule:
    """pycoll._C.cuda (csrc/python/bind_cuda.cc): pointers and streams are ints (0: none / default)."""

    @staticmethod
    def built() -> bool: ...
    @staticmethod
    def device_count() -> int: ...
    @staticmethod
    def device_error() -> str: ...
    @staticmethod
    def get_device() -> int: ...
    @staticmethod
    def set_device(device: int) -> None: ...
    @staticmethod
    def synchronize(stream: int = 0) -> None: ...
    @staticmethod
    def reduce(
        dtype: int,
        op: int,
        dst: int,
        dst2: int,
        a: int,
        b: int,
        n: int,
        avg_divisor: int = 0,
        stream: int = 0,
    ) -> None: ...
    @staticmethod
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
    @staticmethod
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
    @staticmethod
    def rotate(x: int, n: int, part: int, block: int, inverse: bool = False, stream: int = 0) -> None: ...

cuda: _CudaModule
