"""Plans: what one rank does in one collective, as plain data.

An algorithm (ring, tree, direct, ...) is a pure function that returns, for one rank, a ``Plan``: an
ordered list of *steps*, each a tuple of *ops*. The native executor (csrc/engine) and the pure-Python
simulator (``simulate.py``) both run plans with exactly the semantics written here; nothing else
about an algorithm is known to either of them. (The simulator runs compressed all-reduce and
reduce-scatter plans, ``exact`` receive-reduces included, but no compressed COPY: the compressed
all-gather and all-to-all run natively and are checked against the reference codecs on real ranks,
tests/distributed/test_compressed_all_gather.py, test_all_to_all.py.)

Buffers
    ``INPUT`` (``input_count`` elements) and ``OUTPUT`` (``output_count`` elements). For an in-place
    all-reduce both refer to the same memory; plans for in-place collectives must therefore be correct
    when they alias (they read a region of INPUT only before writing the same region of OUTPUT).

Ops (``count`` elements each; ``src``/``dst`` are (buffer, element offset)):
    SEND                 send src[0:count] to ``send_peer``.
    RECV                 receive ``count`` elements from ``recv_peer`` into dst.
    RECV_REDUCE          dst[i] = src[i] (+) msg[i]          (msg received from ``recv_peer``)
    RECV_REDUCE_SEND     send src[i] (+) msg[i] to ``send_peer``; nothing is written locally.
    RECV_REDUCE_COPY_SEND  v = src[i] (+) msg[i]; dst[i] = v; send v to ``send_peer``.
    RECV_COPY_SEND       dst[i] = msg[i]; send msg[i] on to ``send_peer``.
    COPY                 dst[0:count] = src[0:count] (local).
    (+) is the reduction operator (sum, min, max, prod; avg reduces as sum).

``finalize`` marks the op that produces the *final* value of a region (the chunk owner's last
reduction). For ``avg`` the executor divides by the world size there, before the value is written or
sent on, so every rank receives the same already-divided bits. For other operators it changes nothing.

Execution order
    Steps run in order: step k+1 starts only when every op of step k is complete. Within a step,
    pure SENDs progress independently of the receiving ops (full duplex), except that messages to one
    peer leave in list order (an op sending to a peer waits for the earlier ops of its step that send to
    the same peer). Every op that receives (or COPY) completes in list order, which makes float
    reductions deterministic, and may read what an earlier op of its step wrote; a SEND must not read a
    region written in its own step (it is sent fragment by fragment, concurrently).
    Messages between an ordered pair of ranks are FIFO and are matched by position: the n-th message
    rank a sends to rank b is the n-th message b receives from a, and both sides must agree on its
    count (the executor checks, and raises CollectiveMismatchError otherwise).
    These are the semantics, and the results are those of running the steps in this order. The native
    executor overlaps steps where that changes nothing (csrc/engine/plan_dependencies.h): an op starts as
    soon as the earlier ops it depends on are done (those whose regions overlap its own where one of
    them writes, and the previous op sending to, or receiving from, the same peer), and an empty
    message (count 0: a barrier round, an acknowledgement) waits for every op of the earlier steps. So a
    plan relies on step order only through the data its ops touch and through empty messages. It also
    does a *chain* of receive-reduces into one region (a direct all-reduce's owner reducing its peers'
    segments) in one pass over memory, and writes the region it finalizes
    straight into the SENDs of it that follow (csrc/engine/plan_fusion.h), combining every element in
    plan order and rounding it as each op would.

Compressed plans (``algorithms/compressed.py``; all-reduce and reduce-scatter on float32 with a codec)
    Offsets and counts are still elements, every op starting on a codec block boundary (an all-reduce's
    blocks are the buffer's; a reduce-scatter's are its chunk's, each chunk's last block maybe short).
    Every message carries the encoding of its op's elements instead of the elements themselves, and the
    ops do this:
        SEND from INPUT      msg = encode(src (+ residual))
        SEND from ENCODED    msg = the encoded bytes this rank kept for the region (a final value)
        RECV                 keep msg in ENCODED; dst = decode(msg)
        RECV_COPY_SEND       send msg on unchanged; keep it in ENCODED; dst = decode(msg)
        RECV_REDUCE          dst = src (+ residual) + decode(msg), in float32; with finalize the value
                             is divided (avg), encoded once into ENCODED, and dst = decode(that encoding)
        RECV_REDUCE_SEND     send encode(src (+ residual) + decode(msg))
        RECV_REDUCE_COPY_SEND  v = src (+ residual) + decode(msg) (divided when finalize); e = encode(v);
                             send e, keep it in ENCODED, dst = decode(e)
    So a final value is encoded exactly once, by its owner, and everyone (the owner too) ends with the
    decoding of the same bytes: every rank's result is bitwise identical. ENCODED is a staging buffer
    addressed like OUTPUT. Error feedback (``residual``, float32 like INPUT): ops that read INPUT add the
    residual and reset it to 0; every encode of a region stores what it lost there (for avg, times the
    world size, as the loss happened after the division). A compressed all-gather's COPY of its own chunk:
        COPY                 e = encode(src); keep e in ENCODED; dst = decode(e) (``exact``: dst = src)
    and its SENDs forward e from ENCODED; an all-reduce has no COPY. ENCODED is addressed like OUTPUT,
    in chunks of the smaller of INPUT's and OUTPUT's counts (an all-reduce's whole buffer, one rank's
    chunk otherwise), each cut in blocks from its start (csrc/engine/plan.h EncodedLayout).

    A reduce-scatter's final values stay with their owner, so its finalizing RECV_REDUCEs are marked
    ``exact``: dst = (src (+ residual) + decode(msg)) / divisor, kept in float32 and never encoded. Each
    element is then quantized once, by its sender, and the owner's own share not at all.

    Ops marked ``uncompressed`` are the exception: their messages carry the float32 elements themselves
    and they do what they do in a plan without a codec (a SEND of OUTPUT sends OUTPUT; nothing is encoded,
    decoded or kept in ENCODED), and they leave the residual alone. The hierarchical all-reduce marks its
    intra-host stages so, which keeps the codec on the slow links between hosts; its error feedback is
    then the loss of the host's sum, which the cross-host stage adds back when it next reads that sum.

Empty regions
    Plans emit ops for empty chunks too (count 0): the executor still sends a header-only message, so
    every collective synchronises the ranks it connects and a rank that called with a different count
    is detected rather than left waiting.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np


class OpKind(enum.IntEnum):
    """Op codes; the values are shared with csrc/engine/plan.h."""

    SEND = 0
    RECV = 1
    RECV_REDUCE = 2
    RECV_REDUCE_SEND = 3
    RECV_REDUCE_COPY_SEND = 4
    RECV_COPY_SEND = 5
    COPY = 6


class Buf(enum.IntEnum):
    INPUT = 0
    OUTPUT = 1
    ENCODED = 2  # compressed plans only: see "Compressed plans" above


SENDS = frozenset(
    {OpKind.SEND, OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND, OpKind.RECV_COPY_SEND}
)
RECEIVES = frozenset(
    {
        OpKind.RECV,
        OpKind.RECV_REDUCE,
        OpKind.RECV_REDUCE_SEND,
        OpKind.RECV_REDUCE_COPY_SEND,
        OpKind.RECV_COPY_SEND,
    }
)
READS_SRC = frozenset(
    {OpKind.SEND, OpKind.RECV_REDUCE, OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND, OpKind.COPY}
)
WRITES_DST = frozenset(
    {OpKind.RECV, OpKind.RECV_REDUCE, OpKind.RECV_REDUCE_COPY_SEND, OpKind.RECV_COPY_SEND, OpKind.COPY}
)


@dataclass(frozen=True)
class Op:
    kind: OpKind
    count: int
    send_peer: int = -1
    recv_peer: int = -1
    src: tuple[Buf, int] = (Buf.INPUT, 0)
    dst: tuple[Buf, int] = (Buf.OUTPUT, 0)
    finalize: bool = False
    #: In a compressed plan, this op's message carries the float32 elements, not their encoding (see
    #: "Compressed plans"); in other plans it changes nothing.
    uncompressed: bool = False
    #: In a compressed plan, a finalizing RECV_REDUCE whose value stays on this rank (a reduce-scatter's
    #: owner): kept in float32, not encoded; a COPY that keeps its source (see "Compressed plans").
    exact: bool = False

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"op count must be >= 0, got {self.count}")
        if (self.kind in SENDS) != (self.send_peer >= 0):
            raise ValueError(f"{self.kind.name} needs send_peer iff it sends, got {self.send_peer}")
        if (self.kind in RECEIVES) != (self.recv_peer >= 0):
            raise ValueError(f"{self.kind.name} needs recv_peer iff it receives, got {self.recv_peer}")
        exact_ok = (self.kind == OpKind.RECV_REDUCE and self.finalize) or self.kind == OpKind.COPY
        if self.exact and not exact_ok:
            raise ValueError(
                f"only a finalizing RECV_REDUCE or a COPY keeps its value exact, not {self.kind.name}"
            )


# Columns of the int64 table handed to the native executor (csrc/engine/plan.h reads the same order).
OP_COLUMNS = (
    "kind", "count", "send_peer", "recv_peer", "src_buf", "src_off", "dst_buf", "dst_off", "finalize",
    "uncompressed", "exact",
)


@dataclass(frozen=True)
class Plan:
    rank: int
    world: int
    collective: str
    algorithm: str
    input_count: int
    output_count: int
    steps: tuple[tuple[Op, ...], ...] = field(default_factory=tuple)
    #: A plan that runs in place on a copy of the caller's input (INPUT and OUTPUT alias, input_count
    #: elements each) and whose result is OUTPUT[offset : offset + count]: (offset, count); None for the
    #: others (the hierarchical reduce-scatter, whose partial sums need the whole buffer).
    result: tuple[int, int] | None = None

    def ops(self) -> Iterable[Op]:
        for step in self.steps:
            yield from step

    @property
    def in_place(self) -> bool:
        """Whether INPUT and OUTPUT are one buffer (``INPLACE_COLLECTIVES``, and a plan with a ``result``
        range); the others' callers keep them apart (the API refuses overlapping buffers), which the
        executor's dependencies rely on."""
        return self.collective in INPLACE_COLLECTIVES or self.result is not None

    def to_table(self) -> tuple[np.ndarray, np.ndarray]:
        """(ops as an int64 [n_ops, len(OP_COLUMNS)] array, step start indices as int64 [n_steps+1])."""
        rows = [
            (int(o.kind), o.count, o.send_peer, o.recv_peer, int(o.src[0]), o.src[1], int(o.dst[0]), o.dst[1],
             int(o.finalize), int(o.uncompressed), int(o.exact))
            for o in self.ops()
        ]
        table = np.array(rows, dtype=np.int64).reshape(len(rows), len(OP_COLUMNS))
        starts = np.zeros(len(self.steps) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self.steps], out=starts[1:])
        return table, starts


#: Collectives whose INPUT and OUTPUT are the same buffer; every other one is out of place.
INPLACE_COLLECTIVES = frozenset({"allreduce", "broadcast", "barrier"})


def split_even(count: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of ``parts`` contiguous pieces of ``count`` elements, sizes differing by <= 1."""
    base, extra = divmod(count, parts)
    out = []
    off = 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((off, n))
        off += n
    return out


def segments(offset: int, length: int, segment_elems: int) -> list[tuple[int, int]]:
    """Split [offset, offset+length) into pieces of at most ``segment_elems`` (one empty piece if empty)."""
    if length == 0:
        return [(offset, 0)]
    return [(offset + s, min(segment_elems, length - s)) for s in range(0, length, segment_elems)]


def make_plan(
    rank: int,
    world: int,
    collective: str,
    algorithm: str,
    input_count: int,
    output_count: int,
    steps: Sequence[Sequence[Op]],
) -> Plan:
    return Plan(rank, world, collective, algorithm, input_count, output_count,
                tuple(tuple(s) for s in steps if len(s)))
