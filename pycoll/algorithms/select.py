"""``algorithm="auto"``: which algorithm each collective uses for a given world size and message size.

A plain table, to be re-tuned by measurement (``pycoll bench``); every threshold is a constant here.
``nbytes`` is the size of the largest buffer of the call: the all-reduce / broadcast buffer, the
reduce-scatter INPUT (world * chunk) or the all-gather OUTPUT (world * chunk).

    collective       rule (first match wins)
    allreduce        world <= 2 or nbytes <= DIRECT_MAX_BYTES            -> direct (one round trip)
                     world >= TREE_MIN_WORLD and nbytes <= TREE_MAX_BYTES -> tree   (log-depth latency)
                     otherwise                                           -> ring   (bandwidth)
    reduce_scatter   world <= 2 or nbytes <= DIRECT_MAX_BYTES            -> direct, otherwise ring
    all_gather       world <= 2 or nbytes <= DIRECT_MAX_BYTES            -> direct, otherwise ring
    broadcast        world <= 2 or nbytes <= TREE_BROADCAST_MAX_BYTES    -> tree,   otherwise ring (chain)
    barrier                                                              -> dissemination
"""

from __future__ import annotations

DIRECT_MAX_BYTES = 64 * 1024
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
    small = world <= 2 or nbytes <= DIRECT_MAX_BYTES
    if collective == "allreduce":
        if small:
            return "direct"
        return "tree" if world >= TREE_MIN_WORLD and nbytes <= TREE_MAX_BYTES else "ring"
    if collective in ("reduce_scatter", "all_gather"):
        return "direct" if small else "ring"
    if collective == "broadcast":
        return "tree" if world <= 2 or nbytes <= TREE_BROADCAST_MAX_BYTES else "ring"
    if collective == "barrier":
        return "dissemination"
    raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(_COLLECTIVES)}")
