"""Tree algorithms: double-binary-tree all-reduce and a pipelined binary-tree broadcast.

The parts, named as the code names them:

    label     a rank's position in a tree. The tree is built over labels 0..world-1 and mapped to ranks.
    tree      a binary tree over labels: label 0 is the ``root`` with one child, the largest power of two
              below ``world``; a label v > 0 whose lowest set bit is b has the children v - b/2 and
              v + b/2 (or v + b/4, v + b/8, ... when v + b/2 is past the end). Odd labels are leaves,
              even labels are interior, and the height is about log2(world).
    half      the all-reduce buffer is cut into two halves, one per tree. Tree 0 maps label = rank; tree 1
              is its complement: the mirror (label = world-1-rank) for even ``world`` and a shift by one
              (label = rank-1) for odd, so a rank that is a leaf in one tree is interior in the other and
              every rank does about the same work.
    segment   each half is cut into the same number of segments, the unit of one message; segments flow
              through the tree one after another (a pipeline). A segment is half the largest message
              (``segment_elems``): a link carries both trees' messages and one sent at tick t is consumed
              at tick t+1 (below), so a link keeps four segments in flight where the ring keeps two of
              the largest messages, and the transport's channels hold that much without stalling.
    up        the reduce phase: partials flow from the leaves to the root. An interior node reduces the
              partial of its first child into its own buffer (RECV_REDUCE) and that of its second child
              straight on to its parent (RECV_REDUCE_SEND), so a partial is written at most once.
    down      the broadcast phase: the root finalizes a segment and sends it to a child in the same op
              (RECV_REDUCE_COPY_SEND, finalize=True); every node writes what it receives and forwards it to
              its first child in the same op (RECV_COPY_SEND) and to its second child with a SEND one
              step later.
    tick      one tree's own clock. A message sent at tick t is received at tick t+1, always, so a link
              never holds more than a segment or two and, together with the next rule, each ordered pair
              of ranks sees its messages in the order they were sent. The up phase of a node at depth D
              works on segment t - (H - D) at tick t (H = the tree's height) and its down phase on segment
              t - H - delay, so in one step a node does the up phase of a later segment and the down phase
              of an earlier one.
    step      plan steps alternate between the trees: step 2t is tick t of tree 0, step 2t+1 tick t of
              tree 1. So one step holds at most one message per ordered pair of ranks, and the two trees'
              messages are in flight at the same time.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

from pycoll.algorithms._layout import (
    acknowledge_root,
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


@dataclass(frozen=True)
class BinaryTree:
    """A binary tree over ranks (indexed by rank; -1 means none)."""

    root: int
    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]  # first child first
    depth: tuple[int, ...]

    @property
    def height(self) -> int:
        return max(self.depth)

    def leaves(self) -> frozenset[int]:
        return frozenset(r for r, kids in enumerate(self.children) if not kids)


def _label_children(label: int, world: int) -> tuple[int, ...]:
    if label == 0:
        return (1 << ((world - 1).bit_length() - 1),) if world > 1 else ()
    lowest = label & -label
    if lowest == 1:
        return ()
    reach = lowest // 2
    second = reach
    while second >= 1 and label + second >= world:
        second //= 2
    return (label - reach, label + second) if second >= 1 else (label - reach,)


def binary_tree(world: int, rank_of_label: list[int]) -> BinaryTree:
    """The label tree (see the module comment) with label l placed on rank ``rank_of_label[l]``."""
    parent = [-1] * world
    children: list[tuple[int, ...]] = [()] * world
    depth = [0] * world
    order = [0]  # labels, parents before children
    for label in order:
        kids = _label_children(label, world)
        rank = rank_of_label[label]
        children[rank] = tuple(rank_of_label[k] for k in kids)
        for k in kids:
            parent[rank_of_label[k]] = rank
            depth[rank_of_label[k]] = depth[rank] + 1
        order.extend(kids)
    if len(order) != world:  # the construction covers every label exactly once; guard it anyway
        raise AssertionError(f"binary tree over {world} labels reached {len(order)}")
    return BinaryTree(rank_of_label[0], tuple(parent), tuple(children), tuple(depth))


@functools.lru_cache(maxsize=64)
def double_binary_tree(world: int) -> tuple[BinaryTree, BinaryTree]:
    """Tree 0 (label = rank) and its complement tree 1 (mirror for even world, shift by one for odd).
    Every rank's plan reads the whole of both (made once per world size: the cost model builds every
    rank's plan)."""
    first = binary_tree(world, list(range(world)))
    if world % 2 == 0:
        second = binary_tree(world, [world - 1 - label for label in range(world)])
    else:
        second = binary_tree(world, [(label + 1) % world for label in range(world)])
    return first, second


