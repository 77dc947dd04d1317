"""The rendezvous key-value store, shaped like ``torch.distributed.Store``; one concern per module.

- ``protocol.py``: the ``Store`` interface, and the TCP store's wire protocol (framing, message kinds,
  the HMAC handshake, ``DEFAULT_TIMEOUT`` and ``MAX_FRAME``). Imports nothing else from here.
- ``server.py``: ``TCPStoreServer``, the store served from one thread with a ``selectors`` loop.
- ``client.py``: ``TCPStoreClient``: connecting with retries, per-request deadlines, pycoll's errors.
- ``adapters.py``: ``PrefixStore`` and ``TorchStoreAdapter``, stores over other stores.

Imports go one way: ``protocol`` <- ``server``, ``protocol`` <- ``client``, ``protocol`` <- ``adapters``;
server and client meet only on the wire. Rendezvous (``pycoll/bootstrap/rendezvous.py``) hosts a server
on rank 0, connects a client on every rank and wraps it in adapters. Import the names from this package
(``pycoll.bootstrap.store``) or from ``pycoll.bootstrap``; the modules are its parts.
"""

from pycoll.bootstrap.store.adapters import PrefixStore, TorchStoreAdapter
from pycoll.bootstrap.store.client import TCPStoreClient
from pycoll.bootstrap.store.protocol import DEFAULT_TIMEOUT, MAX_FRAME, Store
from pycoll.bootstrap.store.server import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_PENDING_OUTPUT,
    TCPStoreServer,
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
