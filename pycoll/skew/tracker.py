"""A communicator's side of skew reporting: its ranks' clock domains and first clock estimate, the
straggler notices (callbacks and the rate-limited ``pycoll`` WARNING), the report gathered from every rank,
and the JSON written at finalize (PYCOLL_SKEW_REPORT). Built from the communicator's Context and the
function that runs a collective on it (its dispatcher's ``launch``)."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from pycoll import auto
from pycoll.algorithms import ALGORITHMS
from pycoll.arrays import as_buffer
from pycoll.call import Call
from pycoll.errors import InvalidUsageError
from pycoll.skew.report import SkewReport, from_snapshot

if TYPE_CHECKING:
    from pycoll.context import Context

log = logging.getLogger("pycoll")

#: One WARNING per rank and notice at most this often; the ones held back are counted in the next.
LOG_INTERVAL_S = 60.0
#: Barriers run at set-up when some rank's clock is not rank 0's, for the first estimate of its offset.
CLOCK_SYNC_ROUNDS = 3


@dataclass(frozen=True)
class StragglerEvent:
    """A rank whose mean lateness over the last ``window`` collectives passed a notice's threshold."""

    rank: int
    host: str
    mean_late_ms: float
    window: int
    #: The time the other ranks spent waiting for this rank over the window, summed over them.
    wait_inflicted_ms: float
    threshold_ms: float
    #: The collective (its number on the communicator) that completed the window.
    seq: int

    def __str__(self) -> str:
        return (
            f"rank {self.rank} (host {self.host}) entered its collectives {self.mean_late_ms:.2f} ms late on "
            f"average over the last {self.window} (threshold {self.threshold_ms:g} ms); the other ranks lost "
            f"{self.wait_inflicted_ms / 1000:.3f} s waiting for it"
        )


class Notice:
    """What ``Communicator.on_straggler`` returns: ``remove()`` stops it."""

    def __init__(
        self,
        tracker: SkewTracker,
        ident: int,
        callback: Callable[[StragglerEvent], None] | None,
        late_ms: float,
    ) -> None:
        self._tracker = tracker
        self.id = ident
        self.callback = callback
        self.late_ms = late_ms
        self.logged_at: dict[int, float] = {}  # rank -> monotonic time of its last WARNING
        self.held_back: dict[int, int] = {}

    def remove(self) -> None:
        self._tracker.remove(self)


def display_host(host_id: str) -> str:
    """A host id as a person reads it: the hostname, without the boot id."""
    return host_id.split("/", 1)[0]


