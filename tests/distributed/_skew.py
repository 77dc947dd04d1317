"""Rank bodies of test_skew.py (not a test module): skew reports (issue 19) on real rank processes.

Every body makes a communicator of its own (``fresh``) over the pool's store, with per-rank settings
(transport, a fake clock offset, skew off, a report path, a window), runs a schedule of all-reduces on it
and returns plain data: the gathered report (``skew().to_dict()``, rank 0's view on every rank), this
rank's own view (``skew_local()``), the native recorder's per-collective lateness (its recent window,
exact), and the ground truth: this rank's CLOCK_MONOTONIC (the recorder's clock, shared by every process
of the host) just before each all-reduce call. The communicator is finalized before the body returns, so
the pool's own one is left as it was.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

import pycoll
from pycoll.comm import Communicator
from pycoll.errors import InvalidUsageError

#: Seconds every deadline inside a body is bounded by (the harness deadline is longer).
BODY_TIMEOUT = 20.0
#: Elements of the all-reduces the schedules run (small: the time is in the scripted delays).
COUNT = 256


def fresh(comm: Any, rank: int, world: int, **changes: Any) -> Communicator:
    """A new communicator over the pool's store, with the pool's settings but ``changes``."""
    settings = dataclasses.replace(comm.settings, **changes)
    return Communicator(comm.store, rank, world, timeout=BODY_TIMEOUT, settings=settings)


def raw_late_ms(c: Communicator) -> list[list[float]]:
    """The native recorder's recent window, [collective][rank], in ms (oldest first; every user
    collective of the schedules below, which are shorter than the window)."""
    c.native().skew_flush()
    snap = c.native().skew_snapshot()
    return (np.asarray(snap["recent_late_ns"], dtype=np.float64) / 1e6).tolist()


def scripted(
    comm: Any,
    rank: int,
    world: int,
    *,
    n: int,
    delays: dict[int, int],
    delay_s: float,
    window: int | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """``n`` all-reduces; before all-reduce ``i`` rank ``delays[i]`` (if any) sleeps ``delay_s``. The
    reports after them: whole run (``skew()``), its window (``skew(window=)``), this rank's own view."""
    c = fresh(comm, rank, world, **changes)
    try:
        x = np.full(COUNT, rank + 1, np.float32)
        want = world * (world + 1) // 2
        entered = []
        for i in range(n):
            if delays.get(i) == rank:
                time.sleep(delay_s)
            y = x.copy()
            entered.append(time.monotonic_ns())
            pycoll.allreduce(y, comm=c, timeout=BODY_TIMEOUT)
            assert np.all(y == want), f"all-reduce {i}: {y[:4]} != {want}"
        report = c.skew(timeout=BODY_TIMEOUT)
        windowed = c.skew(window=window, timeout=BODY_TIMEOUT) if window is not None else None
        local = c.skew_local()
        return {
            "report": report.to_dict(),
            "json": report.to_json(),
            "windowed": None if windowed is None else windowed.to_dict(),
            "local": local.to_dict(),
            "raw_ms": raw_late_ms(c),
            "entered_ns": entered,
            "transport": c.transport,
        }
    finally:
        c.finalize()


