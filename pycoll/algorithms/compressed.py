"""Compressed all-reduce plans: any all-reduce plan, cut at codec block boundaries.

A codec encodes blocks of ``block`` elements, and a fragment of a message must hold whole blocks to be
decoded on its own. So the plan is built over *blocks* (an all-reduce of ceil(count / block) "elements")
and then scaled back to elements, every offset landing on a block boundary; only the buffer's last block
may be short, and it stays the last piece of the last message that carries it.

Final values travel encoded once: every SEND of OUTPUT (a final value) becomes a SEND of ENCODED, the
bytes its owner encoded when it finalized the region (or that this rank forwarded), so no rank ever
re-encodes a final value and every rank decodes the same bits. See "Compressed plans" in plan.py.
Ops the algorithm marked ``uncompressed`` (the hierarchical all-reduce's intra-host stages) keep their
float32 messages, and their SENDs of OUTPUT stay SENDs of OUTPUT.

Each algorithm quantizes an element a different number of times, which is what its error grows with:

    direct (two-shot)   twice, whatever the world size: each rank's share once on the way to its owner,
                        the owner's sum once on the way back (the owner's own input is not quantized)
    ring                world - 1 times in the reduce-scatter (every hop re-encodes the partial sum), then
                        the final value once; the all-gather forwards the encoded bits unchanged
    tree                once per level on the way up (about log2(world)), then once at the root
    hierarchical        as the ring among the hosts (hosts - 1 times, then the final value once); the
                        sums within a host are exact
"""

from __future__ import annotations

from dataclasses import replace

from pycoll.algorithms import build_plan
from pycoll.algorithms.plan import WRITES_DST, Buf, Op, OpKind, Plan

#: The default algorithm with a codec: each element is quantized at most twice.
DEFAULT_COMPRESSED_ALGORITHM = "direct"


def _scale(op: Op, block: int, count: int) -> Op:
    region = op.dst[1] if op.kind in WRITES_DST else op.src[1]
    start = min(region * block, count)
    n = min((region + op.count) * block, count) - start
    sends_final = op.kind == OpKind.SEND and op.src[0] == Buf.OUTPUT and not op.uncompressed
    src = (Buf.ENCODED if sends_final else op.src[0],
           min(op.src[1] * block, count))
    dst = (op.dst[0], min(op.dst[1] * block, count))
    return replace(op, count=n, src=src, dst=dst)


def build_compressed_plan(algorithm: str, rank: int, world: int, count: int, block: int,
                          segment_blocks: int, local_size: int = 1) -> Plan:
    """The all-reduce plan of ``rank`` for ``count`` elements encoded in blocks of ``block`` elements,
    with messages of at most ``segment_blocks`` blocks."""
    if block < 1 or segment_blocks < 1:
        raise ValueError(f"need block >= 1 and segment_blocks >= 1, got {block} and {segment_blocks}")
    blocks = -(-count // block)
    plan = build_plan("allreduce", algorithm, rank, world, blocks, segment_elems=segment_blocks,
                      local_size=local_size)
    steps = tuple(tuple(_scale(op, block, count) for op in step) for step in plan.steps)
    return Plan(rank, world, "allreduce", algorithm, count, count, steps)
