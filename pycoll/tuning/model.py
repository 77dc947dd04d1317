"""The cost model: predicted time of a collective from its plans and an α-β description of the link.

The model reads every rank's plan (the same plans the executor runs; ``pycoll.algorithms``) and, for each
plan step of each rank, counts what the step moves and computes:

    sent, received   bytes on the wire (a codec's encoded bytes when compressed)
    traffic          bytes of memory a rank's copies and reductions touch: a SEND copies its source into
                     the transport (read + write: 2 x bytes), a RECV copies out (2x), a RECV_REDUCE reads
                     the message and its source and writes the result (3x), a fused receive-reduce-send
                     3x or 4x, a forwarding receive 3x; compressed ops instead count
    encoded, decoded float32 bytes going through the codec's encode and decode(-accumulate) kernels

Over a whole collective each rank keeps three resources busy: its device for

    compute = traffic / copy + encoded / encode + decoded / decode   (times world / cores when more
              ranks than cores share one host; plus a fixed cost per coding step on GPUs)

and, on a link with a wire (shared memory has none: the rank's own core does all the copying), its
sending and receiving sides for sent / beta and received / beta (full duplex; DMA and kernels overlap).
Every bandwidth is multiplied by the link's efficiency for the algorithm (1 unless calibrated), and the
collective takes

    time = alpha * hops + max(the busiest resource of the busiest rank,
                              all ranks' traffic / host memory bandwidth   (ranks sharing a host))

``hops`` is the longest chain of dependent messages through the plans (``latency_hops``, equal to the
simulator's), so the latency term follows the plans' real dependencies (2(n-1) per segment for the
ring, 2 per segment for two-shot, about 2 log2(n) plus the pipeline's length for the tree), and the
bandwidth term is the busiest rank's work, as in a pipeline. For the ring this is the textbook
2(n-1) (alpha + (bytes/n) / beta), for two-shot 2 alpha + 2 (n-1)/n bytes / beta, with the segments,
tree shapes and odd sizes of the real plans. algbw and busbw follow nccl-tests (``pycoll.benchmark``):
bytes / time, and algbw x 2(n-1)/n for all-reduce.

``expected_error`` gives the relative L2 error a codec is expected to add (the measured accuracy table of
bench/codec_accuracy.py, Gaussian inputs), which ``choose_compression`` compares with the caller's budget.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.plan import Buf, Op, OpKind, Plan
from pycoll.tuning.links import DeviceProfile, LinkProfile, device_for, link_named

__all__ = [
    "CODEC_ALGORITHMS",
    "Model",
    "Prediction",
    "bus_factor",
    "expected_error",
    "plan_loads",
    "step_loads",
]

#: Algorithms a compressed all-reduce can use.
CODEC_ALGORITHMS = ("direct", "ring", "tree")
#: Codecs ``choose_compression`` considers, most accurate first.
AUTO_CODECS = ("fp16", "bf16", "int8", "int4")

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
    """nccl-tests' busbw / algbw: 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather,
    1 for broadcast."""
    if world <= 1:
        return 1.0
    if collective == "allreduce":
        return 2 * (world - 1) / world
    if collective in ("reduce_scatter", "all_gather"):
        return (world - 1) / world
    return 1.0


def step_loads(plan: Plan, itemsize: int, bytes_per_element: float | None = None) -> np.ndarray:
    """What each step of ``plan`` moves: float64 [steps, 5] (sent, received, traffic, encoded, decoded
    bytes). ``bytes_per_element``: the codec's wire bytes per element for a compressed plan."""
    if not plan.steps:
        return np.zeros((0, _COLUMNS))
    table, starts = plan.to_table()
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
        wire = count * bytes_per_element
        raw = count * 4.0  # compressed plans run on float32
        cost[:, SENT] = np.where(sends, wire, 0.0)
        cost[:, RECEIVED] = np.where(receives, wire, 0.0)
        send_input = (kind == OpKind.SEND) & (src_buf == Buf.INPUT)
        forward = ((kind == OpKind.SEND) & (src_buf == Buf.ENCODED)) | (kind == OpKind.RECV_COPY_SEND)
        cost[:, TRAFFIC] = np.where(forward, 2 * wire, 0.0)
        final_reduce = (kind == OpKind.RECV_REDUCE) & finalize
        reduce_sends = np.isin(kind, (OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND))
        encodes = send_input | reduce_sends | final_reduce
        cost[:, ENCODED] = np.where(encodes, raw, 0.0)
        # Every receive decodes; an op that encodes a final value also decodes its own encoding.
        redecode = (kind == OpKind.RECV_REDUCE_COPY_SEND) | final_reduce
        cost[:, DECODED] = np.where(receives, raw, 0.0) + np.where(redecode, raw, 0.0)
    return np.add.reduceat(cost, starts[:-1], axis=0)


