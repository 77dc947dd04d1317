"""Compressed plans: any all-reduce plan cut at codec block boundaries; the direct reduce-scatter and
all-gather.

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

Reduce-scatter (``build_compressed_reduce_scatter``) is direct: every rank encodes each chunk of its
input once, on the way to the chunk's owner, and the owner sums the decoded shares and its own exact
share in float32 and keeps the sum (its finalizing receive-reduces are ``exact``). So each element is
quantized once whatever the world size, where a ring would re-encode the partial sum world - 1 times.
The chunk's blocks start at the chunk: segments are whole blocks of it, only its last block may be short.
On several hosts it may be hierarchical (``build_compressed_hierarchical_reduce_scatter``,
hierarchical.py): the host's sums exact, each element quantized once, on its way between hosts.

All-to-all (``build_compressed_all_to_all``) is the direct all-to-all: every part a rank sends is one
message, encoded once, in blocks from the part's start, straight into the transport's fragments (whole
blocks each), and decoded once by its receiver; nothing is kept encoded. A rank's own part is COPYd
``uncompressed`` (it goes nowhere, so nothing need quantize it).

All-gather (``build_compressed_all_gather``) is direct too: every rank encodes its chunk once (a COPY
of it into OUTPUT, keeping the encoding in ENCODED) and sends those bytes to every peer (SENDs from
ENCODED), which decode them. The owner keeps the decoding of its own encoding, so every rank's output
is bitwise identical; with ``exact_own`` the COPY is ``exact`` and the owner keeps its input instead.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from pycoll.algorithms import build_plan
from pycoll.algorithms._layout import copy, recv, send
from pycoll.algorithms.direct import _peers, direct_all_to_all, direct_reduce_scatter
from pycoll.algorithms.hierarchical import hierarchical_all_gather, hierarchical_reduce_scatter
from pycoll.algorithms.plan import WRITES_DST, Buf, Op, OpKind, Plan, make_plan, segments

#: The default algorithm with a codec: each element is quantized at most twice.
DEFAULT_COMPRESSED_ALGORITHM = "direct"
#: The one algorithm of a compressed reduce-scatter or all-gather (each element quantized once).
COMPRESSED_DIRECT_ALGORITHM = "direct"


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


def _check_chunked(what: str, world: int, block: int, segment_blocks: int) -> None:
    if block < 1 or segment_blocks < 1:
        raise ValueError(f"need block >= 1 and segment_blocks >= 1, got {block} and {segment_blocks}")
    if world == 1:
        raise ValueError(f"a compressed {what} needs world >= 2 (one rank copies its input exactly)")


def build_compressed_reduce_scatter(
    rank: int, world: int, count: int, block: int, segment_blocks: int
) -> Plan:
    """The direct reduce-scatter plan of ``rank`` for chunks of ``count`` elements encoded in blocks of
    ``block`` elements (of each chunk), with messages of at most ``segment_blocks`` blocks."""
    _check_chunked("reduce-scatter", world, block, segment_blocks)
    blocks = -(-count // block)  # of each chunk
    plan = direct_reduce_scatter(rank, world, blocks, segment_blocks)  # in blocks, then scaled back

    def element(region: tuple[Buf, int]) -> tuple[Buf, int]:  # INPUT is world chunks, OUTPUT one
        chunk, b = divmod(region[1], blocks) if blocks else (0, 0)
        return region[0], chunk * count + min(b * block, count)

    def scale(op: Op) -> Op:
        region = op.dst if op.kind in WRITES_DST else op.src
        b = region[1] % blocks if blocks else 0
        n = min((b + op.count) * block, count) - min(b * block, count)
        return replace(op, count=n, src=element(op.src), dst=element(op.dst), exact=op.finalize)

    steps = tuple(tuple(scale(op) for op in step) for step in plan.steps)
    return replace(plan, input_count=world * count, output_count=count, steps=steps)


def build_compressed_all_gather(
    rank: int, world: int, count: int, block: int, segment_blocks: int, exact_own: bool = False
) -> Plan:
    """The direct all-gather plan of ``rank`` for chunks of ``count`` elements encoded in blocks of
    ``block`` elements (of each chunk), with messages of at most ``segment_blocks`` blocks."""
    _check_chunked("all-gather", world, block, segment_blocks)
    to_peers, from_peers = _peers(rank, world)
    own = rank * count
    encode_own = replace(copy(count, (Buf.INPUT, 0), (Buf.OUTPUT, own)), exact=exact_own)
    steps: list[list[Op]] = [[encode_own]]
    for off, n in segments(0, count, segment_blocks * block):
        step = [send(n, p, (Buf.ENCODED, own + off)) for p in to_peers]
        step += [recv(n, q, (Buf.OUTPUT, q * count + off)) for q in from_peers]
        steps.append(step)
    return make_plan(rank, world, "all_gather", "direct", count, world * count, steps)


def build_compressed_all_to_all(
    rank: int, world: int, send_counts: Sequence[int], recv_counts: Sequence[int]
) -> Plan:
    """The direct all-to-all plan of ``rank`` (parts of ``send_counts`` / ``recv_counts`` elements), each
    part one message encoded in codec blocks from its start; the own part is COPYd uncompressed."""
    if world == 1:
        raise ValueError("a compressed all-to-all needs world >= 2 (one rank copies its input exactly)")
    plan = direct_all_to_all(rank, world, send_counts, recv_counts)
    own, *rest = plan.steps[0]
    return replace(plan, steps=((replace(own, uncompressed=True), *rest), *plan.steps[1:]))


def build_compressed_hierarchical_reduce_scatter(
    rank: int, world: int, count: int, block: int, segment_blocks: int, local_size: int
) -> Plan:
    """The hierarchical reduce-scatter (hierarchical.py) with a codec: segments of whole blocks of each
    chunk, the intra-host stage ``uncompressed``, the cross-host messages encoded once each, the owner's
    finalizing receives ``exact``."""
    _check_chunked("reduce-scatter", world, block, segment_blocks)
    plan = hierarchical_reduce_scatter(rank, world, count, segment_blocks * block, local_size)
    def owner_keeps(op: Op) -> Op:
        return replace(op, exact=op.finalize and not op.uncompressed)

    return replace(plan, steps=tuple(tuple(owner_keeps(op) for op in step) for step in plan.steps))


def build_compressed_hierarchical_all_gather(
    rank: int, world: int, count: int, block: int, segment_blocks: int, local_size: int,
    exact_own: bool = False,
) -> Plan:
    """The hierarchical all-gather (hierarchical.py) with a codec: the owner's COPY encodes its chunk once
    (``exact_own``: keeping its own values exact), and every SEND forwards those bytes from ENCODED."""
    _check_chunked("all-gather", world, block, segment_blocks)
    plan = hierarchical_all_gather(rank, world, count, segment_blocks * block, local_size, finals=Buf.ENCODED)
    (encode_own,), *rest = plan.steps
    return replace(plan, steps=((replace(encode_own, exact=exact_own),), *rest))
