"""Shared by the baseline scripts: load ``pycoll.benchmark`` without importing the rest of pycoll.

``pycoll/benchmark.py`` depends only on numpy, but ``import pycoll.benchmark`` would first run
``pycoll/__init__.py``, which loads the native module. The baselines must run even where pycoll is not
built, so the file is loaded by path from this checkout; only when the scripts are used outside a
checkout do they fall back to the installed package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_MODULE_NAME = "_pycoll_benchmark_standalone"


def load_benchmark() -> ModuleType:
    """The ``pycoll.benchmark`` module, loaded from ../../pycoll/benchmark.py when present."""
    if _MODULE_NAME in sys.modules:
        return sys.modules[_MODULE_NAME]
    path = Path(__file__).resolve().parents[2] / "pycoll" / "benchmark.py"
    if not path.is_file():
        import pycoll.benchmark

        return pycoll.benchmark
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module  # dataclasses look their module up here while executing
    spec.loader.exec_module(module)
    return module
