"""The cost model: predicted time of a collective from its plans and an α-β description of the link.

The model reads every rank's plan (the same plans the executor runs; ``pycoll.algorithms``) and, for each
op of each rank, counts what it moves (``op_costs``):

    sent, received   bytes on the wire (a codec's encoded bytes when compressed)
    traffic          bytes of memory a rank's copies and reductions touch: a SEND copies its source into
                     the transport (read + write: 2 x bytes), a RECV copies out (2x), a RECV_REDUCE reads
                     the message and its source and writes the result (3x), a fused receive-reduce-send
                     3x or 4x, a forwarding receive 3x; a compressed op counts only the encoded bytes it
                     forwards unchanged (2x), its arithmetic being the codec's
    encoded, decoded float32 bytes going through the codec's encode and decode(-accumulate) kernels

The ops of every rank are then run in the executor's order (``critical_path``): a rank's ops use its
device one after another for

    traffic / copy + encoded / encode + decoded / decode (+ a hand-over cost per message taken in)

seconds (on shared memory the rank's core does all the copying; more ranks than cores time-share them,
and traffic beyond the host's last-level cache runs at the memory bandwidth the running ranks divide);
a message reaches its peer alpha after it leaves, its bytes taking sent / beta on the sender's side and
on the receiver's side of a link with a wire (full duplex); and ops stream fragment by fragment, so a
receive can start when the first fragment is in and a chain of forwarding ranks costs one message plus
a fragment per hop. The collective's time is when its last rank finishes. Bandwidths are multiplied by
the link's efficiency for the algorithm (1 unless calibrated; calibration may give one per world size,
"tree@2"). For the ring with whole messages this is the textbook 2(n-1) (alpha + (bytes/n) / beta), for
two-shot 2 alpha + 2 (n-1)/n bytes / beta, with the segments, tree shapes and odd sizes of the real
plans; ``latency_hops`` (alpha = 1, bytes free) equals the simulator's count of dependent messages.
A calibrated link also carries residual corrections per (collective, algorithm, world, codec), which
multiply the prediction (``LinkProfile.corrections``). algbw and busbw follow nccl-tests
(``pycoll.bench.timing``): bytes / time, and algbw x 2(n-1)/n for all-reduce.

``expected_error`` gives the relative L2 error a codec is expected to add (the measured accuracy table of
bench/codec_accuracy.py, Gaussian inputs), which ``choose_compression`` compares with the caller's budget.
"""

from __future__ import annotations

import functools
import math
import operator
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms.compressed import (
    COMPRESSED_DIRECT_ALGORITHM,
    build_compressed_all_gather,
    build_compressed_all_to_all,
    build_compressed_hierarchical_all_gather,
    build_compressed_hierarchical_reduce_scatter,
    build_compressed_plan,
    build_compressed_reduce_scatter,
)
from pycoll.algorithms.plan import Buf, Op, OpKind, Plan
from pycoll.call import COMPRESSIBLE_COLLECTIVES
from pycoll.tuning.links import GPU_SEGMENT_BYTES, DeviceProfile, LinkProfile, device_for, link_named

__all__ = [
    "CODEC_ALGORITHMS",
    "Model",
    "Prediction",
    "bus_factor",
    "codec_layout",
    "expected_error",
    "critical_path",
    "op_costs",
    "plan_costs",
    "step_loads",
]

#: Algorithms a compressed all-reduce can use.
CODEC_ALGORITHMS = ("direct", "ring", "tree")
#: Codecs ``choose_compression`` considers, most accurate first.
AUTO_CODECS = ("fp16", "bf16", "int8", "int4")

#: Messages per chunk beyond which ``Model.predict`` extrapolates linearly from two smaller plans.
EXTRAPOLATE_SEGMENTS = 16

# Columns of step_loads().
SENT, RECEIVED, TRAFFIC, ENCODED, DECODED = range(5)
_COLUMNS = 5

# Memory traffic of an uncompressed op, in multiples of its bytes (see the module docstring).
_TRAFFIC = {
    OpKind.SEND: 2,
    OpKind.RECV: 2,
    OpKind.RECV_REDUCE: 3,
    OpKind.RECV_REDUCE_SEND: 3,
    OpKind.RECV_REDUCE_COPY_SEND: 4,
    OpKind.RECV_COPY_SEND: 3,
    OpKind.COPY: 2,
}
_SENDS = (OpKind.SEND, OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND, OpKind.RECV_COPY_SEND)
_RECEIVES = (
    OpKind.RECV,
    OpKind.RECV_REDUCE,
    OpKind.RECV_REDUCE_SEND,
    OpKind.RECV_REDUCE_COPY_SEND,
    OpKind.RECV_COPY_SEND,
)


def bus_factor(collective: str, world: int) -> float:
    """nccl-tests' busbw / algbw: 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and
    all-to-all, 1 for broadcast."""
    if world <= 1:
        return 1.0
    if collective == "allreduce":
        return 2 * (world - 1) / world
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (world - 1) / world
    return 1.0


