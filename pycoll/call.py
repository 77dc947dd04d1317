"""One collective call as a value: what ``pycoll.api`` validated, and what the dispatcher
(``pycoll.dispatch``) runs. Built once per call, in ``pycoll.api``; nothing below it re-checks the caller's
arguments.

The one home of what may be compressed (``compression_refusal``): ``pycoll.api`` refuses a codec the rule
refuses, ``pycoll.auto`` picks none there, and the native side, handed only what passed, checks nothing
of it again.
"""

from __future__ import annotations

from typing import Any

from pycoll.arrays import Buffer
from pycoll.codes import KIND_CODES
from pycoll.compression.codecs import CODEC_DTYPES, Codec

#: The element types a codec compresses (its messages are float32 sums; float16 and bfloat16 are widened
#: first and rounded back once at the end): the codecs' own rule.
COMPRESSIBLE_DTYPES = CODEC_DTYPES
#: The operators a codec compresses: a sum of decoded messages is a sum, not a min or a product.
COMPRESSIBLE_OPS = ("sum", "avg")
#: The collectives a codec compresses (their plans: pycoll/algorithms/compressed.py).
COMPRESSIBLE_COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "all_to_all")


def compression_refusal(collective: str, dtype: str, op: str) -> str | None:
    """Why a codec may not compress ``collective`` on ``dtype`` data with ``op``; None where it may."""
    if collective not in COMPRESSIBLE_COLLECTIVES:
        return f"compresses {', '.join(COMPRESSIBLE_COLLECTIVES)} only, not {collective}"
    if dtype not in COMPRESSIBLE_DTYPES:
        return (
            f"needs {', '.join(COMPRESSIBLE_DTYPES)} data, got {dtype}; "
            "integers and float64 are reduced without compression"
        )
    if op.lower() not in COMPRESSIBLE_OPS:
        return f"supports op {' or '.join(repr(o) for o in COMPRESSIBLE_OPS)}, got {op!r}"
    return None


def gpu_codec_refusal(kind: str) -> str | None:
    """Why a codec of ``kind`` cannot compress GPU memory (a user codec is CPU code); None where it can."""
    if kind in KIND_CODES and kind != "user":
        return None
    return "is a user codec, which runs on CPUs only; on GPUs use fp16, bf16, int8 or int4"


class Call:
    """One validated collective (a plain class with slots: it is made on every call).

    ``count``: the elements per rank as the native side counts them (``out``'s for reduce-scatter, ``x``'s
    for all-gather); ``op``: the RedOp code, ``op_name`` what the caller wrote; ``algorithm``: the plan's
    algorithm (``auto`` already decided), or ``nccl``; ``codec`` / ``residual``: compression and its
    error-feedback state; ``timeout``: seconds, None for the communicator's; ``result``: what the call
    returns (or its Work holds); ``report``: False for the library's own collectives, which the skew
    report leaves out; ``exact_own``: a compressed all-gather keeps this rank's own chunk exact;
    ``splits``: an uneven all-to-all's (send counts, receive counts), this rank's (``count`` is then 0;
    an even one has no splits and ``count`` elements per part).
    """

    __slots__ = (
        "collective",
        "algorithm",
        "inp",
        "out",
        "count",
        "op",
        "op_name",
        "root",
        "codec",
        "residual",
        "timeout",
        "async_op",
        "result",
        "report",
        "exact_own",
        "splits",
    )

    def __init__(
        self,
        collective: str,
        algorithm: str,
        inp: Buffer,
        out: Buffer,
        count: int,
        *,
        op: int = 0,
        op_name: str = "sum",
        root: int = 0,
        codec: Codec | None = None,
        residual: Buffer | None = None,
        timeout: float | None = None,
        async_op: bool = False,
        result: Any = None,
        report: bool = True,
        exact_own: bool = False,
        splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> None:
        self.collective = collective
        self.algorithm = algorithm
        self.inp = inp
        self.out = out
        self.count = count
        self.op = op
        self.op_name = op_name
        self.root = root
        self.codec = codec
        self.residual = residual
        self.timeout = timeout
        self.async_op = async_op
        self.result = result
        self.report = report
        self.exact_own = exact_own
        self.splits = splits

    @property
    def on_gpu(self) -> bool:
        return self.inp.on_gpu

    @property
    def agreed_count(self) -> int:
        """The count every rank's descriptor carries (and must agree on): ``count``, but 0 for an all-to-all,
        whose ranks send and receive parts of their own sizes (each part's size is checked as its message
        arrives instead)."""
        return 0 if self.collective == "all_to_all" else self.count

    def describe(self) -> str:
        """e.g. "allreduce(1000 x float32, sum, ring, Int8(block=64))", for Work and errors."""
        if self.splits is not None:
            parts = [f"send {list(self.splits[0])}, receive {list(self.splits[1])} x {self.inp.dtype}"]
        elif self.collective == "all_to_all":
            parts = [f"{self.count} x {self.inp.dtype} per rank"]
        else:
            parts = [f"{self.count} x {self.inp.dtype}"]
        if self.collective in ("allreduce", "reduce_scatter"):
            parts.append(self.op_name)
        if self.collective == "broadcast":
            parts.append(f"root={self.root}")
        elif self.collective != "barrier":
            parts.append(self.algorithm)
        if self.codec is not None:
            parts.append(repr(self.codec))
        return f"{self.collective}({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"<pycoll.Call {self.describe()}>"


def codec_parts(call: Call, world: int) -> tuple[list[int], list[int]]:
    """The parts of ``call``'s INPUT and OUTPUT (element counts, one after another) whose codec blocks start
    at their first element, as its compressed plan cuts them (pycoll/algorithms/compressed.py): an
    all-reduce's buffer; a reduce-scatter's and an all-gather's chunks; an all-to-all's parts. Where a
    codec's rotation applies (csrc/kernels/rotation.h)."""
    count, collective = call.count, call.collective
    if collective == "reduce_scatter":
        return [count] * world, [count]
    if collective == "all_gather":
        return [count], [count] * world
    if collective == "all_to_all":
        if call.splits is not None:
            return list(call.splits[0]), list(call.splits[1])
        return [count] * world, [count] * world
    return [count], [count]


def exact_part(call: Call, rank: int) -> tuple[int, int, int] | None:
    """(input offset, output offset, count) of the elements ``call`` must leave bit for bit as this rank's
    input holds them: an all-to-all's own part, a compressed all-gather's own chunk with ``exact_own``;
    None for the others. (A codec's rotation would otherwise round them, rotating there and back.)"""
    if call.collective == "all_gather" and call.exact_own:
        return 0, rank * call.count, call.count
    if call.collective == "all_to_all":
        if call.splits is None:
            return rank * call.count, rank * call.count, call.count
        send, recv = call.splits
        return sum(send[:rank]), sum(recv[:rank]), send[rank]
    return None
