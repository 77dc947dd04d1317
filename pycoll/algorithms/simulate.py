"""Run every rank's plan in one process, on numpy arrays, exactly as plan.py defines it.

This is the oracle the native executor is tested against, so it is strict rather than forgiving.

Execution (plan.py, "Execution order"), as simulated:
    * each rank runs its steps in order; step k+1 starts when every op of step k is complete;
    * at the start of a step the rank posts its pure SENDs: their source is read then and the message
      is in the channel at once (channels are unbounded, so a SEND never waits), except that messages
      to one peer leave in list order within a step: a pure SEND listed after a fused op that sends to
      the same peer is posted when that op completes (csrc/engine does the same);
    * the other ops of the step (those that receive, and COPY) complete one after another in list order;
      an op that receives waits until the next message from its ``recv_peer`` is there. A fused op
      sends its value when it completes;
    * each ordered pair of ranks is a FIFO channel; the n-th message a sends to b is the n-th b receives
      from a, and the two must agree on the count.

Reductions are computed as the native kernels compute them (csrc/kernels/reduce_ops.h): in the buffers'
dtype, except float16 and bfloat16, which are computed in float32 and rounded once when stored.
Integers wrap as numpy wraps them. Operators: sum, prod, min, max (NaN propagates), and avg, which
reduces as sum and, at the op marked ``finalize``, divides the reduced value by the world size in the
compute type (``v / C(world)``, a true division, not a multiplication by 1/world) before it is written
or sent. avg needs a floating dtype. ``finalize`` is only allowed on ops that reduce (RECV_REDUCE,
RECV_REDUCE_SEND, RECV_REDUCE_COPY_SEND): the executor divides inside its reduce kernel and nowhere else.

Aliasing: for in-place collectives (allreduce, broadcast, barrier) INPUT and OUTPUT are one array;
reduce_scatter and all_gather get separate arrays. ``inplace=`` overrides this (for example to check
that an all-reduce plan is also correct when its buffers do not alias).

Before running, every plan is checked (``check_plan``) and rejected with ``PlanError`` if:
    * a peer is out of range or is the rank itself, or a region lies outside its buffer;
    * it writes INPUT in an out-of-place collective, or an in-place plan has input_count != output_count;
    * a pure SEND reads a region that another op of the same step writes (the SEND may still be reading
      when the write happens, so the result would depend on timing);
    * an op that does not reduce is marked ``finalize``.
While running it raises ``DeadlockError`` (no rank can progress; the message says who waits for whom),
``CountMismatchError`` (a message's count differs from the receiving op's) and, at the end,
``UnmatchedMessageError`` (messages sent that nobody received).

Compressed all-reduce plans (``codec=``; plan.py, "Compressed plans", and ``codec_recv`` / ``pump_send``
in csrc/engine/executor.cc): float32 inputs, op sum or avg, INPUT and OUTPUT aliased (the compressed
reduce-scatter and all-gather, whose blocks start at each chunk, are not simulated). Every message carries
the codec's encoding of its op's elements (``pycoll.compression.reference``, the same bits as the native
codecs) and its element count. Each rank has an ENCODED buffer addressed like OUTPUT (element offset o is
byte offset ``o // block * block_bytes``): RECV_COPY_SEND keeps the bytes it forwards there, and a
finalizing RECV_REDUCE / RECV_REDUCE_COPY_SEND keeps the one encoding of its final value there; a SEND
from ENCODED forwards those bytes (``PlanError`` if this rank never kept them). Receive-reduces decode
and accumulate in float32 (``src (+ residual) + decode(msg)``, divided by the world size at an avg's
finalize), and an op that sends or finalizes a reduced value encodes it and keeps the decoding of that
encoding. With ``residuals`` (float32 per rank, updated in place), an op that reads INPUT adds the
residual and sets it to 0, and every encode stores what it lost (times the world size at an avg's
finalize). Stochastic rounding uses ``rounding_key(seed, rank, seq)``, element indices being buffer
offsets. The plan checks also require block-aligned offsets, no COPY, no SEND of OUTPUT, and ENCODED
only as the source of a SEND. ``bytes_per_link`` then counts encoded bytes, and ``quantizations`` says
how many encodes the most-quantized contribution to each element went through. Ops marked
``uncompressed`` run as in a plan without a codec (float32 messages; they may SEND OUTPUT) and leave the
residual alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pycoll.algorithms.plan import READS_SRC, RECEIVES, SENDS, WRITES_DST, Buf, Op, OpKind, Plan
from pycoll.codes import COLLECTIVE_NAMES

REDUCE_OPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}

_Maybe = Optional[np.ndarray]

REDUCING = frozenset({OpKind.RECV_REDUCE, OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND})
HALF_DTYPES = frozenset({"float16", "bfloat16"})  # stored in 16 bits, computed in float32


class SimulationError(Exception):
    """Base class of everything the simulator rejects."""


class PlanError(SimulationError):
    """A plan is malformed or ambiguous (found before anything runs; for a compressed plan, also a SEND
    from ENCODED of a region this rank never kept, found when the SEND is posted)."""


class DeadlockError(SimulationError):
    """No rank can make progress and not every rank has finished."""


class CountMismatchError(SimulationError):
    """A message's element count differs from the count of the op that receives it."""