def latency_hops(plans: Sequence[Plan]) -> int:
    """The longest chain of dependent messages through every rank's plan, each message one hop and local
    work free: the latency term's multiplier. Runs the plans' order exactly as the simulator does
    (``pycoll.algorithms.simulate``, whose ``latency_hops`` this equals) without any data, so it is
    cheap for large counts."""
    world = len(plans)
    channels: dict[tuple[int, int], deque[int]] = {}

    def post(rank: int, peer: int, time: int) -> None:
        channels.setdefault((rank, peer), deque()).append(time)

    # Per rank and step: the pure SENDs (with the fused op to the same peer each must wait for, if any)
    # and the ops that complete in list order.
    layouts = []
    for plan in plans:
        steps = []
        for step in plan.steps:
            pure: list[tuple[int, int, int | None]] = []
            ordered: list[tuple[int, Op]] = []
            waits_for: dict[int, list[int]] = {}
            last_sender: dict[int, int] = {}
            for i, op in enumerate(step):
                if op.kind == OpKind.SEND:
                    pure.append((i, op.send_peer, last_sender.get(op.send_peer)))
                else:
                    ordered.append((i, op))
                    if op.kind in _SENDS:
                        last_sender[op.send_peer] = i
            for _, peer, after in pure:
                if after is not None:
                    waits_for.setdefault(after, []).append(peer)
            steps.append(([peer for _, peer, after in pure if after is None], ordered, waits_for))
        layouts.append(steps)
    step_of = [0] * world
    position = [0] * world
    started = [False] * world
    clock = [0] * world
    last = [0] * world
    active = list(range(world))
    while active:
        progressed = False
        for r in active:
            while step_of[r] < len(layouts[r]):
                free_sends, ordered, waits_for = layouts[r][step_of[r]]
                if not started[r]:
                    started[r], last[r] = True, clock[r]
                    for peer in free_sends:
                        post(r, peer, clock[r])
                    progressed = True
                while position[r] < len(ordered):
                    i, op = ordered[position[r]]
                    if op.kind != OpKind.COPY:
                        queue = channels.get((op.recv_peer, r))
                        if not queue:
                            break
                        last[r] = max(last[r], queue.popleft() + 1)
                        if op.kind in _SENDS:
                            post(r, op.send_peer, last[r])
                        for peer in waits_for.get(i, ()):
                            post(r, peer, last[r])
                    position[r] += 1
                    progressed = True
                if position[r] < len(ordered):
                    break
                step_of[r], position[r], started[r] = step_of[r] + 1, 0, False
                clock[r] = last[r]
                progressed = True
        active = [r for r in active if step_of[r] < len(layouts[r])]
        if active and not progressed:
            raise ValueError("the plans deadlock (check them with pycoll.algorithms.simulate)")
    return max(clock, default=0)


