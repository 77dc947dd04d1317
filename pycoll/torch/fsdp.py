"""FSDP2 with error feedback that applies: a reduce-scatter per FSDP module that keeps its own residual.

    model = ...                                        # fully_shard(...) applied, on a "pycoll" group
    pycoll.torch.fsdp.keep_error_feedback(model)       # every FSDPModule in it

FSDP2 reduce-scatters each module's gradients from a buffer it allocates for that call and frees after
it, so the backend's residuals, which belong to a tensor's storage (pycoll.torch.options), start from
zeros every step: compression applies but error feedback does nothing. FSDP2 lets a module's
reduce-scatter be replaced (``FSDPModule.set_custom_reduce_scatter``); ``keep_error_feedback`` gives
every FSDP module of ``model`` a ``ReduceScatter`` whose residual belongs to it instead, so what
compression lost in one step's gradients is added to the next step's.

Memory: a reduce-scatter's residual has the size of its input, the module's unsharded gradients in
float32, one per FSDP module: about the model's full gradients in float32 on every rank, which is what
error feedback for a reduce-scatter costs (each rank carries what it lost on every chunk it sent), and
which FSDP otherwise frees. It counts against ``Options.max_residuals`` like the others. On groups whose
backend is not pycoll's, or without a codec, the reduce-scatter is FSDP2's default one.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from pycoll.errors import InvalidUsageError
from pycoll.torch.backend import ProcessGroupPycoll

__all__ = ["ReduceScatter", "keep_error_feedback"]


class ReduceScatter:
    """FSDP2's reduce-scatter primitive (``allocate`` and the call, as ``set_custom_reduce_scatter`` takes
    them) whose error-feedback residual belongs to this object, so to the one FSDP module it is set on."""

    def allocate(self, size: Sequence[Any], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        backend = _pycoll_backend(group, input_tensor.device)
        if backend is None:
            return dist.reduce_scatter_tensor(
                output_tensor, input_tensor, op=op, group=group, async_op=async_op
            )
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = op
        opts.asyncOp = async_op
        return backend.reduce_scatter_owned(output_tensor, input_tensor, opts, self)


def _pycoll_backend(group: dist.ProcessGroup, device: torch.device) -> ProcessGroupPycoll | None:
    """The pycoll backend of ``group`` on ``device`` (a "pycoll" group is its own backend), or None."""
    if isinstance(group, ProcessGroupPycoll):
        return group
    try:
        backend = group._get_backend(device)
    except RuntimeError:  # no backend of that device
        return None
    return backend if isinstance(backend, ProcessGroupPycoll) else None


def keep_error_feedback(model: torch.nn.Module) -> int:
    """Gives every FSDP module of ``model`` (``model`` included) a ``ReduceScatter`` of its own; returns
    how many modules got one."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise InvalidUsageError("keep_error_feedback needs a model that fully_shard was applied to")
    for m in modules:
        m.set_custom_reduce_scatter(ReduceScatter())  # type: ignore[arg-type]
    return len(modules)
