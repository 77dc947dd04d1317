"""The flight recorder's Python side: switched on once per process, told of each communicator, read.

The records themselves are kept natively (csrc/engine/flight_recorder.h) by the code that runs the
collectives, with the call site the binding takes from the caller's frames (csrc/python/call_site.h): the
innermost frame outside pycoll's own files, and torch's once the torch layer is imported.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from pycoll import _C
from pycoll.env import Settings

_lock = threading.Lock()
_started = False
_noted = False
#: Where live processes note their control address for ``pycoll trace dump`` (one file per process).
LIVE_DIR = "live"


def trace_dir(settings: Settings) -> Path:
    """Where records are written: PYCOLL_TRACE_DIR, else <tmp>/pycoll-trace."""
    return Path(settings.trace_dir or os.path.join(tempfile.gettempdir(), "pycoll-trace"))


def start(settings: Settings) -> None:
    """Switches the recorder on for this process (PYCOLL_TRACE, PYCOLL_TRACE_ENTRIES; the first
    communicator's settings hold), and lets probes read its stacks."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    _C.trace_configure(settings.trace_entries if settings.trace else 0)
    # pycoll's files, and the standard library's thread machinery: a collective run on a worker thread
    # whose caller is not known has no call site, rather than concurrent.futures' line.
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    internal_paths([package, threading.__file__, os.path.dirname(concurrent.futures.__file__) + os.sep])
    main = threading.main_thread()
    _C.trace_start_stacks(main.native_id or 0, main.ident or 0)
    atexit.register(_C.trace_stop_stacks)


def internal_paths(prefixes: list[str]) -> None:
    """Frames of files under these directories are not call sites (pycoll's own; the torch layer adds
    torch's)."""
    _C.trace_internal_paths(prefixes)


def comm_name(plane: Any) -> str:
    """A communicator's name in the records: its fault plane's id and epoch, the same on every rank; without a
    plane, one of this process's own."""
    return str(plane.id) if plane is not None else f"local-{os.getpid()}"


def comm_id(name: str, rank: int, world: int, epoch: int, members: list[str]) -> int:
    """A new communicator's id in the recorder: its records carry it, its probes this info and its members'
    control addresses (``pycoll trace dump`` reaches every member through them)."""
    info = {"name": name, "rank": rank, "world": world, "epoch": epoch}
    return _C.trace_comm_id(json.dumps(info), json.dumps(members))


def register(native: Any, name: str, rank: int, world: int, epoch: int, members: list[str]) -> None:
    """Names a new communicator's native side in the recorder (``comm_id``)."""
    native.trace_comm = comm_id(name, rank, world, epoch, members)


def note_live(settings: Settings, address: str) -> None:
    """Notes this process's control address where ``pycoll trace dump`` looks for the job's processes on
    this host (removed at exit; one left by a killed process is skipped and removed by the command)."""
    global _noted
    with _lock:
        if _noted:  # one control listener per process: its address is noted once
            return
        _noted = True
    live = trace_dir(settings) / LIVE_DIR
    path = live / f"{os.getpid()}.json"
    try:
        live.mkdir(parents=True, exist_ok=True)
        live_notes(live)  # prunes the notes of processes that were killed (no exit handler ran)
        path.write_text(json.dumps({"pid": os.getpid(), "address": address}))
    except OSError:
        return  # a read-only or full temporary directory: the command can still be given the address
    atexit.register(_forget, path)


def live_notes(live: Path) -> list[dict[str, Any]]:
    """The notes in ``live`` of processes still running ({"pid", "address"}); those of processes that are
    gone are removed."""
    found = []
    for note in sorted(live.glob("*.json")):
        try:
            data = json.loads(note.read_text())
            os.kill(int(data["pid"]), 0)
        except ProcessLookupError:
            _forget(note)
            continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(data)
    return found


def _forget(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def local_report(records: int = 0) -> dict[str, Any]:
    """This process's report, as a probe of it gets it without stacks: its communicators and its last
    ``records`` records (0: none)."""
    return dict(json.loads(_C.trace_report(records, 0)))