def op_costs(plan: Plan, itemsize: int, bytes_per_element: float | None = None) -> np.ndarray:
    """What each op of ``plan`` (in ``plan.ops()`` order) moves: float64 [ops, 5] (sent, received,
    traffic, encoded, decoded bytes). ``bytes_per_element``: the codec's wire bytes per element for a
    compressed plan."""
    return _table_costs(plan.to_table()[0], itemsize, bytes_per_element)


def _plans_costs(
    plans: Sequence[Plan], itemsize: int, bytes_per_element: float | None
) -> tuple[np.ndarray, ...]:
    """``op_costs`` of every plan, worked out over their tables at once (numpy's per-call cost, not the
    ops, is what n plans of a few ops each would pay)."""
    tables = [p.to_table()[0] for p in plans]
    ends = np.cumsum([len(t) for t in tables])[:-1]
    return tuple(np.split(_table_costs(np.concatenate(tables), itemsize, bytes_per_element), ends))


def _table_costs(table: np.ndarray, itemsize: int, bytes_per_element: float | None) -> np.ndarray:
    if not len(table):
        return np.zeros((0, _COLUMNS))
    kind, count = table[:, 0], table[:, 1].astype(np.float64)
    src_buf, finalize = table[:, 4], table[:, 8].astype(bool)
    sends = np.isin(kind, _SENDS)
    receives = np.isin(kind, _RECEIVES)
    cost = np.zeros((len(kind), _COLUMNS))
    if bytes_per_element is None:
        nbytes = count * itemsize
        cost[:, SENT] = np.where(sends, nbytes, 0.0)
        cost[:, RECEIVED] = np.where(receives, nbytes, 0.0)
        factor = np.zeros(len(kind))
        for k, f in _TRAFFIC.items():
            factor[kind == k] = f
        cost[:, TRAFFIC] = factor * nbytes
    else:
        # Ops marked uncompressed (the hierarchical all-reduce's intra-host stages) move float32 as an
        # uncompressed plan does; the others move the codec's bytes.
        plain, exact = table[:, 9].astype(bool), table[:, 10].astype(bool)
        coded = ~plain
        wire = count * bytes_per_element
        raw = count * 4.0  # compressed plans run on float32
        cost[:, SENT] = np.where(sends, np.where(plain, raw, wire), 0.0)
        cost[:, RECEIVED] = np.where(receives, np.where(plain, raw, wire), 0.0)
        send_input = (kind == OpKind.SEND) & (src_buf == Buf.INPUT) & coded
        forward = ((kind == OpKind.SEND) & (src_buf == Buf.ENCODED)) | (kind == OpKind.RECV_COPY_SEND)
        factor = np.zeros(len(kind))
        for k, f in _TRAFFIC.items():
            factor[kind == k] = f
        cost[:, TRAFFIC] = np.where(plain, factor * raw, np.where(forward, 2 * wire, 0.0))
        # A reduce-scatter's final values (exact) stay float32; an all-gather's COPY encodes its own chunk
        # once and keeps the decoding (or, exact, copies the chunk as it is).
        final_reduce = (kind == OpKind.RECV_REDUCE) & finalize & coded & ~exact
        own_chunk = (kind == OpKind.COPY) & coded
        cost[:, TRAFFIC] += np.where(own_chunk & exact, factor * raw, 0.0)
        reduce_sends = np.isin(kind, (OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND)) & coded
        encodes = send_input | reduce_sends | final_reduce | own_chunk
        cost[:, ENCODED] = np.where(encodes, raw, 0.0)
        # Every receive decodes; an op that encodes a final value also decodes its own encoding.
        redecode = ((kind == OpKind.RECV_REDUCE_COPY_SEND) & coded) | final_reduce | (own_chunk & ~exact)
        cost[:, DECODED] = np.where(receives & coded, raw, 0.0) + np.where(redecode, raw, 0.0)
    return cost


def step_loads(plan: Plan, itemsize: int, bytes_per_element: float | None = None) -> np.ndarray:
    """``op_costs`` summed per step: float64 [steps, 5]."""
    if not plan.steps:
        return np.zeros((0, _COLUMNS))
    _, starts = plan.to_table()
    return np.add.reduceat(op_costs(plan, itemsize, bytes_per_element), starts[:-1], axis=0)


def latency_hops(plans: Sequence[Plan]) -> int:
    """The longest chain of dependent messages through every rank's plan, each message one hop and local
    work free: the latency term's multiplier (``critical_path`` with alpha = 1 and free bytes; equal to
    the simulator's ``latency_hops``, computed without any data)."""
    costs = PlanCosts(tuple(plans), tuple(op_costs(p, 4) for p in plans), 0.0, len(plans))
    weights = np.zeros(_PARTS)
    weights[C_ALPHA] = 1.0
    return int(round(critical_path(costs, weights, math.inf)[0]))


class Timing(NamedTuple):
    """A predicted time and what it is made of: ``path`` is the critical path's composition (components
    C_ALPHA ... C_WIRE: time = ``Model.weights`` . path), plus ``extra`` seconds of fixed costs."""

    time_s: float
    path: np.ndarray | None
    extra: float


def correction_key(collective: str, algorithm: str, world: int, codec: str) -> str:
    """The key of ``LinkProfile.corrections`` for one kind of call ("allreduce/tree@2/none")."""
    return f"{collective}/{algorithm}@{world}/{codec}"


