"""``algorithm="auto"``: which algorithm each collective uses for a given world size and message size.

A plain table; every threshold is a constant here. ``nbytes`` is the size of the largest buffer of the
call: the all-reduce / broadcast buffer, the reduce-scatter INPUT (world * chunk) or the all-gather
OUTPUT (world * chunk).

    collective       rule (first match wins)
    allreduce        nbytes * world <= DIRECT_MAX_TOTAL_BYTES              -> direct (two hops, any world)
                     world >= TREE_MIN_WORLD and nbytes <= TREE_MAX_BYTES   -> tree   (log-depth latency)
                     otherwise                                              -> ring   (bandwidth)
    reduce_scatter   nbytes <= DIRECT_MAX_TOTAL_BYTES                       -> direct, otherwise ring
    all_gather       nbytes <= DIRECT_MAX_TOTAL_BYTES                       -> direct, otherwise ring
    broadcast        world <= 2 or nbytes <= TREE_BROADCAST_MAX_BYTES       -> tree,   otherwise ring (chain)
    barrier                                                                 -> dissemination

Where the all-reduce numbers come from (shared memory, float32, 2 vCPUs, median of 2 interleaved
rounds, busbw GB/s for ring / direct / tree; 2026-11-29):

    world 2:   4 KiB 1.12/1.14/1.10   256 KiB 13.0/13.6/13.1   1 MiB 20.5/17.7/20.5   8 MiB 20.2/15.5/7.1
    world 3:   4 KiB 0.29/0.46/0.37   256 KiB 5.1/6.8/6.9      1 MiB 7.5/8.3/7.1      8 MiB 6.3/4.8/4.6
    world 4:   4 KiB 0.30/0.32/0.29   256 KiB 5.8/6.5/6.4      1 MiB 6.2/4.5/6.1      8 MiB 4.6/2.6/3.0
    world 8:   4 KiB 0.06/0.07/0.10   32 KiB 0.50/0.68/0.68    256 KiB 2.0/1.7/1.3    1 MiB 3.0/1.0/1.1

Direct wins while the whole exchange (nbytes * world) is small: it finishes in two hops, where the
ring needs 2(world-1). Beyond that the ring, whose every link carries each byte once, wins. Tree is
kept for large worlds, where its log-depth latency matters more than on one host.
"""

from __future__ import annotations

DIRECT_MAX_TOTAL_BYTES = 1 << 20
TREE_MIN_WORLD = 16
TREE_MAX_BYTES = 4 * 1024 * 1024
TREE_BROADCAST_MAX_BYTES = 256 * 1024

_COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier")


def select_algorithm(collective: str, world: int, nbytes: int) -> str:
    """The algorithm name for ``build_plan`` (see the module table)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if collective == "allreduce":
        if nbytes * world <= DIRECT_MAX_TOTAL_BYTES:
            return "direct"
        return "tree" if world >= TREE_MIN_WORLD and nbytes <= TREE_MAX_BYTES else "ring"
    if collective in ("reduce_scatter", "all_gather"):
        return "direct" if nbytes <= DIRECT_MAX_TOTAL_BYTES else "ring"
    if collective == "broadcast":
        return "tree" if world <= 2 or nbytes <= TREE_BROADCAST_MAX_BYTES else "ring"
    if collective == "barrier":
        return "dissemination"
    raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(_COLLECTIVES)}")
