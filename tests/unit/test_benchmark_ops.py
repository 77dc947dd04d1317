"""The exact checks of ``pycoll bench -o OP -d TYPE`` (pycoll/bench/inputs.py): every op on every type has
inputs whose reduction is exact in that type, in any order, with a closed form that matches it bit for
bit. Checked here against numpy reductions of the very inputs, folded in several orders the way the
kernels compute (float16 / bfloat16 in float32, rounded back after every step; integers wrapping), and
against exact float64 arithmetic where the result is an exact value."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from pycoll.bench import inputs, timing

ml_dtypes = pytest.importorskip("ml_dtypes")

TYPES = list(inputs.DATATYPES)  # nccl-tests names
WORLDS = [1, 2, 3, 4, 5, 7, 8, 17, 18, 24, 31, 40, 57, 58, 64, 90]
COUNT = 70  # ten periods of 7, both parities


def _compute(dt: np.dtype) -> np.dtype:
    if dt.name in ("float16", "bfloat16"):
        return np.dtype(np.float32)
    return dt


def _step(op: str, a: np.ndarray, b: np.ndarray, divisor: int = 0) -> np.ndarray:
    """One reduce step as the kernels do it: load into the compute type, apply, (divide), store."""
    dt = a.dtype
    c = _compute(dt)
    x, y = a.astype(c), b.astype(c)
    with np.errstate(over="ignore"):
        if op in ("sum", "avg"):
            r = np.add(x, y, dtype=c)
        elif op == "prod":
            r = np.multiply(x, y, dtype=c)
        elif op == "min":
            r = np.minimum(x, y)
        else:
            r = np.maximum(x, y)
        if divisor:
            r = (r / c.type(divisor)).astype(c)
        return r.astype(dt)


def _fold(op: str, xs: list[np.ndarray], order: str) -> np.ndarray:
    """Reduce ``xs`` in one of several orders; avg divides in the last step (the finalize)."""
    n = len(xs)
    if n == 1:
        if op == "avg":
            c = _compute(xs[0].dtype)
            return (xs[0].astype(c) / c.type(1)).astype(xs[0].dtype)
        return xs[0].copy()
    if order == "tree":
        level = list(xs)
        while len(level) > 1:
            last = len(level) == 2
            nxt = [
                _step(op, level[i], level[i + 1], n if (last and op == "avg") else 0)
                for i in range(0, len(level) - 1, 2)
            ]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]
    seq = xs if order == "forward" else xs[::-1]
    acc = seq[0]
    for i, x in enumerate(seq[1:], start=2):
        acc = _step(op, acc, x, n if (op == "avg" and i == n) else 0)
    return acc


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("op", inputs.REDOPS)
def test_closed_form_is_the_reduction_in_every_order(op: str, name: str) -> None:
    dt = inputs.resolve_dtype(name)
    for world in WORLDS:
        if op == "avg" and dt.kind in "iu":
            with pytest.raises(ValueError, match="floating"):
                inputs.exact_expected(op, world, COUNT, dt)
            continue
        expected = inputs.exact_expected(op, world, COUNT, dt)
        assert expected.dtype == dt and expected.shape == (COUNT,)
        xs = [inputs.exact_input(op, r, world, COUNT, dt) for r in range(world)]
        assert all(x.dtype == dt for x in xs)
        for order in ("forward", "backward", "tree"):
            got = _fold(op, xs, order)
            np.testing.assert_array_equal(
                _bits(got), _bits(expected), err_msg=f"{op} {dt.name} world {world} order {order}"
            )


@pytest.mark.parametrize("name", ["float", "half", "bfloat16", "double"])
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 17])
def test_floating_closed_forms_are_the_exact_values(op: str, name: str, world: int) -> None:
    """On small worlds every result is the exact (float64) value: nothing rounds."""
    dt = inputs.resolve_dtype(name)
    xs = np.stack([inputs.exact_input(op, r, world, COUNT, dt).astype(np.float64) for r in range(world)])
    exact: Callable[..., np.ndarray] = {
        "sum": np.sum,
        "avg": np.mean,
        "min": np.min,
        "max": np.max,
        "prod": np.prod,
    }[op]
    expected = inputs.exact_expected(op, world, COUNT, dt).astype(np.float64)
    np.testing.assert_array_equal(expected, exact(xs, axis=0))


def test_default_pattern_is_rank_input() -> None:
    for world in (1, 2, 5):
        for r in range(world):
            np.testing.assert_array_equal(
                inputs.exact_input("sum", r, world, 50, "float"), inputs.rank_input(r, 50)
            )
        expected = inputs.exact_expected("sum", world, 50, "float32")
        np.testing.assert_array_equal(expected, inputs.expected_sum(world, 50))
    k = np.arange(14) % 7
    np.testing.assert_array_equal(inputs.exact_expected("min", 4, 14, "float32"), 1 + k)
    np.testing.assert_array_equal(inputs.exact_expected("max", 4, 14, "int32"), 4 + k)
    np.testing.assert_array_equal(inputs.exact_expected("avg", 4, 14, "half"), 2.5 + k)


@pytest.mark.parametrize(
    ("op", "name", "world", "pattern"),
    [
        ("sum", "bfloat16", 17, "ranks"),  # 153 + 102 = 255 <= 256
        ("sum", "bfloat16", 18, "pairs"),
        ("avg", "bfloat16", 170, "pairs"),  # 170 + 85 = 255
        ("sum", "half", 57, "ranks"),
        ("sum", "half", 58, "pairs"),
        ("sum", "int8", 200, "ranks"),  # wraps, exactly as numpy
        ("min", "int8", 121, "ranks"),
        ("max", "int8", 122, "pairs"),  # 122 + 6 > 127
        ("max", "uint8", 249, "ranks"),
        ("min", "bfloat16", 251, "pairs"),
        ("prod", "half", 4, "powers"),
    ],
)
def test_pattern_choice(op: str, name: str, world: int, pattern: str) -> None:
    assert inputs.exact_pattern(op, world, name) == pattern


def test_no_exact_check_raises() -> None:
    with pytest.raises(ValueError, match="-c 0"):
        inputs.exact_pattern("sum", 171, "bfloat16")  # 171 + 86 > 256
    with pytest.raises(ValueError, match="floating"):
        inputs.exact_pattern("avg", 2, "int32")
    with pytest.raises(ValueError, match="unknown op"):
        inputs.exact_pattern("xor", 2, "int32")


def test_wrapping_integers_and_float_overflow() -> None:
    # prod of int8 / uint8 on 50 ranks: up to 2**8 wraps to 0, 2**7 in int8 to -128 (numpy's wrapping)
    for name, values in (("int8", {1: 2, 7: -128, 8: 0}), ("uint8", {7: 128, 8: 0})):
        expected = inputs.exact_expected("prod", 50, 7, name)
        c = [max(0, (50 - ((-i) % 7) + 6) // 7) for i in range(7)]
        for power, value in values.items():
            assert all(int(e) == value for e, p in zip(expected, c) if p == power), (name, power)
    # float16 overflows to inf past 2**15 (112 ranks: 16 ranks share each residue), as the kernel does
    assert np.isinf(inputs.exact_expected("prod", 112, 7, "half")).all()
    # int8 sum past 127 wraps like numpy's
    np.testing.assert_array_equal(
        inputs.exact_expected("sum", 20, 7, "int8"),
        (210 + 20 * np.arange(7)).astype(np.int64).astype(np.int8),
    )


def test_dtype_names() -> None:
    assert {inputs.resolve_dtype(n).name for n in inputs.DATATYPES} == {
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "int32",
        "int64",
        "int8",
        "uint8",
    }
    assert inputs.resolve_dtype("float") == np.float32 and inputs.resolve_dtype("double") == np.float64
    assert inputs.resolve_dtype("half") == np.float16 and inputs.resolve_dtype("float32") == np.float32
    assert inputs.REDOPS == ("sum", "prod", "max", "min", "avg")


@pytest.mark.parametrize("op", inputs.REDOPS)
def test_exact_inputs_judge_counts_wrong_elements(op: str) -> None:
    exact = inputs.ExactInputs(op)
    judge = exact.judge(0, 3, 100, "half")
    good = inputs.exact_expected(op, 3, 100, "half")
    assert judge(good.copy()) == (0, 0.0)
    bad = good.copy()
    bad[[3, 50]] = 99
    wrong, rel = judge(bad)
    assert wrong == 2 and rel is not None and rel > 0


def test_sweep_with_op_and_type_on_one_rank() -> None:
    """A world of one: the identity is the right all-reduce for every op; the type and op show."""
    seen: list[np.dtype] = []

    def identity(x: np.ndarray) -> None:
        seen.append(x.dtype)

    for op in ("prod", "max", "avg"):
        variant = timing.Variant("none", identity, library="x", algorithm="a", op=op)
        (r,) = timing.run_interleaved_sweep(
            [variant],
            lambda: None,
            lambda a: a,
            0,
            1,
            min_bytes=64,
            max_bytes=64,
            iters=2,
            warmup=1,
            dtype="bfloat16",
        )
        assert (r.redop, r.dtype, r.count, r.wrong) == (op, "bfloat16", 32, 0)
        assert (r.library, r.algorithm, r.label) == ("x", "a", "x/a") and len(r.times_us) == 2
    assert {d.name for d in seen} == {"bfloat16"}
