"""The Python side of GPU collectives (pycoll/gpu.py) with the CUDA and NCCL pieces replaced by fakes.

What runs on a real GPU is in tests/gpu/; here, without one, the checks are of what pycoll hands the
native side (pointers, codes, codec layout, streams, the plan and its grouped program), how Work waits,
and that the watchdog turns a collective past its deadline or an NCCL error into an aborted NCCL
communicator and a broken pycoll communicator instead of a hang.
"""

from __future__ import annotations

import dataclasses
import time
import types

import pytest

import pycoll
from pycoll import _C
from pycoll import gpu as gpu_module
from pycoll.errors import CollectiveTimeoutError, CommunicatorBrokenError, PeerLostError

pytestmark = pytest.mark.skipif(not _C.gpu.built, reason="this pycoll was built without CUDA (no nvcc)")


class DeviceArray:
    def __init__(self, n, typestr="<f4", ptr=0x7F0000000000, stream=None):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
        }
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream
        self.device = types.SimpleNamespace(id=0)


class FakeEvent:
    done = True  # what every new event's query() answers

    def __init__(self):
        self.stream = None
        self.answer = FakeEvent.done

    def record(self, stream):
        self.stream = stream

    def query(self):
        return self.answer


class FakeNccl:
    def __init__(self):
        self.calls, self.aborted, self.async_error = [], False, None

    def __getattr__(self, name):  # all_reduce, reduce_scatter, all_gather, broadcast
        return lambda *args: self.calls.append((name, args))

    def check_async(self):
        if self.async_error is not None:
            raise self.async_error

    def abort(self):
        self.aborted = True


class FakeGpuCommunicator:
    def __init__(self, nccl=None):
        self.nccl, self.runs = nccl, []

    def run(self, plan, program, call):
        self.runs.append((plan, program, call))


@pytest.fixture
def fakes(monkeypatch):
    nccl = FakeNccl()
    cuda = types.SimpleNamespace(
        built=lambda: True,
        device_count=lambda: 1,
        device_error=lambda: "",
        get_device=lambda: 0,
        set_device=lambda i: None,
    )
    gpu = types.SimpleNamespace(Event=FakeEvent, Call=_C.gpu.Call, GpuCommunicator=FakeGpuCommunicator)
    # _C.Call holds a real GPU communicator only: the fake one travels in a plain namespace.
    fake_c = types.SimpleNamespace(cuda=cuda, gpu=gpu, Call=types.SimpleNamespace, trace_begin=_C.trace_begin,
                                   trace_end=_C.trace_end)  # fmt: skip
    monkeypatch.setattr(gpu_module, "_C", fake_c)
    import pycoll.nccl

    monkeypatch.setattr(pycoll.nccl, "create_nccl_comm", lambda store, rank, world, timeout: nccl)
    monkeypatch.setattr(gpu_module, "WATCHDOG_PERIOD_S", 0.001)
    FakeEvent.done = True
    return nccl


@pytest.fixture
def comm(one_rank_comm):
    return one_rank_comm


def test_nccl_algorithm_hands_nccl_the_pointers_codes_and_stream(fakes, comm):
    x = DeviceArray(1000, stream=0x5000)
    assert pycoll.allreduce(x, "max", comm=comm) is x  # auto on GPU memory: NCCL's all-reduce
    assert fakes.calls == [("all_reduce", (0x7F0000000000, 0x7F0000000000, 1000, 0, 3, 0x5000))]
    out = DeviceArray(3000, ptr=0x7F0000100000)
    pycoll.all_gather(DeviceArray(3000), out, algorithm="nccl", comm=comm)
    assert fakes.calls[-1] == ("all_gather", (0x7F0000000000, 0x7F0000100000, 3000, 0, 0))


def test_plans_run_as_grouped_programs_with_the_codec_layout(fakes, comm):
    x, res = DeviceArray(5000), DeviceArray(5000, ptr=0x7F0000200000)
    pycoll.allreduce(
        x, "avg", algorithm="ring", compression=pycoll.compression.Int8(block=64), residual=res, comm=comm
    )
    plan, program, call = comm.gpu()._native.runs[-1]
    assert isinstance(plan, _C.NativePlan) and isinstance(program, _C.GroupedProgram)
    assert (call.input, call.output, call.dtype, call.op, call.count) == (
        x.__cuda_array_interface__["data"][0],
    ) * 2 + (0, 1, 5000)
    assert (call.codec_kind, call.codec_block, call.block_elems, call.block_bytes) == (3, 64, 64, 68)
    assert call.residual == 0x7F0000200000 and call.algorithm == _C.ALGORITHM_NAMES.index("ring")
    assert fakes.calls == []  # NCCL's own collectives were not used


def _nccl_records(comm):
    from pycoll.flight.analysis import records_of
    from pycoll.flight.recorder import local_report

    return records_of(local_report(64), f"{comm.plane.id}/nccl")[2]


