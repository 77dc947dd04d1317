"""``TCPStoreClient``: the client of a ``TCPStoreServer`` (connecting with retries, deadlines, errors).

It speaks the wire protocol of ``protocol.py`` and imports only that module of the package (never the
server: the two meet only on the wire). It turns what comes back into pycoll's errors: a deadline
passed on the server becomes CollectiveTimeoutError naming the missing keys, a server that stops
answering CollectiveTimeoutError, a closed connection PeerLostError, a secret mismatch
InvalidUsageError (not retried).
"""

from __future__ import annotations

import hmac
import math
import random
import secrets
import socket
import threading
import time

from pycoll.bootstrap.store.protocol import (
    _AUTH_HMAC,
    _AUTH_NONE,
    _CLIENT_TAG,
    _F64,
    _I64,
    _MAGIC,
    _MAX_HANDSHAKE_FRAME,
    _NONCE_BYTES,
    _OP_ADD,
    _OP_AUTH,
    _OP_CHECK,
    _OP_DELETE,
    _OP_GET,
    _OP_HELLO,
    _OP_MGET,
    _OP_SET,
    _OP_WAIT,
    _SERVER_TAG,
    _ST_ERROR,
    _ST_OK,
    _ST_TIMEOUT,
    _U8,
    DEFAULT_TIMEOUT,
    _as_bytes,
    _check_secret,
    _enc_blob,
    _enc_keys,
    _enc_str,
    _fmt_seconds,
    _frame,
    _proof,
    _ProtocolError,
    _read_reply,
    _Reader,
)
from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, PeerLostError

__all__ = ["TCPStoreClient"]

# How much longer than the server-side deadline a client waits for the reply before it gives up on the
# server itself (a wedged host, a black-holed network).
_REPLY_GRACE = 10.0
# Retries of a connection the server refused (it is not listening yet: rank 0 starts it as the others
# start too): the first after a few milliseconds, then doubling, with jitter, up to a quarter second, so
# that a rank is connected soon after the server is up (a cap of a second made a 16-rank pycoll.init take
# half a second more than the server needed) without every rank of a large job knocking 100 times a second.
_FIRST_RETRY_S = 0.005
_MAX_RETRY_S = 0.25


