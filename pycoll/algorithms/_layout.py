"""Shared vocabulary for the algorithm files: how a buffer is cut into parts, and short op constructors.

Every algorithm file cuts its buffer the same way:

    buffer   the ``count`` elements one collective works on (or one rank's share of them).
    chunk    a contiguous piece of the buffer with an owner (``split_even``: sizes differ by <= 1).
    segment  a contiguous piece of a chunk, the unit of one message. Every chunk of one plan is cut into
             the *same number* of segments (``num_segments``), so that the sender and the receiver of
             segment s of any chunk agree on its size without talking.

Nothing here knows an algorithm; the constructors only fill in ``Op`` fields by name.
"""

from __future__ import annotations

from pycoll.algorithms.plan import Buf, Op, OpKind, split_even

Region = tuple[Buf, int]
Span = tuple[int, int]  # (element offset, element count)


def num_segments(longest: int, segment_elems: int) -> int:
    """How many segments a part of ``longest`` elements needs so no segment exceeds ``segment_elems``."""
    if segment_elems < 1:
        raise ValueError(f"segment_elems must be >= 1, got {segment_elems}")
    return max(1, -(-longest // segment_elems))


def cut_segments(chunks: list[Span], segment_elems: int) -> list[list[Span]]:
    """``[chunk][segment] -> (offset, count)``: each chunk cut into the same number of even segments."""
    n_segments = num_segments(max((length for _, length in chunks), default=0), segment_elems)
    return [[(offset + seg_off, seg_len) for seg_off, seg_len in split_even(length, n_segments)]
            for offset, length in chunks]


# ---- op constructors (names follow plan.py's op list) -------------------------------------------------

def send(count: int, to: int, src: Region) -> Op:
    return Op(OpKind.SEND, count, send_peer=to, src=src)


def recv(count: int, frm: int, dst: Region) -> Op:
    return Op(OpKind.RECV, count, recv_peer=frm, dst=dst)


def recv_reduce(count: int, frm: int, src: Region, dst: Region, finalize: bool = False) -> Op:
    return Op(OpKind.RECV_REDUCE, count, recv_peer=frm, src=src, dst=dst, finalize=finalize)


def recv_reduce_send(count: int, frm: int, to: int, src: Region) -> Op:
    return Op(OpKind.RECV_REDUCE_SEND, count, send_peer=to, recv_peer=frm, src=src)


def recv_reduce_copy_send(count: int, frm: int, to: int, src: Region, dst: Region, finalize: bool) -> Op:
    return Op(OpKind.RECV_REDUCE_COPY_SEND, count, send_peer=to, recv_peer=frm, src=src, dst=dst,
              finalize=finalize)


def recv_copy_send(count: int, frm: int, to: int, dst: Region) -> Op:
    return Op(OpKind.RECV_COPY_SEND, count, send_peer=to, recv_peer=frm, dst=dst)


def copy(count: int, src: Region, dst: Region) -> Op:
    return Op(OpKind.COPY, count, src=src, dst=dst)


def acknowledge_root(rank: int, world: int, root: int) -> list[Op]:
    """A last step in which every other rank sends an empty message to ``root``.

    Without it the root of a broadcast only sends, so it would return before anyone checked that the
    others called the same broadcast; with it, a mismatch reaches the root at this call too, and the
    root returns only once every rank has its data.
    """
    if world == 1:
        return []
    if rank != root:
        return [send(0, root, (Buf.INPUT, 0))]
    return [recv(0, peer, (Buf.OUTPUT, 0)) for peer in range(world) if peer != root]
