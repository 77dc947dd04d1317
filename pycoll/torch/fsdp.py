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
which FSDP otherwise frees. Each counts against the group's ``Options.max_residuals`` like the others:
a reduce-scatter refuses to run when the group keeps fewer residuals than there are modules (they would
evict each other every step and error feedback would silently do nothing). On a pycoll group without
a codec the reduce-scatter is pycoll's plain one (no residual); on other backends, FSDP2's default one.

A residual belongs to the module and the size of its reduce-scatter. A module whose parameters with
gradients change from step to step gets a residual per size; if two such sets have the same size, they
share one, and what one lost is added to the other's gradients.
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
    them) whose error-feedback residual belongs to this object, so to the one FSDP module it is set on.
    ``modules``: how many modules of the model got one (checked against the group's ``max_residuals``)."""

    def __init__(self, modules: int = 1) -> None:
        self.modules = modules

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
        limit = backend._residuals.limit
        if self.modules > limit:
            raise InvalidUsageError(
                f"keep_error_feedback gave {self.modules} FSDP modules a residual each, but the group "
                f"keeps at most max_residuals={limit}; give pycoll.torch.Options(max_residuals="
                f"{self.modules}) or more"
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
    how many modules got one (those holding no parameters of their own never reduce-scatter)."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise InvalidUsageError("keep_error_feedback needs a model that fully_shard was applied to")
    for m in modules:
        m.set_custom_reduce_scatter(ReduceScatter(len(modules)))  # type: ignore[arg-type]
    return len(modules)
