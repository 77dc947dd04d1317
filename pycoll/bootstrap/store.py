"""Key-value stores for rendezvous, shaped like ``torch.distributed.Store``.

``TCPStoreServer`` keeps a dict in a daemon thread and serves any number of ``TCPStoreClient``\\ s over
one ``selectors`` loop. Blocking reads (``get``/``wait`` on keys that do not exist yet) are parked on
the server and answered the moment a ``set``/``add`` creates the key, or when the deadline the client
sent passes: clients never poll.

Wire protocol (all integers big-endian). Every message, both ways, is one *frame*::

    frame    = u32 body_length, body            (1 <= body_length <= MAX_FRAME)
    request  = u8 op, fields...
    reply    = u8 status, fields...             (status: OK, TIMEOUT, ERROR)
    str/blob = u32 length, bytes                (keys are UTF-8)
    keys     = u32 count, str * count
    seconds  = f64                              (negative: no deadline)

    op        request fields        OK reply fields          other replies
    HELLO     blob magic            blob magic
    SET       str key, blob value   -
    GET       str key, seconds      blob value               TIMEOUT
    ADD       str key, i64 amount   i64 new value            ERROR str message (value not an integer)
    WAIT      keys, seconds         -                        TIMEOUT keys (the ones still missing)
    DELETE    str key               u8 existed
    CHECK     keys                  u8 all exist

A connection whose bytes do not parse (garbage, an unknown op, a length past ``MAX_FRAME``) is dropped;
the server keeps serving everyone else. Counters written by ``add`` are stored as ASCII decimal, as
torch does, so ``get`` of a counter returns e.g. ``b"3"``.
"""

from __future__ import annotations

import logging
import math
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, PeerLostError

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_FRAME",
    "PrefixStore",
    "Store",
    "TCPStoreClient",
    "TCPStoreServer",
    "TorchStoreAdapter",
]

logger = logging.getLogger("pycoll.bootstrap")

#: Default deadline (seconds) of a store operation when neither the call nor the client gives one.
DEFAULT_TIMEOUT = 300.0
#: Largest frame either side accepts; a peer announcing more is dropped (it is not speaking our protocol).
MAX_FRAME = 256 * 1024 * 1024

_MAGIC = b"pycoll-store/1"

_OP_HELLO = 0
_OP_SET = 1
_OP_GET = 2
_OP_ADD = 3
_OP_WAIT = 4
_OP_DELETE = 5
_OP_CHECK = 6

_ST_OK = 0
_ST_TIMEOUT = 1
_ST_ERROR = 2

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

# How much longer than the server-side deadline a client waits for the reply before it gives up on the
# server itself (a wedged host, a black-holed network).
_REPLY_GRACE = 10.0


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


# --------------------------------------------------------------------------------------------------
# Server


class _Conn:
    __slots__ = ("sock", "peer", "inbuf", "outbuf", "waiter", "closed", "writing")

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.waiter: _Waiter | None = None
        self.closed = False
        self.writing = False


class _Waiter:
    """A parked GET or WAIT: registered under its first missing key, answered when all keys exist."""

    __slots__ = ("conn", "op", "keys", "deadline", "parked_key")

    def __init__(self, conn: _Conn, op: int, keys: list[str], deadline: float | None) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.deadline = deadline
        self.parked_key: str | None = None