def _per_algorithm(table: dict[str, float], algorithm: str, world: int) -> float:
    """``table``'s factor for ``algorithm`` on ``world`` ranks: "tree@2" if calibrated, else "tree", 1."""
    return table.get(f"{algorithm}@{world}", table.get(algorithm, 1.0))


class PlanCosts(NamedTuple):
    """A collective's plans (one per rank) and what each op of each moves (``op_costs``). Of a rotation
    symmetric plan (``plan_costs(symmetric=True)``), rank 0's alone: every rank's is the same up to a
    rotation."""

    plans: tuple[Plan, ...]
    ops: tuple[np.ndarray, ...]
    #: Bytes of memory traffic of all ranks together.
    traffic: float
    #: The ranks the plans are for (``len(plans)``, or more when only rank 0's plan is kept).
    world: int

    @property
    def steps(self) -> int:
        return max((len(p.steps) for p in self.plans), default=0)


#: (collective, algorithm) pairs whose plans are rotation symmetric: rank r's plan is rank 0's with every
#: peer moved on by r (and the chunks with them), so that every rank's ops take the same times and one
#: rank's critical path is the collective's (``critical_path``); tests/unit/test_tuning.py checks each.
#: Not a broadcast (its root is the odd one), nor the tree and hierarchical plans.
ROTATION_SYMMETRIC = frozenset(
    (collective, algorithm)
    for collective in ("allreduce", "reduce_scatter", "all_gather", "all_to_all", "barrier")
    for algorithm in ("ring", "direct", "dissemination")
)


