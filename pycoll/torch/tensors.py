"""How the pycoll backend hands torch tensors to pycoll: ops, dtypes and layouts pycoll does not take.

- **Ops** (``reduce_op``): torch's ReduceOp as pycoll's op name (``sum avg min max prod``) plus a
  pre-multiplier (PREMUL_SUM: each rank scales its own tensor, then the sum), or a bitwise op
  (``band bor bxor``: integers and bool only, reduced from an all-gather in rank order).
- **Dtypes** (``lowered``): bool reduces as uint8 (SUM and MAX as MAX, i.e. logical or; MIN and PRODUCT
  as MIN, logical and); int16/uint16 in int32 and uint32 in int64 (SUM and PRODUCT wrap exactly as
  they would in the narrow type, since the result is cast back); complex as its real pairs (SUM, AVG,
  PREMUL_SUM only); anything else raises InvalidUsageError naming the dtype and the op.
- **Data movement** (broadcast, gathers, all-to-all, send/recv) is lossless and moves bytes
  (``as_bytes``): any dtype torch has travels.
- **Layouts**: a non-contiguous tensor is reduced or moved through a contiguous copy, written back after.
- **When**: the caller's thread only checks (``check_reducible``); every copy of the caller's data is
  made where the collective runs (``lowered``...), so an asynchronous op reads its inputs after the ops
  called before it have written them, as it would in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.distributed import ReduceOp

from pycoll.errors import InvalidUsageError

_RED = ReduceOp.RedOpType
_OP_NAMES = {  # keyed by the enum's int value: hashing the enum itself costs a few times more per call
    int(getattr(_RED, kind)): name
    for kind, name in [
        ("SUM", "sum"),
        ("AVG", "avg"),
        ("MIN", "min"),
        ("MAX", "max"),
        ("PRODUCT", "prod"),
        ("PREMUL_SUM", "sum"),
        ("BAND", "band"),
        ("BOR", "bor"),
        ("BXOR", "bxor"),
    ]
}
_PREMUL_SUM = int(_RED.PREMUL_SUM)  # type: ignore[attr-defined]
BITWISE = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
#: The dtypes pycoll reduces as they are.
NATIVE_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
NATIVE_DTYPES |= {torch.int32, torch.int64, torch.uint8, torch.int8}
_WIDER = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}
_BOOL_OPS = {"sum": "max", "max": "max", "min": "min", "prod": "min"}
_INTEGER = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool}
_INTEGER |= {torch.uint16, torch.uint32, torch.uint64}


def reduce_op(op: Any) -> tuple[str, Any]:
    """(pycoll op name or bitwise name, PREMUL_SUM's factor or None) of a torch ReduceOp."""
    kind = int(getattr(op, "op", op))  # a ReduceOp, or its RedOpType
    name = _OP_NAMES.get(kind)
    if name is None:
        raise InvalidUsageError(f"the pycoll backend does not reduce with {op!r}")
    return name, (op.factor if kind == _PREMUL_SUM else None)


def check_bitwise(tensor: torch.Tensor, op: str) -> None:
    if tensor.dtype not in _INTEGER:
        raise InvalidUsageError(f"ReduceOp.{op.upper()} needs an integer or bool tensor, got {tensor.dtype}")


@dataclass
class Lowered:
    """What pycoll reduces for a tensor: ``work`` (the tensor itself or a contiguous / wider copy), the
    op to use on it, and ``back``, which writes ``work`` into the caller's tensor (None: it is the tensor)."""

    work: torch.Tensor
    op: str
    back: Callable[[], Any] | None


def check_reducible(tensor: torch.Tensor, op: str) -> None:
    """Raises InvalidUsageError now if ``lowered`` could not make ``tensor`` reducible with ``op``."""
    dtype = tensor.dtype
    if dtype in NATIVE_DTYPES or dtype in _WIDER:
        return
    if (dtype == torch.bool and op in _BOOL_OPS) or (dtype == torch.uint64 and op in ("sum", "prod")):
        return
    if dtype.is_complex and op in ("sum", "avg"):
        return
    raise InvalidUsageError(
        f"the pycoll backend cannot reduce a {dtype} tensor with op {op!r} (it reduces float32/64, "
        "float16, bfloat16 and int8-64/uint8-64 tensors; bool with SUM, MIN, MAX, PRODUCT; complex sums)"
    )


def lowered(tensor: torch.Tensor, op: str) -> Lowered:
    """``tensor`` made reducible by pycoll with ``op`` (one of pycoll's names; see the module docstring).
    Copies the tensor where it must, so it runs where the collective does, in call order."""
    dtype = tensor.dtype
    if dtype in NATIVE_DTYPES and tensor.is_contiguous():
        return Lowered(tensor, op, None)  # the common case, first
    check_reducible(tensor, op)
    if dtype in _WIDER:
        wide = tensor.to(_WIDER[dtype])
        return _through(tensor, wide, wide, op)
    base = tensor if tensor.is_contiguous() else tensor.contiguous()
    if dtype == torch.bool:
        return _through(tensor, base, base.view(torch.uint8), _BOOL_OPS[op])
    if dtype == torch.uint64:
        return _through(tensor, base, base.view(torch.int64), op)
    if dtype.is_complex:
        return _through(tensor, base, torch.view_as_real(base), op)
    return _through(tensor, base, base, op)


def _through(tensor: torch.Tensor, base: torch.Tensor, work: torch.Tensor, op: str) -> Lowered:
    """``work`` (a view of ``base``) reduced with ``op``; ``base`` copied into ``tensor`` after, unless it
    is the tensor itself (``copy_`` casts a wider copy back, wrapping as the narrow type would)."""
    return Lowered(work, op, None if base is tensor else (lambda: tensor.copy_(base)))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's memory (any dtype; empty for no elements)."""
    if tensor.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return tensor.reshape(-1).view(torch.uint8)


def contiguous_for_write(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], Any] | None]:
    """``tensor`` itself when contiguous, else a contiguous copy and the function writing it back."""
    if tensor.is_contiguous():
        return tensor, None
    work = tensor.contiguous()
    return work, lambda: tensor.copy_(work)