def stragglers(
    comm: Any,
    rank: int,
    world: int,
    *,
    n: int,
    delayed: int | None,
    delay_s: float,
    late_ms: float,
    window: int,
    callback: bool = True,
    **changes: Any,
) -> dict[str, Any]:
    """``n`` all-reduces with ``on_straggler(late_ms=, window=)`` (``callback=False``: none, for the notice
    of PYCOLL_STRAGGLER_MS in ``changes``); rank ``delayed`` (None: nobody) sleeps ``delay_s`` before every
    one. The events this rank's callback got (each with the all-reduce after which it came), what it got
    after ``notice.remove()`` and a window more, and the ``pycoll`` WARNINGs logged on this rank."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("pycoll")
    logger.addHandler(handler)
    c = fresh(comm, rank, world, **changes)
    try:
        events: list[dict[str, Any]] = []
        current = [-1]

        def on_event(event: Any) -> None:
            events.append({**dataclasses.asdict(event), "after": current[0]})

        notice = c.on_straggler(on_event, late_ms=late_ms, window=window) if callback else None
        x = np.ones(COUNT, np.float32)
        entered = []
        for i in range(n):
            current[0] = i
            if rank == delayed:
                time.sleep(delay_s)
            entered.append(time.monotonic_ns())
            pycoll.allreduce(x, "max", comm=c, timeout=BODY_TIMEOUT)
        if notice is None:
            return {"warnings": [r.getMessage() for r in records], "entered_ns": entered}
        notice.remove()
        # After remove(): a window more (still delayed) fires nothing.
        removed_at = len(events)
        for i in range(n, n + window + 1):
            current[0] = i
            if rank == delayed:
                time.sleep(delay_s)
            pycoll.allreduce(x, "max", comm=c, timeout=BODY_TIMEOUT)
        report = c.skew(timeout=BODY_TIMEOUT)
        return {
            "events": events,
            "after_remove": len(events) - removed_at,
            "warnings": [r.getMessage() for r in records],
            "entered_ns": entered,
            "report": report.to_dict(),
        }
    finally:
        logger.removeHandler(handler)
        c.finalize()


def clocks(
    comm: Any,
    rank: int,
    world: int,
    *,
    n: int,
    delays: dict[int, int],
    delay_s: float,
    offsets_s: list[float],
    transport: str,
) -> dict[str, Any]:
    """``scripted`` on ranks whose clocks are shifted by ``offsets_s[rank]`` (PYCOLL_FAKE_CLOCK_OFFSET_S),
    plus this rank's estimate of every rank's offset (``skew_local().clock_*``)."""
    out = scripted(
        comm,
        rank,
        world,
        n=n,
        delays=delays,
        delay_s=delay_s,
        transport=transport,
        fake_clock_offset_s=offsets_s[rank],
    )
    out["offset_ms"] = out["local"]["clock"]["offset_ms"]
    out["uncertainty_ms"] = out["local"]["clock"]["uncertainty_ms"]
    return out


def report_files(comm: Any, rank: int, world: int, *, n: int, path: str) -> dict[str, Any]:
    """``n`` all-reduces on a communicator whose settings write the skew report to ``path`` (may hold
    ``{rank}``) at finalize."""
    c = fresh(comm, rank, world, skew_report=path)
    x = np.ones(COUNT, np.float32)
    for _ in range(n):
        pycoll.allreduce(x, "max", comm=c, timeout=BODY_TIMEOUT)
    local = c.skew_local().to_dict()
    c.finalize()
    return {"local": local}


def skew_off(comm: Any, rank: int, world: int, *, n: int, off: list[int], **changes: Any) -> dict[str, Any]:
    """``n`` all-reduces, a barrier and a broadcast with skew recording off on the ranks in ``off``: the
    gathered report (``pycoll.skew_report``), this rank's own view, and what on_straggler said (it must
    refuse where recording is off)."""
    c = fresh(comm, rank, world, skew=rank not in off, **changes)
    try:
        refused = None
        try:
            notice = c.on_straggler(lambda e: None, late_ms=1.0, window=10)
        except InvalidUsageError as e:
            refused = str(e)
        else:
            notice.remove()
        x = np.full(COUNT, rank + 1, np.float32)
        for _ in range(n):
            y = x.copy()
            pycoll.allreduce(y, comm=c, timeout=BODY_TIMEOUT)
            assert np.all(y == world * (world + 1) // 2), "all-reduce results"
        pycoll.barrier(comm=c, timeout=BODY_TIMEOUT)
        y = x.copy()
        pycoll.broadcast(y, 0, comm=c, timeout=BODY_TIMEOUT)
        assert np.all(y == 1), "broadcast results"
        report = pycoll.skew_report(c, timeout=BODY_TIMEOUT)  # the module-level spelling of c.skew()
        return {
            "report": report.to_dict(),
            "json": report.to_json(),
            "local": c.skew_local().to_dict(),
            "refused": refused,
            "enabled": bool(c.native().skew_enabled),
            "transport": c.transport,
        }
    finally:
        c.finalize()


def limits(comm: Any, rank: int, world: int, *, n: int, capacity: int) -> dict[str, Any]:
    """A recent window of ``capacity`` collectives (PYCOLL_SKEW_WINDOW) and PYCOLL_STRAGGLER_MS set (its
    notice's window is cut to the capacity): on_straggler refuses a longer window and takes one that
    fits; ``n`` all-reduces, half of them asynchronous (counted as well), then the reports."""
    c = fresh(comm, rank, world, skew_window=capacity, straggler_ms=1000.0)
    try:
        errors = {}
        for name, kwargs in {
            "too long": {"window": capacity + 1},
            "zero": {"window": 0},
            "not an int": {"window": 2.5},
            "late_ms 0": {"late_ms": 0.0},
            "not callable": {"callback": 5},
        }.items():
            args = {"callback": lambda e: None, "late_ms": 1.0, "window": 5, **kwargs}
            cb = args.pop("callback")
            try:
                c.on_straggler(cb, **args).remove()
            except InvalidUsageError as e:
                errors[name] = str(e)
        fits = c.on_straggler(None, late_ms=1000.0, window=capacity)
        x = np.ones(COUNT, np.float32)
        for _ in range(n // 2):
            pycoll.allreduce(x, "max", comm=c, timeout=BODY_TIMEOUT)
        works = [
            pycoll.allreduce(x, "max", comm=c, timeout=BODY_TIMEOUT, async_op=True) for _ in range(n - n // 2)
        ]
        for w in works:
            w.wait()
        fits.remove()
        fits.remove()  # twice: nothing happens
        bad_window = None
        try:
            c.skew(window=-1)
        except InvalidUsageError as e:
            bad_window = str(e)
        return {
            "errors": errors,
            "report": c.skew(timeout=BODY_TIMEOUT).to_dict(),
            "small": c.skew(window=3, timeout=BODY_TIMEOUT).to_dict(),
            "zero": c.skew(window=0, timeout=BODY_TIMEOUT).to_dict(),
            "bad_window": bad_window,
        }
    finally:
        c.finalize()


def raising_callback(
    comm: Any, rank: int, world: int, *, delayed: int, window: int, extra: int
) -> dict[str, Any]:
    """A callback that raises: the collective after which it runs (the one that completed the window, or
    the end of its batch) raises it on every rank, with its result complete, and the communicator stays
    usable (docs/skew.md). ``window + extra`` all-reduces, then one more."""
    c = fresh(comm, rank, world)
    try:
        seen: list[int] = []

        def boom(event: Any) -> None:
            seen.append(event.rank)
            raise RuntimeError(f"boom on rank {rank}")

        c.on_straggler(boom, late_ms=5.0, window=window)
        x = np.full(COUNT, rank + 1, np.float32)
        want = world * (world + 1) // 2
        raised_at, message, complete = None, None, None
        for i in range(window + extra):
            if rank == delayed:
                time.sleep(0.01)
            y = x.copy()
            try:
                pycoll.allreduce(y, comm=c, timeout=BODY_TIMEOUT)
            except RuntimeError as e:
                raised_at, message, complete = i, str(e), bool(np.all(y == want))
        y = x.copy()
        pycoll.allreduce(y, comm=c, timeout=BODY_TIMEOUT)
        return {
            "raised_at": raised_at,
            "message": message,
            "complete": complete,
            "after_ok": bool(np.all(y == want)),
            "seen": seen,
            "count": c.skew(timeout=BODY_TIMEOUT).to_dict()["collectives"],
        }
    finally:
        c.finalize()