class UnmatchedMessageError(SimulationError):
    """Every rank finished but some messages were never received."""


@dataclass
class SimResult:
    outputs: list[np.ndarray]
    """OUTPUT of every rank (for in-place collectives the one array INPUT and OUTPUT share)."""
    output_written: list[np.ndarray]
    """Per rank, a bool mask of the OUTPUT elements that some op wrote."""
    elements_per_link: dict[tuple[int, int], int]
    """(src rank, dst rank) -> elements sent, summed over messages; links never used are absent."""
    bytes_per_link: dict[tuple[int, int], int]
    """elements_per_link times the itemsize (payload only, no headers); with a codec, the encoded bytes."""
    messages_per_link: dict[tuple[int, int], int]
    """(src rank, dst rank) -> number of messages (empty ones included)."""
    steps_per_rank: list[int]
    latency_hops: int
    """Length of the longest chain of dependent messages, counting each message as one unit of time
    and local work as free: the latency term of a cost model."""
    finalized: list[list[tuple[Buf, int, int]]] = field(default_factory=list)
    """Per rank, the (buffer, offset, count) regions written or sent by ops with finalize=True."""
    heard_from: list[frozenset[int]] = field(default_factory=list)
    """Per rank, the ranks whose messages causally precede its last op (itself included): for a
    barrier, and for any collective that synchronises all ranks, every rank."""
    quantizations: list[np.ndarray] = field(default_factory=list)
    """Compressed simulations only (else empty): per rank and OUTPUT element, the most encodes any
    rank's input went through on its way into that element (0 for an element never encoded)."""

    @property
    def max_steps(self) -> int:
        return max(self.steps_per_rank, default=0)

    def bytes_sent(self, rank: int) -> int:
        return sum(b for (src, _), b in self.bytes_per_link.items() if src == rank)

    def bytes_received(self, rank: int) -> int:
        return sum(b for (_, dst), b in self.bytes_per_link.items() if dst == rank)


def _is_inplace(plan: Plan, inplace: bool | None) -> bool:
    if inplace is not None:
        return inplace
    if plan.collective not in COLLECTIVE_NAMES:
        raise ValueError(f"collective {plan.collective!r} is unknown to the simulator: pass inplace=")
    return plan.in_place


def _where(step: int, index: int, op: Op) -> str:
    return f"step {step} op {index} ({op.kind.name})"


