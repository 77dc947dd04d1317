"""``TCPStoreServer``: the rendezvous key-value store, served from a daemon thread.

It keeps a dict and serves any number of ``TCPStoreClient``\\ s (``client.py``) over one
``selectors`` loop. Blocking reads (``get``/``wait`` on keys that do not exist yet) are parked on the
server and answered the moment a ``set``/``add`` creates the key, or when the deadline the client sent
passes: clients never poll. It speaks the wire protocol of ``protocol.py``, which it imports as the
client does; server and client never import each other.

Only after the handshake are other ops served. A connection that has not finished the handshake within
``handshake_timeout`` seconds, sends bytes that do not parse (garbage, an unknown op, a length out of
range, a truncated frame), fails authentication, does not read its replies (more than
``max_pending_output`` bytes queued for it) or piles more than 1 MiB behind a request still waiting for
its reply is dropped and logged as a warning on the ``pycoll`` logger (``pycoll.bootstrap``) naming its
address; the server keeps serving everyone else, and nothing it does for one connection blocks.
"""

from __future__ import annotations

import hmac
import logging
import math
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pycoll.bootstrap.store.protocol import (
    _AUTH_HMAC,
    _AUTH_NONE,
    _CLIENT_TAG,
    _I64,
    _MAGIC,
    _MAGIC_FAMILY,
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
    _U32,
    MAX_FRAME,
    _check_secret,
    _enc_blob,
    _enc_keys,
    _enc_str,
    _fmt_seconds,
    _proof,
    _ProtocolError,
    _Reader,
)
from pycoll.errors import InvalidUsageError

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "DEFAULT_MAX_PENDING_OUTPUT", "TCPStoreServer"]

logger = logging.getLogger("pycoll.bootstrap")

#: Seconds a new connection has to complete the handshake before the server drops it.
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
#: Bytes of replies the server queues for a connection that is not reading them before it drops it
#: (one reply of any size is always queued: a client that waits for each reply never comes near this).
DEFAULT_MAX_PENDING_OUTPUT = 4 * 1024 * 1024
# Bytes a connection may send beyond a parked (blocking) request of its own; our client never does.
_MAX_PIPELINED = 1024 * 1024
# At most this many drop warnings per minute; the rest are counted and summarised (an attacker must not
# be able to flood the job's log).
_MAX_WARNINGS_PER_MINUTE = 50


def _peer_text(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)


