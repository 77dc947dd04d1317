"""The collectives ``pycoll bench`` times, one class each: the one home of what differs between them.

A benchmark's *size* is nccl-tests' (``all_reduce_perf``, ``reduce_scatter_perf``, ``all_gather_perf``):
the whole buffer, that is the all-reduce's buffer, the reduce-scatter's *input* and the all-gather's
*output* (nccl-tests' ``count * nranks`` for the last two), so a size's element count is rounded down
to a multiple of the world size for them, as nccl-tests does. Each rank holds a chunk of ``m = count / n``
elements of the reduce-scatter's output and of the all-gather's input.

===================  =============  ==================  ==============  ===============================
collective           nccl-tests     buffers (elements)  busbw / algbw   bytes each rank must send
===================  =============  ==================  ==============  ===============================
``allreduce``        all_reduce     x: count, in place  2(n-1)/n        2(n-1)/n * M
``reduce_scatter``   reduce_scatter x: count, out: m    (n-1)/n         (n-1)/n * M
``all_gather``       all_gather     x: m, out: count    (n-1)/n         (n-1)/n * M
===================  =============  ==================  ==============  ===============================

(algbw = size / time; M the size in bytes; the bus factor is the share of the buffer each rank must
send, and receive, in a bandwidth-optimal algorithm, so busbw compares across world sizes. These are
nccl-tests' factors, doc/PERFORMANCE.md of NVIDIA/nccl-tests.) With a codec the bytes sent are the
encoded chunks', ``Collective.sent_bytes``.

Each ``Collective`` also knows how its callables are called (``args``: ``(x,)`` in place for the
all-reduce, ``(x, out)`` for the others), how pycoll, torch.distributed (Gloo, NCCL) and MPI call it
(``pycoll_call``, ``torch_call``, ``mpi_call``), its exact inputs and closed-form results
(``exact_input`` / ``exact_expected``: the all-reduce's, ``pycoll.bench.inputs.exact_pattern``, and for
the reduce-scatter the owner's chunk of them) and, for compressed runs, the float64 reference and the
derived error bound (``codec_reference``: ``pycoll.compression.bounds``).

Importing this module loads only the standard library; numpy, pycoll, torch and mpi4py are loaded by the
methods that need them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pycoll.bench.inputs import REDOPS

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import DTypeLike
else:
    DTypeLike = Any

__all__ = [
    "COLLECTIVES",
    "MPI_OPS",
    "TORCH_OPS",
    "AllGather",
    "AllReduce",
    "BoundFn",
    "Collective",
    "ReduceScatter",
    "get_collective",
    "poison",
]

#: The bound of a compressed result's elements ``lo:hi`` given them (as the sum: avg times the world).
BoundFn = Callable[[int, int, "np.ndarray"], "np.ndarray"]


class Collective:
    """What one collective is to a benchmark (see the module doc); subclasses fill it in."""

    #: ``pycoll bench --collective`` name, pycoll's own ("allreduce", "reduce_scatter", "all_gather").
    name = ""
    #: In prose ("all-reduce").
    label = ""
    #: nccl-tests' binary that times it.
    perf = ""
    #: busbw / algbw = ``bus_numerator * (n - 1) / n``.
    bus_numerator = 1
    #: Whether it takes a reduction op (the all-gather's ``redop`` column says "none", as nccl-tests').
    reduces = True
    #: Whether its result overwrites its input (one buffer, ``x``).
    in_place = False
    #: pycoll's algorithms for it besides "auto" (a unit test keeps them in step with
    #: pycoll.algorithms.ALGORITHMS, spelled out here so that ``pycoll --help`` imports no numpy).
    algorithms: tuple[str, ...] = ()
    #: The algorithms that take a codec ("auto" resolved as ``compressed_plan`` says).
    codec_algorithms: tuple[str, ...] = ()

    @property
    def codec_plans(self) -> str:
        """The algorithms that take a codec, in prose: "direct or hierarchical (or auto)"."""
        named = [a for a in self.codec_algorithms if a != "auto"]
        return " or ".join(named) + (" (or auto)" if "auto" in self.codec_algorithms else "")

    def __repr__(self) -> str:
        return f"<collective {self.name}>"

    # ---- sizes -------------------------------------------------------------------------------------
    def bus_factor(self, world: int) -> float:
        """nccl-tests' busbw / algbw for ``world`` ranks (see the module doc)."""
        if world < 1:
            raise ValueError(f"world size must be >= 1, got {world}")
        return self.bus_numerator * (world - 1) / world

    def count(self, nbytes: int, itemsize: int, world: int) -> int:
        """Elements of a size of ``nbytes`` (the whole buffer: see the module doc)."""
        return nbytes // itemsize

    def input_count(self, count: int, world: int) -> int:
        """Elements of each rank's input ``x`` for a size of ``count`` elements."""
        return count

    def output_count(self, count: int, world: int) -> int:
        """Elements of each rank's result for a size of ``count`` elements."""
        return count

    def sent_bytes(self, count: int, world: int, encoded: Callable[[int], int]) -> float:
        """Bytes each rank must send for a size of ``count`` elements in a bandwidth-optimal plan, a chunk
        of ``m`` elements taking ``encoded(m)`` bytes (``m * itemsize``, or a codec's
        ``encoded_bytes``): bus factor x size, counted in encoded chunks."""
        chunks = self.bus_numerator * (world - 1)
        return chunks * encoded(count // world) if world > 1 else 0.0

    # ---- buffers and calls -------------------------------------------------------------------------
    def buffers(self, template: np.ndarray, count: int, world: int) -> tuple[np.ndarray, np.ndarray]:
        """(x, out) for one size: ``x`` a copy of the input ``template``, ``out`` the result's buffer
        (``x`` itself for an in-place collective), filled with ``poison`` when it is not ``x``."""
        import numpy as np

        x = template.copy()
        if self.in_place:
            return x, x
        out = np.empty(self.output_count(count, world), dtype=template.dtype)
        poison(out)
        return x, out

    def refill(self, x: np.ndarray, out: np.ndarray, template: np.ndarray) -> None:
        """Before a checked iteration: ``x`` back to the input, a separate ``out`` poisoned, so that a
        call that leaves its result alone is caught."""
        import numpy as np

        np.copyto(x, template)
        if out is not x:
            poison(out)

    def args(self, x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, ...]:
        """What a variant's callables (the call, ``before``, ``after``) are given: ``(x, out)``."""
        return (x, out)

    def check_op(self, op: str) -> None:
        """ValueError unless ``op`` is one this collective takes ("none" for the all-gather)."""
        ops = REDOPS if self.reduces else ("none",)
        if op not in ops:
            raise ValueError(f"unknown op {op!r} for {self.name}; expected one of {', '.join(ops)}")

    def compressed_plan(self, algorithm: str) -> str:
        """The plan that runs with a codec and ``algorithm`` (ValueError when none does)."""
        raise NotImplementedError

    def pycoll_call(self, op: str, algorithm: str, codec: Any = None) -> Callable[..., Any]:
        """pycoll's collective as a variant's callable (``args``)."""
        raise NotImplementedError

    def torch_call(self, op: str) -> Callable[..., Any]:
        """torch.distributed's collective on tensors ordered as ``args`` (default process group)."""
        raise NotImplementedError

    def mpi_call(self, comm: Any, op: str) -> Callable[..., Any]:
        """mpi4py's collective on ``comm``, on numpy arrays ordered as ``args``."""
        raise NotImplementedError

    # ---- inputs and results ------------------------------------------------------------------------
    def exact_input(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        """Rank ``rank``'s input for an exact check (``input_count`` elements)."""
        from pycoll.bench.inputs import exact_input

        return exact_input(op, rank, world, count, dtype)

    def exact_expected(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        """Rank ``rank``'s result of ``exact_input``, bit for bit (``output_count`` elements)."""
        raise NotImplementedError

    def codec_reference(
        self,
        codec: Any,
        plan: str,
        rank: int,
        world: int,
        count: int,
        seed: int,
        chunks: Sequence[tuple[int, int]],
    ) -> tuple[np.ndarray, BoundFn]:
        """For a compressed run on Gaussian inputs (``inputs.gaussian_input(r, input_count, seed)``): rank
        ``rank``'s exact result in float64, and the codec's derived bound (``pycoll.compression.bounds``)
        of its elements ``lo:hi`` (one of ``chunks``, which cover the result) given them, as the sum."""
        raise NotImplementedError


def poison(out: np.ndarray) -> None:
    """Fill a result buffer with what a checked result does not hold: NaN, or 0 for integer types (an
    exact integer result is 0 only where a sum or product wraps around the type)."""
    out.fill(0 if out.dtype.kind in "iub" else float("nan"))


class AllReduce(Collective):
    """All-reduce: every rank's buffer becomes the reduction of all of them, in place."""

    name = "allreduce"
    label = "all-reduce"
    perf = "all_reduce_perf"
    bus_numerator = 2
    in_place = True
    algorithms = ("ring", "tree", "direct", "hierarchical")
    codec_algorithms = ("auto", "ring", "tree", "direct", "hierarchical")

    def args(self, x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, ...]:
        return (x,)

    def compressed_plan(self, algorithm: str) -> str:
        if algorithm != "auto":
            return algorithm
        import pycoll
        from pycoll.algorithms.compressed import DEFAULT_COMPRESSED_ALGORITHM
        from pycoll.auto import auto_compressed_algorithm

        if not pycoll.is_initialized():
            return DEFAULT_COMPRESSED_ALGORITHM
        return auto_compressed_algorithm(pycoll.get_comm())

    def pycoll_call(self, op: str, algorithm: str, codec: Any = None) -> Callable[..., Any]:
        import pycoll

        def allreduce(x: np.ndarray) -> None:
            pycoll.allreduce(x, op, algorithm=algorithm, compression=codec)

        return allreduce

    def torch_call(self, op: str) -> Callable[..., Any]:
        import torch.distributed as dist

        reduce_op = _torch_op(op)

        def all_reduce(x: Any) -> None:
            dist.all_reduce(x, op=reduce_op)

        return all_reduce

    def mpi_call(self, comm: Any, op: str) -> Callable[..., Any]:
        from mpi4py import MPI

        mpi_op = _mpi_op(op)

        def allreduce(x: np.ndarray) -> None:
            comm.Allreduce(MPI.IN_PLACE, x, op=mpi_op)

        return allreduce

    def exact_expected(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        from pycoll.bench.inputs import exact_expected

        return exact_expected(op, world, count, dtype)

    def codec_reference(
        self,
        codec: Any,
        plan: str,
        rank: int,
        world: int,
        count: int,
        seed: int,
        chunks: Sequence[tuple[int, int]],
    ) -> tuple[np.ndarray, BoundFn]:
        import numpy as np

        from pycoll.bench.inputs import gaussian_input
        from pycoll.compression.bounds import SumBound

        exact = np.zeros(count)
        bounds = {lo: SumBound(codec, plan, hi - lo) for lo, hi in chunks}  # one per chunk: small temporaries
        for r in range(world):
            x = gaussian_input(r, count, seed)
            exact += x
            for lo, hi in chunks:
                bounds[lo].add(x[lo:hi])
            del x

        def bound(lo: int, hi: int, part: np.ndarray) -> np.ndarray:
            return bounds[lo].bound(part.astype(np.float32))

        return exact, bound


class ReduceScatter(Collective):
    """Reduce-scatter: rank r's ``out`` becomes chunk r of the reduction of every rank's ``x``."""

    name = "reduce_scatter"
    label = "reduce-scatter"
    perf = "reduce_scatter_perf"
    algorithms = ("ring", "direct", "hierarchical")
    codec_algorithms = ("auto", "direct", "hierarchical")

    def count(self, nbytes: int, itemsize: int, world: int) -> int:
        return nbytes // itemsize // world * world

    def output_count(self, count: int, world: int) -> int:
        return count // world

    def compressed_plan(self, algorithm: str) -> str:
        return _chunked_compressed_plan(self.name, algorithm)

    def pycoll_call(self, op: str, algorithm: str, codec: Any = None) -> Callable[..., Any]:
        import pycoll

        def reduce_scatter(x: np.ndarray, out: np.ndarray) -> None:
            pycoll.reduce_scatter(x, out, op, algorithm=algorithm, compression=codec)

        return reduce_scatter

    def torch_call(self, op: str) -> Callable[..., Any]:
        import torch.distributed as dist

        reduce_op = _torch_op(op)
        # torch 2.13 names it reduce_scatter_single (reduce_scatter_tensor is its deprecated alias).
        call = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def reduce_scatter(x: Any, out: Any) -> None:
            call(out, x, op=reduce_op)

        return reduce_scatter

    def mpi_call(self, comm: Any, op: str) -> Callable[..., Any]:
        mpi_op = _mpi_op(op)

        def reduce_scatter(x: np.ndarray, out: np.ndarray) -> None:
            comm.Reduce_scatter_block(x, out, op=mpi_op)

        return reduce_scatter

    def exact_expected(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        from pycoll.bench.inputs import exact_expected

        m = count // world
        return exact_expected(op, world, count, dtype)[rank * m : (rank + 1) * m].copy()

    def codec_reference(
        self,
        codec: Any,
        plan: str,
        rank: int,
        world: int,
        count: int,
        seed: int,
        chunks: Sequence[tuple[int, int]],
    ) -> tuple[np.ndarray, BoundFn]:
        import numpy as np

        from pycoll.bench.inputs import gaussian_input
        from pycoll.compression.bounds import reduce_scatter_bound

        # The direct plan's bound (every other rank's share quantized once) holds for the hierarchical
        # plan too: it quantizes each other host's sum once, and a block's step grows with its absmax,
        # which for a sum is at most the sum of its shares'.
        m = count // world
        inputs = [gaussian_input(r, count, seed) for r in range(world)]
        exact = np.zeros(m)
        for x in inputs:
            exact += x[rank * m : (rank + 1) * m]
        full = reduce_scatter_bound(codec, inputs, rank)
        del inputs
        return exact, lambda lo, hi, part: full[lo:hi]


class AllGather(Collective):
    """All-gather: every rank's ``out`` becomes every rank's ``x``, in rank order."""

    name = "all_gather"
    label = "all-gather"
    perf = "all_gather_perf"
    reduces = False
    algorithms = ("ring", "direct", "hierarchical")
    codec_algorithms = ("auto", "direct", "hierarchical")

    def count(self, nbytes: int, itemsize: int, world: int) -> int:
        return nbytes // itemsize // world * world

    def input_count(self, count: int, world: int) -> int:
        return count // world

    def compressed_plan(self, algorithm: str) -> str:
        return _chunked_compressed_plan(self.name, algorithm)

    def pycoll_call(self, op: str, algorithm: str, codec: Any = None) -> Callable[..., Any]:
        import pycoll

        def all_gather(x: np.ndarray, out: np.ndarray) -> None:
            pycoll.all_gather(x, out, algorithm=algorithm, compression=codec)

        return all_gather

    def torch_call(self, op: str) -> Callable[..., Any]:
        import torch.distributed as dist

        # torch 2.13 names it all_gather_single (all_gather_into_tensor is its deprecated alias).
        call = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def all_gather(x: Any, out: Any) -> None:
            call(out, x)

        return all_gather

    def mpi_call(self, comm: Any, op: str) -> Callable[..., Any]:
        def all_gather(x: np.ndarray, out: np.ndarray) -> None:
            comm.Allgather(x, out)

        return all_gather

    def exact_input(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        """``inputs.rank_input``: ``x_r[i] = r + 1 + (i % 7)`` (any values are exact: nothing is added)."""
        from pycoll.bench.inputs import rank_input

        return rank_input(rank, count // world, dtype)

    def exact_expected(self, op: str, rank: int, world: int, count: int, dtype: DTypeLike) -> np.ndarray:
        import numpy as np

        return np.concatenate([self.exact_input(op, r, world, count, dtype) for r in range(world)])

    def codec_reference(
        self,
        codec: Any,
        plan: str,
        rank: int,
        world: int,
        count: int,
        seed: int,
        chunks: Sequence[tuple[int, int]],
    ) -> tuple[np.ndarray, BoundFn]:
        import numpy as np

        from pycoll.bench.inputs import gaussian_input
        from pycoll.compression.bounds import F32_U, magnitude, quantization_bound

        m = count // world
        inputs = [gaussian_input(r, m, seed) for r in range(world)]
        exact = np.concatenate(inputs).astype(np.float64)
        # Every chunk is encoded once, by its owner, and decoded by every rank (the owner too): one
        # quantization, plus float32 rounding in the encode (a multiply by the reciprocal scale) and the
        # decode, as the all-reduce's bound has it for one rank (without it int8 left 2 of 2M Gaussian
        # elements a hair, 1e-5 relative, past half a step: those at x/step = k + 0.5).
        q = np.concatenate([quantization_bound(codec, x) for x in inputs])  # blocks start at each chunk
        size = np.concatenate([magnitude(codec, x) for x in inputs])  # |x|, or its rotated piece's sum
        full = q + 4 * F32_U * (size + q)
        return exact, lambda lo, hi, part: full[lo:hi]


def _chunked_compressed_plan(collective: str, algorithm: str) -> str:
    """A compressed reduce-scatter's or all-gather's plan: pycoll's rule (``pycoll.auto``), for the
    default communicator when there is one (auto: hierarchical on hosts of equal size for the
    reduce-scatter), else for one host."""
    import pycoll
    from pycoll.auto import compressed_algorithm
    from pycoll.errors import InvalidUsageError

    comm = pycoll.get_comm() if pycoll.is_initialized() else None
    try:
        return compressed_algorithm(collective, algorithm, comm)
    except InvalidUsageError as exc:
        raise ValueError(str(exc)) from None


#: torch.distributed's and MPI's names of the ops (MPI has no average).
TORCH_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
MPI_OPS = {"sum": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX"}


def _torch_op(op: str) -> Any:
    import torch.distributed as dist

    return getattr(dist.ReduceOp, TORCH_OPS[op])


def _mpi_op(op: str) -> Any:
    from mpi4py import MPI

    return getattr(MPI, MPI_OPS[op])


#: Every collective ``pycoll bench`` times, by name.
COLLECTIVES: dict[str, Collective] = {c.name: c for c in (AllReduce(), ReduceScatter(), AllGather())}


def get_collective(name: str | Collective) -> Collective:
    """The ``Collective`` named ``name`` (ValueError naming the choices otherwise)."""
    if isinstance(name, Collective):
        return name
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; choose one of {', '.join(COLLECTIVES)}") from None