def check_plan(plan: Plan, inplace: bool, *, block: int | None = None) -> None:
    """Static checks (see the module docstring); raises PlanError naming the step and op.

    ``block`` is the codec's block (elements) when the plan is run compressed, None otherwise: only then
    is ENCODED a buffer (the source of a SEND, addressed like OUTPUT), and the compressed rules apply.
    """
    rank, world = plan.rank, plan.world
    compressed = block is not None
    sizes = {Buf.INPUT: plan.input_count, Buf.OUTPUT: plan.output_count}
    if compressed:
        sizes[Buf.ENCODED] = plan.output_count
    if not 0 <= rank < world:
        raise PlanError(f"plan rank {rank} is not in [0, {world})")
    if inplace and plan.input_count != plan.output_count:
        raise PlanError(f"rank {rank}: in-place plan has input_count {plan.input_count} != output_count "
                        f"{plan.output_count}")

    def space(buf: Buf) -> int:  # aliased buffers share one address space
        if buf == Buf.ENCODED:  # kept by the ops that write the same region of OUTPUT
            buf = Buf.OUTPUT
        return 0 if inplace else int(buf)

    for k, step in enumerate(plan.steps):
        writes: list[tuple[int, int, int, int]] = []  # (space, start, end, op index)
        for i, op in enumerate(step):
            where = f"rank {rank} {_where(k, i, op)}"
            for peer in ((op.send_peer,) if op.kind in SENDS else ()) + (
                    (op.recv_peer,) if op.kind in RECEIVES else ()):
                if not 0 <= peer < world or peer == rank:
                    raise PlanError(f"{where}: peer {peer} is not another rank of a world of {world}")
            for used, (buf, off), what in ((op.kind in READS_SRC, op.src, "reads"),
                                           (op.kind in WRITES_DST, op.dst, "writes")):
                if not used:
                    continue
                if buf not in sizes or (buf == Buf.ENCODED and (what == "writes" or op.kind != OpKind.SEND)):
                    raise PlanError(f"{where} {what} {buf.name}: "
                                    + ("only a compressed plan's SEND may read ENCODED" if compressed else
                                       "ENCODED exists only in compressed plans (simulate with codec=)"))
                if not (0 <= off and off + op.count <= sizes[buf]):
                    raise PlanError(f"{where} {what} {buf.name}[{off}:{off + op.count}] outside its "
                                    f"{sizes[buf]} elements")
                # (an all-reduce's blocks run from its buffer's start; the chunked plans' from each chunk's,
                # which their builders cut whole, as the executor encodes every message from its start)
                end = off + op.count
                if block is not None and plan.collective == "allreduce" and (
                        (off % block and off != sizes[buf]) or (op.count % block and end != sizes[buf])):
                    raise PlanError(f"{where} {what} {buf.name}[{off}:{off + op.count}], which is not cut at "
                                    f"codec blocks of {block} (only the buffer's last block may be short)")
            if compressed and op.kind == OpKind.COPY:
                raise PlanError(f"{where}: a compressed plan cannot COPY")
            if compressed and op.kind == OpKind.SEND and op.src[0] == Buf.OUTPUT and not op.uncompressed:
                raise PlanError(f"{where} sends OUTPUT: a compressed plan sends final values from ENCODED, "
                                f"the bytes encoded once by their owner")
            if op.kind in WRITES_DST:
                if op.dst[0] == Buf.INPUT and not inplace:
                    raise PlanError(f"{where} writes INPUT in out-of-place collective {plan.collective!r}")
                if op.count:
                    writes.append((space(op.dst[0]), op.dst[1], op.dst[1] + op.count, i))
            if op.finalize and op.kind not in REDUCING:
                raise PlanError(f"{where} is marked finalize but does not reduce; only RECV_REDUCE, "
                                f"RECV_REDUCE_SEND and RECV_REDUCE_COPY_SEND can finalize")
        for i, op in enumerate(step):
            if op.kind != OpKind.SEND or not op.count:
                continue
            s, start, end = space(op.src[0]), op.src[1], op.src[1] + op.count
            for ws, wstart, wend, j in writes:
                if ws == s and wstart < end and start < wend:
                    raise PlanError(f"rank {rank} {_where(k, i, op)} reads {op.src[0].name}[{start}:{end}] "
                                    f"while op {j} of the same step writes [{wstart}:{wend}]")


@dataclass
class _Message:
    data: np.ndarray  # the elements, or with a codec their encoding
    count: int        # elements
    time: int  # latency-model time at which it was sent
    know: int  # bitmask of the ranks the sender had heard from when it sent
    step: int
    index: int
    depth: np.ndarray | None = None  # with a codec: per element, encodes so far (see SimResult.quantizations)


@dataclass
class _Step:
    """One step of one rank, split the way the executor walks it."""

    in_order: list[tuple[int, Op]]  # receiving ops and COPYs, completing in list order
    pure_sends: list[tuple[int, Op]]
    after: dict[int, int]  # pure SEND index -> index of the previous op of the step sending to that peer


