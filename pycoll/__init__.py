"""pycoll: collective communication (all-reduce and friends) with compression, for multi-process jobs.

    import pycoll
    pycoll.init()                      # under `pycoll run -n 4`, torchrun, mpirun or srun
    pycoll.allreduce(x)                # x: numpy array or torch CPU tensor, reduced in place

The API is loaded on first use, so ``import pycoll`` stays cheap and never fails for lack of a GPU,
a driver or NCCL (and ``import pycoll.algorithms`` works without the native module).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pycoll import _missing_native
from pycoll._version import __version__ as __version__
from pycoll.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    CommunicatorRevokedError,
    EvictedError,
    InvalidUsageError,
    NcclError,
    PeerFailedError,
    PeerLostError,
    PycollError,
)

# A missing native module (a source tree that was never built) is reported as what it is.
_missing_native.install()

# Silent by default: warnings (a dropped rendezvous connection, a watchdog abort) reach the application's
# logging configuration, or stderr through PYCOLL_DEBUG, never Python's last-resort handler.
logging.getLogger("pycoll").addHandler(logging.NullHandler())

_API = (
    "init",
    "finalize",
    "is_initialized",
    "get_comm",
    "get_rank",
    "get_world_size",
    "allreduce",
    "broadcast",
    "barrier",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "skew_report",
    "SUPPORTED_DTYPES",
    "SUPPORTED_OPS",
)

__all__ = [
    *_API,
    "Communicator",
    "Work",
    "PycollError",
    "CollectiveTimeoutError",
    "PeerLostError",
    "PeerFailedError",
    "CollectiveMismatchError",
    "InvalidUsageError",
    "NcclError",
    "CommunicatorBrokenError",
    "CommunicatorRevokedError",
    "EvictedError",
    "nccl_version",
]

if TYPE_CHECKING:
    from pycoll.api import (  # noqa: F401
        SUPPORTED_DTYPES,
        SUPPORTED_OPS,
        all_gather,
        all_to_all,
        allreduce,
        barrier,
        broadcast,
        finalize,
        get_comm,
        get_rank,
        get_world_size,
        init,
        is_initialized,
        reduce_scatter,
        skew_report,
    )
    from pycoll.comm import Communicator  # noqa: F401
    from pycoll.nccl import nccl_version  # noqa: F401
    from pycoll.work import Work  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _API:
        from pycoll import api

        value = getattr(api, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    if name == "Communicator":
        from pycoll.comm import Communicator

        return Communicator
    if name == "nccl_version":  # loads NCCL only when called
        from pycoll.nccl import nccl_version

        return nccl_version
    if name == "Work":
        from pycoll.work import Work

        return Work
    if name == "compression":  # pycoll.compression.Int8(...) after a plain `import pycoll`
        import importlib

        return importlib.import_module("pycoll.compression")
    raise AttributeError(f"module 'pycoll' has no attribute {name!r}")
