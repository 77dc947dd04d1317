"""Every plan, every collective, world sizes 1..16, awkward counts: proved correct with the simulator.

Inputs are rank-dependent with closed-form results (int64: x_r[i] = (r+1)*1000 + i); float32 results are
checked against a float64 reference within a derived rounding bound; bytes and messages per link are
checked against closed forms; every element is finalized by exactly one op.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms._layout import num_segments
from pycoll.algorithms.plan import Buf, Plan, split_even
from pycoll.algorithms.simulate import SimResult, simulate
from pycoll.algorithms.tree import binary_tree, double_binary_tree

WORLDS = range(1, 17)
U32 = 2.0**-24  # unit roundoff of float32
REDUCTIONS = [("allreduce", a) for a in ALGORITHMS["allreduce"]] + [
    ("reduce_scatter", a) for a in ALGORITHMS["reduce_scatter"]
]


def cases(world: int, collective: str = "allreduce") -> list[tuple[int, int]]:
    """(count, segment_elems): empty, single, fewer than world, just over world, odd, large, and
    multi-segment with tiny segments. For reduce_scatter / all_gather ``count`` is the per-rank chunk, so
    their multi-segment cases use per-rank sizes like an all-reduce's chunks."""
    plain = sorted({0, 1, world - 1, world + 1, 7, 1000})
    out = [(c, 65536) for c in plain] + [(2, 1)]
    per_rank = collective in ("reduce_scatter", "all_gather")
    out.append((14, 3) if per_rank else (13 * world + 5, 3))
    if world in (2, 3, 7, 16):
        out.append((1000 // world + 3, 5) if per_rank else (1000, 5))
    return out


def plans_for(collective: str, algorithm: str, world: int, count: int, seg: int, root: int = 0) -> list[Plan]:
    return [
        build_plan(collective, algorithm, r, world, count, root=root, segment_elems=seg) for r in range(world)
    ]


def int_inputs(plans: list[Plan]) -> list[np.ndarray]:
    return [(r + 1) * 1000 + np.arange(p.input_count, dtype=np.int64) for r, p in enumerate(plans)]


def float_inputs(plans: list[Plan], op: str) -> list[np.ndarray]:
    rng = np.random.default_rng(len(plans) * 100003 + plans[0].input_count)
    lo, hi = (0.5, 2.0) if op == "prod" else (-1.0, 1.0)
    return [rng.uniform(lo, hi, p.input_count).astype(np.float32) for p in plans]


def int_expected(op: str, world: int, index: np.ndarray) -> np.ndarray:
    """Closed form of op over ranks of (r+1)*1000 + i, element-wise for the global indices ``index``."""
    if op == "sum":
        return 1000 * world * (world + 1) // 2 + world * index
    if op == "max":
        return world * 1000 + index
    if op == "min":
        return 1000 + index
    assert op == "prod"
    out = []
    for i in index.tolist():
        p = 1
        for r in range(world):
            p = p * ((r + 1) * 1000 + i) % 2**64
        out.append(p - 2**64 if p >= 2**63 else p)
    return np.array(out, dtype=np.int64)


def float_reference(op: str, inputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(float64 reference, derived bound on |float32 result - reference|), element-wise."""
    x = np.stack(inputs).astype(np.float64)
    n = len(inputs)
    gamma = (n - 1) * U32 / (1 - (n - 1) * U32)  # any summation order of n terms: |err| <= gamma * sum|x|
    if op in ("sum", "avg"):
        ref = x.sum(axis=0)
        bound = gamma * np.abs(x).sum(axis=0)
        if op == "avg":  # then one division, rounded once more
            ref, bound = ref / n, (bound * (1 + U32) + U32 * np.abs(ref)) / n
        return ref, bound * (1 + 1e-6) + 1e-30
    if op == "prod":
        ref = x.prod(axis=0)
        return ref, gamma * np.abs(ref) * (1 + 1e-6)
    ref = x.max(axis=0) if op == "max" else x.min(axis=0)
    return ref, np.zeros_like(ref)


# ---- checks shared by the sweeps ----------------------------------------------------------------------


def assert_identical(outputs: list[np.ndarray]) -> None:
    first = outputs[0].tobytes()
    for r, o in enumerate(outputs):
        assert o.tobytes() == first, f"rank {r} differs bitwise from rank 0"


def assert_finalized_once(
    collective: str, world: int, count: int, res: SimResult, in_place: bool = False
) -> None:
    """Every element finalized exactly once (a reduce-scatter's chunk r by rank r, at offset 0 of its
    OUTPUT, or ``in_place`` at its place in the whole buffer)."""
    covered = np.zeros(world * count if collective == "reduce_scatter" else count, dtype=np.int64)
    for r, regions in enumerate(res.finalized):
        for buf, off, n in regions:
            assert buf == Buf.OUTPUT, f"rank {r} finalizes into {buf.name}"
            base = r * count if collective == "reduce_scatter" and not in_place else 0
            covered[base + off : base + off + n] += 1
    if world == 1:  # a plain COPY or nothing: nothing to reduce, nothing to divide
        assert not covered.any()
    else:
        assert (covered == 1).all(), f"finalize coverage {np.unique(covered)} (want exactly 1 everywhere)"


def expected_links(
    collective: str, algorithm: str, world: int, count: int, seg: int, root: int = 0
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """Closed forms: (elements per link, messages per link)."""
    elements: dict[tuple[int, int], int] = {}
    messages: dict[tuple[int, int], int] = {}

    def add(a: int, b: int, n: int, m: int) -> None:
        elements[a, b] = elements.get((a, b), 0) + n
        messages[a, b] = messages.get((a, b), 0) + m

    if world == 1:
        return elements, messages
    chunk = [n for _, n in split_even(count, world)]
    # hierarchical with one rank per host (what build_plan gives without local_size) is the ring
    if collective == "allreduce" and algorithm in ("ring", "hierarchical"):
        segments = num_segments(max(chunk), seg)
        for r in range(world):  # every chunk but r as a partial, r as final, all but r, r+1 as final again
            add(r, (r + 1) % world, 2 * count - chunk[r] - chunk[(r + 1) % world], 2 * (world - 1) * segments)
    elif collective == "allreduce" and algorithm == "direct":
        segments = num_segments(max(chunk), seg)
        for r in range(world):
            for p in range(world):
                if p != r:  # chunk p to its owner, then the owner's chunk r back
                    add(r, p, chunk[p] + chunk[r], 2 * segments)
    elif collective == "allreduce" and algorithm == "tree":
        halves = [n for _, n in split_even(count, 2)]
        segments = num_segments(max(halves), max(1, seg // 2))  # a tree segment: half the largest message
        for half, tree in zip(halves, double_binary_tree(world)):
            for child, parent in enumerate(tree.parent):
                if parent >= 0:  # up then down: each edge carries the tree's half once each way
                    add(child, parent, half, segments)
                    add(parent, child, half, segments)
    elif collective in ("reduce_scatter", "all_gather") and algorithm == "ring":
        for r in range(world):
            add(r, (r + 1) % world, (world - 1) * count, (world - 1) * num_segments(count, seg))
    elif collective in ("reduce_scatter", "all_gather") and algorithm in ("direct", "hierarchical"):
        # (the hierarchical reduce-scatter with one rank per host is the direct one, in place)
        for r in range(world):
            for p in range(world):
                if p != r:
                    add(r, p, count, num_segments(count, seg))
    elif collective == "broadcast":
        if algorithm == "ring":
            for k in range(world - 1):
                add((root + k) % world, (root + k + 1) % world, count, num_segments(count, seg))
        else:
            tree = binary_tree(world, [(label + root) % world for label in range(world)])
            for child, parent in enumerate(tree.parent):
                if parent >= 0:
                    add(parent, child, count, num_segments(count, seg))
        for r in range(world):  # the empty acknowledgement every rank sends the root at the end
            if r != root:
                add(r, root, 0, 1)
    elif collective == "barrier":
        distance = 1
        while distance < world:
            for r in range(world):
                add(r, (r + distance) % world, 0, 1)
            distance *= 2
    else:
        raise AssertionError(f"no closed form for {collective}/{algorithm}")
    return elements, messages


def assert_links(
    collective: str, algorithm: str, world: int, count: int, seg: int, res: SimResult, root: int = 0
) -> None:
    elements, messages = expected_links(collective, algorithm, world, count, seg, root)
    assert res.elements_per_link == elements
    assert res.messages_per_link == messages
    assert res.bytes_per_link == {link: n * 8 for link, n in elements.items()}  # int64
    if collective == "allreduce" and algorithm != "tree" and world > 1:
        # 2(n-1)/n * count per rank, up to rounding of chunk sizes (which differ by <= 1): ring sends
        # 2*count - c_r - c_{r+1}, direct count + (n-2)*c_r.
        slack = 2 if algorithm == "ring" else world - 1
        for r in range(world):
            sent = sum(n for (a, _), n in res.elements_per_link.items() if a == r)
            assert abs(sent - 2 * (world - 1) * count / world) < slack


# ---- the sweeps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS["allreduce"])
def test_allreduce_int64_sum(algorithm: str, world: int) -> None:
    for count, seg in cases(world):
        plans = plans_for("allreduce", algorithm, world, count, seg)
        inputs = int_inputs(plans)
        res = simulate(plans, inputs)
        expected = int_expected("sum", world, np.arange(count))
        for o in res.outputs:
            np.testing.assert_array_equal(o, expected)
        assert_identical(res.outputs)
        assert_finalized_once("allreduce", world, count, res)
        assert_links("allreduce", algorithm, world, count, seg, res)
        assert all(h == frozenset(range(world)) for h in res.heard_from), "must synchronise every rank"
        if world > 1:  # the plans are also right when INPUT and OUTPUT do not alias
            apart = simulate(plans, inputs, inplace=False)
            for o, w in zip(apart.outputs, apart.output_written):
                np.testing.assert_array_equal(o, expected)
                assert w.all()


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS["reduce_scatter"])
def test_reduce_scatter_int64_sum(algorithm: str, world: int) -> None:
    for count, seg in cases(world, "reduce_scatter"):
        plans = plans_for("reduce_scatter", algorithm, world, count, seg)
        if algorithm == "hierarchical":  # in place on a copy of the input; the result is this rank's chunk
            assert all(p.result == (r * count, count) and p.in_place for r, p in enumerate(plans))
        else:
            assert all((p.input_count, p.output_count) == (world * count, count) for p in plans)
        res = simulate(plans, int_inputs(plans))
        for r, (o, written) in enumerate(zip(res.outputs, res.output_written)):
            if plans[r].result is not None:
                o, written = o[r * count:(r + 1) * count], written[r * count:(r + 1) * count]
            np.testing.assert_array_equal(o, int_expected("sum", world, r * count + np.arange(count)))
            assert written.all() or world == 1 and plans[r].result is not None  # nothing moves
        assert_finalized_once("reduce_scatter", world, count, res, in_place=algorithm == "hierarchical")
        assert_links("reduce_scatter", algorithm, world, count, seg, res)
        assert all(h == frozenset(range(world)) for h in res.heard_from)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS["all_gather"])
def test_all_gather_int64(algorithm: str, world: int) -> None:
    for count, seg in cases(world, "all_gather"):
        plans = plans_for("all_gather", algorithm, world, count, seg)
        assert all((p.input_count, p.output_count) == (count, world * count) for p in plans)
        inputs = int_inputs(plans)
        res = simulate(plans, inputs)
        for o, written in zip(res.outputs, res.output_written):
            np.testing.assert_array_equal(o, np.concatenate(inputs))
            assert written.all()
        assert not any(res.finalized)
        assert_links("all_gather", algorithm, world, count, seg, res)
        assert all(h == frozenset(range(world)) for h in res.heard_from)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS["broadcast"])
def test_broadcast_int64(algorithm: str, world: int) -> None:
    roots = range(world) if world <= 5 else sorted({0, 1, world // 2, world - 1})
    for root in roots:
        for count, seg in cases(world)[::2] + [(13 * world + 5, 3)]:
            plans = plans_for("broadcast", algorithm, world, count, seg, root)
            inputs = int_inputs(plans)
            res = simulate(plans, inputs)
            for o in res.outputs:
                np.testing.assert_array_equal(o, inputs[root])
            assert not any(res.finalized)
            assert_links("broadcast", algorithm, world, count, seg, res, root)
            assert all(root in h for h in res.heard_from)


@pytest.mark.parametrize("world", range(1, 34))
def test_barrier(world: int) -> None:
    plans = plans_for("barrier", "dissemination", world, 0, 1)
    res = simulate(plans, [np.zeros(0, dtype=np.int64)] * world)
    assert all(h == frozenset(range(world)) for h in res.heard_from), "every rank must hear from every rank"
    assert res.max_steps == math.ceil(math.log2(world))
    assert_links("barrier", "dissemination", world, 0, 1, res)


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "avg"])
@pytest.mark.parametrize("collective,algorithm", REDUCTIONS)
def test_reduction_ops(collective: str, algorithm: str, op: str) -> None:
    for world in (1, 2, 3, 5, 8, 13, 16):
        multi = (14, 3) if collective == "reduce_scatter" else (13 * world + 5, 3)
        for count, seg in ((world + 1, 65536), multi):
            plans = plans_for(collective, algorithm, world, count, seg)
            index = np.arange(plans[0].input_count)  # global element index (rank r's chunk for rs)
            if op != "avg":
                res = simulate(plans, int_inputs(plans), op)
                expected = int_expected(op, world, index)
                check_outputs(collective, world, count, res, expected, np.zeros(expected.shape))
            inputs = float_inputs(plans, op)
            res = simulate(plans, inputs, op)
            assert all(o.dtype == np.float32 for o in res.outputs)
            ref, bound = float_reference(op, inputs)
            check_outputs(collective, world, count, res, ref, bound)
            if collective == "allreduce":
                assert_identical(res.outputs)
            assert_finalized_once(collective, world, count, res, in_place=plans[0].result is not None)


def check_outputs(
    collective: str, world: int, count: int, res: SimResult, expected: np.ndarray, bound: np.ndarray
) -> None:
    for r, o in enumerate(res.outputs):
        part = slice(r * count, (r + 1) * count) if collective == "reduce_scatter" else slice(None)
        if collective == "reduce_scatter" and o.size == world * count:  # in place: the chunk is the result
            o = o[part]
        if bound.any():
            err = np.abs(o.astype(np.float64) - expected[part])
            assert (err <= bound[part]).all(), f"rank {r}: error {err.max()} over bound"
        else:
            np.testing.assert_array_equal(o, expected[part].astype(o.dtype))


def test_float_results_match_reference_to_rounding() -> None:
    """The derived float32 bound is not vacuous: results differ from the float64 reference, within it."""
    world, count = 13, 200
    plans = plans_for("allreduce", "ring", world, count, 7)
    inputs = float_inputs(plans, "sum")
    ref, bound = float_reference("sum", inputs)
    err = np.abs(simulate(plans, inputs).outputs[0] - ref)
    assert err.max() > 0 and (err <= bound).all()
