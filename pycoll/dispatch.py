"""Where a validated call (``pycoll.call.Call``) goes: a table of executors, each ``launch(call)``.

    executor       runs                                          when
    cpu-fragment   the plan, fragment by fragment, on the CPU    host memory (the default)
                   transport (csrc/engine/executor.cc)
    cpu-grouped    the plan's grouped program over the CPU       host memory, ``comm.grouped_on_cpu``
                   transport (csrc/engine/grouped_executor.cc)   (the tests of the programs GPUs run)
    nccl           NCCL's own collective, or the grouped         GPU memory (pycoll/gpu.py)
                   program as NCCL send / receive groups
    host-staged    the grouped program, its messages through     GPU memory, PYCOLL_GPU_TRANSPORT=shm
                   the CPU transport (pycoll/gpu.py)

``launch`` returns the call's result, or its Work when ``call.async_op``. The plans and grouped programs
every executor runs are compiled once, in the dispatcher's ``PlanCache`` (pycoll/plans.py). Collectives
on host memory run on the calling thread, or, asynchronous, on the communicator's one worker thread
(``Worker``): a rank's collectives keep their call order either way. The dispatcher is built from the
communicator's Context (pycoll/context.py) alone; it also holds the GPU side (pycoll/gpu.py ``GpuSide``),
made at the first GPU collective, which the GPU executors share.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Protocol

from pycoll import _C
from pycoll.call import Call, codec_parts, exact_part
from pycoll.codes import ALGORITHM_CODES, COLLECTIVE_CODES
from pycoll.context import Context
from pycoll.errors import InvalidUsageError
from pycoll.plans import PlanCache
from pycoll.work import Work

if TYPE_CHECKING:
    from pycoll.gpu import GpuSide

#: Prepared native arguments kept per executor (the oldest kind of call dropped first).
ARGS_CACHE_SIZE = 64


class Executor(Protocol):
    name: str

    def launch(self, call: Call) -> Any: ...


class Worker:
    """Runs a communicator's collectives on the calling thread, or on its one worker thread when
    asynchronous, in call order; once the communicator is broken or closed, its ``check_usable`` raises."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._ident: int | None = None  # the worker thread's
        #: Whether an asynchronous collective was ever started (the fast path keeps out from then on).
        self.started = False

    def submit(self, fn: Callable[[], Any], async_op: bool) -> Any:
        """Runs fn now (sync) or on the worker thread (async: a Future), keeping call order."""
        ctx = self._ctx
        if ctx.broken is not None or ctx.closed:
            ctx.check_usable()
        if not async_op and self._pool is None:
            return fn()  # the common case: nothing asynchronous was ever started
        if not async_op and threading.get_ident() == self._ident:
            # A synchronous call from the worker thread itself: a future's callback (e.g. a DDP hook's
            # fut.then(...)) runs there when its collective finishes. Queuing it behind the next
            # asynchronous collective and waiting would wait for this very thread; run it now, between
            # the finished collective and the next one, which is the same point on every rank.
            return fn()
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            if not async_op and not self._pending:
                fut = None
            else:
                if self._pool is None:
                    self.started = True
                    self._pool = ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix=f"pycoll-rank{ctx.rank}", initializer=self._note
                    )
                fut = self._pool.submit(fn)
                self._pending.append(fut)
        if fut is None:
            return fn()
        return fut if async_op else fut.result()

    def _note(self) -> None:
        self._ident = threading.get_ident()

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class _HostExecutor:
    """The CPU executors' common part: a call on host memory runs on the native communicator, now or on
    the worker thread, and its native arguments come from ``args`` (each executor's own)."""

    name = ""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.ctx = dispatcher.ctx
        self.plans = dispatcher.plans
        self.worker = dispatcher.worker
        self._dispatcher = dispatcher

    def launch(self, call: Call) -> Any:
        if not call.async_op:
            ctx = self.ctx
            if not self.worker.started and ctx.broken is None and not ctx.closed:
                self.run(call)  # Worker.submit's common case, without its closure (small calls feel it)
            else:
                self.worker.submit(lambda: self.run(call), False)
            return call.result

        # Its flight record is made now, with the caller's call site and the time it was enqueued.
        args = self.args(call)
        ticket = _C.trace_enqueue(self.ctx.native(), args)

        def body() -> Any:
            self.run(call, args, ticket)
            return call.result

        return Work(self.worker.submit(body, True), call.describe())

    def run(self, call: Call, args: Any = None, ticket: int = 0) -> None:
        """Runs ``call`` on this thread (the GIL released while it runs); straggler notices it completed
        are delivered before it returns. ``args``: its native arguments, when already made; ``ticket``: its
        flight record, made when it was enqueued."""
        native = self.ctx.native()
        if args is None:
            args = self.args(call)
        try:
            events = native.run(args, call.inp.ptr, call.out.ptr, ticket)
        except BaseException as e:
            self.ctx.native_failed(e)
        if events and call.report:  # never inside the library's own collectives
            self._dispatcher.on_events()

    def args(self, call: Call) -> Any:
        raise NotImplementedError

    def make_args(self, call: Call, program: Any = None) -> Any:
        """The native arguments of ``call`` (its buffers' addresses are given per run)."""
        codec = call.codec
        args = _C.Call(
            plan=self.plans.plan(
                call.collective, call.algorithm, call.count, call.inp.itemsize, call.root, codec,
                exact=call.exact_own, splits=call.splits,
            ),
            dtype=call.inp.code,
            op=call.op,
            collective=COLLECTIVE_CODES[call.collective],
            algorithm=ALGORITHM_CODES[call.algorithm],
            count=call.agreed_count,
            root=call.root,
            codec=None if codec is None else codec.native(),
            codec_id=0 if codec is None else codec.wire_id,
            residual=0 if call.residual is None else call.residual.ptr,
            seed=0 if codec is None else codec.seed,
            timeout_s=self.ctx.timeout if call.timeout is None else call.timeout,
            program=program,
        )
        if not call.report:
            args.skew = False
        if codec is not None and codec.rotation is not None:
            args.rotation_block = codec.block_elems
            args.rotate_input, args.rotate_output = codec_parts(call, self.ctx.world_size)
            exact = exact_part(call, self.ctx.rank)
            if exact is not None:
                args.exact_src, args.exact_dst, args.exact_count = exact
        return args


