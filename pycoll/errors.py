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


class PeerFailedError(PeerLostError):
    """A peer's own set-up (``pycoll.init``, rendezvous) failed, and it said so through the rendezvous
    store, while this rank waited for it. ``.rank`` is that peer; ``.error_type`` and ``.error_message``
    are its error's class name and text, which the message also gives."""

    def __init__(self, message: str, rank: int = -1, error_type: str = "", error_message: str = "") -> None:
        super().__init__(message, rank)
        self.error_type = error_type
        self.error_message = error_message


class CollectiveMismatchError(PycollError):
    """Ranks called the same collective with different arguments (count, dtype, op, algorithm...)."""


class InvalidUsageError(PycollError, ValueError):
    """The call itself is wrong (bad tensor, dtype, op, device...); nothing was sent."""


class NcclError(PycollError):
    """NCCL reported an error; the message carries NCCL's own text and the rank."""


class CommunicatorBrokenError(PycollError):
    """An earlier collective on this communicator failed; it cannot be used any more."""


class CommunicatorRevokedError(CommunicatorBrokenError):
    """The communicator was revoked (``comm.revoke()`` on some rank, or a lost peer): every pending and
    later collective raises this. ``comm.shrink()`` makes a new communicator of the ranks still alive."""


class EvictedError(CommunicatorRevokedError):
    """The other ranks went on without this one (they found it dead: killed, stopped or cut off for longer
    than the heartbeat timeout). It cannot rejoin that communicator; a new process may join the job."""


def ranks_text(ranks: list[int], limit: int = 32) -> str:
    """Ranks as an error message names them: "1, 5, 9", the first ``limit`` and how many in all past them."""
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f", ... ({len(ranks)} in all)" if len(ranks) > limit else "")


__all__ = [
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
]
