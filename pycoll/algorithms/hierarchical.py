"""Hierarchical all-reduce: within each host over its fast links, across hosts over the slow ones, with
every rank of a host carrying a share of the cross-host traffic (so every rank's network link is used).

The parts, named as the code names them:

    host     ``local_size`` consecutive ranks (host h holds ranks h*local_size .. h*local_size+local_size-1,
             the order launchers number ranks in); ``hosts`` = world / local_size.
    share    the buffer cut into ``local_size`` shares: local rank l of every host owns share l on its host.
    column   the ranks with one local rank l on every host: rank l, local_size + l, 2*local_size + l, ...
             Column l all-reduces share l across the hosts.
    segment  the unit of one message, as elsewhere (_layout.py).

All-reduce, three stages:

    intra-host reduce-scatter   every rank SENDs share j of INPUT to local rank j of its host, for every
                                other j, and RECV_REDUCEs share l from each of them, in a fixed order, into
                                share l of INPUT (of OUTPUT on one host, where it is final): the host's sum
                                (direct algorithm). All-reduce is in place, so INPUT may be written.
    cross-host all-reduce       column l runs the ring all-reduce (ring.py) on share l among ``hosts``
                                ranks, from INPUT into OUTPUT; its owners finalize (avg divides there).
    intra-host all-gather       every rank SENDs its final share to the other local ranks and RECVs theirs.

Per rank, the cross-host stage moves 2*(hosts-1)/hosts * count/local_size elements over the network (the
ring's volume on one share), so a host's network traffic is that of one ring rank, spread over all of its
ranks' links; the intra-host stages move 2*(local_size-1)/local_size * count per rank over shared memory.
With one rank per host it is the ring all-reduce; on one host it is the direct all-reduce.

Reduce-scatter (``hierarchical_reduce_scatter``) has one chunk per rank (INPUT is world chunks of
``count``; chunk (c, j) is rank c*local_size + j's) and runs in place on a copy of the caller's input (its
``result`` range is this rank's chunk), two stages:

    intra-host reduce-scatter   by column: every rank SENDs the chunks of local rank j of every host to
                                local rank j of its own host, for every other j, and RECV_REDUCEs the
                                chunks of its own column from each of them, in a fixed order, in place:
                                the host's sum of every chunk its column owns.
    cross-host reduce-scatter   column l runs the direct reduce-scatter among the hosts on those sums:
                                a SEND of the host's sum of chunk (c, l) to rank (c, l), for every other
                                host c, and the RECV_REDUCEs of its own chunk from every other host, the
                                last finalizing (avg divides by the world there).

Per rank, (hosts - 1) * count elements cross the network, against (world - local_size) * count for the
direct reduce-scatter: a host's cross-host traffic falls local_size times. Compressed
(``build_compressed_hierarchical_reduce_scatter`` in compressed.py): the intra-host ops are
``uncompressed`` (the host's sums exact), the cross-host messages encoded, each element quantized once, and
the owner's finalizing receives ``exact``. Error feedback: rank (h, l) keeps what encoding its host's sum
of chunk (c, l) lost at that chunk's place in its residual (shaped like INPUT).

All-gather (``hierarchical_all_gather``): chunk (c, j) is rank c*local_size + j's ``count`` elements of
OUTPUT; after a COPY of the rank's own chunk, two stages:

    cross-host all-gather   column l exchanges its chunks among the hosts: a SEND of the own chunk to rank
                            (c, l) of every other host c, and a RECV of chunk (c, l) from it.
    intra-host all-gather   every rank SENDs the chunks of its column (its own and those it received) to
                            every other local rank, and RECVs theirs.

Per rank, (hosts - 1) * count elements cross the network, against (world - local_size) * count for the
direct all-gather. Compressed (``build_compressed_hierarchical_all_gather``): the owner encodes its chunk
once (the COPY), and both stages forward those bytes (SENDs of ENCODED, RECVs that keep what they
decode), so every rank decodes the owner's bytes and every rank's OUTPUT is bitwise identical; over
shared memory the encoded bytes are the smaller message too.

Compressed (compressed.py): only the cross-host stage is. The intra-host ops are marked ``uncompressed``
(plan.py, "Compressed plans"): shared memory is fast enough that encoding would cost more time than it
saves, and the host's sum stays exact, so an element is quantized as in a ring among the hosts (hosts - 1
times, then the final value once) instead of also on both intra-host stages. On one host nothing is
encoded. Error feedback: local rank l keeps, for share l, what encoding its host's sum lost; the next
call's cross-host stage adds it back when it reads the host's sum.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from pycoll.algorithms._layout import copy, cut_segments, recv, recv_reduce, send
from pycoll.algorithms.plan import Buf, Op, Plan, make_plan, segments, split_even

IN, OUT = Buf.INPUT, Buf.OUTPUT


def _remap(op: Op, column: list[int], offset: int) -> Op:
    """An op of a plan over ``len(column)`` ranks and one share, as the op of this rank over the world:
    peers become the column's ranks and offsets move by the share's ``offset``."""
    return replace(
        op,
        send_peer=column[op.send_peer] if op.send_peer >= 0 else -1,
        recv_peer=column[op.recv_peer] if op.recv_peer >= 0 else -1,
        src=(op.src[0], op.src[1] + offset),
        dst=(op.dst[0], op.dst[1] + offset),
    )


def _within_host(op: Op) -> Op:
    """An intra-host op: its message stays float32 in a compressed plan (see the module docstring)."""
    return replace(op, uncompressed=True)


class _Grid(NamedTuple):
    """This rank's place among hosts of ``local_size`` consecutive ranks, as the chunked plans name it:
    ``mates`` (its host's ranks by local index), ``others`` / ``froms`` (the local indices it sends to /
    receives from, in fixed rotations as direct.py), ``column`` (the rank of its local index on each host),
    ``to_hosts`` / ``from_hosts`` (the other hosts, in rotation)."""

    hosts: int
    host: int
    local: int
    mates: list[int]
    others: list[int]
    froms: list[int]
    column: list[int]
    to_hosts: list[int]
    from_hosts: list[int]


def _grid(rank: int, world: int, local_size: int) -> _Grid:
    if local_size < 1 or world % local_size:
        raise ValueError(f"world ({world}) must be a multiple of local_size ({local_size})")
    hosts = world // local_size
    host, local = divmod(rank, local_size)
    return _Grid(
        hosts,
        host,
        local,
        mates=[host * local_size + j for j in range(local_size)],
        others=[(local + k) % local_size for k in range(1, local_size)],
        froms=[(local - k) % local_size for k in range(1, local_size)],
        column=[c * local_size + local for c in range(hosts)],
        to_hosts=[(host + k) % hosts for k in range(1, hosts)],
        from_hosts=[(host - k) % hosts for k in range(1, hosts)],
    )


def hierarchical_allreduce(rank: int, world: int, count: int, segment_elems: int, local_size: int) -> Plan:
    """In-place hierarchical all-reduce of ``count`` elements (INPUT and OUTPUT alias) on hosts of
    ``local_size`` consecutive ranks."""
    from pycoll.algorithms.ring import ring_allreduce

    if local_size < 1 or world % local_size:
        raise ValueError(f"world ({world}) must be a multiple of local_size ({local_size})")
    hosts = world // local_size
    host, local = divmod(rank, local_size)
    if world == 1:
        return make_plan(rank, world, "allreduce", "hierarchical", count, count, [])
    shares = split_even(count, local_size)
    share_segments = cut_segments(shares, segment_elems)
    mates = [host * local_size + j for j in range(local_size)]  # this host's ranks, local rank order
    others = [(local + k) % local_size for k in range(1, local_size)]  # fixed rotation, as direct.py
    froms = [(local - k) % local_size for k in range(1, local_size)]
    # The host's sum goes into INPUT when the cross-host stage follows: to that stage it is input (read
    # first, and encoded as such by compressed plans); on one host it is the final value, in OUTPUT.
    into = OUT if hosts == 1 else IN
    steps: list[list[Op]] = []
    if local_size > 1:
        for segment in range(len(share_segments[0])):
            step: list[Op] = []
            for j in others:
                off, n = share_segments[j][segment]
                step.append(send(n, mates[j], (IN, off)))
            off, n = share_segments[local][segment]
            for k, j in enumerate(froms):
                step.append(
                    recv_reduce(
                        n,
                        mates[j],
                        (IN if k == 0 else into, off),
                        (into, off),
                        finalize=hosts == 1 and k == len(froms) - 1,
                    )
                )
            steps.append([_within_host(op) for op in step])
    if hosts > 1:
        column = [h * local_size + local for h in range(hosts)]
        offset, length = shares[local]
        ring = ring_allreduce(host, hosts, length, segment_elems)
        steps += [[_remap(op, column, offset) for op in step] for step in ring.steps]
    if local_size > 1:
        for segment in range(len(share_segments[0])):
            step = []
            off, n = share_segments[local][segment]
            for j in others:
                step.append(send(n, mates[j], (OUT, off)))
            for j in froms:
                off_j, n_j = share_segments[j][segment]
                step.append(recv(n_j, mates[j], (OUT, off_j)))
            steps.append([_within_host(op) for op in step])
    return make_plan(rank, world, "allreduce", "hierarchical", count, count, steps)


def hierarchical_reduce_scatter(
    rank: int, world: int, count: int, segment_elems: int, local_size: int
) -> Plan:
    """The hierarchical reduce-scatter of chunks of ``count`` elements on hosts of ``local_size``
    consecutive ranks, in place on a copy of INPUT (world * count elements); the result is this rank's
    chunk of it. Segments are cut from every chunk's start (so whole codec blocks where ``segment_elems``
    is a multiple of a block)."""
    hosts, host, local, mates, others, froms, column, to_hosts, from_hosts = _grid(rank, world, local_size)
    total = world * count

    def chunk(c: int, j: int, off: int) -> int:  # element offset of `off` in chunk (c, j)
        return (c * local_size + j) * count + off

    steps: list[list[Op]] = []
    for off, n in segments(0, count, segment_elems):
        if local_size > 1:
            step = [send(n, mates[j], (IN, chunk(c, j, off))) for j in others for c in range(hosts)]
            last = froms[-1] if hosts == 1 else None  # on one host the host's sum is the final value
            step += [recv_reduce(n, mates[j], (IN, chunk(c, local, off)), (IN, chunk(c, local, off)),
                                 finalize=j == last) for c in range(hosts) for j in froms]
            steps.append([_within_host(op) for op in step])
        step = [send(n, column[c], (IN, chunk(c, local, off))) for c in to_hosts]
        mine = chunk(host, local, off)
        step += [recv_reduce(n, column[c], (IN if k == 0 else OUT, mine), (OUT, mine),
                             finalize=k == hosts - 2) for k, c in enumerate(from_hosts)]
        steps.append(step)
    plan = make_plan(rank, world, "reduce_scatter", "hierarchical", total, total, steps)
    return replace(plan, result=(chunk(host, local, 0), count))


def hierarchical_all_gather(
    rank: int, world: int, count: int, segment_elems: int, local_size: int, finals: Buf = OUT
) -> Plan:
    """The hierarchical all-gather of chunks of ``count`` elements on hosts of ``local_size`` consecutive
    ranks (INPUT ``count``, OUTPUT ``world * count``). ``finals``: where SENDs read the chunks they forward
    (OUTPUT; ENCODED in the compressed plan). Segments are cut from every chunk's start."""
    hosts, host, local, mates, others, froms, column, to_hosts, from_hosts = _grid(rank, world, local_size)

    def chunk(c: int, j: int, off: int) -> int:  # element offset of `off` in chunk (c, j) of OUTPUT
        return (c * local_size + j) * count + off

    steps: list[list[Op]] = [[copy(count, (IN, 0), (OUT, chunk(host, local, 0)))]]
    pieces = segments(0, count, segment_elems)
    for off, n in pieces:
        step = [send(n, column[c], (finals, chunk(host, local, off))) for c in to_hosts]
        step += [recv(n, column[c], (OUT, chunk(c, local, off))) for c in from_hosts]
        steps.append(step)
    for off, n in pieces if local_size > 1 else ():
        step = [send(n, mates[j], (finals, chunk(c, local, off))) for j in others for c in range(hosts)]
        step += [recv(n, mates[j], (OUT, chunk(c, j, off))) for j in froms for c in range(hosts)]
        steps.append(step)
    return make_plan(rank, world, "all_gather", "hierarchical", count, world * count, steps)