@functools.lru_cache(maxsize=128)
def _down_delays(tree: BinaryTree) -> tuple[int, ...]:
    """Ticks after the root finalizes a segment at which each rank receives it (root: 0). The first
    child is sent to in the receiving op (one tick), the second by a SEND one tick later (two ticks)."""
    delay = [0] * len(tree.parent)
    order = [tree.root]
    for rank in order:
        kids = tree.children[rank]
        fused = kids[-1] if rank == tree.root else kids[0] if kids else -1
        for k in kids:
            delay[k] = delay[rank] + (1 if k == fused else 2)
        order.extend(kids)
    return tuple(delay)


def _tree_ticks(rank: int, tree: BinaryTree, segments: list[tuple[int, int]]) -> dict[int, list[Op]]:
    """This rank's ops for one tree and one half, keyed by tick (pure SENDs first within a tick)."""
    height = tree.height
    parent, kids = tree.parent[rank], tree.children[rank]
    level = height - tree.depth[rank]  # up phase of segment s at tick s + level
    delay = _down_delays(tree)[rank]   # down phase of segment s at tick s + height + delay
    sends: dict[int, list[Op]] = defaultdict(list)
    receives: dict[int, list[Op]] = defaultdict(list)
    for segment, (off, n) in enumerate(segments):
        up = segment + level
        if rank == tree.root:
            if len(kids) == 2:
                receives[up].append(recv_reduce(n, kids[0], (IN, off), (OUT, off)))
                sends[up + 1].append(send(n, kids[0], (OUT, off)))
            src = (OUT, off) if len(kids) == 2 else (IN, off)
            receives[up].append(recv_reduce_copy_send(n, kids[-1], kids[-1], src, (OUT, off), finalize=True))
            continue
        if not kids:
            sends[up].append(send(n, parent, (IN, off)))
        elif len(kids) == 1:
            receives[up].append(recv_reduce_send(n, kids[0], parent, (IN, off)))
        else:
            receives[up].append(recv_reduce(n, kids[0], (IN, off), (OUT, off)))
            receives[up].append(recv_reduce_send(n, kids[1], parent, (OUT, off)))
        down = segment + height + delay
        if not kids:
            receives[down].insert(0, recv(n, parent, (OUT, off)))
        else:
            receives[down].insert(0, recv_copy_send(n, parent, kids[0], (OUT, off)))
            if len(kids) == 2:
                sends[down + 1].append(send(n, kids[1], (OUT, off)))
    return {tick: sends.get(tick, []) + receives.get(tick, []) for tick in set(sends) | set(receives)}


def tree_allreduce(rank: int, world: int, count: int, segment_elems: int) -> Plan:
    """In-place double-binary-tree all-reduce of ``count`` elements (INPUT and OUTPUT alias)."""
    if world == 1:
        return make_plan(rank, world, "allreduce", "tree", count, count, [])
    trees = double_binary_tree(world)
    half_segments = cut_segments(split_even(count, 2), max(1, segment_elems // 2))
    ticks = [_tree_ticks(rank, tree, half_segments[half]) for half, tree in enumerate(trees)]
    last_tick = max(max(t, default=0) for t in ticks)
    steps = [ticks[half].get(tick, []) for tick in range(last_tick + 1) for half in (0, 1)]
    return make_plan(rank, world, "allreduce", "tree", count, count, steps)


def tree_broadcast(rank: int, world: int, count: int, segment_elems: int, root: int = 0) -> Plan:
    """In-place pipelined binary-tree broadcast from ``root`` (tree labels = (rank - root) mod world).

    The root SENDs segment s to its child at step s; a node at depth D receives segment s at step
    s + D - 1, forwarding it to its first child in the same op and to its second child by a SEND at
    step s + D, so each link carries its segments in order at a fixed lag.
    """
    steps: dict[int, list[Op]] = defaultdict(list)
    if world > 1:
        tree = binary_tree(world, [(label + root) % world for label in range(world)])
        parent, kids, depth = tree.parent[rank], tree.children[rank], tree.depth[rank]
        for segment, (off, n) in enumerate(cut_segments([(0, count)], segment_elems)[0]):
            if rank == root:
                steps[segment] += [send(n, k, (IN, off)) for k in kids]
                continue
            at = segment + depth - 1
            if len(kids) == 2:
                steps[at + 1].insert(0, send(n, kids[1], (OUT, off)))
            if kids:
                steps[at].append(recv_copy_send(n, parent, kids[0], (OUT, off)))
            else:
                steps[at].append(recv(n, parent, (OUT, off)))
    ordered = [steps[t] for t in sorted(steps)] + [acknowledge_root(rank, world, root)]
    return make_plan(rank, world, "broadcast", "tree", count, count, ordered)
