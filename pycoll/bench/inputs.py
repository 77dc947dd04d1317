"""What a benchmark feeds the collective and how it judges the result: rank-dependent inputs and their
expected values.

- ``ExactInputs(op, collective)``: per op, type and world size, inputs whose reduction is exact in that
  type whatever order the ranks combine them in, and a closed form of the result (``exact_input`` /
  ``exact_expected``; the derivation is in ``exact_pattern``'s docstring), so ``#wrong`` is an exact
  element-by-element comparison for every op and type (nccl-tests' names in ``DATATYPES`` /
  ``REDOPS``). For a float32 sum these are ``rank_input`` (``x_r[i] = r + 1 + (i % 7)``) and
  ``expected_sum`` (``n(n+1)/2 + n * (i % 7)``), exact in float32 up to several thousand ranks. A
  reduce-scatter gets the all-reduce's inputs and is held to its chunk of the all-reduce's result; an
  all-gather's rank r gives ``rank_input(r, m)``, and the result is their concatenation
  (``pycoll.bench.collectives``).
- ``gaussian_input``: the inputs of a compressed run (``variants.CodecInputs`` judges them against
  the codec's derived error bound).

numpy is imported where it is used, not here: `pycoll --help` loads the flags of `pycoll bench` and
must stay fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import DTypeLike
else:
    DTypeLike = Any

__all__ = [
    "CODEC_OPS",
    "DATATYPES",
    "INPUT_SEED",
    "REDOPS",
    "ExactInputs",
    "Inputs",
    "JudgeFn",
    "exact_expected",
    "exact_input",
    "exact_pattern",
    "expected_sum",
    "gaussian_input",
    "rank_input",
    "relative_error",
    "resolve_dtype",
]

#: Judges one result on one rank: (elements wrong / outside the bound, relative L2 error or None).
JudgeFn = Callable[["np.ndarray"], "tuple[int, float | None]"]

#: nccl-tests' ``-d`` names and the numpy dtype names pycoll reports them as (the ``type`` column).
DATATYPES: dict[str, str] = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
#: nccl-tests' ``-o`` names (the ``redop`` column), in nccl-tests' order.
REDOPS = ("sum", "prod", "max", "min", "avg")
#: Significant bits of the floating types: every integer up to 2**bits is exact in them.
_SIGNIFICANT_BITS = {"float32": 24, "float64": 53, "float16": 11, "bfloat16": 8}
#: ops a codec takes.
CODEC_OPS = ("sum", "avg")
#: Seed of the Gaussian inputs of compressed runs.
INPUT_SEED = 0


def rank_input(rank: int, count: int, dtype: DTypeLike = "float32") -> np.ndarray:
    """Rank ``rank``'s input: ``x[i] = rank + 1 + (i % 7)``, small integers exact in every dtype."""
    import numpy as np

    pattern = np.arange(count, dtype=np.int64) % 7
    pattern += rank + 1
    return pattern.astype(dtype)


def expected_sum(world: int, count: int, dtype: DTypeLike = "float32") -> np.ndarray:
    """The all-reduce (sum) of ``rank_input`` over ``world`` ranks: ``n(n+1)/2 + n * (i % 7)``."""
    import numpy as np

    pattern = np.arange(count, dtype=np.int64) % 7
    pattern *= world
    pattern += world * (world + 1) // 2
    return pattern.astype(dtype)


def relative_error(out: np.ndarray, exact: np.ndarray) -> float:
    """||out - exact|| / ||exact|| (L2, in float64); 0 when both are zero, inf when only ``exact`` is.

    Computed without BLAS: OpenBLAS's threads spin for a while after a call (np.linalg.norm, np.dot)
    and would take the cores from the ranks of the next timed iteration."""
    import numpy as np

    exact64 = np.asarray(exact, dtype=np.float64)
    diff = math.sqrt(float(np.sum(np.square(np.asarray(out, dtype=np.float64) - exact64))))
    norm = math.sqrt(float(np.sum(np.square(exact64))))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def gaussian_input(rank: int, count: int, seed: int = 0, dtype: DTypeLike = "float32") -> np.ndarray:
    """Rank ``rank``'s Gaussian input (mean 0, standard deviation 1): a pure function of (rank, count,
    seed), so every rank can rebuild every rank's input and the exact sum."""
    import numpy as np

    rng = np.random.default_rng([seed, rank, count])
    return rng.standard_normal(count, dtype=np.float32).astype(dtype, copy=False)