class CpuFragment(_HostExecutor):
    """The fragment executor. The native arguments of a call are made once per kind of call (making them
    costs more than the rest of a small call): only the buffers' addresses change from call to call. It
    also keeps ``pycoll.allreduce``'s fast path (``prepared``, ``run_prepared``)."""

    name = "cpu-fragment"

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__(dispatcher)
        #: The native communicator, until the communicator is finalized (``close``).
        self.native: Any = dispatcher.ctx.native()
        #: Per kind of call: its codec (None uncompressed) and its native arguments.
        self._args: dict[tuple, tuple[Any, Any]] = {}
        #: pycoll.allreduce's fast path: per (dtype number, length, op, algorithm, timeout) of a numpy
        #: array, its dtype and the prepared arguments of a call that passed the full path. Read by
        #: pycoll.api, written by ``remember``.
        self.prepared: dict[tuple, Any] = {}

    def args(self, call: Call) -> Any:
        # A codec is keyed by identity and seed (the rest of what the arguments take from it, its native
        # codec and wire id, is fixed when it is made) and kept in the entry, so that its id is not reused
        # while the entry lives; a residual by its address, which the native arguments hold.
        codec, residual = call.codec, call.residual
        key = (
            call.collective,
            call.algorithm,
            call.count,
            call.inp.code,
            call.op,
            call.root,
            call.timeout,
            call.report,
            None if codec is None else (id(codec), codec.seed),
            0 if residual is None else residual.ptr,
            call.exact_own,
            call.splits,
        )
        entry = self._args.get(key)
        if entry is None or entry[0] is not codec:
            if len(self._args) >= ARGS_CACHE_SIZE:
                del self._args[next(iter(self._args))]  # the oldest kind of call
            entry = self._args[key] = (codec, self.make_args(call))
        return entry[1]

    def remember(self, key: tuple, dtype: Any, call: Call) -> None:
        """Keeps the prepared arguments of a validated plain in-place call on arrays of ``dtype`` (a numpy
        dtype, matched by identity: byte-swapped variants are other objects) under ``key``."""
        if len(self.prepared) >= ARGS_CACHE_SIZE:
            self.prepared.clear()
        self.prepared[key] = (dtype, self.args(call))

    def run_prepared(self, args: Any, array: Any) -> bool:
        """The fast path of a small call (pycoll.allreduce on a numpy array like one it ran before):
        ``args`` from ``remember``, run in place on ``array``. False, with nothing run, where the call
        must take the full path: an asynchronous collective was ever started (call order is kept there),
        the communicator failed or runs grouped programs, or the array is not writable and C-contiguous."""
        ctx = self.ctx
        native = self.native
        if native is None or self.worker.started or ctx.broken is not None or ctx.grouped_on_cpu:
            return False
        try:
            events = native.run_in_place(args, array)
        except BaseException as e:
            ctx.native_failed(e)
        if events > 0:
            self._dispatcher.on_events()
        return events >= 0

    def close(self) -> None:
        self.native = None