class TCPStoreServer:
    """A rendezvous key-value store served from a daemon thread.

    ``port=0`` lets the kernel pick a free port (read it back from ``.port``): use that whenever the
    port can be handed to the clients some other way, so there is no race for a fixed port.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 0, *, backlog: int = 1024) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as exc:
            raise InvalidUsageError(
                f"cannot listen on {host}:{port} for the rendezvous store: {exc.strerror or exc}"
                + (" (choose another port, or port 0 for a free one)" if port else "")
            ) from exc
        self._listener.setblocking(False)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._data: dict[str, bytes] = {}
        self._waiters: dict[str, list[_Waiter]] = {}
        self._parked: set[_Waiter] = set()
        self._conns: set[_Conn] = set()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, "listener")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._clients_changed = threading.Condition()
        self._close_callbacks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._serve, name=f"pycoll-store-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def add_close_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (once) when the server is closed; exceptions from it are logged."""
        self._close_callbacks.append(callback)

    @property
    def num_clients(self) -> int:
        """Connections open now."""
        with self._clients_changed:
            return len(self._conns)

    def wait_for_clients_to_leave(self, timeout: float) -> bool:
        """Block until no client is connected, at most ``timeout`` seconds; True if none is left."""
        with self._clients_changed:
            return self._clients_changed.wait_for(lambda: not self._conns, timeout=max(0.0, timeout))

    def close(self, drain_timeout: float = 0.0) -> None:
        """Stop serving and close every connection (clients then see PeerLostError). Idempotent.

        With ``drain_timeout`` > 0, first wait up to that long for the clients to disconnect by
        themselves: a rank that hosts the store and leaves a final barrier first would otherwise cut
        off the ranks whose last request is still on its way (close your own client before this).
        """
        if drain_timeout > 0 and not self._closed:
            self.wait_for_clients_to_leave(drain_timeout)
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10.0)
        for conn in list(self._conns):
            self._drop(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._sel.close()
        for callback in self._close_callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - cleanup must not mask the caller's own error
                logger.warning("rendezvous store close callback failed", exc_info=True)
        self._close_callbacks.clear()

    def __enter__(self) -> TCPStoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- event loop (server thread only below this line) --------------------------------------------

    def _serve(self) -> None:
        try:
            self._serve_loop()
        except Exception:  # noqa: BLE001 - never leave clients waiting on a dead loop
            if self._stop:
                return
            logger.error(
                "rendezvous store at %s failed; closing its connections", self.address, exc_info=True
            )
            for conn in list(self._conns):
                self._drop(conn)
            try:
                self._sel.unregister(self._listener)
            except (KeyError, ValueError, OSError):
                pass
            self._listener.close()

    def _serve_loop(self) -> None:
        while not self._stop:
            timeout = self._next_timeout()
            try:
                events = self._sel.select(timeout)
            except OSError:
                if self._stop:
                    return
                raise
            for key, mask in events:
                if self._stop:
                    return
                tag = key.data
                if tag == "listener":
                    self._accept()
                elif tag == "wake":
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                else:
                    conn: _Conn = tag
                    try:
                        if mask & selectors.EVENT_READ and not conn.closed:
                            self._on_readable(conn)
                        if mask & selectors.EVENT_WRITE and not conn.closed:
                            self._flush(conn)
                    except Exception:  # noqa: BLE001 - one bad client must not stop the store
                        logger.debug("rendezvous store: dropping client %s", conn.peer, exc_info=True)
                        self._drop(conn)
            self._expire_waiters()

    def _next_timeout(self) -> float | None:
        deadlines = [w.deadline for w in self._parked if w.deadline is not None]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                logger.debug("rendezvous store: accept failed", exc_info=True)
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            conn = _Conn(sock, peer)
            with self._clients_changed:
                self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.waiter is not None:
            self._unpark(conn.waiter)
        with self._clients_changed:
            self._conns.discard(conn)
            self._clients_changed.notify_all()
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.sock.close()

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)  # disconnected (possibly mid-frame: the partial frame is discarded)
            return
        conn.inbuf += data
        self._process_input(conn)

    def _process_input(self, conn: _Conn) -> None:
        # Requests from one connection are answered in order: while one is parked, later ones wait.
        while not conn.closed and conn.waiter is None and len(conn.inbuf) >= 4:
            (length,) = _U32.unpack_from(conn.inbuf, 0)
            if length == 0 or length > MAX_FRAME:
                logger.debug("rendezvous store: bad frame length %d from %s", length, conn.peer)
                self._drop(conn)
                return
            if len(conn.inbuf) < 4 + length:
                return
            body = bytes(conn.inbuf[4 : 4 + length])
            del conn.inbuf[: 4 + length]
            try:
                self._handle(conn, _Reader(body))
            except _ProtocolError as exc:
                logger.debug("rendezvous store: protocol error from %s: %s", conn.peer, exc)
                self._drop(conn)
                return

    def _handle(self, conn: _Conn, req: _Reader) -> None:
        op = req.u8()
        if op == _OP_HELLO:
            magic = req.blob()
            req.end()
            if magic != _MAGIC:
                raise _ProtocolError("wrong magic")
            self._reply(conn, _U8.pack(_ST_OK) + _enc_blob(_MAGIC))
        elif op == _OP_SET:
            key, value = req.text(), req.blob()
            req.end()
            self._data[key] = value
            self._reply(conn, _U8.pack(_ST_OK))
            self._key_created(key)
        elif op == _OP_ADD:
            key, amount = req.text(), req.i64()
            req.end()
            try:
                total = int(self._data.get(key, b"0")) + amount
            except ValueError:
                self._reply(conn, _U8.pack(_ST_ERROR) + _enc_str(f"key '{key}' does not hold an integer"))
                return
            self._data[key] = str(total).encode("ascii")
            self._reply(conn, _U8.pack(_ST_OK) + _I64.pack(total))
            self._key_created(key)
        elif op in (_OP_GET, _OP_WAIT):
            keys = [req.text()] if op == _OP_GET else req.keys()
            seconds = req.f64()
            req.end()
            deadline = None if seconds < 0 else time.monotonic() + seconds
            waiter = _Waiter(conn, op, keys, deadline)
            if not self._try_answer(waiter):
                if deadline is not None and seconds == 0:
                    self._unpark(waiter)
                    self._answer_timeout(waiter)
                else:
                    conn.waiter = waiter
                    self._parked.add(waiter)
        elif op == _OP_DELETE:
            key = req.text()
            req.end()
            existed = self._data.pop(key, None) is not None
            self._reply(conn, _U8.pack(_ST_OK) + _U8.pack(int(existed)))
        elif op == _OP_CHECK:
            keys = req.keys()
            req.end()
            self._reply(conn, _U8.pack(_ST_OK) + _U8.pack(int(all(k in self._data for k in keys))))
        else:
            raise _ProtocolError(f"unknown op {op}")

    def _try_answer(self, waiter: _Waiter) -> bool:
        """Answer ``waiter`` if all its keys exist, else park it under its first missing key."""
        for key in waiter.keys:
            if key not in self._data:
                self._waiters.setdefault(key, []).append(waiter)
                waiter.parked_key = key
                return False
        waiter.parked_key = None
        if waiter.op == _OP_GET:
            self._reply(waiter.conn, _U8.pack(_ST_OK) + _enc_blob(self._data[waiter.keys[0]]))
        else:
            self._reply(waiter.conn, _U8.pack(_ST_OK))
        return True

    def _unpark(self, waiter: _Waiter) -> None:
        self._parked.discard(waiter)
        if waiter.conn.waiter is waiter:
            waiter.conn.waiter = None
        key = waiter.parked_key
        if key is not None:
            waiters = self._waiters.get(key)
            if waiters is not None:
                try:
                    waiters.remove(waiter)
                except ValueError:
                    pass
                if not waiters:
                    del self._waiters[key]
            waiter.parked_key = None

    def _key_created(self, key: str) -> None:
        for waiter in self._waiters.pop(key, ()):
            waiter.parked_key = None
            conn = waiter.conn
            if conn.closed or conn.waiter is not waiter:
                continue
            if self._try_answer(waiter):
                self._unpark(waiter)
                self._process_input(conn)

    def _answer_timeout(self, waiter: _Waiter) -> None:
        missing = [k for k in waiter.keys if k not in self._data]
        self._reply(waiter.conn, _U8.pack(_ST_TIMEOUT) + _enc_keys(missing))

    def _expire_waiters(self) -> None:
        if not self._parked:
            return
        now = time.monotonic()
        for waiter in [w for w in self._parked if w.deadline is not None and w.deadline <= now]:
            self._unpark(waiter)
            conn = waiter.conn
            if conn.closed:
                continue
            self._answer_timeout(waiter)
            self._process_input(conn)

    def _reply(self, conn: _Conn, body: bytes) -> None:
        if conn.closed:
            return
        conn.outbuf += _U32.pack(len(body)) + body
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            del conn.outbuf[:sent]
        want_write = bool(conn.outbuf)
        if want_write != conn.writing:
            conn.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._sel.modify(conn.sock, events, conn)


