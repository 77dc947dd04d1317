"""Direct (two-shot) algorithms: all-reduce, reduce-scatter and all-gather over all-to-all links.

The parts, named as the code names them:

    chunk     one chunk per rank: rank r is the ``owner`` of chunk r and the only rank that reduces it.
    segment   many segments per chunk: every chunk is cut into the same number of segments, the unit of
              one message. Steps are segment-major (every step of segment 0, then of segment 1, ...) so
              the data one step touches stays in cache.
    peers     the other ranks in a fixed rotation: rank r sends to r+1, r+2, ..., r-1 and receives from
              r-1, r-2, ..., r+1. The k-th peer a rank sends to is the one that receives from it k-th, so
              every rank starts on a different link, and the owner always reduces its peers' segments
              in the same order (reductions are deterministic).

All-reduce, for each segment s:

    reduce-scatter step   every rank SENDs segment s of chunk p to owner p, for every peer p; the owner
                          receives segment s of its chunk from every peer in the fixed order and reduces
                          it into OUTPUT (RECV_REDUCE; the first reads INPUT, the last has finalize=True).
    all-gather step       the owner SENDs the final segment s of its chunk to every peer and receives
                          segment s of every peer's chunk into OUTPUT (RECV).

Each ordered pair (r, p) carries segment s of chunk p and then segment s of chunk r: 2*count/world
elements per pair in all, 2*(world-1)/world*count per rank, in two message latencies per segment.

Reduce-scatter is the reduce-scatter step alone (OUTPUT is the owner's chunk) and all-gather the
all-gather step alone plus a local COPY of the rank's own chunk.

All-to-all (``direct_all_to_all``) has no owner and no reduction; its parts:

    part      INPUT is cut, in rank order, into ``send_counts[p]`` elements for rank p (this rank's own
              part included), and OUTPUT into ``recv_counts[q]`` elements from rank q. Parts may differ
              in size and be empty (MoE dispatch). Rank p's ``recv_counts[r]`` must equal rank r's
              ``send_counts[p]``: each part is one message, whose size the executor checks against the
              receiver's on its first fragment (a mismatch is a CollectiveMismatchError, never a hang or
              a message left behind). An empty part is an empty message, so every pair of ranks meets.
    own part  COPYd locally, in the first step.
    exchange  the second step: one SEND to every peer and one RECV from every peer, in the fixed
              rotation; the executor moves them all at once, fragment by fragment (no segments: nothing
              waits on a part, so cutting it would only add messages).
"""

from __future__ import annotations

import itertools
from typing import Sequence

from pycoll.algorithms._layout import copy, cut_segments, recv, recv_reduce, send
from pycoll.algorithms.plan import Buf, Op, Plan, make_plan, split_even

IN, OUT = Buf.INPUT, Buf.OUTPUT


def _peers(rank: int, world: int) -> tuple[list[int], list[int]]:
    """(ranks to send to, ranks to receive from), both in the fixed rotation."""
    return ([(rank + k) % world for k in range(1, world)], [(rank - k) % world for k in range(1, world)])


def _reduce_own_chunk(rank: int, world: int, from_peers: list[int], src: tuple[Buf, int],
                      dst: tuple[Buf, int], n: int) -> list[Op]:
    """The owner's receive-reduces of one segment: first from INPUT, then in OUTPUT; the last finalizes."""
    ops = []
    for k, peer in enumerate(from_peers):
        ops.append(recv_reduce(n, peer, src if k == 0 else dst, dst, finalize=k == len(from_peers) - 1))
    return ops


