"""The cost model's persistence: what the core may load (``load_model``) and the file it lives in.

A calibration (``pycoll bench --calibrate``, pycoll/tuning/calibrate.py, which measures and fits and
sits on top of the core) is saved by ``save_model`` as JSON to ``tuning_file()``
(``$PYCOLL_TUNING_FILE``, default ``~/.cache/pycoll/tuning.json``). ``load_model`` reads it back for
``algorithm="auto"`` / ``compression="auto"``; a file written on another host is ignored.
``model_to_dict`` / ``model_from_dict`` carry a model between ranks (rank 0 loads, the others read it
from the store). ``shm_segment_bytes`` / ``shm_fragment_bytes`` are the shared-memory transport's sizes
the model predicts with.

This module imports neither the benchmark package nor calibration, nor argparse: ``pycoll.comm``
imports it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from pycoll.env import cache_home, tuning_file_setting, usable_cpus
from pycoll.tuning.links import DeviceProfile, LinkProfile
from pycoll.tuning.model import Model

__all__ = [
    "load_model",
    "model_from_dict",
    "model_to_dict",
    "save_model",
    "shm_fragment_bytes",
    "shm_segment_bytes",
    "tuning_file",
]


def tuning_file() -> Path:
    """Where calibrations are saved: ``$PYCOLL_TUNING_FILE`` or ``~/.cache/pycoll/tuning.json``.
    ``PYCOLL_TUNING_FILE=none`` makes ``load_model`` ignore any calibration (the built-in defaults)."""
    env = tuning_file_setting()
    if env:
        return Path(env)
    return Path(cache_home()) / "pycoll" / "tuning.json"


def shm_segment_bytes(world: int) -> int:
    """The shared-memory transport's message size (half a ring of slots; csrc/transport/shm.h) under the
    current environment's settings."""
    from pycoll.env import Settings

    settings = Settings.from_environ()
    return settings.slot_bytes_for(world) * settings.shm_slots // 2


def shm_fragment_bytes(world: int) -> int:
    """The shared-memory transport's fragment: one ring slot (csrc/transport/shm.h)."""
    from pycoll.env import Settings

    return Settings.from_environ().slot_bytes_for(world)


def model_to_dict(model: Model) -> dict[str, Any]:
    """``model`` as plain JSON-able data (``model_from_dict`` reads it back)."""
    return {
        "link": model.link.to_dict(),
        "device": model.device.to_dict(),
        "segment_bytes": model.segment_bytes,
        "fragment_bytes": model.fragment_bytes,
        "origin": model.origin,
    }


def model_from_dict(data: dict[str, Any]) -> Model:
    fragment = data.get("fragment_bytes")
    return Model(
        LinkProfile.from_dict(data["link"]),
        DeviceProfile.from_dict(data["device"]),
        int(data["segment_bytes"]),
        None if fragment is None else int(fragment),
        origin=str(data.get("origin", "")),
    )


def save_model(model: Model, report: dict[str, Any] | None = None, path: Path | None = None) -> Path:
    """Write ``model``'s link and device to ``path`` (default ``tuning_file()``) for this host."""
    path = path or tuning_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "host": platform.node(),
        "cpus": usable_cpus(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "link": model.link.to_dict(),
        "device": model.device.to_dict(),
        "fit": report or {},
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # readers never see half a file
    return path


def load_model(
    path: Path | None = None,
    *,
    segment_bytes: int | None = None,
    fragment_bytes: int | None = None,
    workers: int | None = None,
) -> Model | None:
    """The calibrated shared-memory model saved on this host, or None (no file, another host's file, or
    an unreadable one)."""
    if path is None and (tuning_file_setting() or "").strip().lower() == "none":
        return None
    path = path or tuning_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("host") != platform.node():
            return None
        link = LinkProfile.from_dict(data["link"])
        device = DeviceProfile.from_dict(data["device"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if workers is not None:
        device = replace(device, workers=workers)
    return Model(link, device, segment_bytes or 512 * 1024, fragment_bytes, origin=str(path))