# --------------------------------------------------------------------------------------------------
# Client


class TCPStoreClient:
    """Client of a ``TCPStoreServer``.

    The constructor connects, retrying with exponential backoff until ``connect_timeout`` (default:
    ``timeout``) has passed, so clients may start before the server. ``timeout`` is the default
    deadline of every operation. One client may be shared by threads; its requests are serialized
    (a blocking ``get`` holds the connection until it returns).
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        connect_timeout: float | None = None,
    ) -> None:
        if timeout < 0:
            raise InvalidUsageError(f"store timeout must be >= 0 seconds, got {timeout}")
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
        delay = 0.01
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
                sock.sendall(_frame(bytes([_OP_HELLO]) + _enc_blob(_MAGIC)))
                status, reply = _read_reply(sock)
                if status != _ST_OK or reply.blob() != _MAGIC:
                    raise _ProtocolError("unexpected handshake reply")
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
            now = time.monotonic()
            if now >= deadline:
                raise CollectiveTimeoutError(
                    f"could not connect to the rendezvous store at {self.address} within "
                    f"{_fmt_seconds(now - start)} ({attempts} attempts; last error: {last_error}); "
                    "check that rank 0 (or the launcher) is running and that MASTER_ADDR/MASTER_PORT "
                    "point to it"
                )
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 1.0)

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
            return status, reply


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def _read_reply(sock: socket.socket) -> tuple[int, _Reader]:
    (length,) = _U32.unpack(_recv_exact(sock, 4))
    if length == 0 or length > MAX_FRAME:
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


# --------------------------------------------------------------------------------------------------
# Wrappers


class PrefixStore:
    """Every key of ``store`` seen through this object is ``f"{prefix}/{key}"``.

    ``close()`` closes the wrapped store only when ``close_underlying`` is true (by default the
    wrapped store belongs to whoever created it).
    """

    def __init__(self, store: Store, prefix: str, *, close_underlying: bool = False) -> None:
        self.store = store
        self.prefix = prefix
        self._close_underlying = close_underlying

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.store.get(self._k(key), timeout)

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self._k(key), amount)

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self.store.wait([self._k(k) for k in keys], timeout)

    def check(self, keys: list[str]) -> bool:
        check = getattr(self.store, "check", None)
        if check is None:
            raise InvalidUsageError(f"{type(self.store).__name__} has no check()")
        return bool(check([self._k(k) for k in keys]))

    def delete(self, key: str) -> bool:
        return bool(self.store.delete(self._k(key)))

    def close(self) -> None:
        if self._close_underlying:
            self.store.close()

    def __repr__(self) -> str:
        return f"PrefixStore({self.store!r}, {self.prefix!r})"


class TorchStoreAdapter:
    """A ``torch.distributed.Store`` (TCPStore, FileStore, PrefixStore...) seen as a pycoll ``Store``.

    Duck typed: torch is never imported here. Torch's timeout errors become CollectiveTimeoutError and
    its connection errors PeerLostError. ``close()`` does nothing: the torch store belongs to its creator.
    """

    def __init__(self, torch_store: Any, *, name: str | None = None) -> None:
        self.torch_store = torch_store
        self.name = name or type(torch_store).__name__

    def set(self, key: str, value: bytes) -> None:
        self._call("set", [key], lambda: self.torch_store.set(key, _as_bytes(value)))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        if timeout is not None:
            self.wait([key], timeout)
        value = self._call("get", [key], lambda: self.torch_store.get(key), timeout)
        return _as_bytes(value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", [key], lambda: self.torch_store.add(key, int(amount))))

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        keys = list(keys)
        if timeout is None:
            self._call("wait", keys, lambda: self.torch_store.wait(keys))
        else:
            delta = timedelta(seconds=float(timeout))
            self._call("wait", keys, lambda: self.torch_store.wait(keys, delta), timeout)

    def check(self, keys: list[str]) -> bool:
        keys = list(keys)
        return bool(self._call("check", keys, lambda: self.torch_store.check(keys)))

    def delete(self, key: str) -> bool:
        return bool(self._call("delete_key", [key], lambda: self.torch_store.delete_key(key)))

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"TorchStoreAdapter({self.torch_store!r})"

    def _call(self, op: str, keys: list[str], fn: Callable[[], Any], timeout: float | None = None) -> Any:
        start = time.monotonic()
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, (CollectiveTimeoutError, PeerLostError, InvalidUsageError)):
                raise
            text = str(exc)
            low = text.lower()
            waited = time.monotonic() - start
            what = f"key {keys[0]!r}" if len(keys) == 1 else f"keys {keys!r}"
            if "timeout" in low or "timed out" in low:
                raise CollectiveTimeoutError(
                    f"timed out after {_fmt_seconds(waited)} waiting for {what} in the torch store "
                    f"{self.name} ({op}: {text})"
                ) from exc
            if any(
                s in low
                for s in (
                    "connection reset",
                    "broken pipe",
                    "connection closed",
                    "refused",
                    "connection was closed",
                    "peer",
                )
            ):
                raise PeerLostError(
                    f"rendezvous store {self.name} closed the connection during {op} of {what}: {text}",
                    rank=0,
                ) from exc
            raise
