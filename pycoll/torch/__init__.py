"""PyTorch integration: DDP communication hooks that all-reduce gradients through pycoll.

    import pycoll.torch as pt
    state = pt.HookState(compression="int8")             # error feedback, from iteration 2 on
    ddp.register_comm_hook(state, pt.allreduce_hook)

    ddp.register_comm_hook(pt.PowerSGDState(rank=4), pt.powersgd_hook)   # low-rank, with error feedback

The pycoll communicator comes from the process group DDP already uses (``init_from_process_group``,
through torch's own rendezvous store: no second rendezvous, no extra port), from ``comm=``, or from
``pycoll.init()`` if the caller made one. ``import pycoll`` never imports this module (nor torch).
"""

from __future__ import annotations

from pycoll.torch.hooks import HookState, allreduce_hook, init_from_process_group
from pycoll.torch.powersgd import PowerSGDState, powersgd_hook

__all__ = ["HookState", "PowerSGDState", "allreduce_hook", "init_from_process_group", "powersgd_hook"]
