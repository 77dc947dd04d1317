"""Where fault-plane connections arrive: one listening socket per process and address.

Every communicator's fault plane (pycoll/fault/plane.py) is a full mesh of TCP connections, one per
pair of ranks; rank r dials the ranks below it and is dialled by those above. Connections of every plane
a process takes part in, and the requests of processes asking to join a job, arrive at this one socket:

    dialer                                  listener
      connect  -------------------------->  accept; send {"t": "challenge", "c": <random hex>}
      {"t": "hello", plane, rank, to, token, proof} or {"t": "join", id, host, pid, address, proof}
                                            -> parked until that plane claims it (hello), or handed to
                                               the plane that admits joiners (join)

``token`` is a random value only the plane's members know (from the rendezvous store or an agreement),
so a connection claims a place in a plane only if it knows it; ``proof`` is an HMAC with PYCOLL_SECRET
over the challenge when the job has a secret (pycoll/fault/wire.py), so a joiner must know the secret.
The handshake reads exactly one frame: what the dialer sends after it stays in the socket for the plane.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from typing import Any, Callable

from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, PeerLostError
from pycoll.fault import wire

log = logging.getLogger("pycoll")

#: How long a connection may take to send its hello before the listener drops it.
HANDSHAKE_S = 5.0


class ControlListener:
    """The process's control socket on one address (``listener_for`` returns the shared one)."""

    def __init__(self, bind: str, advertise: str, secret: bytes | None) -> None:
        self._secret = secret
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((bind, 0))
        except OSError as exc:
            self._sock.close()
            raise InvalidUsageError(f"cannot listen for control connections on {bind}: {exc}") from None
        self._sock.listen(256)
        #: "host:port" other ranks dial.
        self.address = f"{advertise}:{self._sock.getsockname()[1]}"
        self._cv = threading.Condition()
        self._hellos: dict[tuple[str, int, int], tuple[socket.socket, str]] = {}  # (plane, from, to)
        self._join_handler: Callable[[socket.socket, dict[str, Any]], bool] | None = None
        self._thread = threading.Thread(target=self._accept_loop, name="pycoll-control-listen", daemon=True)
        self._thread.start()

    # ---- arrivals ----------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        challenge = secrets.token_hex(16)
        try:
            conn.sendall(wire.encode({"t": "challenge", "c": challenge}))
            msg = wire.recv_frame(conn, time.monotonic() + HANDSHAKE_S, "control hello")
        except (PeerLostError, OSError, ValueError):
            conn.close()
            return
        kind = msg.get("t")
        fields: tuple[Any, ...]
        if kind == "hello":
            fields = (msg.get("plane"), msg.get("rank"), msg.get("to"), msg.get("token"))
        elif kind == "join":
            fields = (msg.get("id"), msg.get("address"))
        else:
            fields = ()
        if not fields or not wire.proof_ok(self._secret, msg.get("proof"), challenge, *fields):
            log.warning("pycoll: dropped a control connection that did not prove it holds the job's secret")
            conn.close()
            return
        if kind == "hello":
            with self._cv:
                key = (str(msg["plane"]), int(msg["rank"]), int(msg["to"]))
                self._hellos[key] = (conn, str(msg["token"]))
                self._cv.notify_all()
            return
        with self._cv:
            handler = self._join_handler
        if handler is None or not handler(conn, msg):
            try:
                conn.sendall(wire.encode({"t": "refused", "why": "no communicator here admits joiners now"}))
            except OSError:
                pass
            conn.close()

    def admit_joins(self, handler: Callable[[socket.socket, dict[str, Any]], bool] | None) -> None:
        """The function that takes join requests (the newest live plane's); None: refuse them."""
        with self._cv:
            self._join_handler = handler

    def join_handler(self) -> Callable[[socket.socket, dict[str, Any]], bool] | None:
        with self._cv:
            return self._join_handler

    def claim(
        self, plane: str, rank: int, me: int, token: str, deadline: float, gone: Callable[[], str | None]
    ) -> socket.socket:
        """The connection rank ``rank`` of ``plane`` dialled to rank ``me``, once it arrives. ``gone()`` says
        why to stop waiting (the rank is known dead), or None."""
        with self._cv:
            while True:
                got = self._hellos.pop((plane, rank, me), None)
                if got is not None:
                    conn, their_token = got
                    if secrets.compare_digest(their_token, token):
                        return conn
                    conn.close()
                why = gone()
                if why is not None:
                    raise PeerLostError(f"rank {rank} did not join the fault plane: {why}", rank=rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(
                        f"rank {rank} did not connect its fault plane in time (plane {plane})"
                    )
                self._cv.wait(min(left, 0.05))

    def forget(self, plane: str) -> None:
        """Drops connections parked for ``plane`` that nobody claimed (a plane whose forming failed)."""
        with self._cv:
            for key in [k for k in self._hellos if k[0] == plane]:
                self._hellos.pop(key)[0].close()

    # ---- departures --------------------------------------------------------------------------------
    def hello(
        self, address: str, msg: dict[str, Any], deadline: float, fields: tuple[Any, ...]
    ) -> socket.socket:
        """Dials ``address``, answers its challenge with ``msg`` (plus the proof over ``fields``)."""
        return dial(address, msg, deadline, fields, self._secret)


def dial(
    address: str, msg: dict[str, Any], deadline: float, fields: tuple[Any, ...], secret: bytes | None
) -> socket.socket:
    host, _, port = address.rpartition(":")
    left = max(0.05, deadline - time.monotonic())
    try:
        sock = socket.create_connection((host, int(port)), timeout=min(left, 5.0))
    except OSError as exc:
        raise PeerLostError(f"cannot reach the control socket at {address}: {exc}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        challenge = wire.recv_frame(sock, deadline, f"control socket at {address}")
        if challenge.get("t") != "challenge":
            raise PeerLostError(f"{address} is not a pycoll control socket")
        sock.sendall(wire.encode({**msg, "proof": wire.proof(secret, str(challenge.get("c")), *fields)}))
    except BaseException:
        sock.close()
        raise
    return sock


_listeners: dict[tuple[str, str], ControlListener] = {}
_listeners_lock = threading.Lock()


def listener_for(bind: str, advertise: str, secret: bytes | None) -> ControlListener:
    """The process's listener on ``bind`` (made on first use; it lives as long as the process)."""
    with _listeners_lock:
        found = _listeners.get((bind, advertise))
        if found is None:
            found = _listeners[(bind, advertise)] = ControlListener(bind, advertise, secret)
        return found
