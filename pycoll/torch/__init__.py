"""PyTorch integration: pycoll as a torch.distributed backend, and DDP communication hooks.

    import pycoll.torch                                  # registers the backend "pycoll" (cpu, cuda)
    dist.init_process_group("pycoll")                    # DDP, FSDP2, Lightning, Accelerate...
    pycoll.torch.init_process_group()                    # the same under pycoll run, mpirun, srun
    dist.init_process_group("pycoll", pg_options=pycoll.torch.Options(compression="int8"))

    import pycoll.torch as pt
    state = pt.HookState(compression="int8")             # error feedback, from iteration 2 on
    ddp.register_comm_hook(state, pt.allreduce_hook)

    ddp.register_comm_hook(pt.PowerSGDState(rank=4), pt.powersgd_hook)   # low-rank, with error feedback

The backend's communicators (one per process group) and the hooks' (``init_from_process_group``) are
formed through torch's own rendezvous store: no second rendezvous, no extra port. ``import pycoll``
never imports this module (nor torch).
"""

from __future__ import annotations

from pycoll.torch import fsdp
from pycoll.torch.backend import BACKEND_NAME, ProcessGroupPycoll, register
from pycoll.torch.hooks import HookState, allreduce_hook, init_from_process_group, skew_report
from pycoll.torch.launch import init_process_group
from pycoll.torch.options import Options
from pycoll.torch.powersgd import PowerSGDState, powersgd_hook

register()

__all__ = [
    "BACKEND_NAME",
    "HookState",
    "Options",
    "PowerSGDState",
    "ProcessGroupPycoll",
    "allreduce_hook",
    "fsdp",
    "init_from_process_group",
    "init_process_group",
    "powersgd_hook",
    "register",
    "skew_report",
]
