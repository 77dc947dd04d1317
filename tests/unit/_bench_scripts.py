"""The scripts of bench/ as modules, for the unit tests of their pure parts (bench/ is no package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(script: str, name: str) -> ModuleType:
    """bench/``script`` imported as module ``name`` (registered in sys.modules, which dataclasses need)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