class CpuGrouped(_HostExecutor):
    """The grouped executor over the CPU transport: the programs GPUs run, checked on CPUs."""

    name = "cpu-grouped"

    def args(self, call: Call) -> Any:
        if call.splits is not None:
            raise InvalidUsageError(
                "an all_to_all of uneven parts runs on the fragment executor only: a grouped program is "
                "lowered from every rank's plan, and uneven parts are known to their own ranks only"
            )
        program = self.plans.program(
            call.collective, call.algorithm, call.count, call.inp.itemsize, call.root, call.codec,
            exact=call.exact_own,
        )
        return self.make_args(call, program)


def _gpu_executor(name: str) -> Callable[[Dispatcher], Executor]:
    def make(dispatcher: Dispatcher) -> Executor:
        from pycoll import gpu  # GPU code is imported at the first GPU collective

        return gpu.EXECUTORS[name](dispatcher.ctx, dispatcher.plans, dispatcher.gpu)

    return make


#: The executors by name: how each is made from its dispatcher (GPU ones at the first GPU collective).
EXECUTORS: dict[str, Callable[[Dispatcher], Executor]] = {
    "cpu-fragment": CpuFragment,
    "cpu-grouped": CpuGrouped,
    "nccl": _gpu_executor("nccl"),
    "host-staged": _gpu_executor("host-staged"),
}


def _nothing() -> None:
    pass


class Dispatcher:
    """One communicator's executors, its plan cache, its worker thread and its GPU side."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        group = ctx.group
        self.plans = PlanCache(group.rank, group.world_size, group.hosts, group.segment_bytes)
        self.worker = Worker(ctx)
        #: Called after a collective of the caller's left straggler events (the skew tracker's dispatch).
        self.on_events: Callable[[], None] = _nothing
        self._executors: dict[str, Executor] = {}
        self._gpu: GpuSide | None = None
        #: The fragment executor (the fast path of ``pycoll.allreduce`` reads it directly).
        self.cpu = self.executor("cpu-fragment")

    def executor(self, name: str) -> Any:
        """The executor ``name`` (made at its first use)."""
        found = self._executors.get(name)
        if found is None:
            found = self._executors[name] = EXECUTORS[name](self)
        return found

    def executor_for(self, call: Call) -> str:
        """The name of the executor that runs ``call``."""
        if call.inp.on_gpu:
            return "host-staged" if self.ctx.settings.gpu_transport == "shm" else "nccl"
        return "cpu-grouped" if self.ctx.grouped_on_cpu else "cpu-fragment"

    def launch(self, call: Call) -> Any:
        """Runs ``call`` on its executor: its result, or a Work when ``call.async_op``."""
        if not call.inp.on_gpu and not self.ctx.grouped_on_cpu:
            return self.cpu.launch(call)  # the common case, without the table's lookups
        return self.executor(self.executor_for(call)).launch(call)

    def gpu(self) -> GpuSide:
        """The GPU side (NCCL communicator, device, watchdog), made at the first GPU collective."""
        if self._gpu is None:
            from pycoll.gpu import GpuSide

            self._gpu = GpuSide(self.ctx)
        return self._gpu

    def fail_gpu(self, error: BaseException) -> None:
        """The communicator failed (revoked, a member lost): so do the GPU collectives in flight."""
        if self._gpu is not None:
            self._gpu.fail(error)

    def close(self) -> None:
        self.worker.shutdown()
        for executor in self._executors.values():
            close = getattr(executor, "close", None)
            if close is not None:
                close()
        self._executors.clear()
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
