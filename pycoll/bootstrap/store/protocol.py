"""The store's contract: the ``Store`` interface every store satisfies, and the TCP store's wire protocol.

This module is the bottom of ``pycoll.bootstrap.store``; it imports nothing else from the package.
``server.py`` (``TCPStoreServer``) and ``client.py`` (``TCPStoreClient``) each import it and never each
other: they share only the bytes defined here (framing, message kinds, the HMAC handshake).
``adapters.py`` (``PrefixStore``, ``TorchStoreAdapter``) builds on the ``Store`` interface alone.

Wire protocol (all integers big-endian). Every message, both ways, is one *frame*::

    frame    = u32 body_length, body            (1 <= body_length <= MAX_FRAME; 1024 in the handshake)
    request  = u8 op, fields...
    reply    = u8 status, fields...             (status: OK, TIMEOUT, ERROR)
    str/blob = u32 length, bytes                (keys are UTF-8)
    keys     = u32 count, str * count
    seconds  = f64                              (negative: no deadline)

    op        request fields        OK reply fields          other replies
    HELLO     blob magic, u8 auth   blob magic, u8 auth,     ERROR str message (other protocol version)
                                    blob server_nonce
    AUTH      blob client_nonce,    blob server_proof        ERROR str message (wrong secret)
              blob client_proof
    SET       str key, blob value   -
    GET       str key, seconds      blob value               TIMEOUT
    ADD       str key, i64 amount   i64 new value            ERROR str message (value not an integer)
    WAIT      keys, seconds         -                        TIMEOUT keys (the ones still missing)
    MGET      keys, seconds         u32 count, blob * count  TIMEOUT keys (the ones still missing)
    DELETE    str key               u8 existed
    CHECK     keys                  u8 all exist

Handshake. A connection must first send HELLO (``auth`` 1: the client holds a secret, 0: it does not);
the server answers with its own ``auth`` and, when it holds a secret, a fresh 32-byte ``server_nonce``.
When the two ``auth`` values differ both sides give up (the client with a message that says which side
lacks the secret). With a secret ``k`` the client then sends AUTH with its own 32-byte nonce and
``client_proof = HMAC-SHA256(k, "pycoll-store client" || server_nonce || client_nonce || magic)``; the
server checks it (constant-time) and proves itself back with the same MAC under ``"pycoll-store
server"``, which the client checks, so neither side talks on to a peer that does not know ``k``. The
secret itself never crosses the wire. This authenticates connections; it does not encrypt them.

How the server treats connections that break these rules is described in ``server.py``. Counters
written by ``add`` are stored as ASCII decimal, as torch does, so ``get`` of a counter returns e.g.
``b"3"``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import socket
import struct
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from pycoll.errors import InvalidUsageError

__all__ = ["DEFAULT_TIMEOUT", "MAX_FRAME", "Store"]

#: Default deadline (seconds) of a store operation when neither the call nor the client gives one.
DEFAULT_TIMEOUT = 300.0
#: Largest frame either side accepts; a peer announcing more is dropped (it is not speaking our protocol).
MAX_FRAME = 256 * 1024 * 1024

# Version 2 added the authenticated handshake (HELLO carries the auth mode, then AUTH).
_MAGIC = b"pycoll-store/2"
_MAGIC_FAMILY = b"pycoll-store/"
# Frames before the handshake is complete are small: an unauthenticated peer cannot make the server
# buffer more than this.
_MAX_HANDSHAKE_FRAME = 1024
_NONCE_BYTES = 32
_AUTH_NONE = 0
_AUTH_HMAC = 1
_CLIENT_TAG = b"pycoll-store client"
_SERVER_TAG = b"pycoll-store server"

_OP_HELLO = 0
_OP_SET = 1
_OP_GET = 2
_OP_ADD = 3
_OP_WAIT = 4
_OP_DELETE = 5
_OP_CHECK = 6
_OP_AUTH = 7
_OP_MGET = 8  # every key's value at once, when all exist (a round's table of n records in one request)

_ST_OK = 0
_ST_TIMEOUT = 1
_ST_ERROR = 2

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


@runtime_checkable
class Store(Protocol):
    """What pycoll needs from a rendezvous key-value store (the shape of ``torch.distributed.Store``).

    ``timeout=None`` means the store's own default deadline; no operation waits forever.
    """

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, timeout: float | None = None) -> bytes: ...

    def add(self, key: str, amount: int) -> int: ...

    def wait(self, keys: list[str], timeout: float | None = None) -> None: ...

    def delete(self, key: str) -> bool: ...

    # Optional: ``multi_get(keys, timeout) -> list[bytes]``, every key's value once all exist (one request
    # where ``get`` would make one per key); ``get_many`` (pycoll/bootstrap/store/adapters.py) falls back to
    # ``get`` for a store without it.

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------------
# Encoding


class _ProtocolError(Exception):
    """Bytes that are not a valid message of this protocol."""


def _enc_blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _enc_str(text: str) -> bytes:
    return _enc_blob(text.encode("utf-8"))


def _enc_keys(keys: Iterable[str]) -> bytes:
    keys = list(keys)
    return _U32.pack(len(keys)) + b"".join(_enc_str(k) for k in keys)


def _frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME:
        raise InvalidUsageError(
            f"store message of {len(body)} bytes exceeds the limit of {MAX_FRAME} bytes; "
            "store large data elsewhere and put only a reference in the store"
        )
    return _U32.pack(len(body)) + body


class _Reader:
    """Sequential decoder over one frame body; any underflow or bad value raises _ProtocolError."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _take(self, n: int) -> bytes:
        end = self._pos + n
        if n < 0 or end > len(self._data):
            raise _ProtocolError("truncated message")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def u8(self) -> int:
        return int(_U8.unpack(self._take(1))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def f64(self) -> float:
        value = float(_F64.unpack(self._take(8))[0])
        if math.isnan(value):
            raise _ProtocolError("NaN deadline")
        return value

    def blob(self) -> bytes:
        return self._take(self.u32())

    def text(self) -> str:
        try:
            return self.blob().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _ProtocolError("key is not UTF-8") from exc

    def keys(self) -> list[str]:
        count = self.u32()
        if count > len(self._data):  # each key takes at least 4 bytes: cheap sanity bound
            raise _ProtocolError("key count larger than the message")
        return [self.text() for _ in range(count)]

    def end(self) -> None:
        if self._pos != len(self._data):
            raise _ProtocolError("trailing bytes after message")


def _fmt_seconds(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _check_secret(secret: bytes | str | None) -> bytes | None:
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise InvalidUsageError(
            f"the rendezvous secret must be bytes, str or None, got {type(secret).__name__}"
        )
    if not secret:
        raise InvalidUsageError("the rendezvous secret must not be empty (pass None for no secret)")
    return bytes(secret)


def _proof(secret: bytes, tag: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """HMAC-SHA256 over both nonces and the protocol magic; ``tag`` keeps the two directions apart."""
    return hmac.new(secret, tag + server_nonce + client_nonce + _MAGIC, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def _read_reply(sock: socket.socket, limit: int = MAX_FRAME) -> tuple[int, _Reader]:
    (length,) = _U32.unpack(_recv_exact(sock, 4))
    if length == 0 or length > limit:
        raise _ProtocolError(f"bad reply length {length}")
    reader = _Reader(_recv_exact(sock, length))
    status = reader.u8()
    if status not in (_ST_OK, _ST_TIMEOUT, _ST_ERROR):
        raise _ProtocolError(f"bad reply status {status}")
    return status, reader


def _as_bytes(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)