def _split_step(step: tuple[Op, ...]) -> _Step:
    last_sender: dict[int, int] = {}
    after = {}
    for i, o in enumerate(step):
        if o.kind in SENDS:
            if o.kind == OpKind.SEND and o.send_peer in last_sender:
                after[i] = last_sender[o.send_peer]
            last_sender[o.send_peer] = i
    return _Step([(i, o) for i, o in enumerate(step) if o.kind != OpKind.SEND],
                 [(i, o) for i, o in enumerate(step) if o.kind == OpKind.SEND], after)


@dataclass
class _Rank:
    plan: Plan
    buffers: dict[Buf, np.ndarray]
    written: np.ndarray
    steps: list[_Step]
    know: int               # bitmask of the ranks heard from so far (causally)
    step: int = 0
    position: int = 0       # next op of steps[step].in_order
    started: bool = False
    posted: set[int] = field(default_factory=set)  # indices of the current step's ops that have sent
    clock: int = 0          # when the current step started (latency model)
    last_done: int = 0      # when the last in-order op of the current step completed
    finalized: list[tuple[Buf, int, int]] = field(default_factory=list)
    # compressed simulations only
    key: int = 0                              # stochastic-rounding key of this rank and collective
    residual: np.ndarray | None = None        # error feedback, updated in place
    encoded: np.ndarray | None = None         # ENCODED: bytes kept, at encoded offsets
    kept: np.ndarray | None = None            # per OUTPUT element: whether ENCODED holds its bytes
    depth: np.ndarray | None = None           # per element of the (aliased) buffer: encodes so far
    kept_depth: np.ndarray | None = None      # the same for the bytes in ENCODED


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.name in HALF_DTYPES else dtype


