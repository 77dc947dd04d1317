"""Helpers for DDP tests on rank pools: a gloo process group per worker process (file rendezvous, no
ports) and the pycoll communicator formed from it, both made once per process and reused."""

from __future__ import annotations

import os
import tempfile
from typing import Any

_STATE: dict[str, Any] = {}


def process_group(rank: int, world: int, tag: str) -> Any:
    """Initializes torch.distributed (gloo) once per worker process and returns the pycoll communicator
    made from it with ``pycoll.torch.init_from_process_group``. ``tag`` names the rendezvous file: every
    rank of a pool must pass the same one, unique to the test session (``session_tag()`` of the test
    process), so that a file left by an earlier session is never read."""
    import torch.distributed as dist

    import pycoll.torch as pt

    if "comm" in _STATE:
        return _STATE["comm"]
    path = os.path.join(tempfile.gettempdir(), f"pycoll-ddp-{tag}-{world}")
    dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world)
    _STATE["comm"] = pt.init_from_process_group(timeout=60)
    return _STATE["comm"]


def session_tag() -> str:
    """Called in the test process: a tag unique to this pytest session."""
    return f"{os.getpid()}"
