"""pycoll as a torch.distributed backend: ``dist.init_process_group("pycoll")``.

    import pycoll.torch                      # registers "pycoll" for cpu and cuda tensors
    dist.init_process_group("pycoll")        # lossless: results equal gloo's to rounding
    dist.init_process_group("pycoll", pg_options=pycoll.torch.Options(compression="int8"))
    tp = dist.new_group([0, 1], backend="pycoll", pg_options=pycoll.torch.Options("bf16"))

The parts, by the names used below:

- **group**: ``ProcessGroupPycoll``, one per torch process group (the default one, every ``new_group``,
  ``split_group`` and DeviceMesh dimension). Its ``comm`` is a pycoll communicator formed over the
  PrefixStore torch hands every backend, with torch's rank, size and timeout: no second rendezvous, no
  extra port. Torch calls it from Python (``dist.all_reduce``...) and from C++ (DDP's reducer,
  functional collectives) through ``torch.distributed.ProcessGroup``'s Python trampoline.
- **run**: each collective is validated in the caller, then becomes one function that lowers its
  tensors (``tensors.py``: contiguous, wider or reinterpreted copies) and runs pycoll's collectives on
  ``comm``: at once when ``async_op`` is false, else on the communicator's worker thread, in call
  order. Every copy of the caller's data is made in that function, never at call time, so an
  asynchronous op sees what the ops called before it wrote.
- **channels**: point-to-point traffic (``p2p.py``): ``user`` channels carry send/recv, ``coll``
  channels the all-to-all, gather and scatter, so a user's message never meets a collective's.
- **codec rule**, **residuals**: ``Options.codec_for`` says which reductions compress; error feedback
  keeps a residual per tensor storage (``options.py``).
- **work**: ``TorchWork`` (``pg_work.py``), what every call returns.

Errors are pycoll's own (PeerLostError, CollectiveMismatchError, CollectiveTimeoutError,
InvalidUsageError naming the op and what it expected), raised by ``Work.wait()`` (and so by every
synchronous call) on every rank; every wait has the group's deadline.
"""

# The overrides keep the signatures torch's trampoline calls them with; torch's stubs declare overloads
# (the C++ and the Python spellings) that no single Python method matches.
# mypy: disable-error-code="override, assignment"

from __future__ import annotations

import functools
import math
import os
import sys
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

import pycoll
from pycoll.bootstrap import TorchStoreAdapter
from pycoll.errors import InvalidUsageError
from pycoll.flight.recorder import internal_paths
from pycoll.skew import Notice, SkewReport, StragglerEvent
from pycoll.torch.monitored import MonitoredBarriers, reach_pycoll_groups
from pycoll.torch.options import Options, Residuals
from pycoll.torch.p2p import Channels, when_all
from pycoll.torch.pg_work import TorchWork
from pycoll.torch.sparse import check_sparse, sparse_allreduce
from pycoll.torch.tensors import (
    BITWISE,
    NATIVE_DTYPES,
    as_bytes,
    check_bitwise,
    check_reducible,
    contiguous_for_write,
    lowered,
    reduce_op,
)

BACKEND_NAME = "pycoll"
Tensors = list[torch.Tensor]
T = TypeVar("T")

# Collectives called through torch.distributed are recorded at the user's line, outside torch's frames.
internal_paths([os.path.dirname(os.path.abspath(torch.__file__)) + os.sep])