def test_nccl_collectives_are_flight_recorded_until_the_watchdog_sees_them_end(fakes, comm):
    FakeEvent.done = False
    work = pycoll.allreduce(DeviceArray(10), comm=comm, async_op=True)
    rec = _nccl_records(comm)[-1]
    assert (rec["collective"], rec["algorithm"], rec["count"], rec["gpu"]) == ("allreduce", "nccl", 10, True)
    assert rec["state"] == "started" and rec["site"].endswith("in test_nccl_collectives_are_flight_recorded_"
                                                              "until_the_watchdog_sees_them_end")  # fmt: skip
    work._event.answer = True
    work.wait()
    deadline = time.monotonic() + 5
    while _nccl_records(comm)[-1]["state"] != "completed" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _nccl_records(comm)[-1]["state"] == "completed" and _nccl_records(comm)[-1]["seq"] == rec["seq"]


def test_async_work_waits_for_the_event_and_times_out_without_breaking(fakes, comm):
    FakeEvent.done = False
    work = pycoll.allreduce(DeviceArray(10), algorithm="direct", comm=comm, async_op=True)
    assert not work.is_completed()
    with pytest.raises(CollectiveTimeoutError, match="given to Work.wait"):
        work.wait(timeout=0.05)
    assert comm.broken is None
    work._event.answer = True
    assert work.wait() is True and work.is_success() and work.exception() is None


def test_watchdog_aborts_nccl_and_breaks_the_communicator_past_the_deadline(fakes, comm):
    FakeEvent.done = False
    pycoll.allreduce(DeviceArray(10), comm=comm, timeout=0.05)
    deadline = time.monotonic() + 5
    while comm.broken is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(comm.broken, CollectiveTimeoutError) and fakes.aborted
    assert _nccl_records(comm)[-1]["state"] == "failed"
    with pytest.raises(CommunicatorBrokenError, match="did not finish within its deadline"):
        pycoll.allreduce(DeviceArray(10), comm=comm)


def test_an_nccl_async_error_breaks_the_communicator(fakes, comm):
    FakeEvent.done = False
    fakes.async_error = PeerLostError("NCCL reports a remote peer failed", 1)
    work = pycoll.allreduce(DeviceArray(10), comm=comm, async_op=True)
    with pytest.raises(PeerLostError):
        work.wait()
    assert fakes.aborted and isinstance(comm.broken, PeerLostError)


def test_host_staged_transport_runs_through_the_shared_memory_communicator(fakes, comm, monkeypatch):
    group = dataclasses.replace(comm.context.group, settings=comm.settings.__class__(gpu_transport="shm"))
    monkeypatch.setattr(comm.context, "group", group)
    seen = []

    class Native:
        def __getattr__(self, name):
            return getattr(real, name)

        def run(self, call, input, output):
            assert isinstance(call.plan, _C.NativePlan) and isinstance(call.program, _C.GroupedProgram)
            seen.append((call.gpu, call.device.count, call.timeout_s, input == output == call.device.input))

    real = comm.native()
    monkeypatch.setattr(comm.context, "native", Native)
    pycoll.allreduce(DeviceArray(77), algorithm="tree", comm=comm, timeout=9)
    with pytest.raises(pycoll.InvalidUsageError, match="needs NCCL"):
        pycoll.allreduce(DeviceArray(77), algorithm="nccl", comm=comm)
    assert len(seen) == 1 and seen[0][1:] == (77, 9, True) and isinstance(seen[0][0], FakeGpuCommunicator)
    assert fakes.calls == []


def test_a_collective_aborted_by_the_watchdog_fails_although_its_event_then_completes(fakes, comm):
    finished = pycoll.allreduce(DeviceArray(10), comm=comm, async_op=True)  # its event is complete
    FakeEvent.done = False
    stuck = pycoll.allreduce(DeviceArray(10), comm=comm, timeout=0.05, async_op=True)
    deadline = time.monotonic() + 5
    while comm.broken is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fakes.aborted
    stuck._event.answer = True  # NCCL's abort ended the kernels, so the stream goes on past them
    with pytest.raises(CollectiveTimeoutError, match="did not finish within its deadline"):
        stuck.wait()
    assert stuck.is_completed() and not stuck.is_success()
    assert finished.wait() is True and finished.exception() is None


def test_close_destroys_nccl_before_the_gpu_communicator_waits_for_its_workspace(fakes, comm, monkeypatch):
    order = []
    fakes.destroy = lambda: order.append("nccl destroyed")

    class Native(FakeGpuCommunicator):
        def __del__(self):
            order.append("gpu communicator dropped")

    monkeypatch.setattr(gpu_module._C.gpu, "GpuCommunicator", Native)
    pycoll.allreduce(DeviceArray(10), algorithm="ring", comm=comm)
    comm.finalize()
    assert order == ["nccl destroyed", "gpu communicator dropped"]


def test_a_host_staged_call_carries_its_device_part_in_the_one_native_call():
    device = _C.gpu.Call()
    device.count, device.stream = 5, 0x5000
    call = _C.Call(device=device, timeout_s=3.0)
    assert (call.device.count, call.device.stream, call.gpu, call.timeout_s) == (5, 0x5000, None, 3.0)
    with pytest.raises(TypeError, match="Call\\(\\): gpu cannot be a FakeGpuCommunicator"):
        _C.Call(gpu=FakeGpuCommunicator())  # only a real GPU communicator
