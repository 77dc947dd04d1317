"""The GPU side of a communicator: collectives on CUDA memory, enqueued on the caller's stream.

``algorithm="nccl"`` calls NCCL's own collective (the baseline). ``ring``, ``tree`` and ``direct`` run
pycoll's plans, lowered to grouped programs (pycoll/algorithms/grouped.py), as NCCL send / recv groups
with pycoll's CUDA kernels doing the reductions and codecs, so every built-in codec works on GPUs.

Nothing here waits for the GPU. A collective returns once its work is enqueued; the host waits only in
``Work.wait()`` (``async_op=True``) or when the caller synchronizes. So that nothing hangs, a watchdog
thread follows every enqueued collective: past its deadline (or when NCCL reports an asynchronous error,
such as a lost peer) it aborts the NCCL communicator, which ends the stuck kernels, and the communicator
is marked broken with the error (every later call raises it).

``PYCOLL_GPU_TRANSPORT=shm`` moves the messages of ring, tree and direct through the communicator's
shared memory instead (copied to and from the device around each group, the kernels still on the GPU):
for ranks that share one GPU, which NCCL refuses, or that have no NCCL.

The device: the communicator's local rank modulo the number of visible GPUs (as torchrun's LOCAL_RANK
is meant to be used), fixed at the first GPU collective. A tensor on another device is refused with an
error naming both.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from pycoll import _C
from pycoll.arrays import Buffer
from pycoll.bootstrap import PrefixStore
from pycoll.call import Call, codec_parts, exact_part
from pycoll.codes import ALGORITHM_CODES, COLLECTIVE_CODES, KIND_CODES, ROUNDING_CODES
from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, PycollError
from pycoll.flight import recorder as flight
from pycoll.tuning.links import GPU_SEGMENT_BYTES
from pycoll.work import Work

if TYPE_CHECKING:
    from pycoll.context import Context
    from pycoll.plans import PlanCache

log = logging.getLogger("pycoll")

#: How often the watchdog looks at outstanding collectives (seconds). Deadlines are seconds long; each look
#: takes the GIL from the thread that feeds the GPU, so it is not done more often than needed.
WATCHDOG_PERIOD_S = 0.01


def _cuda_module() -> Any:
    cuda = _C.cuda
    if not cuda.built():
        raise InvalidUsageError(
            "GPU memory needs pycoll built with CUDA (nvcc was not found when it was installed); "
            "reinstall it where the CUDA toolkit is present"
        )
    return cuda


def _finished(event: Any) -> bool:
    try:
        return bool(event.query())
    except PycollError:
        return False


class Enqueued:
    """One collective enqueued on a stream: the event recorded after it, its deadline, and the error that
    ended it when the communicator failed before it finished. Once NCCL is aborted its kernels return
    and the event completes, so the event alone cannot tell a finished collective from an aborted one."""

    __slots__ = ("event", "deadline", "description", "error", "ticket")

    def __init__(self, event: Any, deadline: float, description: str, ticket: int = 0) -> None:
        self.event = event
        #: Its flight record (pycoll/flight/; 0: none), ended when the watchdog sees it finish or fail.
        self.ticket = ticket
        self.deadline = deadline
        self.description = description
        self.error: BaseException | None = None


class GpuWork(Work):
    """A collective enqueued on a stream. ``wait()`` blocks the host until the GPU finished it (polling,
    with the collective's deadline); ``get_future()`` is a torch future that is stream-aware."""

    def __init__(self, side: GpuSide, enqueued: Enqueued, description: str, result: Any, device: int) -> None:
        self._side = side
        self._enqueued = enqueued
        self._event = enqueued.event
        self._deadline = enqueued.deadline
        self._description = description
        self._result = result
        self._device = device
        self._torch_future: Any = None
        self._error: BaseException | None = None
        self._done = False

    def _poll(self) -> bool:
        if self._done:
            return True
        try:
            done = bool(self._event.query())
        except PycollError as e:
            self._error, self._done = self._enqueued.error or e, True
            return True
        if self._enqueued.error is not None:  # aborted (its event completes once NCCL is)
            self._error, self._done = self._enqueued.error, True
            return True
        broken = self._side.ctx.broken
        if not done and broken is not None:
            self._error, self._done = broken, True
            return True
        self._done = done
        return done

    def wait(self, timeout: float | None = None) -> bool:
        limit = None if timeout is None else time.monotonic() + timeout
        pause = 20e-6
        while not self._poll():
            now = time.monotonic()
            if now >= self._deadline:
                self._side.fail(
                    CollectiveTimeoutError(
                        f"{self._description} did not finish on the GPU within its deadline; the NCCL "
                        f"communicator was aborted. Raise the timeout with timeout= or PYCOLL_TIMEOUT if "
                        f"the job is only slow"
                    )
                )
                continue
            if limit is not None and now >= limit:
                raise CollectiveTimeoutError(
                    f"{self._description} did not finish within the {timeout} s given to Work.wait()"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._poll()

    def is_success(self) -> bool:
        return self._poll() and self._error is None

    def exception(self) -> BaseException | None:
        try:
            self.wait()
        except PycollError as e:
            return e
        return None

    def result(self) -> Any:
        self.wait()
        return self._result

    def get_future(self) -> Any:
        """A torch.futures.Future (torch must be imported) holding the result. Like NCCL's in torch, it
        is complete once the work is enqueued and carries the stream order: whoever waits on it, or
        chains ``then()``, is ordered after the collective on their current stream."""
        if self._torch_future is None:
            import torch

            device = torch.device("cuda", self._device)
            with torch.cuda.device(device):
                # The future records its event on the current stream, which need not be the one the
                # collective was enqueued on (get_future() may come later, under another stream): make
                # that stream wait for the collective first.
                self._event.block(torch.cuda.current_stream(device).cuda_stream)
                fut: Any = torch.futures.Future(devices=[device])
                fut.set_result(self._result)
            self._torch_future = fut
        return self._torch_future

    def __repr__(self) -> str:
        state = "done" if self._done else "enqueued"
        return f"<pycoll.Work {self._description} on cuda:{self._device} {state}>"


class GpuSide:
    """One rank's GPU state: its device, NCCL communicator, native GPU communicator and watchdog."""

    def __init__(self, ctx: Context) -> None:
        cuda = _cuda_module()
        count = cuda.device_count()
        if count == 0:
            raise InvalidUsageError(
                f"GPU memory was passed, but no CUDA device is usable: {cuda.device_error()}"
            )
        self.ctx = ctx
        self.device = ctx.group.local_rank % count
        self._cuda = cuda
        self._nccl: Any = None
        self._native: Any = None
        self._outstanding: deque[Enqueued] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failure: BaseException | None = None  # the first error fail() was given
        #: The flight recorder's communicator of the collectives NCCL runs (numbered on their own: they take
        #: no number of the CPU transport's), and their count.
        self._trace_comm = flight.comm_id(f"{flight.comm_name(ctx.plane)}/nccl", ctx.rank, ctx.world_size,
                                          ctx.group.epoch, [])  # fmt: skip
        self._traced = 0

    # ---- set-up ------------------------------------------------------------------------------------
    def check_device(self, buf: Buffer, name: str) -> None:
        if buf.device != self.device:
            raise InvalidUsageError(
                f"{name} is on cuda:{buf.device} but the communicator is on cuda:{self.device} "
                f"(local rank {self.ctx.group.local_rank} of {self._cuda.device_count()} visible GPUs); "
                f"put rank r's tensors on cuda:(LOCAL_RANK % device_count), "
                f"e.g. with torch.cuda.set_device(local_rank)"
            )

    def _use_device(self) -> Callable[[], None] | None:
        """Makes the communicator's device current on this thread (kernels, cudaMalloc, events and NCCL act
        on the current device); returns what restores the caller's, None when it already was current."""
        previous = self._cuda.get_device()
        if previous == self.device:
            return None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            # torch's own guard: restoring a device the caller never used must not create a CUDA context
            # on it (cudaSetDevice does, since CUDA 12), which every rank would do on cuda:0.
            guard = torch.cuda.device(self.device)
            guard.__enter__()
            return lambda: guard.__exit__(None, None, None)
        cuda = self._cuda
        cuda.set_device(self.device)
        return lambda: cuda.set_device(previous)

    def nccl(self) -> Any:
        """The NCCL communicator, made at the first GPU collective (which every rank makes)."""
        if self._nccl is None:
            from pycoll.nccl import create_nccl_comm

            restore = self._use_device()
            try:
                self._nccl = create_nccl_comm(
                    PrefixStore(self.ctx.store, "nccl"),
                    self.ctx.rank,
                    self.ctx.world_size,
                    self.ctx.timeout,
                )
            finally:
                if restore is not None:
                    restore()
            self._native = _C.gpu.GpuCommunicator(self._nccl)
            log.info("rank %d: NCCL communicator on cuda:%d", self.ctx.rank, self.device)
        return self._nccl

    def nccl_native(self) -> Any:
        """The GPU communicator over NCCL (its kernels and workspace), made with the NCCL communicator."""
        self.nccl()
        return self._native

    def staged_native(self) -> Any:
        """The GPU communicator without NCCL, for host-staged collectives (its kernels and workspace)."""
        if self._native is None:
            self._native = _C.gpu.GpuCommunicator()
        return self._native

    # ---- running -----------------------------------------------------------------------------------
    def enqueue(self, call: Call, run: Callable[[Call, int], None], record: bool = True) -> Enqueued:
        """Enqueues ``call`` on its input's stream by ``run(call, stream)`` with the communicator's device
        current; returns it (the event recorded after it, its deadline), followed by the watchdog.
        ``record``: make its flight record here (the host-staged executor's is made natively)."""
        self.check_device(call.inp, "x")
        if call.out is not call.inp:
            self.check_device(call.out, "out")
        if call.residual is not None:
            self.check_device(call.residual, "residual")
        stream = call.inp.stream
        ticket = self._trace_begin(call) if record else 0
        restore = self._use_device()
        try:
            run(call, stream)
            event = _C.gpu.Event()
            event.record(stream)
        except BaseException:
            _C.trace_end(ticket, False)
            raise
        finally:
            if restore is not None:
                restore()
        timeout = self.ctx.timeout if call.timeout is None else call.timeout
        what = f"{call.collective}({call.count} x {call.inp.dtype}, {call.algorithm}) on cuda:{self.device}"
        enqueued = Enqueued(event, time.monotonic() + timeout, what, ticket)
        self._watch(enqueued)
        return enqueued

    def _trace_begin(self, call: Call) -> int:
        """The flight record of ``call``, enqueued now (its call site the caller's)."""
        self._traced += 1
        codec = 0 if call.codec is None else call.codec.wire_id
        return int(_C.trace_begin(self._trace_comm, COLLECTIVE_CODES[call.collective],
                                  ALGORITHM_CODES[call.algorithm], call.inp.code, call.op, call.agreed_count,
                                  call.root, codec, self._traced))  # fmt: skip

    # ---- watchdog ----------------------------------------------------------------------------------
    def _watch(self, enqueued: Enqueued) -> None:
        with self._cond:
            if self._failure is not None:  # enqueued while fail() aborted NCCL: it may not have run
                enqueued.error = self._failure
                return
            self._outstanding.append(enqueued)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watchdog, name=f"pycoll-gpu-watchdog-{self.ctx.rank}", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _watchdog(self) -> None:
        try:  # a CUDA call on a thread without a current device would make a context on cuda:0
            self._cuda.set_device(self.device)
        except PycollError:
            log.debug("the watchdog could not make cuda:%d current", self.device, exc_info=True)
        while True:
            with self._cond:
                while not self._outstanding and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                head = self._outstanding[0]
            try:
                if head.event.query():
                    with self._cond:
                        if self._outstanding and self._outstanding[0] is head:
                            self._outstanding.popleft()
                    _C.trace_end(head.ticket, True)
                    continue
                nccl = self._nccl
                if nccl is not None:
                    nccl.check_async()
            except PycollError as e:
                self.fail(e)
                continue
            if time.monotonic() >= head.deadline:
                self.fail(
                    CollectiveTimeoutError(
                        f"{head.description} on rank {self.ctx.rank} did not finish within its "
                        f"deadline; the NCCL communicator was aborted (a peer may have died, hung or called "
                        f"differently)"
                    )
                )
                continue
            time.sleep(WATCHDOG_PERIOD_S)

    def fail(self, error: BaseException) -> None:
        """Aborts the NCCL communicator (ending kernels that wait on peers) and breaks the communicator.
        Collectives not finished by then fail with ``error`` (GpuWork.wait raises it)."""
        with self._cond:
            pending = list(self._outstanding)
            self._outstanding.clear()
            if self._failure is None:
                self._failure = error
        nccl = self._nccl
        # Which ones finished must be asked before the abort, after which every event completes. NCCL
        # already aborted (by the native side, on an error while enqueuing): none can be told apart.
        aborted = nccl is not None and nccl.aborted
        for enqueued in pending:
            if enqueued.error is None and (aborted or not _finished(enqueued.event)):
                enqueued.error = error
            _C.trace_end(enqueued.ticket, enqueued.error is None)
        if nccl is not None and not aborted:  # first, so that whoever is told it is over
            try:
                nccl.abort()
            except PycollError:
                log.debug("NCCL abort failed", exc_info=True)
        if self.ctx.break_with(error):
            log.error("rank %d: %s", self.ctx.rank, error)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        nccl, native = self._nccl, self._native
        self._nccl = self._native = None
        if nccl is None and native is None:
            return
        try:
            restore = self._use_device()  # the workspace and events are freed on their device
        except PycollError:
            restore = None
        try:
            if nccl is not None and not nccl.aborted:
                # NCCL first (the GIL released): its finalize waits, within the communicator's deadline, for
                # the collectives in flight, and aborts those a lost peer would keep waiting forever. Only
                # then may the GPU communicator go, whose workspace waits for the GPU to be done with it.
                try:
                    nccl.destroy()
                except PycollError:
                    log.debug("rank %d: NCCL destroy failed", self.ctx.rank, exc_info=True)
            del native
            del nccl
        finally:
            if restore is not None:
                restore()


# ---- the GPU executors (pycoll/dispatch.py's table) ---------------------------------------------------
def device_call(call: Call, stream: int, world: int, rank: int) -> Any:
    """The native GPU call (``_C.gpu.Call``) of a plan's grouped program: pointers, codes, codec layout (and
    the parts its rotation works in, all of one size on GPU memory)."""
    d = _C.gpu.Call()
    d.input, d.output, d.dtype, d.op = call.inp.ptr, call.out.ptr, call.inp.code, call.op
    d.collective, d.algorithm = COLLECTIVE_CODES[call.collective], ALGORITHM_CODES[call.algorithm]
    d.count, d.root, d.stream = call.agreed_count, call.root, stream
    codec = call.codec
    if codec is not None:
        d.codec_id, d.codec_kind = codec.wire_id, KIND_CODES[codec.kind]
        d.codec_block = getattr(codec, "block", 1)
        d.codec_rounding = ROUNDING_CODES[codec.rounding]
        d.block_elems, d.block_bytes = codec.block_elems, codec.block_bytes
        d.seed = codec.seed
        d.residual = 0 if call.residual is None else call.residual.ptr
        if codec.rotation is not None:
            parts_in, parts_out = codec_parts(call, world)
            d.rotation_block = codec.block_elems
            d.rotate_input_part, d.rotate_output_part = max(parts_in[0], 1), max(parts_out[0], 1)
            exact = exact_part(call, rank)
            if exact is not None:
                d.exact_src, d.exact_dst, d.exact_count = exact
    return d


#: NCCL's own collectives (``algorithm="nccl"``), by pycoll's collective name.
NCCL_COLLECTIVES: dict[str, Callable[[Any, Call, int], None]] = {
    "allreduce": lambda nccl, c, s: nccl.all_reduce(c.inp.ptr, c.out.ptr, c.count, c.inp.code, c.op, s),
    "reduce_scatter": lambda nccl, c, s: nccl.reduce_scatter(
        c.inp.ptr, c.out.ptr, c.count, c.inp.code, c.op, s
    ),
    "all_gather": lambda nccl, c, s: nccl.all_gather(c.inp.ptr, c.out.ptr, c.count, c.inp.code, s),
    "broadcast": lambda nccl, c, s: nccl.broadcast(c.inp.ptr, c.out.ptr, c.count, c.inp.code, c.root, s),
}


class _GpuExecutor:
    """The GPU executors' common part: a call on GPU memory is enqueued on the caller's stream (the host
    does not wait), in call order from any thread; an error while enqueuing breaks the communicator."""

    name = ""
    #: Whether GpuSide.enqueue makes the flight record (the host-staged one's is made natively).
    records = True

    def __init__(self, ctx: Context, plans: PlanCache, side: Callable[[], GpuSide]) -> None:
        self.ctx = ctx
        self.plans = plans
        self._side = side  # the communicator's GPU side, made at its first use
        self._lock = threading.Lock()  # one rank's GPU collectives are enqueued in call order

    def launch(self, call: Call) -> Any:
        ctx = self.ctx
        ctx.check_usable()
        with self._lock:
            side = self._side()
            try:
                self.check(call)
                enqueued = side.enqueue(call, lambda c, stream: self.enqueue(side, c, stream), self.records)
            except PycollError as e:
                if not isinstance(e, InvalidUsageError):
                    ctx.broken = e
                    side.fail(e)
                raise
        if not call.async_op:
            return call.result
        return GpuWork(side, enqueued, call.describe(), call.result, call.inp.device)

    def check(self, call: Call) -> None:
        """Refuses what this executor cannot run, before anything is enqueued."""

    def program(self, call: Call) -> tuple[Any, Any]:
        """The compiled plan and its grouped program, cut at GPU-sized messages."""
        args = (call.collective, call.algorithm, call.count, call.inp.itemsize, call.root, call.codec)
        return (
            self.plans.plan(*args, segment_bytes=GPU_SEGMENT_BYTES, exact=call.exact_own),
            self.plans.program(*args, segment_bytes=GPU_SEGMENT_BYTES, exact=call.exact_own),
        )

    def enqueue(self, side: GpuSide, call: Call, stream: int) -> None:
        raise NotImplementedError


class NcclExecutor(_GpuExecutor):
    """Over NCCL: its own collective (``algorithm="nccl"``), or pycoll's plan as NCCL send / receive
    groups with pycoll's kernels doing the reductions and codecs."""

    name = "nccl"

    def enqueue(self, side: GpuSide, call: Call, stream: int) -> None:
        nccl = side.nccl()
        if call.algorithm == "nccl":
            run = NCCL_COLLECTIVES.get(call.collective)
            if run is None:
                raise InvalidUsageError(f"algorithm 'nccl' does not run {call.collective}")
            run(nccl, call, stream)
            return
        plan, program = self.program(call)
        side.nccl_native().run(plan, program, device_call(call, stream, self.ctx.world_size, self.ctx.rank))


class HostStagedExecutor(_GpuExecutor):
    """PYCOLL_GPU_TRANSPORT=shm: the plan's grouped program with its messages through the communicator's
    CPU transport (copied to and from the device around each group, the kernels still on the GPU)."""

    name = "host-staged"
    records = False

    def check(self, call: Call) -> None:
        if call.algorithm == "nccl":
            raise InvalidUsageError(
                "algorithm='nccl' needs NCCL; PYCOLL_GPU_TRANSPORT=shm runs ring, tree and direct"
            )

    def enqueue(self, side: GpuSide, call: Call, stream: int) -> None:
        plan, program = self.program(call)
        staged = _C.Call(
            plan=plan,
            program=program,
            timeout_s=self.ctx.timeout if call.timeout is None else call.timeout,
            gpu=side.staged_native(),
            device=device_call(call, stream, self.ctx.world_size, self.ctx.rank),
        )
        self.ctx.native().run(staged, call.inp.ptr, call.out.ptr)


#: pycoll/dispatch.py's GPU executors, by name: each made from the communicator's Context, its plan cache
#: and its GPU side.
EXECUTORS: dict[str, Callable[[Context, PlanCache, Callable[[], GpuSide]], Any]] = {
    "nccl": NcclExecutor,
    "host-staged": HostStagedExecutor,
}