class TCPStoreClient:
    """Client of a ``TCPStoreServer``.

    The constructor connects, retrying with exponential backoff until ``connect_timeout`` (default:
    ``timeout``) has passed, so clients may start before the server. ``timeout`` is the default
    deadline of every operation. One client may be shared by threads; its requests are serialized
    (a blocking ``get`` holds the connection until it returns).

    ``secret`` must match the server's (both None, or the same bytes): the client proves it holds the
    secret and checks that the server does too. A mismatch raises InvalidUsageError at once (it is
    not retried).
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        connect_timeout: float | None = None,
        secret: bytes | None = None,
    ) -> None:
        if timeout < 0:
            raise InvalidUsageError(f"store timeout must be >= 0 seconds, got {timeout}")
        self._secret = _check_secret(secret)
        self.host = host
        self.port = int(port)
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._lost = False
        self._closed = False
        self._connect(self.timeout if connect_timeout is None else connect_timeout)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- public API -----------------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        self._request(bytes([_OP_SET]) + _enc_str(key) + _enc_blob(_as_bytes(value)), key)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        seconds = self._timeout(timeout)
        start = time.monotonic()
        status, reply = self._request(
            bytes([_OP_GET]) + _enc_str(key) + _F64.pack(seconds), key, wait=seconds
        )
        if status == _ST_TIMEOUT:
            raise self._timeout_error([key], time.monotonic() - start)
        value = reply.blob()
        reply.end()
        return value

    def add(self, key: str, amount: int) -> int:
        status, reply = self._request(bytes([_OP_ADD]) + _enc_str(key) + _I64.pack(int(amount)), key)
        if status == _ST_ERROR:
            raise InvalidUsageError(
                f"store add({key!r}): {reply.text()} (at {self.address}); add() needs a counter key"
            )
        return reply.i64()

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        keys = list(keys)
        seconds = self._timeout(timeout)
        start = time.monotonic()
        status, reply = self._request(
            bytes([_OP_WAIT]) + _enc_keys(keys) + _F64.pack(seconds), ", ".join(keys), wait=seconds
        )
        if status == _ST_TIMEOUT:
            raise self._timeout_error(reply.keys(), time.monotonic() - start)

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        """Every key's value, in order, once all of them exist: one request where ``get`` makes one per
        key. CollectiveTimeoutError (naming the keys still missing) after ``timeout``."""
        keys = list(keys)
        seconds = self._timeout(timeout)
        start = time.monotonic()
        status, reply = self._request(
            bytes([_OP_MGET]) + _enc_keys(keys) + _F64.pack(seconds), ", ".join(keys[:4]), wait=seconds
        )
        if status == _ST_TIMEOUT:
            raise self._timeout_error(reply.keys(), time.monotonic() - start)
        values = [reply.blob() for _ in range(reply.u32())]
        reply.end()
        return values

    def check(self, keys: list[str]) -> bool:
        """True if every key exists now (never blocks)."""
        _, reply = self._request(bytes([_OP_CHECK]) + _enc_keys(keys), ", ".join(keys))
        return bool(reply.u8())

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""
        _, reply = self._request(bytes([_OP_DELETE]) + _enc_str(key), key)
        return bool(reply.u8())

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._disconnect()

    def __enter__(self) -> TCPStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TCPStoreClient({self.address!r}, timeout={self.timeout})"

    # -- internals ------------------------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        seconds = self.timeout if timeout is None else float(timeout)
        if not seconds >= 0 or math.isinf(seconds):
            raise InvalidUsageError(f"store timeout must be a finite number of seconds >= 0, got {timeout}")
        return seconds

    def _timeout_error(self, keys: list[str], waited: float) -> CollectiveTimeoutError:
        what = f"key {keys[0]!r}" if len(keys) == 1 else f"keys {keys!r}"
        return CollectiveTimeoutError(
            f"timed out after {_fmt_seconds(waited)} waiting for {what} in the rendezvous store at "
            f"{self.address} (a rank that should set it has not done so: is it still running?)"
        )

    def _lost_error(self, detail: str) -> PeerLostError:
        return PeerLostError(
            f"rendezvous store at {self.address} closed the connection ({detail}); "
            "the process hosting it (rank 0 or the launcher) has probably exited",
            rank=0,
        )

    def _connect(self, connect_timeout: float) -> None:
        start = time.monotonic()
        deadline = start + max(0.0, connect_timeout)
        delay = _FIRST_RETRY_S
        attempts = 0
        last_error = "no attempt made"
        while True:
            attempts += 1
            remaining = deadline - time.monotonic()
            sock: socket.socket | None = None
            try:
                sock = socket.create_connection(
                    (self.host, self.port), timeout=max(0.05, min(remaining, 5.0))
                )
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(0.05, min(deadline - time.monotonic(), 10.0)))
                self._handshake(sock)
                sock.settimeout(None)
                self._sock = sock
                return
            except (OSError, _ProtocolError, EOFError) as exc:
                if sock is not None:
                    sock.close()
                if isinstance(exc, (_ProtocolError, EOFError)):
                    last_error = "the server there did not answer as a pycoll store"
                else:
                    last_error = f"{type(exc).__name__}: {exc}"
            except BaseException:  # a secret mismatch (InvalidUsageError): retrying cannot help
                if sock is not None:
                    sock.close()
                raise
            now = time.monotonic()
            if now >= deadline:
                raise CollectiveTimeoutError(
                    f"could not connect to the rendezvous store at {self.address} within "
                    f"{_fmt_seconds(now - start)} ({attempts} attempts; last error: {last_error}); "
                    "check that rank 0 (or the launcher) is running and that MASTER_ADDR/MASTER_PORT "
                    "point to it"
                )
            time.sleep(min(delay * random.uniform(0.5, 1.0), deadline - now))
            delay = min(delay * 2, _MAX_RETRY_S)

    def _handshake(self, sock: socket.socket) -> None:
        """HELLO, then (with a secret) AUTH; see the module docstring."""
        secret = self._secret
        mode = _AUTH_NONE if secret is None else _AUTH_HMAC
        sock.sendall(_frame(bytes([_OP_HELLO]) + _enc_blob(_MAGIC) + _U8.pack(mode)))
        status, reply = _read_reply(sock, _MAX_HANDSHAKE_FRAME)
        if status == _ST_ERROR:
            raise InvalidUsageError(
                f"the rendezvous store at {self.address} refused this client: {reply.text()}"
            )
        if status != _ST_OK or reply.blob() != _MAGIC:
            raise _ProtocolError("unexpected handshake reply")
        theirs, server_nonce = reply.u8(), reply.blob()
        reply.end()
        if theirs == _AUTH_HMAC and mode == _AUTH_NONE:
            raise InvalidUsageError(
                f"the rendezvous store at {self.address} requires a rendezvous secret, but this process has "
                "none: set PYCOLL_SECRET to the job's secret (the same on every rank and on the launcher)"
            )
        if theirs == _AUTH_NONE and mode == _AUTH_HMAC:
            raise InvalidUsageError(
                f"this process has a rendezvous secret (PYCOLL_SECRET) but the rendezvous store at "
                f"{self.address} has none: set the same PYCOLL_SECRET where the store runs (rank 0 or the "
                "launcher), or unset it here"
            )
        if theirs != mode:
            raise _ProtocolError(f"unknown authentication mode {theirs}")
        if secret is None:
            return
        if len(server_nonce) != _NONCE_BYTES:
            raise _ProtocolError("bad server nonce")
        client_nonce = secrets.token_bytes(_NONCE_BYTES)
        proof = _proof(secret, _CLIENT_TAG, server_nonce, client_nonce)
        sock.sendall(_frame(bytes([_OP_AUTH]) + _enc_blob(client_nonce) + _enc_blob(proof)))
        status, reply = _read_reply(sock, _MAX_HANDSHAKE_FRAME)
        hint = "PYCOLL_SECRET must be the same on every rank and on the process hosting the store"
        if status == _ST_ERROR:
            raise InvalidUsageError(
                f"the rendezvous store at {self.address} refused this client: the rendezvous secret did "
                f"not match ({hint})"
            )
        if status != _ST_OK:
            raise _ProtocolError("unexpected handshake reply")
        server_proof = reply.blob()
        reply.end()
        if not hmac.compare_digest(server_proof, _proof(secret, _SERVER_TAG, server_nonce, client_nonce)):
            raise InvalidUsageError(
                f"the rendezvous store at {self.address} could not prove it holds the rendezvous secret: "
                f"the rendezvous secret did not match, or another program is listening there ({hint})"
            )

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _request(self, body: bytes, what: str, wait: float | None = None) -> tuple[int, _Reader]:
        frame = _frame(body)
        with self._lock:
            if self._closed:
                raise InvalidUsageError(f"the store client for {self.address} is closed")
            if self._lost:
                raise self._lost_error("seen by an earlier request")
            if self._sock is None:
                # A previous request timed out on the client side; its late reply would desync the
                # stream, so that socket was dropped. Start a fresh connection.
                self._connect(self.timeout)
            sock = self._sock
            assert sock is not None
            io_timeout = (wait if wait is not None else self.timeout) + _REPLY_GRACE
            sock.settimeout(io_timeout)
            try:
                sock.sendall(frame)
                status, reply = _read_reply(sock)
            except (TimeoutError, socket.timeout):
                self._disconnect()
                raise CollectiveTimeoutError(
                    f"the rendezvous store at {self.address} did not answer within "
                    f"{_fmt_seconds(io_timeout)} (request for {what!r}); the host may be overloaded "
                    "or the network broken"
                ) from None
            except (EOFError, ConnectionError, OSError) as exc:
                self._disconnect()
                self._lost = True
                detail = "end of stream" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
                raise self._lost_error(detail) from None
            except _ProtocolError as exc:
                self._disconnect()
                raise PeerLostError(
                    f"rendezvous store at {self.address} sent a malformed reply ({exc})", rank=0
                ) from None
            except BaseException:
                # Interrupted mid-request (KeyboardInterrupt): its reply may still come and would be read
                # as the answer to the next request. Drop the connection; the next request reconnects.
                self._disconnect()
                raise
            return status, reply
