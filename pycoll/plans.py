"""The plans and grouped programs of one communicator, compiled once and cached under one key type.

A plan (pycoll/algorithms) is what one rank sends, receives and reduces for one kind of call; compiled
(``_C.NativePlan``) it runs on the fragment executor. A grouped program (pycoll/algorithms/grouped.py)
is the same plan lowered to matched send / receive groups, which every rank lowers alike from every
rank's plan: it runs on GPUs (over NCCL or host-staged) and, for the tests, on CPUs. Both live in one
LRU cache keyed by ``PlanKey``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, NamedTuple, Sequence

from pycoll import _C, auto
from pycoll.algorithms import build_plan
from pycoll.algorithms.compressed import (
    build_compressed_all_gather,
    build_compressed_all_to_all,
    build_compressed_hierarchical_all_gather,
    build_compressed_hierarchical_reduce_scatter,
    build_compressed_plan,
    build_compressed_reduce_scatter,
)
from pycoll.algorithms.direct import direct_all_to_all
from pycoll.algorithms.grouped import lower_to_groups
from pycoll.algorithms.plan import Plan
from pycoll.errors import InvalidUsageError
from pycoll.formation import hosts_text

log = logging.getLogger("pycoll")

#: Plans and programs kept per communicator (least recently used dropped first).
CACHE_SIZE = 512


class PlanKey(NamedTuple):
    """What a compiled plan (``kind="plan"``) or grouped program (``kind="program"``) depends on.
    ``layout``: a codec's (block elements, block bytes), None uncompressed; ``segment_bytes``: the largest
    message; ``exact``: a compressed all-gather that keeps each rank's own chunk exact (``exact_own``);
    ``splits``: an all-to-all's (send counts, receive counts), this rank's (None for the others)."""

    kind: str
    collective: str
    algorithm: str
    elements: int  # per rank, as the caller gave them
    itemsize: int
    root: int
    layout: tuple[int, int] | None
    segment_bytes: int
    exact: bool
    splits: tuple[tuple[int, ...], tuple[int, ...]] | None


_new_key = tuple.__new__


class PlanCache:
    """One rank's compiled plans and grouped programs (``plan``, ``program``)."""

    def __init__(self, rank: int, world_size: int, hosts: Sequence[str], segment_bytes: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.hosts = list(hosts)
        #: The largest message when none is given: the CPU transport's segment.
        self.segment_bytes = segment_bytes
        self._cache: OrderedDict[PlanKey, Any] = OrderedDict()
        self._logged: set[tuple] = set()

    def key(
        self,
        kind: str,
        collective: str,
        algorithm: str,
        count: int,
        itemsize: int,
        root: int = 0,
        codec: Any = None,
        segment_bytes: int | None = None,
        exact: bool = False,
        splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> PlanKey:
        layout = None if codec is None else (codec.block_elems, codec.block_bytes)
        if layout is not None:
            itemsize = 4  # compressed plans work on float32 (wider types are widened first)
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (a third of a compressed call's lookup)
        return _new_key(
            PlanKey,
            (
                kind, collective, algorithm, count, itemsize, root, layout,
                segment_bytes or self.segment_bytes, exact, splits,
            ),  # fmt: skip
        )

    def plan(
        self,
        collective: str,
        algorithm: str,
        count: int,
        itemsize: int,
        root: int = 0,
        codec: Any = None,
        segment_bytes: int | None = None,
        exact: bool = False,
        splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> Any:
        """The compiled plan (``_C.NativePlan``). With a codec, a plan on float32 cut at its blocks
        (pycoll/algorithms/compressed.py)."""
        key = self.key(
            "plan", collective, algorithm, count, itemsize, root, codec, segment_bytes, exact, splits
        )
        found = self._cache.get(key)  # _get, inline: every compressed call looks its plan up
        if found is not None:
            self._cache.move_to_end(key)
            return found
        p = self.python_plan(self.rank, key)
        table, starts = p.to_table()
        plan = _C.NativePlan(
            table,
            starts,
            key.itemsize,
            p.input_count,
            p.output_count,
            self.rank,
            self.world_size,
            coded=key.layout is not None,
            distinct=not p.in_place,
            result_off=0 if p.result is None else p.result[0],
            result_count=0 if p.result is None else p.result[1],
        )
        self._put(key, plan)
        self._log(key, codec, plan, p)
        return plan

    def program(
        self,
        collective: str,
        algorithm: str,
        count: int,
        itemsize: int,
        root: int = 0,
        codec: Any = None,
        segment_bytes: int | None = None,
        exact: bool = False,
    ) -> Any:
        """This rank's grouped program (``_C.GroupedProgram``) for the plan ``plan`` returns: every rank's
        plan is built and lowered, which every rank does alike (so not an all-to-all's, whose plans
        depend on every rank's split sizes)."""
        key = self.key("program", collective, algorithm, count, itemsize, root, codec, segment_bytes, exact)
        found = self._get(key)
        if found is not None:
            return found
        plan = self.plan(collective, algorithm, count, itemsize, root, codec, segment_bytes, exact)
        plans = [self.python_plan(r, key) for r in range(self.world_size)]
        if codec is None:
            size = key.itemsize
            programs = lower_to_groups(plans, lambda op: op.count * size)
        else:
            programs = lower_to_groups(plans, lambda op: codec.encoded_bytes(op.count), compressed=True)
        mine = programs[self.rank]
        program = _C.GroupedProgram(
            plan,
            mine.actions,
            mine.msg_bytes,
            mine.recv_stage,
            mine.send_stage,
            mine.work_stage,
            mine.staging_bytes,
        )
        self._put(key, program)
        return program

    def python_plan(self, rank: int, key: PlanKey) -> Plan:
        """Rank ``rank``'s plan (pycoll.algorithms) for ``key``."""
        local_size = self._ranks_per_host() if key.algorithm == "hierarchical" else 1
        if key.collective == "all_to_all":
            if key.splits is not None and rank != self.rank:
                raise ValueError("an uneven all-to-all's plan is built from this rank's part sizes, for it")
            send, recv = key.splits or ((key.elements,) * self.world_size,) * 2
            if key.layout is None:
                return direct_all_to_all(rank, self.world_size, send, recv)
            return build_compressed_all_to_all(rank, self.world_size, send, recv)
        if key.layout is not None:
            segment_blocks = max(1, key.segment_bytes // key.layout[1])
            if key.collective == "reduce_scatter" and key.algorithm == "hierarchical":
                return build_compressed_hierarchical_reduce_scatter(
                    rank, self.world_size, key.elements, key.layout[0], segment_blocks, local_size
                )
            if key.collective == "reduce_scatter":
                return build_compressed_reduce_scatter(
                    rank, self.world_size, key.elements, key.layout[0], segment_blocks
                )
            if key.collective == "all_gather" and key.algorithm == "hierarchical":
                return build_compressed_hierarchical_all_gather(
                    rank, self.world_size, key.elements, key.layout[0], segment_blocks, local_size, key.exact
                )
            if key.collective == "all_gather":
                return build_compressed_all_gather(
                    rank, self.world_size, key.elements, key.layout[0], segment_blocks, key.exact
                )
            return build_compressed_plan(
                key.algorithm, rank, self.world_size, key.elements, key.layout[0], segment_blocks, local_size
            )
        return build_plan(
            key.collective,
            key.algorithm,
            rank,
            self.world_size,
            key.elements,
            root=key.root,
            segment_elems=max(1, key.segment_bytes // key.itemsize),
            local_size=local_size,
        )

    def _ranks_per_host(self) -> int:
        """Ranks per host for ``hierarchical``: hosts must hold equally many ranks, numbered host by host
        (as torchrun, mpirun's default mapping, srun's block distribution and ``pycoll run`` number them)."""
        size = auto.ranks_per_host(self.hosts)
        if size is None:
            raise InvalidUsageError(
                "algorithm='hierarchical' needs the same number of ranks on every host, numbered host by "
                f"host ({hosts_text(self.hosts)}); use ring, tree or direct"
            )
        return size

    def keys(self) -> list[PlanKey]:
        """What is cached now, least recently used first."""
        return list(self._cache)

    def _get(self, key: PlanKey) -> Any:
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
        return found

    def _put(self, key: PlanKey, value: Any) -> None:
        self._cache[key] = value
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _log(self, key: PlanKey, codec: Any, plan: Any, p: Plan) -> None:
        if log.isEnabledFor(logging.INFO):
            nbytes = key.elements * key.itemsize
            bucket = (key.collective, key.algorithm, max(nbytes, 1).bit_length(), repr(codec))
            if bucket not in self._logged:
                self._logged.add(bucket)
                log.info(
                    "rank %d: %s of %d bytes uses %s%s (%d steps, %d ops)",
                    self.rank,
                    key.collective,
                    nbytes,
                    key.algorithm,
                    "" if codec is None else f" with {codec!r}",
                    plan.num_steps,
                    plan.num_ops,
                )
        if log.isEnabledFor(5):  # TRACE
            for i, step in enumerate(p.steps):
                log.log(5, "rank %d %s/%s step %d: %s", self.rank, key.collective, key.algorithm, i, step)
