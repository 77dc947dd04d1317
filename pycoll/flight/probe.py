"""Asking a process where it is: a probe to its control listener, which answers on a native thread of
its own (csrc/fault/probe.h), whatever that process's Python is doing.

The answer (a *report*) is a dict: pid, host, now (steady clock, ns), wall (Unix time), its communicators
(``comms``: id, info, and with ``members`` their members' control addresses), its last records, and with
``stacks`` every thread's Python stack (faulthandler's text) and its main thread's state (``main``).
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pycoll import _C
from pycoll.errors import PeerLostError
from pycoll.fault import wire

#: A report may hold thousands of records and long stacks: larger than a control message.
MAX_REPORT = 64 << 20
#: Probes sent at once by probe_many.
PARALLEL = 16


def probe(
    address: str, *, records: int = 64, stacks: bool = False, members: bool = False,
    secret: bytes | None = None, timeout: float = 3.0,
) -> dict[str, Any]:  # fmt: skip
    """The report of the process whose control listener is at ``address`` ("host:port"). PeerLostError
    when it cannot be reached or does not answer within ``timeout`` seconds."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    what = f"probe of {address}"
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as exc:
        raise PeerLostError(f"{what}: cannot connect ({exc})") from None
    with sock:
        challenge = wire.recv_frame(sock, deadline, what).get("c", "")
        flags = (_C.TRACE_WITH_STACKS if stacks else 0) | (_C.TRACE_WITH_MEMBERS if members else 0)
        body = _C.probe_body(records, flags, secret or b"", str(challenge))
        try:
            sock.sendall(len(body).to_bytes(4, "big") + body)
        except OSError as exc:
            raise PeerLostError(f"{what}: {exc}") from None
        report = wire.recv_frame(sock, deadline, what, max_bytes=MAX_REPORT)
    return report


def probe_many(
    addresses: dict[int, str], *, records: int = 64, stacks: set[int] | None = None, members: bool = False,
    secret: bytes | None = None, timeout: float = 3.0,
) -> dict[int, dict[str, Any] | str]:  # fmt: skip
    """``probe`` of each rank's address, side by side: rank -> its report, or why there is none. ``stacks``:
    the ranks whose stacks are asked for (their answers take 0.1 s longer: the main thread is sampled)."""
    stacks = stacks or set()

    def one(rank: int) -> dict[str, Any] | str:
        try:
            return probe(addresses[rank], records=records, stacks=rank in stacks, members=members,
                         secret=secret, timeout=timeout)  # fmt: skip
        except (PeerLostError, ValueError) as exc:
            return str(exc)

    if not addresses:
        return {}
    workers = min(PARALLEL, len(addresses))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pycoll-probe") as pool:
        return dict(zip(addresses, pool.map(one, addresses)))
