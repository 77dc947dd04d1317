"""pycoll's error types. Each one says what happened and what the caller can do about it.

The native module raises these same classes (csrc/python/module.cc maps its C++ exceptions here).
"""

from __future__ import annotations


class PycollError(RuntimeError):
    """Base class of every error pycoll raises on purpose."""


class CollectiveTimeoutError(PycollError):
    """A collective did not complete before its deadline. The message names the collective and the
    ranks that were not heard from."""


class PeerLostError(PycollError):
    """A peer process died (or its connection broke) while this rank depended on it."""

    def __init__(self, message: str, rank: int = -1) -> None:
        super().__init__(message)
        self.rank = rank


class CollectiveMismatchError(PycollError):
    """Ranks called the same collective with different arguments (count, dtype, op, algorithm...)."""


class InvalidUsageError(PycollError, ValueError):
    """The call itself is wrong (bad tensor, dtype, op, device...); nothing was sent."""


class NcclError(PycollError):
    """NCCL reported an error; the message carries NCCL's own text and the rank."""


class CommunicatorBrokenError(PycollError):
    """An earlier collective on this communicator failed; it cannot be used any more."""


__all__ = [
    "PycollError",
    "CollectiveTimeoutError",
    "PeerLostError",
    "CollectiveMismatchError",
    "InvalidUsageError",
    "NcclError",
    "CommunicatorBrokenError",
]
