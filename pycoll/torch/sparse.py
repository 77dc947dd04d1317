"""All-reduce of sparse COO tensors in the pycoll backend, as gloo does it: SUM only, no codec.

The parts, by the names used below:

- **header**: each rank's number of stored elements (``nnz``) and a digest of its layout (sparse and dense
  dimensions, size, dtype), gathered first: a rank whose layout differs raises CollectiveMismatchError on
  every rank, naming the ranks.
- **padded gather**: every rank's indices (``sparse_dim x nnz`` int64) and values (``nnz x dense``) gathered
  in two all-gathers, each rank's part padded to the largest ``nnz``.
- **sum**: the parts concatenated in rank order and coalesced (duplicate indices summed), on every rank
  alike, so every rank holds the same bits (the sum in rank order, as gloo's); the caller's tensor
  becomes the result (coalesced).

No codec compresses it: sparse gradients (embedding rows) are usually few, and their indices exact.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch

from pycoll.errors import CollectiveMismatchError, InvalidUsageError

#: every rank's contiguous bytes of a tensor, as a (world, nbytes) uint8 tensor (the backend's all-gather)
Gather = Callable[[torch.Tensor], torch.Tensor]


def _layout(t: torch.Tensor) -> str:
    return f"{t.dtype}, size {tuple(t.shape)}, {t.sparse_dim()} sparse and {t.dense_dim()} dense dimensions"


def _digest(layout: str) -> int:
    return int.from_bytes(hashlib.sha256(layout.encode()).digest()[:7], "little")


def _gathered(gather: Gather, part: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's ``part`` (one shape on every rank), stacked: (world, *part.shape)."""
    if part.numel() == 0:  # (a zero-size dense dimension: nothing to move, and no bytes to view)
        return part.new_empty((world, *part.shape))
    return gather(part.contiguous().reshape(-1)).view(part.dtype).reshape(world, *part.shape)


def check_sparse(op: str) -> None:
    if op != "sum":
        raise InvalidUsageError(
            f"the pycoll backend all-reduces sparse tensors with SUM only (as gloo), got {op!r}"
        )


def sparse_allreduce(tensor: torch.Tensor, gather: Gather, rank: int) -> None:
    """Sums every rank's sparse COO ``tensor`` into it, on every rank (module docstring)."""
    mine = tensor.coalesce()
    layout = _layout(mine)
    header = torch.tensor([mine._nnz(), _digest(layout)], dtype=torch.int64, device=tensor.device)
    headers = _gathered(gather, header, -1).cpu()
    counts = [int(n) for n in headers[:, 0]]
    others = [r for r, d in enumerate(headers[:, 1].tolist()) if d != int(header[1])]
    if others:
        raise CollectiveMismatchError(
            f"sparse all_reduce: rank {rank} holds a {layout}, but ranks {others} hold another layout "
            "(every rank's sparse tensor needs the same dtype, size and dimensions)"
        )
    most = max(counts)
    if most == 0:
        tensor.copy_(mine)
        return
    indices = torch.zeros((mine.sparse_dim(), most), dtype=torch.int64, device=tensor.device)
    values = torch.zeros((most, *mine.shape[mine.sparse_dim() :]), dtype=mine.dtype, device=tensor.device)
    indices[:, : counts[rank]] = mine._indices()
    values[: counts[rank]] = mine._values()
    all_indices = _gathered(gather, indices.t().contiguous(), len(counts))
    all_values = _gathered(gather, values, len(counts))
    summed = torch.sparse_coo_tensor(
        torch.cat([all_indices[r, :n] for r, n in enumerate(counts)]).t(),
        torch.cat([all_values[r, :n] for r, n in enumerate(counts)]),
        mine.shape,
    ).coalesce()
    tensor.copy_(summed)