class SkewTracker:
    def __init__(self, ctx: Context, launch: Callable[[Call], Any]) -> None:
        self.ctx = ctx
        self._launch = launch
        self.hosts = [display_host(h) for h in ctx.group.hosts]
        self._notices: dict[int, Notice] = {}

    # ---- set-up --------------------------------------------------------------------------------------
    def sync_clocks(self, timeout: float) -> None:
        """Every rank's clock domain (from the communicator's formation, pycoll/formation.py); where some
        differ from rank 0's, a few barriers for a first estimate of their offsets. The library's own
        collectives: not in the report."""
        domains = list(self.ctx.group.clock_domains)
        self.ctx.native().skew_set_domains(domains)
        if len(set(domains)) > 1:
            empty = as_buffer(np.zeros(0, dtype=np.uint8), "x", writable=True)
            for _ in range(CLOCK_SYNC_ROUNDS):
                self._launch(
                    Call("barrier", ALGORITHMS["barrier"][0], empty, empty, 0, timeout=timeout, report=False)
                )

    # ---- notices -------------------------------------------------------------------------------------
    def add(self, callback: Callable[[StragglerEvent], None] | None, late_ms: float, window: int) -> Notice:
        if callback is not None and not callable(callback):
            raise InvalidUsageError(f"on_straggler needs a callable (or None), got {callback!r}")
        if not late_ms > 0:
            raise InvalidUsageError(f"late_ms must be > 0 milliseconds, got {late_ms!r}")
        if not isinstance(window, int) or window < 1:
            raise InvalidUsageError(f"window must be a number of collectives >= 1, got {window!r}")
        native = self.ctx.native()
        if not native.skew_enabled:
            raise InvalidUsageError(
                "skew recording is off on this rank (PYCOLL_SKEW=0), so no notice can fire"
            )
        ident = native.skew_add_notice(int(late_ms * 1e6), window)
        notice = Notice(self, ident, callback, late_ms)
        self._notices[ident] = notice
        return notice

    def remove(self, notice: Notice) -> None:
        if self._notices.pop(notice.id, None) is not None:
            native = self.ctx.native_or_none()
            if native is not None:
                native.skew_remove_notice(notice.id)

    def dispatch(self) -> None:
        """After a collective that left events: a WARNING on rank 0 (rate limited), then the callbacks
        (on every rank: every rank sees the same events). A callback's exception reaches the caller."""
        native = self.ctx.native_or_none()
        if native is None:
            return
        for ident, rank, seq, window, mean_ns, inflicted_ns in native.skew_take_events():
            notice = self._notices.get(ident)
            if notice is None:
                continue
            event = StragglerEvent(
                rank, self.hosts[rank], mean_ns / 1e6, window, inflicted_ns / 1e6, notice.late_ms, seq
            )
            if self.ctx.rank == 0:
                self._warn(notice, event)
            if notice.callback is not None:
                notice.callback(event)

    def _warn(self, notice: Notice, event: StragglerEvent) -> None:
        now = time.monotonic()
        if now - notice.logged_at.get(event.rank, -LOG_INTERVAL_S) < LOG_INTERVAL_S:
            notice.held_back[event.rank] = notice.held_back.get(event.rank, 0) + 1
            return
        notice.logged_at[event.rank] = now
        held = notice.held_back.pop(event.rank, 0)
        log.warning("straggler: %s%s", event, f" ({held} more such notices held back)" if held else "")

    # ---- reports -------------------------------------------------------------------------------------
    def local_report(self, window: int | None = None) -> SkewReport:
        """This rank's own view (no communication): every rank records every rank's lateness."""
        native = self.ctx.native()
        native.skew_flush()
        return from_snapshot(native.skew_snapshot(), self.hosts, window)

    def gathered_report(self, window: int | None, timeout: float | None) -> SkewReport:
        """Rank 0's view, on every rank (two broadcasts, not in the report): the same report everywhere."""
        rank = self.ctx.rank
        payload = self.local_report(window).to_json().encode() if rank == 0 else b""
        size = np.array([len(payload)], dtype=np.int64)
        self._broadcast(size, timeout)
        data = (
            np.frombuffer(payload, dtype=np.uint8).copy()
            if rank == 0
            else np.zeros(int(size[0]), np.uint8)
        )
        self._broadcast(data, timeout)
        return SkewReport.from_dict(json.loads(data.tobytes().decode()))

    def _broadcast(self, x: np.ndarray, timeout: float | None) -> None:
        buf = as_buffer(x, "x", writable=True)
        algo = auto.algorithm(self.ctx, "broadcast", "auto", buf.nbytes, buf.itemsize, False)
        self._launch(Call("broadcast", algo, buf, buf, buf.count, timeout=timeout, report=False))

    def write(self, path: str) -> None:
        """PYCOLL_SKEW_REPORT at finalize: rank 0 writes ``path`` (with ``{rank}`` in it, every rank writes
        its own file). Each file is that rank's own view, so it is written even when peers are gone."""
        if "{rank}" not in path and self.ctx.rank != 0:
            return
        target = path.replace("{rank}", str(self.ctx.rank))
        try:
            text = self.local_report().to_json()
            directory = os.path.dirname(target)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(target + ".tmp", "w") as f:
                f.write(text + "\n")
            os.replace(target + ".tmp", target)
        except (OSError, ValueError) as e:
            log.warning("rank %d: could not write the skew report to %s: %s", self.ctx.rank, target, e)
