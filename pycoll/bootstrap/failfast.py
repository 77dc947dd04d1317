"""Failing fast at start-up: a rank whose set-up fails tells the others through the rendezvous store.

Without it, when one rank's ``pycoll.init`` raises after it has reached the store (a bad setting of its
own, a transport error, a mismatched world size, Ctrl-C), the other ranks wait in store reads and
barriers until the store's deadline (300 s by default) wherever the launcher does not kill them (mpirun,
ranks started by hand). With it they raise ``PeerFailedError`` within a fraction of a second, naming
that rank and its error.

``FailFastStore(store, key, rank=, timeout=)`` is the store a set-up phase waits in. Its blocking
``get`` and ``wait`` wait in slices of ``SLICE_S`` (through the wrapped store's own timeout argument:
the server holds the request, nothing polls in between). After a slice that ended without the keys it
reads the counter ``<key>/count``; once a peer has failed it raises ``PeerFailedError`` from the
report in ``<key>/record``. A wait answered within its first slice costs nothing more, and every wait
keeps its overall deadline (a timeout still says how long it waited in all).

``announce(exc, world_size)`` is called by the failing rank: the first failure (``add`` on
``<key>/count`` decides) writes ``{"rank", "type", "message"}`` to ``<key>/record`` ("rank": the failing
rank, or the rank whose loss made it fail: a ``PeerLostError``'s), best effort (an
error of the store itself is logged at debug level, never raised over ``exc``). Not published:
``PeerFailedError`` (that rank gives up because of the peer that failed first, which stays the one
reported) and ``CollectiveTimeoutError`` (every rank has its own deadline, and the store may not be
answering). Every announcing rank then counts itself in ``<key>/left``; with ``linger`` (a rank that
hosts the store) it waits, at most that long, until every rank has, so that they can read the report
before the store goes.

Keys are scoped to what is being formed: ``pycoll/rdzv/<n>/failure`` for a rank's n-th rendezvous on a
store, ``pycoll/comm<n>/failure`` for its n-th communicator. A later rendezvous or communicator on the
same store starts clean.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from typing import Callable, TypeVar

from pycoll.bootstrap.store import Store
from pycoll.bootstrap.store.adapters import get_many
from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, PeerFailedError, PeerLostError

__all__ = ["LINGER_S", "SLICE_S", "FailFastStore"]

#: Longest single wait of a FailFastStore between two looks at the failure counter (seconds).
SLICE_S = 0.25
#: Longest time a failing rank that hosts the store keeps it up for the others to read its report.
LINGER_S = 1.5
#: Longest error message published (characters); longer ones are cut.
MAX_MESSAGE_CHARS = 1000
# How long a rank that saw the failure counter waits for the report itself (written just after it).
_RECORD_WAIT_S = 1.0
# A slice that took this much longer than asked timed out because the store did not answer (the TCP
# client gives up on a silent server 10 s past the request's deadline): that error is passed on as it is.
_STALL_S = 5.0
_TIMED_OUT = re.compile(r"^timed out after \d+(?:\.\d+)? s")

T = TypeVar("T")
logger = logging.getLogger("pycoll.bootstrap")


def _retimed(exc: CollectiveTimeoutError, waited: float) -> CollectiveTimeoutError:
    """``exc`` (the timeout of the last slice) saying how long the whole wait took."""
    text, n = _TIMED_OUT.subn(f"timed out after {waited:.2f} s", str(exc), count=1)
    return CollectiveTimeoutError(text) if n else exc


class FailFastStore:
    """``store`` whose blocking waits end early, with PeerFailedError, once a peer has announced a
    failure under ``key``; see the module docstring. ``timeout`` is the deadline of a wait that gives
    none; ``what`` names the phase in messages. ``close()`` does nothing: ``store`` is its creator's."""

    def __init__(
        self, store: Store, key: str, *, rank: int, timeout: float, what: str = "pycoll.init"
    ) -> None:
        self.store = store
        self.key = key
        self.rank = rank
        self.timeout = timeout
        self.what = what

    # -- the Store interface --------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self._sliced(lambda seconds: self.store.get(key, seconds), timeout)

    def add(self, key: str, amount: int) -> int:
        return self.store.add(key, amount)

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        keys = list(keys)
        self._sliced(lambda seconds: self.store.wait(keys, seconds), timeout)

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        keys = list(keys)
        return self._sliced(lambda seconds: get_many(self.store, keys, seconds), timeout)

    def check(self, keys: list[str]) -> bool:
        check = getattr(self.store, "check", None)
        if check is None:
            raise InvalidUsageError(f"{type(self.store).__name__} has no check()")
        return bool(check(keys))

    def delete(self, key: str) -> bool:
        return bool(self.store.delete(key))

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"FailFastStore({self.store!r}, {self.key!r})"

    # -- failures -------------------------------------------------------------------------------------

    def peer_failure(self) -> PeerFailedError | None:
        """The error to raise if a peer has announced its failure, else None (one ``add``)."""
        if self.store.add(f"{self.key}/count", 0) < 1:
            return None
        rank, kind, message = -1, "", ""
        try:
            record = json.loads(self.store.get(f"{self.key}/record", _RECORD_WAIT_S).decode("utf-8"))
            rank, kind, message = int(record["rank"]), str(record["type"]), str(record["message"])
        except (CollectiveTimeoutError, ValueError, KeyError, TypeError):
            who = "another rank"  # it failed before it could write its report
        else:
            who = f"rank {rank}"
        error = f"{kind}: {message}" if message else (kind or "its report could not be read")
        return PeerFailedError(
            f"{who} failed during {self.what} ({error}); this rank ({self.rank}) stops waiting for it",
            rank=rank,
            error_type=kind,
            error_message=message,
        )

    def announce(self, exc: BaseException, world_size: int, *, linger: float = 0.0) -> None:
        """Tells the other ranks that this rank's set-up failed with ``exc`` (see the module docstring).
        Best effort: never raises over ``exc`` (a second Ctrl-C still interrupts it)."""
        if isinstance(exc, CollectiveTimeoutError):
            return
        try:
            if not isinstance(exc, PeerFailedError) and self.store.add(f"{self.key}/count", 1) == 1:
                message = str(exc)
                if len(message) > MAX_MESSAGE_CHARS:
                    message = message[: MAX_MESSAGE_CHARS - 3] + "..."
                # A rank that failed because it lost another names that one: the others raise naming it.
                lost = getattr(exc, "rank", -1) if isinstance(exc, PeerLostError) else -1
                rank = lost if lost >= 0 else self.rank
                record = {"rank": rank, "type": type(exc).__name__, "message": message}
                self.store.set(f"{self.key}/record", json.dumps(record).encode("utf-8"))
            if self.store.add(f"{self.key}/left", 1) >= world_size:
                self.store.set(f"{self.key}/all_left", b"1")
            if linger > 0:
                try:
                    self.store.wait([f"{self.key}/all_left"], linger)
                except CollectiveTimeoutError:
                    pass  # a rank that never reached the store, or is busy elsewhere: do not wait for it
        except Exception:  # noqa: BLE001 - the store may be gone; the rank's own error is the one to raise
            logger.debug("rank %d could not announce its failure (%r)", self.rank, self.key, exc_info=True)

    # -- internals ------------------------------------------------------------------------------------

    def _sliced(self, op: Callable[[float], T], timeout: float | None) -> T:
        total = self.timeout if timeout is None else float(timeout)
        if not total >= 0 or math.isinf(total):
            return op(total)  # the wrapped store reports the bad value
        start = time.monotonic()
        deadline = start + total
        while True:
            began = time.monotonic()
            remaining = max(0.0, deadline - began)
            try:
                return op(min(SLICE_S, remaining))
            except CollectiveTimeoutError as exc:
                if time.monotonic() - began > SLICE_S + _STALL_S:
                    raise  # not "the keys are not there yet" but a store that does not answer
                timed_out = exc
            failure = self.peer_failure()
            if failure is not None:
                raise failure
            if remaining <= SLICE_S:
                raise _retimed(timed_out, time.monotonic() - start) from None