class Inputs:
    """What a sweep feeds the collective and how it judges the result (subclass and override both).
    ``count`` is the size's element count (the whole buffer, ``pycoll.bench.collectives``)."""

    def input(self, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        """Rank ``rank``'s input for one size (re-filled before every checked iteration)."""
        raise NotImplementedError

    def judge(self, rank: int, world: int, count: int, dtype: DTypeLike) -> JudgeFn:
        """A function judging rank ``rank``'s result for one size (made once per size, only when
        checking): it returns how many elements are wrong and the relative L2 error (or None)."""
        raise NotImplementedError


class ExactCollective(Protocol):
    """What ``ExactInputs`` asks of a collective (a ``pycoll.bench.collectives.Collective``)."""

    def check_op(self, op: str) -> None: ...
    def exact_input(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray: ...
    def exact_expected(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray: ...


class ExactInputs(Inputs):
    """Inputs whose collective with ``op`` is exact in the element type, and its closed form
    (``exact_input`` / ``exact_expected``): any differing element is wrong. With ``op="sum"`` on float32
    these are ``rank_input`` / ``expected_sum``. ``collective``: a ``pycoll.bench.collectives.Collective``
    whose ``exact_input`` / ``exact_expected`` say what its ranks give and get (None: the all-reduce)."""

    def __init__(self, op: str = "sum", collective: ExactCollective | None = None) -> None:
        if collective is not None:
            collective.check_op(op)
        elif op not in REDOPS:
            raise ValueError(f"unknown op {op!r}; expected one of {', '.join(REDOPS)}")
        self.op = op
        self.collective = collective

    def input(self, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        if self.collective is not None:
            return self.collective.exact_input(self.op, rank, world, count, dtype)
        return exact_input(self.op, rank, world, count, dtype)

    def judge(self, rank: int, world: int, count: int, dtype: DTypeLike) -> JudgeFn:
        import numpy as np

        if self.collective is not None:
            expected = self.collective.exact_expected(self.op, rank, world, count, dtype)
        else:
            expected = exact_expected(self.op, world, count, dtype)

        def judge(x: np.ndarray) -> tuple[int, float | None]:
            wrong = int(np.count_nonzero(x != expected))
            return wrong, (relative_error(x, expected) if wrong else 0.0)

        return judge


# ---------------------------------------------------------------------------------------------------
# Exact inputs and closed forms for every op and type (``pycoll bench -o ... -d ...``).


def resolve_dtype(name: DTypeLike) -> np.dtype:
    """A numpy dtype from an nccl-tests name (``float``, ``half``, ``double``...), a numpy name or a
    dtype; ``bfloat16`` comes from ``ml_dtypes`` (ValueError naming the package when it is missing)."""
    import numpy as np

    if isinstance(name, str):
        key = DATATYPES.get(name.strip().lower(), name.strip().lower())
        if key == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise ValueError("bfloat16 needs the ml_dtypes package: pip install ml_dtypes") from None
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(key)
    return np.dtype(name)


def _is_float(dt: np.dtype) -> bool:
    return dt.name in _SIGNIFICANT_BITS


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """The type pycoll's kernels reduce ``dt`` in: float64 for float64, float32 for float32, float16
    and bfloat16 (which are rounded back to their own type after every step), ``dt`` for integers."""
    import numpy as np

    if dt.name == "float64" or not _is_float(dt):
        return dt
    return np.dtype(np.float32)


def exact_pattern(op: str, world: int, dtype: DTypeLike) -> str:
    """Which inputs ``exact_input`` gives for ``op`` on ``world`` ranks of ``dtype``, chosen so that
    every rank ends with a result known in closed form, bit for bit, whatever order the ranks add in.

    ``"ranks"``: ``x_r[i] = r + 1 + (i % 7)`` (the pattern of ``rank_input``), with ``k = i % 7``:
        sum = n(n+1)/2 + n·k, min = 1 + k, max = n + k, avg = sum / n = (n+1)/2 + k.
        Floating types: every input and every partial sum is an integer no larger than the total
        T = n(n+1)/2 + 6n, so when T <= 2**p (p significant bits: float32 24, float64 53, float16 11,
        bfloat16 8) no addition rounds, in any order, and the partial sums stored back in a half type
        after each step are exact too. The average is then exact as well: T / n = (n+1)/2 + k is a
        multiple of 1/2 below 2**(p-1), so float32(sum) / float32(n) in the compute type (float32
        for half and bfloat16) is exact and rounding it to the element type changes nothing.
        Integer types: sum wraps modulo 2**bits exactly as numpy's does, in any order (the expected
        value is the closed form cast to the type); min and max need n + 6 <= the type's maximum.
        Used for sum/avg while T <= 2**p (bfloat16: n <= 17, float16: n <= 57, float32: n <= 5785)
        and for min/max while n + 6 fits (int8: n <= 121, bfloat16: n <= 250).
    ``"pairs"``: ``x_r[i] = 1 + ((r + i) % 2)`` for larger worlds: the total is at most n + ceil(n/2),
        exact while that is <= 2**p; sum = n + (n // 2 if i is even else (n + 1) // 2); min and max are
        1 and 2 (for n = 1: 1 + (i % 2)); avg = float32(sum) / float32(n) rounded once to the type.
    ``"powers"`` (prod): ``x_r[i] = 2`` when ``(r + i) % 7 == 0``, else 1: the product is 2**c with
        c = #{r < n : (r + i) % 7 == 0}, a power of two, exact in every floating type (it overflows
        float16 to inf only past 105 ranks, which is then the expected value) and, in integer types,
        wrapping as numpy's does (2**7 in int8 is -128, 2**8 is 0).

    ValueError when no pattern is exact (``op="avg"`` on an integer type, or sums past 2**p with
    both patterns, e.g. bfloat16 on more than 170 ranks)."""
    import numpy as np

    if op not in REDOPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(REDOPS)}")
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    dt = resolve_dtype(dtype)
    n = world
    if op == "prod":
        return "powers"
    if op == "avg" and not _is_float(dt):
        raise ValueError(f"op avg needs a floating-point type, got {dt.name}")
    if _is_float(dt):
        limit = 2 ** _SIGNIFICANT_BITS[dt.name]
        if op in ("min", "max"):
            return "ranks" if n + 6 <= limit else "pairs"
        if n * (n + 1) // 2 + 6 * n <= limit:
            return "ranks"
        if n + (n + 1) // 2 <= limit:
            return "pairs"
        raise ValueError(
            f"no exact check of {op} on {dt.name} with {n} ranks (its sums round); run with -c 0"
        )
    if op in ("min", "max") and n + 6 > int(np.iinfo(dt).max):
        return "pairs"
    return "ranks"


def exact_input(op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
    """Rank ``rank``'s input for an exact check of ``op`` (see ``exact_pattern``)."""
    import numpy as np

    dt = resolve_dtype(dtype)
    pattern = exact_pattern(op, world, dt)
    i = np.arange(count, dtype=np.int64)
    if pattern == "ranks":
        values = i % 7 + (rank + 1)
    elif pattern == "pairs":
        values = (i + rank) % 2 + 1
    else:
        values = np.where((i + rank) % 7 == 0, 2, 1)
    return values.astype(dt)


def exact_expected(op: str, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
    """The closed form of the all-reduce with ``op`` of ``exact_input`` over ``world`` ranks, in
    ``dtype``, bit for bit (see ``exact_pattern``)."""
    import numpy as np

    dt = resolve_dtype(dtype)
    pattern = exact_pattern(op, world, dt)
    n = world
    i = np.arange(count, dtype=np.int64)
    if pattern == "powers":
        j = (-i) % 7  # the ranks r with (r + i) % 7 == 0 are r = j, j + 7, ...
        c = np.maximum(0, (n - j + 6) // 7)
        out = np.empty(count, dtype=dt)
        for power in np.unique(c).tolist():
            out[c == power] = _power_of_two(int(power), dt)
        return out
    if pattern == "ranks":
        k = i % 7
        total = n * (n + 1) // 2 + n * k
        low, high = 1 + k, n + k
    else:
        odd_ranks = np.where(i % 2 == 0, n // 2, (n + 1) // 2)  # ranks whose input is 2
        total = n + odd_ranks
        low = 1 + i % 2 if n == 1 else np.ones(count, dtype=np.int64)
        high = 1 + i % 2 if n == 1 else np.full(count, 2, dtype=np.int64)
    if op == "sum":
        return total.astype(dt)  # integers wrap here as they do in the all-reduce
    if op == "min":
        return low.astype(dt)
    if op == "max":
        return high.astype(dt)
    compute = _compute_dtype(dt)  # avg: float(sum) / float(n) in the compute type, rounded once
    return (total.astype(compute) / compute.type(n)).astype(dt)


def _power_of_two(power: int, dt: np.dtype) -> Any:
    """2**power in ``dt``: wrapping in integer types (as numpy's multiplication), inf past a float's
    range."""
    import numpy as np

    if _is_float(dt):
        with np.errstate(over="ignore"):
            return np.array(2.0**power if power < 1024 else math.inf, dtype=np.float64).astype(dt)[()]
    bits = dt.itemsize * 8
    value = (1 << power) % (1 << bits)
    if dt.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return dt.type(value)
