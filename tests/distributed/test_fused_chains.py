"""Chains run in one pass (csrc/engine/plan_fusion.h) give exactly the bits of running their ops one after
another: the direct all-reduce on 3 and 4 ranks, over shared memory, TCP and both, with the executor's
fusion on and off, against the pure-Python simulator of the plan semantics.

Inputs are random (rank-dependent), so the order of every float addition and each rounding to float16
shows in the bits; counts cover one fragment, several fragments (a chain's lockstep over its links), and
several segments (publishers of later segments while earlier ones are in flight).
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import RankPool

import pycoll
from pycoll import _C
from pycoll.algorithms.simulate import simulate

TCP = {"PYCOLL_TRANSPORT": "tcp"}
MIXED = {"PYCOLL_TEST_RANKS_PER_HOST": "2"}

#: (dtype, op) pairs; float16 rounds after every addition, avg divides where a chain finalizes.
CASES = (("float32", "sum"), ("float32", "avg"), ("float16", "sum"), ("float64", "prod"), ("int32", "max"))


def _input(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([rank, count, len(dtype)])
    if dtype == "int32":
        return rng.integers(-(2**31), 2**31, count, dtype=np.int32)
    return (rng.standard_normal(count) * (1 + rank)).astype(dtype)


def _fused_against_simulator(comm, rank, world):
    failures = []
    chained = False  # whether some direct plan here has chains (else fusion went untested)
    algorithm = "direct"
    for dtype, op in CASES:
        itemsize = np.dtype(dtype).itemsize
        segment = comm.segment_bytes // itemsize
        counts = (1, 1001, 2 * comm.fragment_bytes // itemsize + 3)
        if (dtype, op) in (("float32", "sum"), ("float16", "sum")):
            counts += (3 * world * segment + 5,)
        for count in counts:
            inputs = [_input(r, count, dtype) for r in range(world)]
            key = comm.plans.key("plan", "allreduce", algorithm, count, itemsize)
            plans = [comm.plans.python_plan(r, key) for r in range(world)]
            want = simulate(plans, inputs, op).outputs[rank]
            if _C.testing.plan_chains(comm.plans.plan("allreduce", algorithm, count, itemsize)):
                chained = True
            for fuse in (True, False):
                comm.native().fuse = fuse
                x = inputs[rank].copy()
                pycoll.allreduce(x, op, algorithm=algorithm, comm=comm)
                if x.tobytes() != want.tobytes():
                    bad = int(np.count_nonzero(x.view(np.uint8) != want.view(np.uint8)))
                    label = f"{algorithm} {dtype} {op} count={count} fuse={fuse}"
                    failures.append(f"{label}: {bad} bytes differ")
            comm.native().fuse = True
    return failures, chained


@pytest.mark.parametrize("world,env", [(3, {}), (4, {}), (3, TCP), (4, MIXED)],
                         ids=["shm-3", "shm-4", "tcp-3", "mixed-4"])
def test_chains_give_the_bits_of_the_ops_one_by_one(world, env):
    with RankPool(world, env=env) as pool:
        results = pool.run(_fused_against_simulator, timeout=300)
    assert [failures for failures, _ in results] == [[]] * world
    assert all(chained for _, chained in results), "a direct plan without chains tests nothing"
