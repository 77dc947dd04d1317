"""Where fault-plane connections arrive: one listening socket per process and address.

Every communicator's fault plane (pycoll/fault/plane.py) links each rank to its fingers (pycoll/fault/
overlay.py: O(log n) of them); rank r dials the fingers below it and is dialled by those above. Connections
of every plane a process takes part in, and the requests of processes asking to join a job, arrive at this
one socket, served by a native thread (``_C.ControlListener``, csrc/fault/listener.h):

    dialler                                 listener
      connect  -------------------------->  accept; send {"t": "challenge", "c": <random hex>}
      a member's hello (binary: its plane,  -> checked (with a secret) and parked until that plane's
        ranks, token, proof)                   links claim it (the plane's token checked)
      {"t": "join", id, host, pid, address, -> handed to this module's thread, which checks the proof and
        proof}                                 gives it to the plane that admits joiners

``token`` is a random value only the plane's members know (from the rendezvous store or an agreement),
so a connection claims a place in a plane only if it knows it; ``proof`` is an HMAC with PYCOLL_SECRET
over the challenge when the job has a secret (pycoll/fault/wire.py), so a joiner must know the secret.
The handshake reads exactly one frame: what the dialler sends after it stays in the socket for the plane.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any, Callable

from pycoll import _C
from pycoll.errors import InvalidUsageError, PeerLostError
from pycoll.fault import wire

log = logging.getLogger("pycoll")


class ControlListener:
    """The process's control socket on one address (``listener_for`` returns the shared one)."""

    def __init__(self, bind: str, advertise: str, secret: bytes | None) -> None:
        self._secret = secret
        try:
            #: The native listener the planes' links claim their connections from.
            self.native = _C.ControlListener(bind, secret or b"")
        except InvalidUsageError as exc:
            raise InvalidUsageError(f"cannot listen for control connections on {bind}: {exc}") from None
        #: "host:port" other ranks dial.
        self.address = f"{advertise}:{self.native.port}"
        self._lock = threading.Lock()
        self._join_handler: Callable[[socket.socket, dict[str, Any]], bool] | None = None
        self._thread = threading.Thread(target=self._serve_joins, name="pycoll-control-joins", daemon=True)
        self._thread.start()

    # ---- join requests -----------------------------------------------------------------------------
    def _serve_joins(self) -> None:
        while True:
            got = self.native.next_join(60.0)  # the GIL is released while it waits
            if got is not None:
                self._join(*got)

    def _join(self, fd: int, challenge: str, data: bytes) -> None:
        conn = socket.socket(fileno=fd)
        conn.setblocking(True)
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict) or msg.get("t") != "join":
            conn.close()
            return
        fields = (msg.get("id"), msg.get("address"))
        if not wire.proof_ok(self._secret, msg.get("proof"), challenge, *fields):
            log.warning("pycoll: dropped a control connection that did not prove it holds the job's secret")
            conn.close()
            return
        with self._lock:
            handler = self._join_handler
        if handler is None or not handler(conn, msg):
            try:
                conn.sendall(wire.encode({"t": "refused", "why": "no communicator here admits joiners now"}))
            except OSError:
                pass
            conn.close()

    def admit_joins(self, handler: Callable[[socket.socket, dict[str, Any]], bool] | None) -> None:
        """The function that takes join requests (the newest live plane's); None: refuse them."""
        with self._lock:
            self._join_handler = handler

    def join_handler(self) -> Callable[[socket.socket, dict[str, Any]], bool] | None:
        with self._lock:
            return self._join_handler

    def forget(self, plane: str) -> None:
        """Drops connections parked for ``plane`` that nobody claimed (a plane whose forming failed)."""
        self.native.forget(plane)


def dial(
    address: str, msg: dict[str, Any], deadline: float, fields: tuple[Any, ...], secret: bytes | None
) -> socket.socket:
    """A joining process's connection to a member's control socket at ``address``: answers its challenge
    with ``msg`` (plus the proof over ``fields``)."""
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