@functools.lru_cache(maxsize=1024)
def plan_costs(
    collective: str,
    algorithm: str,
    world: int,
    count: int,
    itemsize: int,
    segment_bytes: int,
    bytes_per_element: float | None = None,
    block: int = 1,
    root: int = 0,
    local_size: int = 1,
    symmetric: bool = False,
) -> PlanCosts:
    """Every rank's plan for one call and its ``op_costs``. They depend only on the plans, not on the
    model's parameters, so they are computed once (cached) and reused by every model and calibration.
    ``local_size``: ranks per host, for the hierarchical all-reduce. ``symmetric``: of a rotation
    symmetric plan (``ROTATION_SYMMETRIC``), rank 0's alone; what makes the first ``auto`` choice on n
    ranks cost O(n) ops instead of O(n^2) (n plans of n ops, on every rank of the job alike)."""
    ranks = range(1 if symmetric and (collective, algorithm) in ROTATION_SYMMETRIC else world)
    if bytes_per_element is None:
        segment_elems = max(1, segment_bytes // itemsize)
        plans = tuple(
            build_plan(
                collective, algorithm, r, world, count, root=root, segment_elems=segment_elems,
                local_size=local_size,
            )
            for r in ranks
        )
        ops = _plans_costs(plans, itemsize, None)
    else:
        segment_blocks = max(1, int(segment_bytes // (bytes_per_element * block)))
        plans = tuple(
            build_compressed_hierarchical_reduce_scatter(r, world, count, block, segment_blocks, local_size)
            if collective == "reduce_scatter" and algorithm == "hierarchical"
            else build_compressed_reduce_scatter(r, world, count, block, segment_blocks)
            if collective == "reduce_scatter"
            else build_compressed_hierarchical_all_gather(r, world, count, block, segment_blocks, local_size)
            if collective == "all_gather" and algorithm == "hierarchical"
            else build_compressed_all_gather(r, world, count, block, segment_blocks)
            if collective == "all_gather"
            else build_compressed_all_to_all(r, world, [count] * world, [count] * world)
            if collective == "all_to_all"
            else build_compressed_plan(algorithm, r, world, count, block, segment_blocks, local_size)
            for r in ranks
        )
        ops = _plans_costs(plans, 4, bytes_per_element)
    for x in ops:
        x.setflags(write=False)
    traffic = float(sum(x[:, TRAFFIC].sum() for x in ops)) * world / len(plans)
    return PlanCosts(plans, ops, traffic, world)


# Components of a stretch of predicted time, each multiplied by one weight (``Model.weights``): alpha
# counts hops, C_MESSAGE messages a core took in, the others bytes.
C_ALPHA, C_TRAFFIC, C_ENCODED, C_DECODED, C_WIRE, C_MESSAGE = range(6)
_PARTS = 6
_Time = tuple[float, np.ndarray]  # (seconds, composition: seconds = weights . composition)


def _later(a: _Time, b: _Time) -> _Time:
    return a if a[0] >= b[0] else b


def _plus(a: _Time, b: _Time) -> _Time:
    return (a[0] + b[0], a[1] + b[1])


def _scaled(t: _Time, f: float) -> _Time:
    return (t[0] * f, t[1] * f)


class PairLinks(NamedTuple):
    """Links that differ from one pair of ranks to another (a topology of nodes: pycoll.tuning.topology).
    [world, world] matrices indexed [sender, receiver], symmetric (a link is full duplex: its two ends
    use the same port). With them ``critical_path`` counts alpha and wire in seconds (their weights must
    be 1: ``Model.weights`` sets them, so a link's calibrated per-algorithm efficiencies do not apply)."""

    #: Seconds of one hop from a rank to another.
    alpha_s: np.ndarray
    #: Seconds per byte on the wire from a rank to another (its share of the link they use).
    wire_s: np.ndarray
    #: Which of a rank's ports (0, 1, ...) a pair's messages use: messages on different ports (NVLink and
    #: the NIC) travel at the same time; on one port they queue.
    port: np.ndarray


def critical_path(
    costs: PlanCosts,
    weights: np.ndarray,
    fragment_bytes: float,
    pairs: PairLinks | None = None,
    *,
    composition: bool = True,
) -> tuple[float, np.ndarray | None]:
    """When the last rank finishes, and what that time is made of, running the plans in the executor's
    order (plan.py, "Execution order"; the same walk as ``latency_hops``) with timed ops.

    ``weights`` are seconds per unit of each component: alpha per hop, then per byte of traffic, of
    encoded and decoded float32, and of wire, and core time per message taken in. A rank's ops use its
    core one after another (pure SENDs first, at the step's start; then the ops that receive, in list
    order); a message travels the link after alpha, its wire time serialized on the sender's and on the
    receiver's side; and ops stream fragment by fragment: a receiving op can start when the first
    fragment of its message is in and end one fragment after the message's last, and a fused op's own
    message starts one fragment into it. ``pairs``: links that differ from pair to pair (each pair's
    hop and wire time, and the rank's port it uses); without them every pair has the one link of
    ``weights``, and a rank one port.

    Of a rotation symmetric plan (``costs`` holds rank 0's alone) rank 0's ops are walked alone: rank p's
    k-th message to rank 0 leaves when rank 0's k-th message to rank -p does (every rank does the same at
    the same times), and only rank 0's side of each link is timed.

    Returns (seconds, composition); without ``composition`` (what a choice needs) the walk adds plain
    seconds, several times faster, and the composition is None."""
    world = costs.world
    symmetric = len(costs.plans) < world
    if symmetric and pairs is not None:
        raise ValueError("links that differ from pair to pair need every rank's plan (symmetric=False)")
    ranks = len(costs.plans)
    # A stretch of time: (seconds, composition) with composition, else seconds alone; the walk below adds
    # (plus), takes the later (later) and scales (scaled) stretches, whichever they are.
    hop_vec = np.zeros(_PARTS)
    hop_vec[C_ALPHA] = 1.0
    zero: Any
    hop: Any
    plus: Callable[[Any, Any], Any]
    later: Callable[[Any, Any], Any]
    scaled: Callable[[Any, float], Any]
    if composition:
        zero, hop = (0.0, np.zeros(_PARTS)), (float(weights[C_ALPHA]), hop_vec)
        plus, later, scaled = _plus, _later, _scaled
    else:
        zero, hop = 0.0, float(weights[C_ALPHA])
        plus, later, scaled = operator.add, max, operator.mul
    channels: dict[tuple[int, int], deque[tuple[Any, Any, Any]]] = {}
    ports = 1 if pairs is None else int(pairs.port.max()) + 1
    send_port: list[list[Any]] = [[zero] * ports for _ in range(ranks)]
    recv_port: list[list[Any]] = [[zero] * ports for _ in range(ranks)]

    def hop_of(src: int, dst: int) -> Any:
        if pairs is None:
            return hop
        a = float(pairs.alpha_s[src, dst])
        return (a, hop_vec * a) if composition else a

    def port_of(src: int, dst: int) -> int:
        return 0 if pairs is None else int(pairs.port[src, dst])

    layouts = []
    for r, plan in enumerate(costs.plans):
        table = costs.ops[r]
        cpu_v = np.zeros((len(table), _PARTS))
        cpu_v[:, C_TRAFFIC], cpu_v[:, C_ENCODED], cpu_v[:, C_DECODED] = (
            table[:, TRAFFIC],
            table[:, ENCODED],
            table[:, DECODED],
        )
        cpu_v[:, C_MESSAGE] = [op.kind in _RECEIVES for op in plan.ops()]
        wire_v = np.zeros((len(table), _PARTS))
        wire_v[:, C_WIRE] = table[:, SENT]
        if pairs is not None:
            peers = np.array([max(op.send_peer, 0) for op in plan.ops()], dtype=np.int64)
            wire_v[:, C_WIRE] *= pairs.wire_s[r, peers] if len(peers) else 0.0
        cpu_t, wire_t = cpu_v @ weights, wire_v @ weights
        moved = np.maximum(table[:, SENT], table[:, RECEIVED])
        phis = np.where(moved > fragment_bytes, fragment_bytes / np.maximum(moved, 1.0), 1.0)
        if not composition:  # plain floats: the walk reads them op by op
            cpu_t, wire_t, phis = cpu_t.tolist(), wire_t.tolist(), phis.tolist()
        steps = []
        index = 0
        for step in plan.steps:
            pure: list[tuple[int, Op, int | None]] = []
            ordered: list[tuple[int, Op]] = []
            last_sender: dict[int, int] = {}
            for op in step:
                if op.kind == OpKind.SEND:
                    pure.append((index, op, last_sender.get(op.send_peer)))
                else:
                    ordered.append((index, op))
                    if op.kind in _SENDS:
                        last_sender[op.send_peer] = index
                index += 1
            waits_for: dict[int, list[tuple[int, Op]]] = {}
            for i, op, after in pure:
                if after is not None:
                    waits_for.setdefault(after, []).append((i, op))
            free = [(i, op) for i, op, after in pure if after is None]
            steps.append((free, ordered, waits_for))
        layouts.append((steps, cpu_t, cpu_v, wire_t, wire_v, phis))

    def cost(r: int, i: int) -> tuple[Any, Any, float]:
        _, cpu_t, cpu_v, wire_t, wire_v, phis = layouts[r]
        if not composition:
            return cpu_t[i], wire_t[i], phis[i]
        return (float(cpu_t[i]), cpu_v[i]), (float(wire_t[i]), wire_v[i]), float(phis[i])

    def post(r: int, peer: int, first: Any, last: Any, wire: Any, phi: float) -> None:
        port = port_of(r, peer)
        start = later(send_port[r][port], first)
        send_port[r][port] = later(plus(start, wire), last)
        queue = channels.setdefault((r, peer), deque())
        queue.append((plus(start, scaled(wire, phi)), send_port[r][port], wire))

    def send_now(r: int, i: int, op: Op, at: Any) -> Any:
        """A pure SEND run on the core from ``at``; returns when the core is free again."""
        c, w, phi = cost(r, i)
        end = plus(at, c)
        post(r, op.send_peer, plus(at, scaled(c, phi)), end, w, phi)
        return end

    step_of = [0] * ranks
    position = [0] * ranks
    started = [False] * ranks
    cpu: list[Any] = [zero] * ranks
    active = list(range(ranks))
    while active:
        progressed = False
        for r in active:
            steps = layouts[r][0]
            while step_of[r] < len(steps):
                free, ordered, waits_for = steps[step_of[r]]
                if not started[r]:
                    started[r] = True
                    for i, op in free:
                        cpu[r] = send_now(r, i, op, cpu[r])
                    progressed = True
                while position[r] < len(ordered):
                    i, op = ordered[position[r]]
                    c, w, phi = cost(r, i)
                    if op.kind == OpKind.COPY:
                        cpu[r] = plus(cpu[r], c)
                    else:
                        sender = op.recv_peer
                        queue = channels.get((0, -sender % world) if symmetric else (sender, r))
                        if not queue:
                            break
                        first, last, mw = queue.popleft()
                        h, port = hop_of(sender, r), port_of(sender, r)
                        first, last = plus(first, h), plus(last, h)
                        # The receiver's side of the link takes the message's wire time too.
                        last = later(last, plus(recv_port[r][port], mw))
                        recv_port[r][port] = last
                        begin = later(cpu[r], first)
                        done = later(plus(begin, c), plus(last, scaled(c, phi)))
                        if op.kind in _SENDS:
                            post(r, op.send_peer, plus(begin, scaled(c, phi)), done, w, phi)
                        cpu[r] = done
                        for j, queued in waits_for.get(i, ()):
                            cpu[r] = send_now(r, j, queued, cpu[r])
                    position[r] += 1
                    progressed = True
                if position[r] < len(ordered):
                    break
                step_of[r], position[r], started[r] = step_of[r] + 1, 0, False
                progressed = True
        active = [r for r in active if step_of[r] < len(layouts[r][0])]
        if active and not progressed:
            raise ValueError("the plans deadlock (check them with pycoll.algorithms.simulate)")
    end = zero
    for t in cpu:
        end = later(end, t)
    return end if composition else (end, None)


@dataclass(frozen=True)
class Prediction:
    """The model's figures for one collective call."""

    collective: str
    algorithm: str
    codec: str  # "none" without compression
    world: int
    bytes: int
    time_s: float
    steps: int
    #: Relative L2 error the codec is expected to add (0 without compression).
    error: float = 0.0

    @property
    def algbw_GBps(self) -> float:
        return self.bytes / self.time_s / 1e9 if self.time_s > 0 else math.inf

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * bus_factor(self.collective, self.world)


# Relative L2 error of the compressed all-reduce, Gaussian inputs, nearest rounding, default blocks,
# measured by bench/codec_accuracy.py (docs/compression.md): codec -> algorithm -> {world: error}.
_MEASURED_ERROR: dict[str, dict[str, dict[int, float]]] = {
    "fp16": {
        "direct": {2: 2.5e-4, 4: 2.8e-4, 8: 2.8e-4},
        "ring": {2: 2.5e-4, 4: 3.3e-4, 8: 4.4e-4},
        "tree": {2: 2.5e-4, 4: 3.1e-4, 8: 3.7e-4},
    },
    "bf16": {
        "direct": {2: 2.0e-3, 4: 2.2e-3, 8: 2.3e-3},
        "ring": {2: 2.0e-3, 4: 2.6e-3, 8: 3.5e-3},
        "tree": {2: 2.0e-3, 4: 2.5e-3, 8: 2.9e-3},
    },
    "int8": {
        "direct": {2: 7.3e-3, 4: 7.8e-3, 8: 8.1e-3},
        "ring": {2: 7.3e-3, 4: 9.4e-3, 8: 1.26e-2},
        "tree": {2: 7.3e-3, 4: 8.9e-3, 8: 1.05e-2},
    },
    "int4": {
        "direct": {2: 0.119, 4: 0.129, 8: 0.133},
        "ring": {2: 0.119, 4: 0.154, 8: 0.208},
        "tree": {2: 0.119, 4: 0.146, 8: 0.173},
    },
}


def expected_error(codec: str, algorithm: str, world: int) -> float:
    """The relative L2 error ``codec`` is expected to add to an all-reduce on ``world`` ranks (measured
    at 2, 4 and 8 ranks, interpolated in log2(world) and extrapolated linearly beyond 8). Unknown codecs
    (user codecs) are not estimated: inf."""
    table = _MEASURED_ERROR.get(codec, {}).get(algorithm)
    if table is None:
        return math.inf
    if world <= 1:
        return 0.0
    x = math.log2(world)
    points = sorted((math.log2(w), e) for w, e in table.items())
    if x <= points[0][0]:
        return points[0][1]
    for (x0, e0), (x1, e1) in zip(points, points[1:]):
        if x <= x1:
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    (x0, e0), (x1, e1) = points[-2], points[-1]
    return e1 + (e1 - e0) * (x - x1) / (x1 - x0)


def one_quantization_error(codec: str, collective: str, world: int) -> float:
    """The relative L2 error of a compressed reduce-scatter, all-gather or all-to-all, from the two-shot
    all-reduce's measured error: two-shot's grows like e1 * sqrt((2n - 1) / n) (docs/compression.md), so
    one quantization's e1 is its 2-rank error / sqrt(3 / 2). An all-gather quantizes each chunk once (e1;
    the owner's own decoded too); an all-to-all every part but the own, exact one (e1 * sqrt((n - 1) / n)
    over the output, like a reduce-scatter, whose owner adds n - 1 quantized shares to its exact one)."""
    if world <= 1:
        return 0.0
    e1 = expected_error(codec, "direct", 2) / math.sqrt(1.5)
    return e1 if collective == "all_gather" else e1 * math.sqrt((world - 1) / world)


def _plan_count(collective: str, world: int, nbytes: int, itemsize: int) -> int:
    """``build_plan``'s count for a call whose largest buffer is ``nbytes`` (as the API counts it: the
    all-reduce or broadcast buffer, the reduce-scatter input, the all-gather output, the all-to-all's
    input, of even parts)."""
    elems = nbytes // itemsize
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return elems // max(world, 1)
    return elems


@dataclass(frozen=True)
class Model:
    """A link, the device at its ends, and the transport's message size: predicts and chooses.

    ``segment_bytes`` is the most bytes one plan message carries (the transport's pipeline segment, the
    communicator's ``segment_bytes``); the plans, and so the predictions, depend on it."""

    link: LinkProfile
    device: DeviceProfile
    segment_bytes: int = 512 * 1024
    #: Bytes a transport fragment carries, the unit ops stream in (None: a quarter of a segment).
    fragment_bytes: int | None = None
    #: Where the parameters came from ("defaults", or a calibration file).
    origin: str = "defaults"
    #: Ranks per host (node), for the hierarchical all-reduce's plans; 1: not known.
    local_size: int = 1
    #: Links that differ between pairs of ranks (a topology of nodes, pycoll.tuning.topology); None: every
    #: pair has ``link``.
    pairs: PairLinks | None = field(default=None, compare=False, repr=False)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_link(
        cls,
        name: str,
        *,
        workers: int | None = None,
        segment_bytes: int | None = None,
        links: dict[str, LinkProfile] | None = None,
    ) -> Model:
        """The default model of link class ``name`` (``pycoll.tuning.links.LINKS``, or ``links``: a
        user's). Messages: as ``segment_bytes`` says, else as the transport cuts them (on GPUs whole
        ``GPU_SEGMENT_BYTES``, on CPUs 512 KiB in fragments of a quarter)."""
        link = link_named(name, links)
        device = device_for(link, workers)
        if segment_bytes is None and device.workers is None:
            return cls(link, device, GPU_SEGMENT_BYTES, GPU_SEGMENT_BYTES)
        return cls(link, device, 512 * 1024 if segment_bytes is None else segment_bytes)

    # ---- predictions ---------------------------------------------------------------------------------
    def predict(
        self,
        collective: str,
        algorithm: str,
        world: int,
        nbytes: int,
        *,
        itemsize: int = 4,
        codec: object = None,
        root: int = 0,
    ) -> Prediction:
        """Predicted time of one call moving ``nbytes`` (the largest buffer, as the API
        counts it) on ``world`` ranks. ``codec``: None, a codec name or a ``pycoll.compression`` codec
        (all-reduce of float32 only)."""
        if world < 1 or nbytes < 0:
            raise ValueError(f"need world >= 1 and nbytes >= 0, got {world} and {nbytes}")
        if self.pairs is not None and world != len(self.pairs.port):
            raise ValueError(f"this model's links join {len(self.pairs.port)} ranks, not {world}")
        name, bpe, block = codec_layout(codec)
        key = (collective, algorithm, world, nbytes, itemsize, name, bpe, block, root)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if name != "none":
            if collective not in COMPRESSIBLE_COLLECTIVES:
                names = ", ".join(COMPRESSIBLE_COLLECTIVES)
                raise ValueError(f"compression applies to {names}, not {collective}")
            hierarchical = collective in ("reduce_scatter", "all_gather")
            chunked = (COMPRESSED_DIRECT_ALGORITHM, "hierarchical") if hierarchical else (
                COMPRESSED_DIRECT_ALGORITHM,
            )
            if collective != "allreduce" and algorithm not in chunked:
                raise ValueError(f"a compressed {collective} runs {' or '.join(chunked)}, not {algorithm}")
            itemsize = 4
        count = _plan_count(collective, world, nbytes, itemsize)
        wire_itemsize = itemsize if bpe is None else bpe
        # Messages per chunk: past EXTRAPOLATE_SEGMENTS the plans only repeat the same steps, and the time
        # grows linearly; predict two sizes that far and extend the line (a 1 GiB all-reduce on 16 ranks
        # would otherwise walk ~250,000 ops on its first call).
        segments = count * wire_itemsize / max(world, 1) / self.segment_bytes
        def run(n: int) -> tuple[float, int]:
            """(seconds, steps) of the plans for ``n`` elements, timed at the call's size."""
            segment = self.segment_bytes
            local = self.local_size if algorithm == "hierarchical" else 1
            costs = plan_costs(
                collective, algorithm, world, n, itemsize, segment, bpe, block, root, local,
                symmetric=self.pairs is None,
            )  # fmt: skip
            return self.timing(costs, algorithm, world, name, nbytes, composition=False).time_s, costs.steps

        if segments > 2 * EXTRAPOLATE_SEGMENTS:
            n1, n2 = (max(1, int(count * k * EXTRAPOLATE_SEGMENTS / segments)) for k in (1, 2))
            (t1, _), (t2, steps2) = run(n1), run(n2)
            base_s, steps = t2 + (t2 - t1) / (n2 - n1) * (count - n2), int(steps2 * count / n2)
        else:
            base_s, steps = run(count)
        time_s = base_s * self.link.correction(correction_key(collective, algorithm, world, name), nbytes)
        error = 0.0 if name == "none" else self.codec_error(name, algorithm, world, collective)
        prediction = Prediction(collective, algorithm, name, world, nbytes, time_s, steps, error)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = prediction
        return prediction

    def codec_error(self, codec: str, algorithm: str, world: int, collective: str = "allreduce") -> float:
        """``expected_error`` of ``codec`` on this model's ranks. The hierarchical all-reduce compresses
        its cross-host stage only, a ring among the hosts (world / local_size of them). A reduce-scatter
        or all-gather quantizes each element once (``one_quantization_error``)."""
        if collective != "allreduce":
            return one_quantization_error(codec, collective, world)
        if algorithm == "hierarchical":
            return expected_error(codec, "ring", max(1, world // max(self.local_size, 1)))
        return expected_error(codec, algorithm, world)

    def weights(self, algorithm: str, world: int, codec: str, nbytes: int = 0) -> np.ndarray:
        """Seconds per unit of each component of ``critical_path`` (C_ALPHA ... C_WIRE) for this call.

        Every message a core takes in costs it ``message_s``. Ranks sharing a host (shared memory)
        time-share its cores when there are more of them than cores (``share``; a message then also
        costs a switch to the rank that waits for it, ``switch_s`` x (1 - 1 / share)), and the part of
        their memory traffic that misses the last-level cache (all of them hold ``world x nbytes``)
        streams from memory, whose bandwidth the ranks running at once divide between them."""
        device, link = self.device, self.link
        eff = _per_algorithm(link.efficiency, algorithm, world)
        share = 1.0
        traffic_s = 1.0 / (device.copy_Bps * eff)
        message_s = device.message_s
        if link.shared_host and device.workers:
            share = max(1.0, world / device.workers)
            message_s += device.switch_s * (1.0 - 1.0 / share)
            if device.cache_bytes and device.memory_Bps:
                miss = max(0.0, 1.0 - device.cache_bytes / max(world * nbytes, 1))
                memory = device.memory_Bps * _per_algorithm(link.memory_efficiency, algorithm, world)
                traffic_s = (1 - miss) * traffic_s + miss * min(world, device.workers) / memory
        encode_Bps, decode_Bps = device.codec_rates(codec) if codec != "none" else (math.inf, math.inf)
        w = np.zeros(_PARTS)
        lat = _per_algorithm(link.latency_efficiency, algorithm, world)
        w[C_ALPHA] = link.alpha_s / lat
        w[C_MESSAGE] = share * message_s / lat
        w[C_TRAFFIC] = share * traffic_s
        w[C_ENCODED] = share / (encode_Bps * eff)
        w[C_DECODED] = share / (decode_Bps * eff)
        w[C_WIRE] = 0.0 if link.beta_Bps is None else 1.0 / (link.beta_Bps * eff)
        if self.pairs is not None:  # each pair's hop and wire seconds come from the pairs
            w[C_ALPHA] = w[C_WIRE] = 1.0
        return w

    def timing(
        self, costs: PlanCosts, algorithm: str, world: int, codec: str, nbytes: int, composition: bool = True
    ) -> Timing:
        """The predicted time of a collective whose plans are ``costs``, and its composition (None
        without ``composition``)."""
        if costs.steps == 0:
            return Timing(0.0, np.zeros(_PARTS), 0.0)
        fragment = self.segment_bytes / 4 if self.fragment_bytes is None else self.fragment_bytes
        weights = self.weights(algorithm, world, codec, nbytes)
        path_t, path = critical_path(costs, weights, fragment, self.pairs, composition=composition)
        extra = 0.0
        if codec != "none" and self.device.codec_step_s:
            extra = self.device.codec_step_s * costs.steps
        return Timing(path_t + extra, path, extra)

    # ---- choices: "which is predicted fastest" (pycoll.auto decides when "auto" asks, and what overrides) --
    def candidates(self, collective: str, world: int = 0) -> tuple[str, ...]:
        """The algorithms ``choose_algorithm`` compares. hierarchical depends on how ranks sit on hosts:
        a candidate only where the model knows it (``local_size``) and ``world`` spans several hosts."""
        skip = ["dissemination"]
        if not (1 < self.local_size < world and world % self.local_size == 0):
            skip.append("hierarchical")
        return tuple(a for a in ALGORITHMS[collective] if a not in skip) or ALGORITHMS[collective]

    def codec_algorithms(self, world: int) -> tuple[str, ...]:
        """The algorithms a compressed all-reduce is compared with: CODEC_ALGORITHMS, and hierarchical
        where it is a candidate (the codec only between hosts)."""
        extra = ("hierarchical",) if "hierarchical" in self.candidates("allreduce", world) else ()
        return CODEC_ALGORITHMS + extra

    def choose_algorithm(
        self,
        collective: str,
        world: int,
        nbytes: int,
        *,
        itemsize: int = 4,
        codec: object = None,
        exclude: tuple[str, ...] = (),
    ) -> str:
        """The algorithm predicted fastest (ties go to the first of ALGORITHMS[collective]), of the
        candidates but ``exclude``. Decisions are remembered, so that ``auto`` costs a dictionary lookup
        per call after the first."""
        key = ("algorithm", collective, world, nbytes, itemsize, codec, exclude)
        choice = self._cache.get(key)
        if choice is None:
            choice = self._choose_algorithm(collective, world, nbytes, itemsize, codec, exclude)
            self._cache[key] = choice
        return choice

    def _choose_algorithm(
        self, collective: str, world: int, nbytes: int, itemsize: int, codec: object, exclude: tuple[str, ...]
    ) -> str:
        compressed = codec_layout(codec)[0] != "none"
        names = self.codec_algorithms(world) if compressed else self.candidates(collective, world)
        names = tuple(a for a in names if a not in exclude) or names
        if len(names) == 1 or world == 1:
            return names[0]
        return min(
            names,
            key=lambda a: self.predict(collective, a, world, nbytes, itemsize=itemsize, codec=codec).time_s,
        )

    def choose_compression(
        self,
        world: int,
        nbytes: int,
        *,
        error_budget: float,
        codecs: Sequence[str] = AUTO_CODECS,
        collective: str = "allreduce",
    ) -> tuple[str, str]:
        """(codec name or "none", algorithm) of the ``collective`` (all-reduce, reduce-scatter or
        all-gather) of ``nbytes`` of float32 (its largest buffer) predicted fastest among the uncompressed
        one and the ``codecs`` whose expected error fits ``error_budget`` (remembered, like
        ``choose_algorithm``)."""
        key = ("compression", collective, world, nbytes, error_budget, tuple(codecs))
        choice = self._cache.get(key)
        if choice is None:
            choice = self._choose_compression(collective, world, nbytes, error_budget, codecs)
            self._cache[key] = choice
        return choice

    def _choose_compression(
        self, collective: str, world: int, nbytes: int, error_budget: float, codecs: Sequence[str]
    ) -> tuple[str, str]:
        best = ("none", self.choose_algorithm(collective, world, nbytes))
        best_time = self.predict(collective, best[1], world, nbytes).time_s
        if world == 1:
            return best
        algorithms = (
            self.codec_algorithms(world) if collective == "allreduce" else (COMPRESSED_DIRECT_ALGORITHM,)
        )
        for name in codecs:
            for algorithm in algorithms:
                p = self.predict(collective, algorithm, world, nbytes, codec=name)
                if p.error <= error_budget and p.time_s < best_time:
                    best, best_time = (name, algorithm), p.time_s
        return best


def codec_layout(codec: object) -> tuple[str, float | None, int]:
    """(kind, wire bytes per element or None, block elements) of ``codec`` (None, a name or a Codec).
    The kind (fp16, bf16, int8, int4, user) names the codec's rates and expected error; a block other
    than the default is taken to cost and err like the default one."""
    if codec is None or (isinstance(codec, str) and codec.lower() == "none"):
        return "none", None, 1
    from pycoll.compression import get_codec

    c = get_codec(codec)
    if c is None:
        return "none", None, 1
    return c.kind, float(c.bytes_per_element), int(c.block_elems)