class PlanLoads(NamedTuple):
    """What a collective's plans move: ``steps`` is float64 [world, steps, 5], ``step_loads`` of every
    rank (ranks with fewer steps padded with zeros); ``hops`` is ``latency_hops`` of the plans."""

    steps: np.ndarray
    hops: int


@functools.lru_cache(maxsize=1024)
def plan_loads(
    collective: str,
    algorithm: str,
    world: int,
    count: int,
    itemsize: int,
    segment_bytes: int,
    bytes_per_element: float | None = None,
    block: int = 1,
    root: int = 0,
) -> PlanLoads:
    """The loads of every rank's plan for one call. They depend only on the plans, not on the model's
    parameters, so they are computed once (cached) and reused by every model and calibration."""
    if bytes_per_element is None:
        segment_elems = max(1, segment_bytes // itemsize)
        plans = [
            build_plan(collective, algorithm, r, world, count, root=root, segment_elems=segment_elems)
            for r in range(world)
        ]
        loads = [step_loads(p, itemsize) for p in plans]
    else:
        segment_blocks = max(1, int(segment_bytes // (bytes_per_element * block)))
        plans = [
            build_compressed_plan(algorithm, r, world, count, block, segment_blocks) for r in range(world)
        ]
        loads = [step_loads(p, 4, bytes_per_element) for p in plans]
    stacked = np.zeros((world, max((len(x) for x in loads), default=0), _COLUMNS))
    for r, x in enumerate(loads):
        stacked[r, : len(x)] = x
    stacked.setflags(write=False)
    return PlanLoads(stacked, latency_hops(plans))


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
# measured by bench/codec_accuracy.py (README, "Compression"): codec -> algorithm -> {world: error}.
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


def _plan_count(collective: str, world: int, nbytes: int, itemsize: int) -> int:
    """``build_plan``'s count for a call whose largest buffer is ``nbytes`` (as the API counts it: the
    all-reduce or broadcast buffer, the reduce-scatter input, the all-gather output)."""
    elems = nbytes // itemsize
    if collective in ("reduce_scatter", "all_gather"):
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
    #: Where the parameters came from ("defaults", or a calibration file).
    origin: str = "defaults"
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_link(cls, name: str, *, workers: int | None = None, segment_bytes: int = 512 * 1024) -> Model:
        """The default model of link class ``name`` (``pycoll.tuning.links.LINKS``)."""
        link = link_named(name)
        return cls(link, device_for(link, workers), segment_bytes)

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
        """Predicted time of one call moving ``nbytes`` (the largest buffer, as ``select_algorithm``
        counts it) on ``world`` ranks. ``codec``: None, a codec name or a ``pycoll.compression`` codec
        (all-reduce of float32 only)."""
        if world < 1 or nbytes < 0:
            raise ValueError(f"need world >= 1 and nbytes >= 0, got {world} and {nbytes}")
        name, bpe, block = _codec_layout(codec)
        key = (collective, algorithm, world, nbytes, itemsize, name, bpe, block, root)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if name != "none":
            if collective != "allreduce":
                raise ValueError(f"compression applies to allreduce only, not {collective}")
            itemsize = 4
        count = _plan_count(collective, world, nbytes, itemsize)
        loads = plan_loads(
            collective, algorithm, world, count, itemsize, self.segment_bytes, bpe, block, root
        )
        time_s, steps = self.time_of(loads, algorithm, world, name)
        error = 0.0 if name == "none" else expected_error(name, algorithm, world)
        prediction = Prediction(collective, algorithm, name, world, nbytes, time_s, steps, error)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = prediction
        return prediction

    def time_of(self, loads: PlanLoads, algorithm: str, world: int, codec: str) -> tuple[float, int]:
        """(seconds, steps) of a collective whose plans move ``loads`` (``plan_loads``)."""
        stacked = loads.steps
        steps = stacked.shape[1]
        if steps == 0:
            return 0.0, 0
        device, link = self.device, self.link
        eff = link.efficiency.get(algorithm, 1.0)
        encode_Bps, decode_Bps = device.codec_rates(codec) if codec != "none" else (1.0, 1.0)
        compute = (
            stacked[..., TRAFFIC] / device.copy_Bps
            + stacked[..., ENCODED] / encode_Bps
            + stacked[..., DECODED] / decode_Bps
        ) / eff
        if link.shared_host and device.workers:
            compute = compute * max(1.0, world / device.workers)
        if codec != "none" and device.codec_step_s:
            coding = (stacked[..., ENCODED] + stacked[..., DECODED]) > 0
            compute = compute + np.where(coding, device.codec_step_s, 0.0)
        # Each rank's resources are busy for their totals; the pipelined plan runs at its busiest one.
        busy = compute.sum(axis=1)
        if link.beta_Bps is not None:
            beta = link.beta_Bps * eff
            busy = np.maximum(
                busy, np.maximum(stacked[..., SENT].sum(axis=1), stacked[..., RECEIVED].sum(axis=1)) / beta
            )
        throughput = float(busy.max())
        if link.shared_host and device.host_copy_Bps:
            throughput = max(throughput, float(stacked[..., TRAFFIC].sum()) / (device.host_copy_Bps * eff))
        return link.alpha_s * loads.hops + throughput, steps

    # ---- choices ---------------------------------------------------------------------------------------
    def candidates(self, collective: str) -> tuple[str, ...]:
        return tuple(a for a in ALGORITHMS[collective] if a != "dissemination") or ALGORITHMS[collective]

    def choose_algorithm(
        self, collective: str, world: int, nbytes: int, *, itemsize: int = 4, codec: object = None
    ) -> str:
        """The algorithm predicted fastest (ties go to the first of ALGORITHMS[collective]). Decisions are
        remembered, so that ``auto`` costs a dictionary lookup per call after the first."""
        key = ("algorithm", collective, world, nbytes, itemsize, codec)
        choice = self._cache.get(key)
        if choice is None:
            choice = self._cache[key] = self._choose_algorithm(collective, world, nbytes, itemsize, codec)
        return choice

    def _choose_algorithm(
        self, collective: str, world: int, nbytes: int, itemsize: int, codec: object
    ) -> str:
        names = CODEC_ALGORITHMS if _codec_layout(codec)[0] != "none" else self.candidates(collective)
        if len(names) == 1 or world == 1:
            return names[0]
        return min(
            names,
            key=lambda a: self.predict(collective, a, world, nbytes, itemsize=itemsize, codec=codec).time_s,
        )

    def choose_compression(
        self, world: int, nbytes: int, *, error_budget: float, codecs: Sequence[str] = AUTO_CODECS
    ) -> tuple[str, str]:
        """(codec name or "none", algorithm) of the all-reduce of ``nbytes`` of float32 predicted fastest
        among the uncompressed one and the ``codecs`` whose expected error fits ``error_budget``
        (remembered, like ``choose_algorithm``)."""
        key = ("compression", world, nbytes, error_budget, tuple(codecs))
        choice = self._cache.get(key)
        if choice is None:
            choice = self._cache[key] = self._choose_compression(world, nbytes, error_budget, codecs)
        return choice

    def _choose_compression(
        self, world: int, nbytes: int, error_budget: float, codecs: Sequence[str]
    ) -> tuple[str, str]:
        best = ("none", self.choose_algorithm("allreduce", world, nbytes))
        best_time = self.predict("allreduce", best[1], world, nbytes).time_s
        if world == 1:
            return best
        for name in codecs:
            for algorithm in CODEC_ALGORITHMS:
                p = self.predict("allreduce", algorithm, world, nbytes, codec=name)
                if p.error <= error_budget and p.time_s < best_time:
                    best, best_time = (name, algorithm), p.time_s
        return best


def _codec_layout(codec: object) -> tuple[str, float | None, int]:
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