def _seconds(opts: Any) -> float | None:
    """The op's own deadline in seconds, None for the group's (torch's default is a negative timedelta)."""
    timeout = getattr(opts, "timeout", None)
    if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
        return timeout.total_seconds()
    return None


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory overlaps (FSDP2 all-gathers and reduce-scatters in place)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _in_order(runs: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for one in runs:
            one()

    return run


def _one(tensors: list[T], what: str) -> T:
    if len(tensors) != 1:
        raise InvalidUsageError(f"the pycoll backend's {what} takes one tensor per rank, got {len(tensors)}")
    return tensors[0]


class ProcessGroupPycoll(dist.ProcessGroup):
    """A torch process group whose collectives run on a pycoll communicator (module docstring)."""

    def __init__(
        self, store: Any, rank: int, size: int, timeout: timedelta, options: Options | None = None
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self.options = options if options is not None else Options()
        self.timeout_s = timeout.total_seconds()
        adapter = TorchStoreAdapter(store)
        self.comm = pycoll.init(
            store=adapter, rank=rank, world_size=size, timeout=self.timeout_s, set_default=False
        )
        self._rank, self._size = rank, size
        self._group_name = self._group_desc = ""
        self._user = Channels(
            TorchStoreAdapter(dist.PrefixStore("user/", store)), rank, self.timeout_s, self.comm.plane
        )
        self._coll = Channels(TorchStoreAdapter(dist.PrefixStore("coll/", store)), rank, self.timeout_s)
        self._residuals = Residuals(self.options.max_residuals)
        plane = self.comm.plane
        self._monitored = MonitoredBarriers(plane, rank, size, self.timeout_s) if plane is not None else None

    # ---- skew (pycoll/skew/) -----------------------------------------------------------------------
    def skew(self, window: int | None = None) -> SkewReport:
        """Who entered this group's collectives late, and how long the others waited for them: the
        group's communicator's report (``Communicator.skew``; docs/skew.md). Every rank must call it."""
        return self.comm.skew(window)

    def on_straggler(
        self, callback: Callable[[StragglerEvent], None] | None = None, *, late_ms: float, window: int = 100
    ) -> Notice:
        """``Communicator.on_straggler`` on the group's communicator."""
        return self.comm.on_straggler(callback, late_ms=late_ms, window=window)

    # ---- what torch asks of every process group ----------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ name torch's trampoline looks up
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # Torch keeps a group's name and description in its C++ backends, which a Python group has none of.
    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def shutdown(self) -> None:
        """Closes the channels and the communicator (``dist.destroy_process_group`` calls it)."""
        self._user.close()
        self._coll.close()
        self.comm.finalize()

    def abort(self) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<ProcessGroupPycoll rank {self._rank}/{self._size} {self.options!r}>"

    # ---- running ------------------------------------------------------------------------------------
    def _start(self, what: str, run: Callable[[], None], outputs: Tensors, opts: Any) -> TorchWork:
        """Runs ``run`` now, or on the communicator's worker thread when the op is asynchronous."""
        if getattr(opts, "asyncOp", True):
            return TorchWork(self.comm.submit(run, True), outputs, what)
        self.comm.submit(run, False)
        return TorchWork.finished(outputs, what)

    def _reduction(
        self,
        tensor: torch.Tensor,
        op: str,
        factor: Any,
        timeout: float | None,
        compress: bool = True,
        key: torch.Tensor | None = None,
    ) -> Callable[[], None]:
        """The all-reduce of ``tensor`` in place with ``op`` (pycoll's name or a bitwise one), compressed
        where the codec rule says; error feedback's residual belongs to ``key``'s storage (default: the
        tensor's own)."""
        if op in BITWISE:
            check_bitwise(tensor, op)
            return lambda: self._bitwise_allreduce(tensor, op, timeout)
        check_reducible(tensor, op)
        comm, options = self.comm, self.options

        def run() -> None:
            low = lowered(tensor, op)
            codec = options.codec_for(low.work, low.op) if compress else None
            residual = None
            if codec is not None and options.error_feedback:
                residual = self._residuals.for_tensor(tensor if key is None else key, low.work.numel())
            if factor is not None:
                low.work.mul_(factor)
            pycoll.allreduce(
                low.work, low.op, algorithm=options.algorithm, compression=codec, residual=residual,
                comm=comm, timeout=timeout,
            )  # fmt: skip
            if low.back is not None:
                low.back()

        return run

    def _gathered(self, flat: torch.Tensor, timeout: float | None) -> torch.Tensor:
        """Every rank's contiguous ``flat`` bytes, as a (world, nbytes) uint8 tensor."""
        data = as_bytes(flat)
        out = torch.empty((self._size, data.numel()), dtype=torch.uint8, device=flat.device)
        pycoll.all_gather(data, out.reshape(-1), comm=self.comm, timeout=timeout)
        return out

    def _bitwise_allreduce(self, tensor: torch.Tensor, op: str, timeout: float | None) -> None:
        """BAND / BOR / BXOR: gathers every rank's tensor and reduces them in rank order, here."""
        work, back = contiguous_for_write(tensor)
        rows = self._gathered(work, timeout)
        if not work.numel():
            return
        acc = rows[0].view(work.dtype).clone()
        for row in rows[1:]:
            BITWISE[op](acc, row.view(work.dtype), out=acc)
        work.view(-1).copy_(acc)
        if back is not None:
            back()

    # ---- all-reduce ---------------------------------------------------------------------------------
    def allreduce(self, tensors: Tensors, opts: Any = None) -> TorchWork:
        opts = AllreduceOptions() if opts is None else opts
        if isinstance(opts, (ReduceOp, ReduceOp.RedOpType)):
            op_opts, opts = opts, AllreduceOptions()
            opts.reduceOp = op_opts if isinstance(op_opts, ReduceOp) else ReduceOp(op_opts)
        tensor = _one(tensors, "all_reduce")
        op, factor = reduce_op(opts.reduceOp)
        if tensor.layout == torch.sparse_coo:
            check_sparse("premul_sum" if factor is not None else op)
            gather = functools.partial(self._gathered, timeout=_seconds(opts))
            run_sparse = functools.partial(sparse_allreduce, tensor, gather, self._rank)
            return self._start("all_reduce", run_sparse, tensors, opts)
        if not opts.asyncOp and factor is None and self._plain(tensor, op):
            # The common synchronous case (what dist.all_reduce asks by default): a native, contiguous,
            # uncompressed tensor goes straight to pycoll, without the run closure of the general path.
            algorithm, timeout = self.options.algorithm, _seconds(opts)
            pycoll.allreduce(tensor, op, algorithm=algorithm, comm=self.comm, timeout=timeout)
            return TorchWork.finished(tensors, "all_reduce")
        run = self._reduction(tensor, op, factor, _seconds(opts))
        return self._start("all_reduce", run, tensors, opts)

    def _plain(self, tensor: torch.Tensor, op: str) -> bool:
        """Whether pycoll reduces ``tensor`` with ``op`` as it is: a native dtype, contiguous, no codec."""
        return (
            tensor.dtype in NATIVE_DTYPES
            and op not in BITWISE
            and tensor.is_contiguous()
            and self.options.codec_for(tensor, op) is None
        )

    def allreduce_coalesced(self, tensors: Tensors, opts: Any = None) -> TorchWork:
        """One all-reduce per dtype for the lossless tensors (packed), one per tensor for compressed ones."""
        opts = AllreduceCoalescedOptions() if opts is None else opts
        op, factor = reduce_op(opts.reduceOp)
        timeout = _seconds(opts)
        runs: list[Callable[[], None]] = []
        packs: dict[Any, Tensors] = {}
        for t in tensors:
            if op not in BITWISE and self.options.codec_for(t, op) is not None:
                runs.append(self._reduction(t, op, factor, timeout))
            else:
                packs.setdefault((t.dtype, t.device), []).append(t)
        for group in packs.values():
            runs.append(self._packed_reduction(group, op, factor, timeout))
        return self._start("all_reduce_coalesced", _in_order(runs), tensors, opts)

    def _packed_reduction(
        self, tensors: Tensors, op: str, factor: Any, timeout: float | None
    ) -> Callable[[], None]:
        if op in BITWISE:
            for t in tensors:
                check_bitwise(t, op)
        else:
            for t in tensors:
                check_reducible(t, op)

        def run() -> None:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            self._reduction(flat, op, factor, timeout, compress=False)()
            at = 0
            for t in tensors:
                t.copy_(flat[at : at + t.numel()].view(t.shape))
                at += t.numel()

        return run

    def reduce(self, tensors: Tensors, opts: Any = None) -> TorchWork:
        """The root's tensor becomes the reduction; the others' stay as they were (lossless)."""
        opts = ReduceOptions() if opts is None else opts
        tensor = tensors[opts.rootTensor] if tensors else _one(tensors, "reduce")
        op, factor = reduce_op(opts.reduceOp)
        timeout = _seconds(opts)
        if self._rank == opts.rootRank:
            run = self._reduction(tensor, op, factor, timeout, compress=False)
        else:
            self._reduction(tensor, op, factor, timeout, compress=False)  # (checks it, runs nothing)

            def run() -> None:
                self._reduction(tensor.clone(), op, factor, timeout, compress=False)()

        return self._start("reduce", run, tensors, opts)

    # ---- broadcast and barrier ----------------------------------------------------------------------
    def broadcast(self, tensors: Tensors, opts: Any = None) -> TorchWork:
        opts = BroadcastOptions() if opts is None else opts
        tensor = tensors[opts.rootTensor] if tensors else _one(tensors, "broadcast")
        root, timeout, comm = int(opts.rootRank), _seconds(opts), self.comm

        def run() -> None:
            work, back = contiguous_for_write(tensor)
            pycoll.broadcast(as_bytes(work), root, comm=comm, timeout=timeout)
            if back is not None:
                back()

        return self._start("broadcast", run, tensors, opts)

    def barrier(self, opts: Any = None) -> TorchWork:
        opts = BarrierOptions() if opts is None else opts
        timeout, comm = _seconds(opts), self.comm
        return self._start("barrier", lambda: pycoll.barrier(comm=comm, timeout=timeout), [], opts)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """A barrier whose error names the ranks that did not arrive (monitored.py), with the group's
        deadline when ``timeout`` is None. Without a fault plane (PYCOLL_FAULT_TOLERANCE off): a barrier
        with that deadline, whose timeout error names the rank it waited for."""
        if isinstance(timeout, timedelta):
            seconds = timeout.total_seconds()
        else:  # seconds (torch's function converts them too), or None: the group's timeout
            seconds = self.timeout_s if timeout is None else float(timeout)
        if self._monitored is None:
            pycoll.barrier(comm=self.comm, timeout=max(seconds, 1e-3))
            return
        self._monitored.wait(max(seconds, 0.0), wait_all_ranks)

    # ---- gathers ------------------------------------------------------------------------------------
    def allgather(self, output_tensors: list[Tensors], input_tensors: Tensors, opts: Any = None) -> TorchWork:
        opts = AllgatherOptions() if opts is None else opts
        run = self._allgather_list(output_tensors, input_tensors, _seconds(opts))
        return self._start("all_gather", run, [t for ts in output_tensors for t in ts], opts)

    def _allgather_list(
        self, output_tensors: list[Tensors], input_tensors: Tensors, timeout: float | None
    ) -> Callable[[], None]:
        tensor = _one(input_tensors, "all_gather")
        outputs = _one(output_tensors, "all_gather")
        if len(outputs) != self._size or any(o.numel() != tensor.numel() for o in outputs):
            raise InvalidUsageError(
                f"all_gather needs {self._size} output tensors of {tensor.numel()} elements each "
                f"(the input's size), got {[o.numel() for o in outputs]}"
            )

        def run() -> None:
            source = tensor.contiguous()
            rows = self._gathered(source, timeout)
            if source.numel():  # (rows of no bytes have no aligned offset to view as another dtype)
                for out, row in zip(outputs, rows):
                    out.copy_(row.view(out.dtype).view(out.shape))

        return run

    def allgather_coalesced(
        self, output_lists: list[Tensors], input_tensors: Tensors, opts: Any = None
    ) -> TorchWork:
        """``output_lists[r][k]`` becomes rank r's ``input_tensors[k]`` (torch's layout: rank, then input)."""
        opts = AllgatherOptions() if opts is None else opts
        timeout = _seconds(opts)
        if len(output_lists) != self._size:
            raise InvalidUsageError(
                f"all_gather_coalesced needs {self._size} output lists (one per rank), "
                f"got {len(output_lists)}"
            )
        runs = [
            self._allgather_list([[outs[k] for outs in output_lists]], [t], timeout)
            for k, t in enumerate(input_tensors)
        ]
        return self._start("all_gather_coalesced", _in_order(runs), [], opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        opts = AllgatherOptions() if opts is None else opts
        run = self._allgather_tensor(output, input, _seconds(opts))
        return self._start("all_gather_into_tensor", run, [output], opts)

    _allgather_base = all_gather_single  # the spelling older torch versions call

    def _allgather_tensor(
        self, output: torch.Tensor, input: torch.Tensor, timeout: float | None
    ) -> Callable[[], None]:
        if output.dtype != input.dtype or output.numel() != input.numel() * self._size:
            raise InvalidUsageError(
                f"all_gather_into_tensor needs an output of world_size * input.numel() = "
                f"{self._size * input.numel()} elements of {input.dtype}, "
                f"got {output.numel()} of {output.dtype}"
            )
        comm = self.comm
        codec = self.options.all_gather_codec_for(input)

        def run() -> None:
            source = input.clone() if _overlap(input, output) else input.contiguous()
            work, back = contiguous_for_write(output)
            if codec is None:
                pycoll.all_gather(as_bytes(source), as_bytes(work), comm=comm, timeout=timeout)
            else:  # each rank's chunk encoded once; every rank decodes the same bytes (Options)
                pycoll.all_gather(source.reshape(-1), work.reshape(-1), compression=codec, comm=comm,
                                  timeout=timeout)  # fmt: skip
            if back is not None:
                back()

        return run

    def all_gather_single_coalesced(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> TorchWork:
        opts = AllgatherOptions() if opts is None else opts
        timeout = _seconds(opts)
        runs = [self._allgather_tensor(o, i, timeout) for o, i in zip(outputs, inputs)]
        return self._start("all_gather_into_tensor_coalesced", _in_order(runs), outputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ---- reduce-scatter -----------------------------------------------------------------------------
    def reduce_scatter(self, outputs: Tensors, input_lists: list[Tensors], opts: Any = None) -> TorchWork:
        opts = ReduceScatterOptions() if opts is None else opts
        output = _one(outputs, "reduce_scatter")
        inputs = _one(input_lists, "reduce_scatter")
        if len(inputs) != self._size:
            raise InvalidUsageError(f"reduce_scatter needs {self._size} input tensors, got {len(inputs)}")
        run = self._reduce_scatter(output, inputs, opts, key=output)
        return self._start("reduce_scatter", run, outputs, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        opts = ReduceScatterOptions() if opts is None else opts
        run = self._reduce_scatter(output, [input], opts, key=input)
        return self._start("reduce_scatter_tensor", run, [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None
    ) -> TorchWork:
        opts = ReduceScatterOptions() if opts is None else opts
        runs = [self._reduce_scatter(o, [i], opts, key=i) for o, i in zip(outputs, inputs)]
        return self._start("reduce_scatter_tensor_coalesced", _in_order(runs), outputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter_owned(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any, owner: object
    ) -> TorchWork:
        """``reduce_scatter_tensor`` whose error-feedback residual belongs to ``owner`` (kept as long as it
        lives) instead of to the input's storage: pycoll.torch.fsdp's per-module reduce-scatter."""
        run = self._reduce_scatter(output, [input], opts, key=owner)
        return self._start("reduce_scatter_tensor", run, [output], opts)

    def _reduce_scatter(
        self, output: torch.Tensor, inputs: Tensors, opts: Any, key: object
    ) -> Callable[[], None]:
        """``output`` becomes this rank's chunk of the reduction of every rank's ``inputs`` (concatenated).

        pycoll's reduce-scatter, compressed where the codec rule says (each element quantized once, by
        its sender; error feedback's residual, shaped like the input, kept for ``key``: a tensor's storage,
        or an owner object). Bitwise ops: an all-reduce of a copy of the input, of which this rank keeps its
        chunk, lossless."""
        op, factor = reduce_op(opts.reduceOp)
        timeout = _seconds(opts)
        m, total = output.numel(), sum(t.numel() for t in inputs)
        if any(t.dtype != output.dtype for t in inputs) or total != m * self._size:
            raise InvalidUsageError(
                f"reduce_scatter needs an input of world_size * output.numel() = {m * self._size} elements "
                f"of {output.dtype}, got {total} of {[str(t.dtype) for t in inputs]}"
            )
        (check_bitwise if op in BITWISE else check_reducible)(output, op)
        chunk = slice(self._rank * m, (self._rank + 1) * m)
        comm, options = self.comm, self.options

        def flat() -> torch.Tensor:
            return inputs[0].reshape(-1) if len(inputs) == 1 else torch.cat([t.reshape(-1) for t in inputs])

        def run_whole() -> None:
            copy = flat().clone()
            self._reduction(copy, op, factor, timeout)()  # bitwise: never compressed
            output.copy_(copy[chunk].view(output.shape))

        def run() -> None:
            source = flat()
            if factor is not None or _overlap(source, output):
                source = source.clone()  # scaled here, or the output lies inside it (FSDP2 does that)
            low_in, low_out = lowered(source, op), lowered(output, op)
            if factor is not None:
                low_in.work.mul_(factor)
            codec = options.codec_for(low_in.work, low_out.op)
            residual = None
            if codec is not None and options.error_feedback:
                n = low_in.work.numel()
                residual = (
                    self._residuals.for_tensor(key, n) if isinstance(key, torch.Tensor)
                    else self._residuals.for_owner(key, n, low_in.work.device)
                )  # fmt: skip
            pycoll.reduce_scatter(
                low_in.work, low_out.work, low_out.op, compression=codec, residual=residual, comm=comm,
                timeout=timeout,
            )  # fmt: skip
            if low_out.back is not None:
                low_out.back()

        return run_whole if op in BITWISE else run

    # ---- point to point -----------------------------------------------------------------------------
    def _check_peer(self, peer: int, what: str) -> int:
        if not isinstance(peer, int) or not 0 <= peer < self._size or peer == self._rank:
            raise InvalidUsageError(
                f"{what} needs a peer rank in 0..{self._size - 1} other than this rank ({self._rank}), "
                f"got {peer!r}"
            )
        return peer

    def send(self, tensors: Tensors, dst: int, tag: int = 0) -> TorchWork:
        tensor = _one(tensors, "send")
        data = as_bytes(tensor.contiguous())
        future = self._user.send(data, self._check_peer(dst, "send"), None)
        return TorchWork(future, tensors, f"send to {dst}")

    def recv(self, tensors: Tensors, src: int, tag: int = 0) -> TorchWork:
        tensor = _one(tensors, "recv")
        work, back = contiguous_for_write(tensor)
        future = self._user.recv(as_bytes(work), self._check_peer(src, "recv"), None)
        if back is not None:
            future = when_all([future], back)
        result = TorchWork(future, tensors, f"recv from {src}")
        result.peer = src
        return result

    def recv_anysource(self, tensors: Tensors, tag: int = 0) -> TorchWork:
        """Receives from whichever rank's message rang first (p2p.py: doorbells, matching in posting order);
        ``Work.source_rank()`` is that rank once the receive is done."""
        tensor = _one(tensors, "recv")
        work, back = contiguous_for_write(tensor)
        future, source = self._user.recv_any(as_bytes(work), None)
        if back is not None:
            future = when_all([future], back)
        result = TorchWork(future, tensors, "recv from any source")
        result.source = source
        return result

    # ---- built on the collective channels -------------------------------------------------------------
    def _exchange(self, sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor], timeout: Any) -> None:
        """Sends ``sends[peer]`` to every peer and receives ``recvs[peer]`` from every peer, all at once,
        on the collective channels; returns when all are done (raising the first error)."""
        futures = [self._coll.send(as_bytes(t), peer, timeout) for peer, t in sends.items()]
        futures += [self._coll.recv(as_bytes(t), peer, timeout) for peer, t in recvs.items()]
        when_all(futures).result()

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> TorchWork:
        """pycoll's all-to-all (one message per pair of ranks), compressed where ``Options`` opts it in
        (``all_to_all_compression``: each part encoded once by its sender, MoE dispatch). Split sizes on
        CUDA tensors (or a communicator running grouped programs, which take even parts only) go over the
        point-to-point channels instead, lossless: whether sizes are given must be the same on every rank,
        as torch's own backends require of their callers."""
        opts = AllToAllOptions() if opts is None else opts
        in_sizes = self._split_sizes(input, list(input_split_sizes), "input")
        out_sizes = self._split_sizes(output, list(output_split_sizes), "output")
        row_in, row_out = _row_numel(input), _row_numel(output)
        if input.dtype != output.dtype or row_in != row_out:
            raise InvalidUsageError(
                f"all_to_all_single needs input and output rows of one size and dtype, got rows of {row_in} "
                f"{input.dtype} and {row_out} {output.dtype}"
            )
        timeout = _seconds(opts)
        split = bool(input_split_sizes) or bool(output_split_sizes)
        if split and (input.is_cuda or self.comm.grouped_on_cpu):
            run = self._exchanged_all_to_all(output, input, in_sizes, out_sizes, timeout)
        else:
            run = self._native_all_to_all(output, input, (in_sizes, out_sizes) if split else None, timeout)
        return self._start("all_to_all_single", run, [output], opts)

    def _native_all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        splits: tuple[list[int], list[int]] | None,
        timeout: float | None,
    ) -> Callable[[], None]:
        """pycoll.all_to_all of ``input`` into ``output`` (``splits``: rows to and from each rank, None for
        even parts): the bytes of any dtype, or the float32 / float16 / bfloat16 elements through the
        group's all-to-all codec."""
        codec, comm, row = self.options.all_to_all_codec_for(input), self.comm, _row_numel(input)

        def counts(unit: int) -> tuple[list[int] | None, list[int] | None]:
            """send_counts and recv_counts in units of ``unit`` per row (None for even parts)."""
            if splits is None:
                return None, None
            return [n * unit for n in splits[0]], [n * unit for n in splits[1]]

        def run() -> None:
            source = input.clone() if _overlap(input, output) else input.contiguous()
            work, back = contiguous_for_write(output)
            if codec is None:  # bytes: every dtype (complex, bool, ...) alike
                send, recv = counts(row * input.element_size())
                pycoll.all_to_all(as_bytes(source), as_bytes(work), send, recv, comm=comm, timeout=timeout)
            else:
                send, recv = counts(row)
                pycoll.all_to_all(source.reshape(-1), work.reshape(-1), send, recv, compression=codec,
                                  comm=comm, timeout=timeout)  # fmt: skip
            if back is not None:
                back()

        return run

    def _exchanged_all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        in_sizes: list[int],
        out_sizes: list[int],
        timeout: float | None,
    ) -> Callable[[], None]:
        """Every part at once on the point-to-point channels (lossless): uneven parts of CUDA tensors."""
        me = self._rank

        def run() -> None:
            work, back = contiguous_for_write(output)
            ins, outs = _rows(input.contiguous(), in_sizes), _rows(work, out_sizes)
            outs[me].copy_(ins[me])
            peers = [p for p in range(self._size) if p != me]
            sends = {p: ins[p] for p in peers if ins[p].numel()}
            self._exchange(sends, {p: outs[p] for p in peers if outs[p].numel()}, timeout)
            _write_back([(work, back)])

        return run

    alltoall_base = all_to_all_single

    def _split_sizes(self, tensor: torch.Tensor, sizes: list[int], what: str) -> list[int]:
        """The rows of dim 0 that go to (or come from) each rank: ``sizes``, or equal parts when empty."""
        rows = tensor.shape[0] if tensor.dim() else tensor.numel()
        if not sizes:
            if rows % self._size:
                raise InvalidUsageError(
                    f"all_to_all_single: the {what}'s first dimension ({rows}) is not divisible by the "
                    f"world size ({self._size}); pass split sizes"
                )
            sizes = [rows // self._size] * self._size
        if len(sizes) != self._size or sum(sizes) != rows or min(sizes) < 0:
            raise InvalidUsageError(
                f"all_to_all_single: {what} split sizes must be {self._size} non-negative numbers summing to "
                f"the first dimension ({rows}), got {sizes}"
            )
        return sizes

    def alltoall(self, output_tensors: Tensors, input_tensors: Tensors, opts: Any = None) -> TorchWork:
        opts = AllToAllOptions() if opts is None else opts
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise InvalidUsageError(
                f"all_to_all needs {self._size} input and output tensors, "
                f"got {len(input_tensors)} and {len(output_tensors)}"
            )
        timeout, me = _seconds(opts), self._rank

        def run() -> None:
            ins = [t.contiguous() for t in input_tensors]
            outs = [contiguous_for_write(t) for t in output_tensors]
            outs[me][0].copy_(ins[me])
            peers = [p for p in range(self._size) if p != me]
            self._exchange({p: ins[p] for p in peers}, {p: outs[p][0] for p in peers}, timeout)
            _write_back(outs)

        return self._start("all_to_all", run, output_tensors, opts)

    def gather(self, output_tensors: list[Tensors], input_tensors: Tensors, opts: Any = None) -> TorchWork:
        opts = GatherOptions() if opts is None else opts
        tensor, root, timeout = _one(input_tensors, "gather"), int(opts.rootRank), _seconds(opts)
        if self._rank != root:
            send = lambda: self._exchange({root: tensor.contiguous()}, {}, timeout)  # noqa: E731
            return self._start("gather", send, [], opts)
        outputs = _one(output_tensors, "gather")
        if len(outputs) != self._size:
            raise InvalidUsageError(
                f"gather needs {self._size} output tensors on the root, got {len(outputs)}"
            )

        def run() -> None:
            outs = [contiguous_for_write(t) for t in outputs]
            outs[root][0].copy_(tensor.reshape(outs[root][0].shape))
            self._exchange({}, {p: outs[p][0] for p in range(self._size) if p != root}, timeout)
            _write_back(outs)

        return self._start("gather", run, outputs, opts)

    def scatter(self, output_tensors: Tensors, input_tensors: list[Tensors], opts: Any = None) -> TorchWork:
        opts = ScatterOptions() if opts is None else opts
        output, root, timeout = _one(output_tensors, "scatter"), int(opts.rootRank), _seconds(opts)
        if self._rank != root:

            def receive() -> None:
                work, back = contiguous_for_write(output)
                self._exchange({}, {root: work}, timeout)
                _write_back([(work, back)])

            return self._start("scatter", receive, output_tensors, opts)
        inputs = _one(input_tensors, "scatter")
        if len(inputs) != self._size:
            raise InvalidUsageError(
                f"scatter needs {self._size} input tensors on the root, got {len(inputs)}"
            )

        def run() -> None:
            ins = [t.contiguous() for t in inputs]
            output.copy_(ins[root].reshape(output.shape))
            self._exchange({p: ins[p] for p in range(self._size) if p != root}, {}, timeout)

        return self._start("scatter", run, output_tensors, opts)


def _write_back(outs: list[tuple[torch.Tensor, Callable[[], Any] | None]]) -> None:
    """Copies each contiguous stand-in (``contiguous_for_write``) into the caller's tensor."""
    for _, back in outs:
        if back is not None:
            back()


def _row_numel(tensor: torch.Tensor) -> int:
    """Elements per row of dim 0, whatever the rows (a 0-d tensor is one row of one element)."""
    return math.prod(tensor.shape[1:])


def _rows(tensor: torch.Tensor, sizes: list[int]) -> Tensors:
    """A contiguous ``tensor`` cut along dim 0 into parts of ``sizes`` rows (a 0-d tensor: one row)."""
    rows = tensor.shape[0] if tensor.dim() else tensor.numel()
    flat = tensor.reshape(rows, -1) if tensor.dim() else tensor.reshape(rows, 1)
    return list(torch.split(flat, sizes))


def _refuse_mixed_device_map() -> None:
    """Torch keeps one Python process group per group (its first device's) and drops the rest of a
    ``"cpu:pycoll,cuda:nccl"`` map; say so instead of silently running CUDA tensors through pycoll."""
    frame = sys._getframe(2)
    config = frame.f_locals.get("backend_config") if frame is not None else None
    get_map = getattr(config, "get_device_backend_map", None)
    if get_map is None:
        return
    backends = dict(get_map())
    if len(set(backends.values())) > 1:
        mapping = ",".join(f"{d}:{b}" for d, b in backends.items())
        raise InvalidUsageError(
            f"backend {mapping!r}: torch runs a Python backend such as pycoll as the whole process group, "
            f"so it cannot share a group with another backend by device; use backend='pycoll' (it moves "
            f"CPU and CUDA tensors), or a separate group per backend (dist.new_group(backend=...))"
        )


def _create(backend_opts: Any, pg_options: Any) -> ProcessGroupPycoll:
    """Torch's factory for the "pycoll" backend (``register_backend(..., extended_api=True)``)."""
    _refuse_mixed_device_map()
    if pg_options is not None and not isinstance(pg_options, Options):
        raise InvalidUsageError(
            "pg_options of a 'pycoll' process group must be pycoll.torch.Options, "
            f"got {type(pg_options).__name__}"
        )
    return ProcessGroupPycoll(
        backend_opts.store, backend_opts.group_rank, backend_opts.group_size, backend_opts.timeout, pg_options
    )


def register() -> None:
    """Registers the "pycoll" backend with torch.distributed (cpu and cuda); a second call does nothing."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    reach_pycoll_groups(ProcessGroupPycoll)
