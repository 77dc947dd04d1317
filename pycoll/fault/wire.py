"""The fault plane's wire: frames of a 4-byte big-endian length and a JSON object, and the HMAC proof a
connection gives when the job has a secret (PYCOLL_SECRET). The native links (csrc/fault/wire.h) add two
frames Python never sees: the empty heartbeat, and the binary hello a member's link starts with.

JSON, not pickle: a frame from a stranger (a process that dialled a listener) is data, never code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
import time
from typing import Any

from pycoll.errors import PeerLostError

#: The frames of an agreement (pycoll/fault/agreement.py), by their "t": a subtree's entries, up the tree;
#: the decision, down it.
AGREEMENT_KINDS = ("up", "decide")

#: The largest frame accepted; a control message is a few hundred bytes, a kv value at most a few KiB.
MAX_FRAME = 4 << 20
_LEN = struct.Struct(">I")


def body(msg: dict[str, Any]) -> bytes:
    """A frame's body: ``msg`` as compact JSON (the native links put the length in front)."""
    return json.dumps(msg, separators=(",", ":")).encode()


def encode(msg: dict[str, Any]) -> bytes:
    data = body(msg)
    return _LEN.pack(len(data)) + data


def recv_frame(sock: socket.socket, deadline: float, what: str, max_bytes: int = MAX_FRAME) -> dict[str, Any]:
    """One frame, read exactly (nothing past it), before ``deadline`` (time.monotonic()); its body at most
    ``max_bytes`` long."""
    head = _recv_exact(sock, 4, deadline, what)
    (n,) = _LEN.unpack(head)
    if n > max_bytes:
        raise PeerLostError(f"{what}: frame of {n} bytes (at most {max_bytes})")
    msg = json.loads(_recv_exact(sock, n, deadline, what))
    if not isinstance(msg, dict):
        raise PeerLostError(f"{what}: not a control frame")
    return msg


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerLostError(f"{what}: no answer in time")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(chunks))
        except (socket.timeout, TimeoutError):
            raise PeerLostError(f"{what}: no answer in time") from None
        except OSError as exc:
            raise PeerLostError(f"{what}: {exc}") from None
        if not chunk:
            raise PeerLostError(f"{what}: the connection was closed")
        chunks += chunk
    return bytes(chunks)


def proof(secret: bytes | None, challenge: str, *fields: object) -> str:
    """HMAC-SHA256 over the listener's challenge and the hello's fields ('' without a secret)."""
    if secret is None:
        return ""
    text = "\0".join([challenge, *map(str, fields)]).encode()
    return hmac.new(secret, b"pycoll control\0" + text, hashlib.sha256).hexdigest()


def proof_ok(secret: bytes | None, given: object, challenge: str, *fields: object) -> bool:
    if secret is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(given, proof(secret, challenge, *fields))