def direct_allreduce(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """In-place two-shot all-reduce of ``count`` elements (INPUT and OUTPUT alias)."""
    if world == 1:
        return make_plan(rank, world, "allreduce", "direct", count, count, [])
    to_peers, from_peers = _peers(rank, world)
    chunk_segments = cut_segments(split_even(count, world), segment_elems)
    steps: list[list[Op]] = []
    for segment in range(len(chunk_segments[0])):
        # segment_of[chunk] = (offset, count) of this segment of that chunk
        segment_of = [chunk_segments[chunk][segment] for chunk in range(world)]
        own_off, own_n = segment_of[rank]
        reduce_scatter = [send(segment_of[p][1], p, (IN, segment_of[p][0])) for p in to_peers]
        reduce_scatter += _reduce_own_chunk(rank, world, from_peers, (IN, own_off), (OUT, own_off), own_n)
        all_gather = [send(own_n, p, (OUT, own_off)) for p in to_peers]
        all_gather += [recv(segment_of[q][1], q, (OUT, segment_of[q][0])) for q in from_peers]
        steps += [reduce_scatter, all_gather]
    return make_plan(rank, world, "allreduce", "direct", count, count, steps)


def direct_reduce_scatter(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """Out-of-place direct reduce-scatter: INPUT is ``world`` chunks of ``count``; OUTPUT chunk ``rank``."""
    if world == 1:
        return make_plan(rank, world, "reduce_scatter", "direct", count, count,
                         [[copy(count, (IN, 0), (OUT, 0))]])
    to_peers, from_peers = _peers(rank, world)
    steps: list[list[Op]] = []
    # Every chunk has ``count`` elements, so segment (off, n) of chunk c sits at c*count + off in INPUT.
    for off, n in cut_segments([(0, count)], segment_elems)[0]:
        reduce_scatter = [send(n, p, (IN, p * count + off)) for p in to_peers]
        reduce_scatter += _reduce_own_chunk(rank, world, from_peers, (IN, rank * count + off), (OUT, off), n)
        steps.append(reduce_scatter)
    return make_plan(rank, world, "reduce_scatter", "direct", world * count, count, steps)


def direct_all_gather(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """Out-of-place direct all-gather: INPUT is ``count`` elements; OUTPUT ``world`` chunks of ``count``."""
    if world == 1:
        return make_plan(rank, world, "all_gather", "direct", count, count,
                         [[copy(count, (IN, 0), (OUT, 0))]])
    to_peers, from_peers = _peers(rank, world)
    steps: list[list[Op]] = []
    for off, n in cut_segments([(0, count)], segment_elems)[0]:
        all_gather = [send(n, p, (IN, off)) for p in to_peers]
        all_gather.append(copy(n, (IN, off), (OUT, rank * count + off)))
        all_gather += [recv(n, q, (OUT, q * count + off)) for q in from_peers]
        steps.append(all_gather)
    return make_plan(rank, world, "all_gather", "direct", count, world * count, steps)


def direct_all_to_all(rank: int, world: int, send_counts: Sequence[int], recv_counts: Sequence[int]) -> Plan:
    """Out-of-place all-to-all: INPUT is ``sum(send_counts)`` elements, part p for rank p; OUTPUT is
    ``sum(recv_counts)``, part q from rank q."""
    if len(send_counts) != world or len(recv_counts) != world or min(*send_counts, *recv_counts, 0) < 0:
        raise ValueError(f"need {world} non-negative send and receive counts: {send_counts} {recv_counts}")
    if send_counts[rank] != recv_counts[rank]:
        raise ValueError(f"rank {rank} sends itself {send_counts[rank]} elements, gets {recv_counts[rank]}")
    send_at = [0, *itertools.accumulate(send_counts)]  # where each part starts (O(world): MoE calls it often)
    recv_at = [0, *itertools.accumulate(recv_counts)]
    to_peers, from_peers = _peers(rank, world)
    own_part = copy(send_counts[rank], (IN, send_at[rank]), (OUT, recv_at[rank]))
    exchange = [send(send_counts[p], p, (IN, send_at[p])) for p in to_peers]
    exchange += [recv(recv_counts[q], q, (OUT, recv_at[q])) for q in from_peers]
    steps = [[own_part], exchange] if exchange else [[own_part]]
    return make_plan(rank, world, "all_to_all", "direct", send_at[-1], recv_at[-1], steps)
