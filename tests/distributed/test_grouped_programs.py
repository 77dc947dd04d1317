"""Grouped programs (pycoll/algorithms/grouped.py: what GPUs run over NCCL) on real CPU ranks.

``comm.grouped_on_cpu`` runs a collective through csrc/engine/grouped_executor.cc over shared memory and
the CPU loops: whole messages in matched groups, kernels between them. Each case runs the same call
both ways, from rank-dependent inputs, and asserts the two results (and error-feedback residuals) are
bitwise identical, and that the result is right: exactly for plain collectives (integers, so any order
of summation gives the closed form), within the codec's bound for compressed ones via the bitwise match
with the fragment executor, which tests/distributed/test_compression.py checks against float64.
"""

from __future__ import annotations

import hashlib
from functools import partial

import numpy as np
import pytest

import pycoll
from pycoll.algorithms import ALGORITHMS
from pycoll.compression import BF16, FP16, Int4, Int8
from pycoll.compression.bounds import error_bound

WORLDS = (2, 3, 4)


def _input(rank: int, count: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, count])
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def _both_ways(comm, fn):
    """fn() run by the fragment executor, then as a grouped program: both results."""
    comm.grouped_on_cpu = False
    plain = fn()
    comm.grouped_on_cpu = True
    try:
        grouped = fn()
    finally:
        comm.grouped_on_cpu = False
    return plain, grouped


def _plain_body(comm, rank, world):
    failures = []
    seg = comm.segment_bytes // 4
    for count in (0, 1, 7, 1000, 3 * seg + 5):
        for dtype, op in (
            ("int32", "sum"),
            ("float32", "sum"),
            ("float64", "avg"),
            ("float32", "max"),
            ("int64", "prod"),
        ):
            inputs = [_input(r, count, dtype, 11) for r in range(world)]
            for algorithm in ALGORITHMS["allreduce"]:
                label = f"allreduce {algorithm} {dtype} {op} n={count}"
                x = inputs[rank]
                plain, grouped = _both_ways(
                    comm,
                    lambda x=x, op=op, a=algorithm: pycoll.allreduce(x.copy(), op, algorithm=a, comm=comm),
                )
                if plain.tobytes() != grouped.tobytes():
                    failures.append(f"{label}: grouped differs from the fragment executor")
                if dtype.startswith("int") and op == "sum":
                    want = np.sum(inputs, axis=0, dtype=dtype)
                    if not np.array_equal(grouped, want):
                        failures.append(f"{label}: not the closed-form sum")
        x = _input(rank, count, "int32", 5)
        for algorithm in ALGORITHMS["reduce_scatter"]:
            plain, grouped = _both_ways(
                comm,
                lambda x=x, n=count, a=algorithm: pycoll.reduce_scatter(
                    np.concatenate([x] * world), np.full(n, -1, np.int32), algorithm=a, comm=comm
                ),
            )
            want = np.sum([_input(r, count, "int32", 5) for r in range(world)], axis=0, dtype=np.int32)
            if not (np.array_equal(plain, grouped) and np.array_equal(grouped, want)):
                failures.append(f"reduce_scatter {algorithm} n={count}: wrong")
        for algorithm in ALGORITHMS["all_gather"]:
            plain, grouped = _both_ways(
                comm,
                lambda x=x, n=count, a=algorithm: pycoll.all_gather(
                    x, np.full(world * n, -1, np.int32), algorithm=a, comm=comm
                ),
            )
            want = np.concatenate([_input(r, count, "int32", 5) for r in range(world)])
            if not (np.array_equal(plain, grouped) and np.array_equal(grouped, want)):
                failures.append(f"all_gather {algorithm} n={count}: wrong")
        for algorithm in ALGORITHMS["broadcast"]:
            for root in range(world):
                plain, grouped = _both_ways(
                    comm,
                    lambda n=count, root=root, a=algorithm: pycoll.broadcast(
                        _input(rank, n, "int32", 9), root, algorithm=a, comm=comm
                    ),
                )
                if not (
                    np.array_equal(plain, grouped)
                    and np.array_equal(grouped, _input(root, count, "int32", 9))
                ):
                    failures.append(f"broadcast {algorithm} root={root} n={count}: wrong")
    if not any(key.kind == "program" for key in comm.plans.keys()):
        failures.append("no grouped program was compiled: the grouped executor did not run")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_grouped_programs_match_the_fragment_executor(rank_pool, world):
    results = rank_pool(world).run(_plain_body, timeout=300)
    assert results == [[]] * world


CODECS = {
    "fp16": FP16(),
    "bf16": BF16(),
    "int8": Int8(),
    "int4-b16": Int4(block=16),
}
STOCHASTIC = Int8(block=32, rounding="stochastic", seed=3)


def _compressed_call(comm, x, op, algorithm, codec, residual):
    x = x.copy()
    res = None if residual is None else residual.copy()
    pycoll.allreduce(x, op, algorithm=algorithm, compression=codec, residual=res, comm=comm)
    return x if res is None else np.concatenate([x, res])


def _compressed_body(comm, rank, world):
    failures = []
    digests = []
    for count in (0, 1, 33, 5000, 3 * comm.segment_bytes // 4 + 7):
        inputs = [_input(r, count, "float32", 21) for r in range(world)]
        residual = (np.arange(count, dtype=np.float32) % 7) * 1e-3
        for algorithm in ("direct", "ring", "tree"):
            for op in ("sum", "avg"):
                for name, codec in CODECS.items():
                    plain, grouped = _both_ways(
                        comm, partial(_compressed_call, comm, inputs[rank], op, algorithm, codec, residual)
                    )
                    if plain.tobytes() != grouped.tobytes():
                        failures.append(
                            f"{name} {algorithm} {op} n={count}: grouped differs (result or residual)"
                        )
                    digests.append(grouped[:count].tobytes())
                # Stochastic rounding keys on the collective's number, so the two runs round differently:
                # check the grouped result against the codec's derived bound instead.
                comm.grouped_on_cpu = True
                got = _compressed_call(comm, inputs[rank], op, algorithm, STOCHASTIC, None).astype(np.float64)
                comm.grouped_on_cpu = False
                scale = world if op == "avg" else 1
                exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
                bound = error_bound(STOCHASTIC, algorithm, inputs, (got * scale).astype(np.float32))
                if not np.all(np.abs(got * scale - exact) <= bound):
                    failures.append(f"stochastic int8 {algorithm} {op} n={count}: outside the error bound")
                digests.append(got.tobytes())
    x16 = _input(rank, 777, "float16", 4)
    plain, grouped = _both_ways(comm, lambda: pycoll.allreduce(x16.copy(), compression=Int8(), comm=comm))
    if plain.tobytes() != grouped.tobytes():
        failures.append("float16 data with int8: grouped differs")
    return failures, hashlib.sha256(b"".join(digests)).hexdigest()


@pytest.mark.parametrize("world", WORLDS)
def test_grouped_compressed_programs_match_bitwise(rank_pool, world):
    results = rank_pool(world).run(_compressed_body, timeout=300)
    assert [f for f, _ in results] == [[]] * world
    assert len({d for _, d in results}) == 1, "ranks ended with different bits"
