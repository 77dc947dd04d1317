"""Collective algorithms as plans: pure functions of (rank, world, count), no I/O.

``build_plan(collective, algorithm, rank, world, count)`` is the one entry point the executor side uses;
``ALGORITHMS`` lists what it accepts; the cost model (``pycoll.tuning``) resolves ``"auto"``;
``simulate`` runs every rank's plan in one process (the oracle for the native executor).
"""

from __future__ import annotations

import functools
import operator
from typing import Callable

from pycoll.algorithms.barrier import dissemination_barrier
from pycoll.algorithms.direct import (
    direct_all_gather,
    direct_all_to_all,
    direct_allreduce,
    direct_reduce_scatter,
)
from pycoll.algorithms.hierarchical import (
    hierarchical_all_gather,
    hierarchical_allreduce,
    hierarchical_reduce_scatter,
)
from pycoll.algorithms.plan import Buf, Op, OpKind, Plan
from pycoll.algorithms.ring import ring_all_gather, ring_allreduce, ring_broadcast, ring_reduce_scatter
from pycoll.algorithms.tree import tree_allreduce, tree_broadcast

DEFAULT_SEGMENT_ELEMS = 65536

# (rank, world, count, segment_elems, root) -> Plan
_Builder = Callable[[int, int, int, int, int], Plan]

_BUILDERS: dict[str, dict[str, _Builder]] = {
    "allreduce": {
        "ring": lambda r, w, c, s, _root: ring_allreduce(r, w, c, s),
        "tree": lambda r, w, c, s, _root: tree_allreduce(r, w, c, s),
        "direct": lambda r, w, c, s, _root: direct_allreduce(r, w, c, s),
        # built in build_plan, which has the hosts' size (local_size)
        "hierarchical": lambda r, w, c, s, _root: hierarchical_allreduce(r, w, c, s, 1),
    },
    "reduce_scatter": {
        "ring": lambda r, w, c, s, _root: ring_reduce_scatter(r, w, c, s),
        "direct": lambda r, w, c, s, _root: direct_reduce_scatter(r, w, c, s),
        # built in build_plan, which has the hosts' size (local_size)
        "hierarchical": lambda r, w, c, s, _root: hierarchical_reduce_scatter(r, w, c, s, 1),
    },
    "all_gather": {
        "ring": lambda r, w, c, s, _root: ring_all_gather(r, w, c, s),
        "direct": lambda r, w, c, s, _root: direct_all_gather(r, w, c, s),
        # built in build_plan, which has the hosts' size (local_size)
        "hierarchical": lambda r, w, c, s, _root: hierarchical_all_gather(r, w, c, s, 1),
    },
    "broadcast": {
        "ring": ring_broadcast,
        "tree": tree_broadcast,
    },
    "barrier": {
        "dissemination": lambda r, w, _c, _s, _root: dissemination_barrier(r, w),
    },
    # even parts of count elements (pycoll.all_to_all builds uneven ones from the split sizes)
    "all_to_all": {
        "direct": lambda r, w, c, _s, _root: direct_all_to_all(r, w, [c] * w, [c] * w),
    },
}

#: The algorithms each collective accepts (the first is a sensible default; "auto" is resolved by
#: the communicator's cost model, ``pycoll.tuning``, before a plan is built).
ALGORITHMS: dict[str, tuple[str, ...]] = {name: tuple(table) for name, table in _BUILDERS.items()}


@functools.lru_cache(maxsize=256)
def build_plan(collective: str, algorithm: str, rank: int, world: int, count: int, *, root: int = 0,
               segment_elems: int = DEFAULT_SEGMENT_ELEMS, local_size: int = 1) -> Plan:
    """The plan of ``rank`` (of ``world``) for one collective.

    ``count`` is the buffer length for allreduce and broadcast, and the per-rank chunk for
    reduce_scatter (INPUT ``world*count``, OUTPUT ``count``), all_gather (INPUT ``count``, OUTPUT
    ``world*count``) and all_to_all (even parts: INPUT and OUTPUT ``world*count``); barrier ignores
    it. ``root`` is used by broadcast only. ``segment_elems`` is the
    most elements one message carries.
    """
    table = _BUILDERS.get(collective)
    if table is None:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(_BUILDERS)}")
    builder = table.get(algorithm)
    if builder is None:
        hint = " (resolve 'auto' with pycoll.tuning.Model.choose_algorithm)" if algorithm == "auto" else ""
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; choose one of "
                         f"{', '.join(table)}{hint}")
    rank, world, count, root, segment_elems = map(operator.index, (rank, world, count, root, segment_elems))
    if world < 1 or segment_elems < 1 or count < 0:
        raise ValueError(f"need world >= 1, segment_elems >= 1, count >= 0; got world={world}, "
                         f"segment_elems={segment_elems}, count={count}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    if not 0 <= root < world:
        raise ValueError(f"root must be in [0, {world}), got {root}")
    if collective == "barrier":
        count = 0
    if algorithm == "hierarchical":
        hierarchical = {"allreduce": hierarchical_allreduce, "reduce_scatter": hierarchical_reduce_scatter,
                        "all_gather": hierarchical_all_gather}[collective]
        return hierarchical(rank, world, count, segment_elems, operator.index(local_size))
    return builder(rank, world, count, segment_elems, root)


__all__ = ["ALGORITHMS", "DEFAULT_SEGMENT_ELEMS", "Buf", "Op", "OpKind", "Plan", "build_plan"]
