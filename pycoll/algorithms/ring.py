"""Ring algorithms: all-reduce, reduce-scatter, all-gather and a chain broadcast.

The parts, named as the code names them:

    ring     ranks 0..world-1 in order; every rank sends only to its ``right`` neighbour (rank+1) and
             receives only from its ``left`` neighbour (rank-1), so each link carries one direction.
    chunk    one chunk per rank: chunk c is owned by rank c, which produces its final value.
    segment  many segments per chunk: every chunk is cut into the same number of segments
             (``cut_segments``) and a segment is what one message carries.
    partial  a segment of a chunk reduced over some of the ranks. Partials travel the ring inside
             RECV_REDUCE_SEND ops and never touch local memory.

All-reduce, for each segment s (segment-major: every step of segment 0, then of segment 1, ...):

    reduce-scatter step   rank r sends segment s of chunk r-1 to the right, then for j = 2..world-1
                          receives the partial of chunk r-j from the left, reduces its own input into it
                          and sends it on (RECV_REDUCE_SEND); finally it receives the partial of its own
                          chunk r, reduces it into the final value, writes it and sends it on
                          (RECV_REDUCE_COPY_SEND, finalize=True).
    all-gather step       for j = 1..world-2 rank r receives the final chunk r-j from the left, writes it
                          and forwards it (RECV_COPY_SEND); the last one, chunk r+1, is only written (RECV)
                          because its owner is the right neighbour.

Each link carries 2*(world-1) messages per segment: rank r sends every chunk but its own once as a
partial, its own chunk once as a final value, and every chunk but r and r+1 once more as a final value.

Reduce-scatter is the reduce-scatter step alone (the owner's last op is a RECV_REDUCE into OUTPUT) and
all-gather the all-gather step alone (with a local COPY of the rank's own chunk). Broadcast is a chain
in ring order starting at ``root``: one step per segment, each rank receiving a segment and forwarding it
in the same op.
"""

from __future__ import annotations

from pycoll.algorithms._layout import (
    acknowledge_root,
    copy,
    cut_segments,
    recv,
    recv_copy_send,
    recv_reduce,
    recv_reduce_copy_send,
    recv_reduce_send,
    send,
)
from pycoll.algorithms.plan import Buf, Op, Plan, make_plan, split_even

IN, OUT = Buf.INPUT, Buf.OUTPUT


def _pass_partials(rank: int, world: int, segment_of: list[tuple[int, int]]) -> list[Op]:
    """The reduce-scatter step up to (not including) the owner's op: send segment of chunk r-1, then
    for j = 2..world-1 receive the partial of chunk r-j, reduce own INPUT into it and pass it on."""
    left, right = (rank - 1) % world, (rank + 1) % world
    off, n = segment_of[(rank - 1) % world]
    ops = [send(n, right, (IN, off))]
    for j in range(2, world):
        off, n = segment_of[(rank - j) % world]
        ops.append(recv_reduce_send(n, left, right, (IN, off)))
    return ops


def ring_allreduce(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """In-place ring all-reduce of ``count`` elements (INPUT and OUTPUT alias)."""
    if world == 1:
        return make_plan(rank, world, "allreduce", "ring", count, count, [])
    left, right = (rank - 1) % world, (rank + 1) % world
    chunk_segments = cut_segments(split_even(count, world), segment_elems)
    steps: list[list[Op]] = []
    for segment in range(len(chunk_segments[0])):
        # segment_of[chunk] = (offset, count) of this segment of that chunk
        segment_of = [chunk_segments[chunk][segment] for chunk in range(world)]
        reduce_scatter = _pass_partials(rank, world, segment_of)
        off, n = segment_of[rank]
        reduce_scatter.append(recv_reduce_copy_send(n, left, right, (IN, off), (OUT, off), finalize=True))

        all_gather: list[Op] = []
        for j in range(1, world - 1):
            off, n = segment_of[(rank - j) % world]
            all_gather.append(recv_copy_send(n, left, right, (OUT, off)))
        off, n = segment_of[(rank + 1) % world]
        all_gather.append(recv(n, left, (OUT, off)))
        steps += [reduce_scatter, all_gather]
    return make_plan(rank, world, "allreduce", "ring", count, count, steps)


def ring_reduce_scatter(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """Out-of-place ring reduce-scatter: INPUT is ``world`` chunks of ``count``; OUTPUT is chunk ``rank``."""
    if world == 1:
        return make_plan(rank, world, "reduce_scatter", "ring", count, count,
                         [[copy(count, (IN, 0), (OUT, 0))]])
    left = (rank - 1) % world
    chunk_segments = cut_segments([(chunk * count, count) for chunk in range(world)], segment_elems)
    steps: list[list[Op]] = []
    for segment in range(len(chunk_segments[0])):
        segment_of = [chunk_segments[chunk][segment] for chunk in range(world)]
        reduce_scatter = _pass_partials(rank, world, segment_of)
        off, n = segment_of[rank]
        reduce_scatter.append(recv_reduce(n, left, (IN, off), (OUT, off - rank * count), finalize=True))
        steps.append(reduce_scatter)
    return make_plan(rank, world, "reduce_scatter", "ring", world * count, count, steps)


def ring_all_gather(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """Out-of-place ring all-gather: INPUT is ``count`` elements; OUTPUT is ``world`` chunks of ``count``."""
    if world == 1:
        return make_plan(rank, world, "all_gather", "ring", count, count, [[copy(count, (IN, 0), (OUT, 0))]])
    left, right = (rank - 1) % world, (rank + 1) % world
    steps: list[list[Op]] = []
    # The rank's INPUT is its own chunk; segment (off, n) of chunk c sits at c*count + off in OUTPUT.
    for off, n in cut_segments([(0, count)], segment_elems)[0]:
        segment_out = [(OUT, chunk * count + off) for chunk in range(world)]
        all_gather = [send(n, right, (IN, off)), copy(n, (IN, off), segment_out[rank])]
        for j in range(1, world - 1):
            all_gather.append(recv_copy_send(n, left, right, segment_out[(rank - j) % world]))
        all_gather.append(recv(n, left, segment_out[(rank + 1) % world]))
        steps.append(all_gather)
    return make_plan(rank, world, "all_gather", "ring", count, world * count, steps)


def ring_broadcast(rank: int, world: int, count: int, segment_elems: int, root: int = 0) -> Plan:
    """In-place chain broadcast from ``root`` in ring order (root, root+1, ...), pipelined over segments."""
    position = (rank - root) % world
    prev, next_ = (rank - 1) % world, (rank + 1) % world
    steps: list[list[Op]] = []
    if world > 1:
        for off, n in cut_segments([(0, count)], segment_elems)[0]:
            if position == 0:
                steps.append([send(n, next_, (IN, off))])
            elif position < world - 1:
                steps.append([recv_copy_send(n, prev, next_, (OUT, off))])
            else:
                steps.append([recv(n, prev, (OUT, off))])
        steps.append(acknowledge_root(rank, world, root))
    return make_plan(rank, world, "broadcast", "ring", count, count, steps)