def simulate(plans: Sequence[Plan], inputs: Sequence[np.ndarray], op: str = "sum", *,
             inplace: bool | None = None, codec: Any = None, residuals: Sequence[np.ndarray] | None = None,
             seed: int | None = None, seq: int = 1) -> SimResult:
    """Run ``plans[r]`` on ``inputs[r]`` for every rank r; see the module docstring.

    ``codec`` (a built-in ``pycoll.compression`` codec) runs the plans as compressed all-reduce plans;
    ``residuals`` (one float32 array per rank, like its input) is their error feedback, updated in
    place; ``seed`` (default: the codec's) and ``seq`` (the collective's number, 1 for a communicator's
    first) give each rank's stochastic-rounding key ``rounding_key(seed, rank, seq)``, as the executor
    computes it.
    """
    world = len(plans)
    if world == 0:
        raise ValueError("no plans")
    if len(inputs) != world:
        raise ValueError(f"{world} plans but {len(inputs)} inputs")
    reduce = REDUCE_OPS.get(op)
    if reduce is None:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(REDUCE_OPS)}")
    dtype = np.asarray(inputs[0]).dtype
    compute = _compute_dtype(dtype)
    if op == "avg" and not np.issubdtype(compute, np.inexact):
        raise ValueError(f"avg needs a floating dtype, got {dtype}")

    compressed = codec is not None
    block = block_bytes = 0
    if compressed:
        from pycoll.compression import reference as codec_ref  # (only compressed simulations need it)

        if dtype != np.float32 or op not in ("sum", "avg"):
            raise ValueError(f"compressed plans run on float32 sums and averages, got {dtype} {op!r}")
        block = int(codec.block_elems)
        block_bytes = codec_ref.encoded_bytes(codec, block)  # (raises for a codec it does not implement)
        seed = int(codec.seed) if seed is None else int(seed)
    elif residuals is not None:
        raise ValueError("residuals (error feedback) need codec=")
    if residuals is not None and len(residuals) != world:
        raise ValueError(f"{world} plans but {len(residuals)} residuals")

    ranks: list[_Rank] = []
    for r, (plan, x) in enumerate(zip(plans, inputs)):
        x = np.asarray(x)
        if plan.rank != r or plan.world != world:
            raise ValueError(f"plans[{r}] is for rank {plan.rank} of {plan.world}, "
                             f"expected rank {r} of {world}")
        if x.ndim != 1 or x.dtype != dtype:
            raise ValueError(f"inputs[{r}] must be 1-D {dtype}, got shape {x.shape} dtype {x.dtype}")
        if x.size != plan.input_count:
            raise ValueError(f"inputs[{r}] has {x.size} elements, plan expects {plan.input_count}")
        aliased = _is_inplace(plan, inplace)
        if compressed and not aliased:
            raise ValueError("compressed plans are in-place all-reduces: INPUT and OUTPUT must alias")
        check_plan(plan, aliased, block=block if compressed else None)
        src = x.copy()
        dst = src if aliased else np.zeros(plan.output_count, dtype=dtype)
        state = _Rank(plan, {Buf.INPUT: src, Buf.OUTPUT: dst}, np.zeros(plan.output_count, dtype=bool),
                      [_split_step(step) for step in plan.steps], know=1 << r)
        if compressed:
            if residuals is not None:
                res = residuals[r]
                if not (isinstance(res, np.ndarray) and res.dtype == np.float32 and res.ndim == 1
                        and res.size == plan.input_count and res.flags.c_contiguous and res.flags.writeable):
                    raise ValueError(f"residuals[{r}] must be a writable contiguous 1-D float32 array of "
                                     f"{plan.input_count} elements")
                state.residual = res
            state.key = codec_ref.rounding_key(seed or 0, r, seq)
            state.encoded = np.zeros(codec_ref.encoded_bytes(codec, plan.output_count), dtype=np.uint8)
            state.kept = np.zeros(plan.output_count, dtype=bool)
            state.depth = np.zeros(plan.output_count, dtype=np.int64)
            state.kept_depth = np.zeros(plan.output_count, dtype=np.int64)
        ranks.append(state)

    channels: dict[tuple[int, int], deque[_Message]] = {}
    elements: dict[tuple[int, int], int] = {}
    payload_bytes: dict[tuple[int, int], int] = {}
    messages: dict[tuple[int, int], int] = {}
    divisor = compute.type(world)

    def read(state: _Rank, o: Op) -> np.ndarray:
        buf, off = o.src
        return state.buffers[buf][off:off + o.count]

    def note_finalized(state: _Rank, o: Op) -> None:
        state.finalized.append((o.dst[0], o.dst[1], o.count) if o.kind in WRITES_DST else
                               (o.src[0], o.src[1], o.count))

    def combine(state: _Rank, o: Op, msg: np.ndarray) -> np.ndarray:
        """What a receiving op writes / sends: the message, or src (+) message (finalized)."""
        if o.kind not in REDUCING:
            return msg
        value = reduce(read(state, o).astype(compute, copy=False), msg.astype(compute, copy=False))
        if o.finalize:
            note_finalized(state, o)
            if op == "avg":
                value = value / divisor
        return value.astype(dtype, copy=False)

    # ---- compressed plans: what codec_recv and pump_send (csrc/engine/executor.cc) do --------------------
    def residual_at(state: _Rank, elem: int, n: int) -> np.ndarray | None:
        return None if state.residual is None else state.residual[elem:elem + n]

    def keep(state: _Rank, elem: int, data: np.ndarray, depth: np.ndarray) -> None:
        """Stores the encoding of OUTPUT[elem:elem+n] in ENCODED (a final value this rank may send on)."""
        assert state.encoded is not None and state.kept is not None and state.kept_depth is not None
        at = elem // block * block_bytes
        state.encoded[at:at + data.size] = data
        state.kept[elem:elem + depth.size] = True
        state.kept_depth[elem:elem + depth.size] = depth

    def compressed_send(state: _Rank, o: Op, k: int, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(encoded bytes, per-element encode count) a pure SEND sends (an uncompressed one: elements)."""
        assert state.encoded is not None and state.kept is not None and state.kept_depth is not None
        assert state.depth is not None
        buf, off = o.src
        n = o.count
        if o.uncompressed:
            return read(state, o).copy(), state.depth[off:off + n].copy()
        if buf == Buf.ENCODED:  # a final value, encoded once by its owner: forward its bits
            if not state.kept[off:off + n].all():
                missing = off + int(np.argmin(state.kept[off:off + n]))
                raise PlanError(f"rank {state.plan.rank} {_where(k, i, o)} sends ENCODED[{off}:{off + n}], "
                                f"but element {missing} was never kept there (no earlier op of this rank "
                                f"finalized or forwarded it)")
            at = off // block * block_bytes
            return (state.encoded[at:at + codec_ref.encoded_bytes(codec, n)].copy(),
                    state.kept_depth[off:off + n].copy())
        data, _ = codec_ref.encode(codec, read(state, o), residual_at(state, off, n), 1.0, index=off,
                                   key=state.key)
        return data, state.depth[off:off + n] + 1

    def compressed_receive(state: _Rank, o: Op, msg: _Message) -> tuple[_Maybe, _Maybe, _Maybe, _Maybe]:
        """(value written to dst, its encode counts, bytes sent, their encode counts) of a receiving op."""
        assert state.depth is not None and msg.depth is not None
        n = o.count
        if o.uncompressed:  # float32 elements, as in a plan without a codec; the residual is left alone
            depth = msg.depth if o.kind not in REDUCING else np.maximum(state.depth[o.src[1]:o.src[1] + n],
                                                                         msg.depth)
            value = combine(state, o, msg.data)
            return value, depth, (value if o.kind in SENDS else None), (depth if o.kind in SENDS else None)
        if o.kind == OpKind.RECV:  # kept too: a final value this rank may forward later (hierarchical)
            keep(state, o.dst[1], msg.data, msg.depth)
            return codec_ref.decode(codec, msg.data, n), msg.depth, None, None
        if o.kind == OpKind.RECV_COPY_SEND:
            keep(state, o.dst[1], msg.data, msg.depth)
            return codec_ref.decode(codec, msg.data, n), msg.depth, msg.data, msg.depth
        # the reducing ops: decode-accumulate in float32, consuming the residual where INPUT is read
        elem = o.dst[1] if o.kind in WRITES_DST else o.src[1]  # the region the op is about
        residual = residual_at(state, elem, n)
        avg_final = o.finalize and op == "avg"
        value = codec_ref.decode(codec, msg.data, n, acc=read(state, o),
                                 residual=residual if o.src[0] == Buf.INPUT else None,
                                 divisor=world if avg_final else 0)
        src_depth = state.depth[o.src[1]:o.src[1] + n]
        depth = np.maximum(src_depth, msg.depth)
        if o.finalize:
            note_finalized(state, o)
        if o.kind == OpKind.RECV_REDUCE and (not o.finalize or o.exact):
            return value, depth, None, None  # a partial kept for a later op, or a final kept in float32
        # a value sent on or final: encoded once (storing its loss), and the decoding of that kept
        data, decoded = codec_ref.encode(codec, value, residual, float(world) if avg_final else 1.0,
                                         index=elem, key=state.key)
        depth = depth + 1
        if o.kind == OpKind.RECV_REDUCE_SEND:
            return None, None, data, depth
        keep(state, elem, data, depth)
        if o.kind == OpKind.RECV_REDUCE:
            return decoded, depth, None, None
        return decoded, depth, data, depth  # RECV_REDUCE_COPY_SEND

    def emit(state: _Rank, o: Op, value: np.ndarray | None, time: int, k: int, i: int,
             payload: np.ndarray | None = None, depth: np.ndarray | None = None,
             payload_depth: np.ndarray | None = None) -> None:
        """Write ``value`` and send ``payload`` (default: ``value``) as op ``o`` says."""
        if o.kind in WRITES_DST and value is not None:
            buf, off = o.dst
            state.buffers[buf][off:off + o.count] = value
            if buf == Buf.OUTPUT or state.buffers[Buf.INPUT] is state.buffers[Buf.OUTPUT]:
                state.written[off:off + o.count] = True
            if state.depth is not None and depth is not None:
                state.depth[off:off + o.count] = depth
        if o.kind in SENDS:
            link = (state.plan.rank, o.send_peer)
            data = np.array(value if payload is None else payload, copy=True)
            channels.setdefault(link, deque()).append(
                _Message(data, o.count, time, state.know, k, i,
                         None if payload_depth is None else payload_depth.copy()))
            elements[link] = elements.get(link, 0) + o.count
            payload_bytes[link] = payload_bytes.get(link, 0) + data.nbytes  # encoded bytes or elements
            messages[link] = messages.get(link, 0) + 1
            state.posted.add(i)

    def post_sends(state: _Rank, k: int, time: int) -> None:
        """Post the pure SENDs of step k whose turn has come (list order per peer)."""
        step = state.steps[k]
        for i, o in step.pure_sends:
            previous = step.after.get(i)
            if i not in state.posted and (previous is None or previous in state.posted):
                if compressed:
                    data, depth = compressed_send(state, o, k, i)
                    emit(state, o, None, time, k, i, payload=data, payload_depth=depth)
                else:
                    emit(state, o, read(state, o).copy(), time, k, i)

    with np.errstate(all="ignore"):
        active = list(ranks)
        while active:
            progressed = False
            for state in active:
                while state.step < len(state.steps):
                    k = state.step
                    step = state.steps[k]
                    if not state.started:
                        state.started = True
                        state.last_done = state.clock
                        post_sends(state, k, state.clock)
                        progressed = True
                    while state.position < len(step.in_order):
                        i, o = step.in_order[state.position]
                        if o.kind == OpKind.COPY:
                            emit(state, o, read(state, o).copy(), state.last_done, k, i)
                        else:
                            link = (o.recv_peer, state.plan.rank)
                            queue = channels.get(link)
                            if not queue:
                                break
                            msg = queue.popleft()
                            if msg.count != o.count:
                                raise CountMismatchError(
                                    f"rank {link[1]} {_where(k, i, o)} expects {o.count} elements from rank "
                                    f"{link[0]}, whose message (its step {msg.step} op {msg.index}) has "
                                    f"{msg.count}")
                            state.know |= msg.know
                            state.last_done = max(state.last_done, msg.time + 1)
                            if compressed:
                                value, depth, data, data_depth = compressed_receive(state, o, msg)
                                emit(state, o, value, state.last_done, k, i, data, depth, data_depth)
                            else:
                                emit(state, o, combine(state, o, msg.data), state.last_done, k, i)
                            if o.kind in SENDS and step.after:  # pure SENDs queued behind this op
                                post_sends(state, k, state.last_done)
                        state.position += 1
                        progressed = True
                    if state.position < len(step.in_order):
                        break
                    state.step, state.position, state.started = k + 1, 0, False
                    state.posted = set()
                    state.clock = state.last_done
                    progressed = True
            active = [s for s in active if s.step < len(s.steps)]
            if active and not progressed:
                raise DeadlockError(_deadlock_report(active, channels))

    leftover = [(link, len(q), q[0]) for link, q in sorted(channels.items()) if q]
    if leftover:
        text = "; ".join(f"rank {a} -> rank {b}: {n} message(s), the first from its step {m.step} "
                         f"op {m.index} ({m.count} elements)" for (a, b), n, m in leftover)
        raise UnmatchedMessageError(f"messages sent but never received: {text}")

    return SimResult(
        outputs=[s.buffers[Buf.OUTPUT] for s in ranks],
        output_written=[s.written for s in ranks],
        elements_per_link=dict(elements),
        bytes_per_link=dict(payload_bytes),
        messages_per_link=dict(messages),
        steps_per_rank=[len(s.steps) for s in ranks],
        latency_hops=max((s.clock for s in ranks), default=0),
        finalized=[s.finalized for s in ranks],
        heard_from=[frozenset(r for r in range(world) if s.know >> r & 1) for s in ranks],
        quantizations=[s.depth for s in ranks if s.depth is not None],
    )


def _deadlock_report(blocked: list[_Rank], channels: dict[tuple[int, int], deque[_Message]]) -> str:
    lines = []
    for state in blocked:
        i, o = state.steps[state.step].in_order[state.position]
        lines.append(f"rank {state.plan.rank} {_where(state.step, i, o)} waits for a message of {o.count} "
                     f"from rank {o.recv_peer}")
    pending = [f"{a}->{b}: {len(q)}" for (a, b), q in sorted(channels.items()) if q]
    return ("deadlock: no rank can progress. " + "; ".join(lines)
            + (f". Undelivered messages per link: {', '.join(pending)}" if pending else ""))