class _Conn:
    __slots__ = (
        "sock",
        "peer",
        "inbuf",
        "outbuf",
        "waiter",
        "closed",
        "writing",
        "ready",
        "nonce",
        "deadline",
        "closing",
    )

    def __init__(self, sock: socket.socket, peer: Any, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.waiter: _Waiter | None = None
        self.closed = False
        self.writing = False
        self.ready = False  # handshake complete: store ops are served
        self.nonce = b""  # the server nonce while an AUTH is expected
        self.deadline = deadline  # monotonic time by which the handshake must be complete
        self.closing = False  # a refused handshake: drop once the queued reply is sent


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

    With ``secret`` only clients that prove they hold the same secret are served (see the module
    docstring); without it, clients that offer one are refused. ``handshake_timeout`` (seconds) bounds
    how long a new connection may take to complete the handshake; ``max_pending_output`` how many reply
    bytes may queue for a connection that does not read them. Connections dropped for breaking the
    protocol are logged and counted in ``rejected_connections``.
    """

    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        backlog: int = 1024,
        secret: bytes | None = None,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        max_pending_output: int = DEFAULT_MAX_PENDING_OUTPUT,
    ) -> None:
        if not handshake_timeout > 0 or math.isinf(handshake_timeout):
            raise InvalidUsageError(
                f"handshake_timeout must be a finite number of seconds > 0, got {handshake_timeout}"
            )
        if max_pending_output < 1:
            raise InvalidUsageError(f"max_pending_output must be >= 1 byte, got {max_pending_output}")
        self._secret = _check_secret(secret)
        self._handshake_timeout = float(handshake_timeout)
        self._max_pending_output = int(max_pending_output)
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
        self._handshaking: set[_Conn] = set()
        self._rejected = 0
        self._warn_window = -math.inf
        self._warn_count = 0
        self._warn_suppressed = 0
        # Until the thread runs, a failure (EMFILE from socketpair, say) must give the port and every
        # descriptor back now, not whenever the half-built object is collected.
        opened: list[socket.socket | selectors.BaseSelector] = [self._listener]
        try:
            self._sel = selectors.DefaultSelector()
            opened.append(self._sel)
            self._wake_r, self._wake_w = socket.socketpair()
            opened += [self._wake_r, self._wake_w]
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
        except BaseException:
            for resource in reversed(opened):
                resource.close()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def requires_secret(self) -> bool:
        """True when clients must prove they hold the rendezvous secret."""
        return self._secret is not None

    @property
    def rejected_connections(self) -> int:
        """Connections dropped so far for breaking the protocol (bad bytes, wrong secret, too slow...)."""
        return self._rejected

    def add_close_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (once) when the server is closed; exceptions from it are logged."""
        self._close_callbacks.append(callback)

    @property
    def num_clients(self) -> int:
        """Clients connected now (past the handshake)."""
        with self._clients_changed:
            return sum(1 for c in self._conns if c.ready)

    def wait_for_clients_to_leave(self, timeout: float) -> bool:
        """Block until no client is connected, at most ``timeout`` seconds; True if none is left.

        Connections still in the handshake do not count: a stranger cannot hold the store open.
        """
        with self._clients_changed:
            return self._clients_changed.wait_for(
                lambda: not any(c.ready for c in self._conns), timeout=max(0.0, timeout)
            )

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
                    except Exception as exc:  # noqa: BLE001 - one bad client must not stop the store
                        logger.debug(
                            "rendezvous store: error serving %s", _peer_text(conn.peer), exc_info=True
                        )
                        self._reject(conn, f"internal error while serving it ({type(exc).__name__}: {exc})")
            self._expire_waiters()
            self._expire_handshakes()

    def _next_timeout(self) -> float | None:
        deadlines = [w.deadline for w in self._parked if w.deadline is not None]
        deadlines.extend(c.deadline for c in self._handshaking)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # then serve the others before accepting more (a flood of connects)
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
            conn = _Conn(sock, peer, time.monotonic() + self._handshake_timeout)
            with self._clients_changed:
                self._conns.add(conn)
            self._handshaking.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.waiter is not None:
            self._unpark(conn.waiter)
        self._handshaking.discard(conn)
        with self._clients_changed:
            self._conns.discard(conn)
            self._clients_changed.notify_all()
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.sock.close()

    def _reject(self, conn: _Conn, reason: str, *, after_reply: bool = False) -> None:
        """Drop a connection that broke the protocol, and say so (``after_reply``: once the queued
        reply, which tells the client why, has been sent)."""
        if conn.closed or conn.closing:
            return
        self._warn_dropped(conn, reason)
        self._rejected += 1  # after the warning: whoever waits for the count finds the warning logged
        if after_reply and conn.outbuf:
            conn.closing = True  # _flush drops it; the handshake deadline still applies if it never reads
            return
        self._drop(conn)

    def _warn_dropped(self, conn: _Conn, reason: str) -> None:
        now = time.monotonic()
        if now - self._warn_window >= 60.0:
            if self._warn_suppressed:
                logger.warning(
                    "rendezvous store at %s: %d more connections were dropped (not logged one by one)",
                    self.address,
                    self._warn_suppressed,
                )
            self._warn_window, self._warn_count, self._warn_suppressed = now, 0, 0
        if self._warn_count < _MAX_WARNINGS_PER_MINUTE:
            self._warn_count += 1
            logger.warning(
                "rendezvous store at %s: dropped the connection from %s: %s",
                self.address,
                _peer_text(conn.peer),
                reason,
            )
        else:
            self._warn_suppressed += 1

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            data = b""
            if not conn.ready or conn.inbuf:
                self._reject(conn, f"connection error during a message ({type(exc).__name__})")
                return
        if not data:
            if conn.closing or (conn.ready and not conn.inbuf):
                self._drop(conn)  # an ordinary disconnect
            elif not conn.ready:
                self._reject(conn, "it closed the connection before completing the handshake")
            else:
                self._reject(conn, "it closed the connection in the middle of a message (truncated frame)")
            return
        if conn.closing:
            return  # the handshake was refused; whatever else it sends is ignored
        conn.inbuf += data
        self._process_input(conn)
        if not conn.closed and conn.waiter is not None and len(conn.inbuf) > _MAX_PIPELINED:
            self._reject(conn, f"it sent {len(conn.inbuf)} bytes past a request still waiting for its reply")

    def _process_input(self, conn: _Conn) -> None:
        # Requests from one connection are answered in order: while one is parked, later ones wait.
        while not conn.closed and not conn.closing and conn.waiter is None and len(conn.inbuf) >= 4:
            (length,) = _U32.unpack_from(conn.inbuf, 0)
            limit = MAX_FRAME if conn.ready else _MAX_HANDSHAKE_FRAME
            if length == 0 or length > limit:
                when = "" if conn.ready else " before the handshake"
                self._reject(
                    conn, f"frame length {length} out of range (1..{limit}{when}); not a pycoll store client?"
                )
                return
            if len(conn.inbuf) < 4 + length:
                return
            body = bytes(conn.inbuf[4 : 4 + length])
            del conn.inbuf[: 4 + length]
            try:
                if conn.ready:
                    self._handle(conn, _Reader(body))
                else:
                    self._handshake(conn, _Reader(body))
            except _ProtocolError as exc:
                self._reject(conn, f"protocol error: {exc}")
                return

    def _handshake(self, conn: _Conn, req: _Reader) -> None:
        op = req.u8()
        secret = self._secret
        if not conn.nonce:  # HELLO expected
            if op != _OP_HELLO:
                raise _ProtocolError(f"op {op} before the handshake")
            magic = req.blob()
            if magic != _MAGIC:
                if not magic.startswith(_MAGIC_FAMILY):
                    raise _ProtocolError("wrong magic (not a pycoll store client)")
                # Shown in a log line and an error: short, printable (it comes from an unknown peer).
                theirs = "".join(c if c.isprintable() else "?" for c in magic[:40].decode("ascii", "replace"))
                self._reply(
                    conn,
                    _U8.pack(_ST_ERROR)
                    + _enc_str(
                        f"this store speaks protocol {_MAGIC.decode()} but the client {theirs}: every "
                        "process of a job must run the same pycoll version"
                    ),
                )
                self._reject(conn, f"it speaks another protocol version ({theirs})", after_reply=True)
                return
            auth = req.u8()
            req.end()
            if auth not in (_AUTH_NONE, _AUTH_HMAC):
                raise _ProtocolError(f"unknown authentication mode {auth}")
            mine = _AUTH_NONE if secret is None else _AUTH_HMAC
            nonce = b"" if secret is None else secrets.token_bytes(_NONCE_BYTES)
            # Ready before the reply goes out: once the client has it, num_clients must count it.
            if auth == mine and secret is None:
                self._ready(conn)
            # The reply carries our mode even when it differs: the client can say which side lacks a secret.
            self._reply(conn, _U8.pack(_ST_OK) + _enc_blob(_MAGIC) + _U8.pack(mine) + _enc_blob(nonce))
            if auth != mine:
                reason = (
                    "it has no rendezvous secret but this store requires one (PYCOLL_SECRET)"
                    if secret is not None
                    else "it offers a rendezvous secret but this store has none (PYCOLL_SECRET not set here)"
                )
                self._reject(conn, reason, after_reply=True)
            elif secret is not None:
                conn.nonce = nonce
            return
        if op != _OP_AUTH:  # AUTH expected
            raise _ProtocolError(f"op {op} instead of AUTH")
        assert secret is not None
        client_nonce, proof = req.blob(), req.blob()
        req.end()
        if len(client_nonce) != _NONCE_BYTES:
            raise _ProtocolError(f"client nonce of {len(client_nonce)} bytes")
        if not hmac.compare_digest(proof, _proof(secret, _CLIENT_TAG, conn.nonce, client_nonce)):
            self._reply(conn, _U8.pack(_ST_ERROR) + _enc_str("the rendezvous secret did not match"))
            self._reject(conn, "wrong rendezvous secret", after_reply=True)
            return
        server_proof = _proof(secret, _SERVER_TAG, conn.nonce, client_nonce)
        self._ready(conn)
        self._reply(conn, _U8.pack(_ST_OK) + _enc_blob(server_proof))

    def _ready(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.ready = True
        conn.nonce = b""
        self._handshaking.discard(conn)

    def _expire_handshakes(self) -> None:
        if not self._handshaking:
            return
        now = time.monotonic()
        for conn in [c for c in self._handshaking if c.deadline <= now]:
            if conn.closing:
                self._drop(conn)  # refused earlier (and logged then), and never read why
            else:
                self._reject(
                    conn, f"it did not complete the handshake within {_fmt_seconds(self._handshake_timeout)}"
                )

    def _handle(self, conn: _Conn, req: _Reader) -> None:
        op = req.u8()
        if op == _OP_SET:
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
        elif op in (_OP_GET, _OP_WAIT, _OP_MGET):
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
        elif waiter.op == _OP_MGET:
            values = b"".join(_enc_blob(self._data[k]) for k in waiter.keys)
            self._reply(waiter.conn, _U8.pack(_ST_OK) + _U32.pack(len(waiter.keys)) + values)
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
        frame = _U32.pack(len(body)) + body
        if conn.outbuf and len(conn.outbuf) + len(frame) > self._max_pending_output:
            # It keeps sending requests but does not take the replies: do not buffer for it without bound.
            self._reject(conn, f"it does not read its replies ({len(conn.outbuf)} bytes queued for it)")
            return
        conn.outbuf += frame
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
        if conn.closing and not conn.outbuf:
            self._drop(conn)  # the reply that says why it is refused has been sent
            return
        want_write = bool(conn.outbuf)
        if want_write != conn.writing:
            conn.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._sel.modify(conn.sock, events, conn)
