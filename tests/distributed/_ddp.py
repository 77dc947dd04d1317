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
    # A pool replaced by a fresh one (the pool cache keeps two alive) must not meet in the file of the
    # pool before it, whose ranks are gone: rank 0 draws a name and the pool's own communicator (the
    # default one in a worker) hands it to the others.
    import numpy as np

    import pycoll

    token = np.frombuffer(os.urandom(8), dtype=np.uint8).copy() if rank == 0 else np.zeros(8, np.uint8)
    pycoll.broadcast(token, 0, timeout=30)
    path = os.path.join(tempfile.gettempdir(), f"pycoll-ddp-{tag}-{world}-{token.tobytes().hex()}")
    dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world)
    _STATE["comm"] = pt.init_from_process_group(timeout=60)
    return _STATE["comm"]


def session_tag() -> str:
    """Called in the test process: a tag unique to this pytest session."""
    return f"{os.getpid()}"
