"""The rendezvous key-value store (shaped like ``torch.distributed.Store``)."""

from pycoll.bootstrap.store.server import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_PENDING_OUTPUT,
    DEFAULT_TIMEOUT,
    MAX_FRAME,
    PrefixStore,
    Store,
    TCPStoreClient,
    TCPStoreServer,
    TorchStoreAdapter,
)

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_MAX_PENDING_OUTPUT",
    "DEFAULT_TIMEOUT",
    "MAX_FRAME",
    "PrefixStore",
    "Store",
    "TCPStoreClient",
    "TCPStoreServer",
    "TorchStoreAdapter",
]
