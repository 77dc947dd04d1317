"""The shape of a fault plane at scale: which members a rank links to, how a message reaches a member it
has no link to, and the tree an agreement runs on. Pure functions of the world size, a rank and the
members this rank knows gone, so that every rank computes the same shape from the same knowledge, and
the simulation (pycoll/testing/fault_sim.py) runs the very code the planes run.

The parts, named once and used by these names below:

- **fingers**: rank r links to the members at ring distance 2^j either way, (r ± 2^j) mod world for every
  2^j < world: at most 2·ceil(log2 world) links (12 at 64 ranks, 28 at 16,384), the same set seen from both
  ends (r is a finger of s when s is one of r). The links carry the heartbeats (a rank watches its fingers)
  and the flooded facts (a death, a goodbye, a revocation reaches every member in O(log world) hops).
- **route**: a message for a member that is not a finger goes to the live finger closest to it on the
  ring, which does the same: each hop at least halves the distance, so at most ceil(log2 world) hops while
  the fingers live. A member with no live finger closer than itself (dead members leave holes) *floods* the
  message instead: every member sends it once to its live fingers until one of them is the destination.
- **tree**: an agreement's binomial tree over ring *positions* counted from its root, the lowest live
  member: position p's parent is p with its lowest set bit cleared, its subtree the positions
  [p, p + lowbit(p)). A dead member is skipped: its children's parent is its nearest live ancestor, so a
  death moves only the dead member's children, and every edge of a tree with no dead member is a finger.
  Depth ceil(log2 world): an agreement's proposals go up and its decision down in 2·ceil(log2 world)
  hops.
"""

from __future__ import annotations

from typing import Callable, Iterable


def fingers(rank: int, world: int) -> list[int]:
    """The members ``rank`` links to, in rank order."""
    out: set[int] = set()
    step = 1
    while step < world:
        out.add((rank + step) % world)
        out.add((rank - step) % world)
        step *= 2
    out.discard(rank)
    return sorted(out)


def distance(a: int, b: int, world: int) -> int:
    """Ring distance between two members (the shorter way round)."""
    d = (b - a) % world
    return min(d, world - d)


def hops_bound(world: int) -> int:
    """How many hops a routed message may take: ceil(log2 world) greedy ones, then a flood across the
    fingers (at most world - 1 more)."""
    return max(1, (world - 1).bit_length()) + world


def next_hop(rank: int, dest: int, world: int, usable: Iterable[int]) -> int | None:
    """The live finger a message for ``dest`` goes to next: ``dest`` itself when it is one, else the one
    closest to it on the ring (ties: the lower rank), if it is closer than ``rank``. None when there is no
    such finger (the message is flooded from here)."""
    best: tuple[int, int] = (distance(rank, dest, world), rank)
    for r in usable:
        key = (distance(r, dest, world), r)
        if key < best:
            best = key
    return None if best[1] == rank else best[1]


# ---- the agreement tree ------------------------------------------------------------------------------
def _lowbit(p: int) -> int:
    return p & -p


def tree_root(world: int, gone: Callable[[int], bool]) -> int | None:
    """The lowest live member (None: none is)."""
    return next((r for r in range(world) if not gone(r)), None)


def tree_parent(rank: int, root: int, world: int, gone: Callable[[int], bool]) -> int | None:
    """``rank``'s parent: its nearest live ancestor (None for the root)."""
    p = (rank - root) % world
    while p:
        p -= _lowbit(p)
        up = (root + p) % world
        if not gone(up):
            return up
    return None


def tree_children(rank: int, root: int, world: int, gone: Callable[[int], bool]) -> list[int]:
    """``rank``'s children: the live members whose parent it is (a dead child's own children in its place)."""
    out: list[int] = []
    stack = [(rank - root) % world]
    while stack:
        p = stack.pop()
        span = _lowbit(p) if p else 1 << max(0, (world - 1).bit_length())
        step = 1
        while step < span and p + step < world:
            c = p + step
            r = (root + c) % world
            if gone(r):
                stack.append(c)
            else:
                out.append(r)
            step *= 2
    return sorted(out)


def tree_subtree(rank: int, root: int, world: int, gone: Callable[[int], bool]) -> list[int]:
    """The live members of ``rank``'s subtree (itself included): those whose path to the root passes it."""
    p = (rank - root) % world
    end = min(world, p + _lowbit(p)) if p else world
    return [(root + q) % world for q in range(p, end) if not gone((root + q) % world)]


def tree_depth(world: int) -> int:
    """Hops from the deepest member to the root when no member is dead."""
    return max(0, (world - 1).bit_length())
