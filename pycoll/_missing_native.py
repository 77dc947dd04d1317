"""What ``import pycoll._C`` says when the native module is not there.

The usual cause is a source tree: Python started in the root of a clone puts the current directory
first on ``sys.path``, so ``import pycoll`` finds the clone's ``pycoll/``, in which the extension was
never built, instead of the installed package. A bare ``No module named 'pycoll._C'`` tells a newcomer
nothing. ``install()`` appends a finder to the end of ``sys.meta_path``; it is asked only after every
other finder (the path finder, an editable install's) has failed to find ``pycoll._C``, and raises an
``ImportError`` that says what happened and what to do. Everything else it leaves alone, and
``import pycoll`` itself (or ``pycoll.algorithms``, pure Python) never needs the native module.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from typing import Any

NATIVE = "pycoll._C"
#: Files that mark the root of pycoll's source tree (``setup.py`` builds ``pycoll._C`` from ``csrc/``).
_SOURCE_MARKERS = ("setup.py", "CMakeLists.txt", "csrc")


def is_source_tree(root: str) -> bool:
    """Whether ``root`` is the root of a pycoll source tree (a clone, or an unpacked sdist)."""
    return all(os.path.exists(os.path.join(root, name)) for name in _SOURCE_MARKERS)


def _other_builds(package_dir: str) -> list[str]:
    """Native modules in ``package_dir`` that this interpreter cannot load (built for another Python)."""
    try:
        names = os.listdir(package_dir)
    except OSError:
        return []
    ours = {"_C" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES}
    return sorted(n for n in names if n.startswith("_C.") and n.endswith(".so") and n not in ours)


def message(package_dir: str) -> str:
    """Why ``pycoll._C`` is missing from the pycoll package at ``package_dir``, and what to do."""
    root = os.path.dirname(package_dir)
    others = _other_builds(package_dir)
    found = ""
    if others:
        found = (
            f" (it holds {', '.join(others)}, built for another Python; this is Python "
            f"{sys.version_info.major}.{sys.version_info.minor})"
        )
    if is_source_tree(root):
        try:
            in_cwd = os.path.samefile(root, ".")
        except OSError:  # the current directory was removed
            in_cwd = False
        here = " (the current directory, which Python searches first)" if in_cwd else ""
        return (
            f"you are importing pycoll from its source tree at {root}{here}, which has no built native "
            f"module pycoll._C{found}. To use the installed pycoll, run Python from another directory "
            f"(or take the tree off PYTHONPATH); to use this tree, build it in place with `pip install -e .` "
            f"in {root}."
        )
    return (
        f"pycoll's native module pycoll._C is missing from {package_dir}{found}: this installation of "
        "pycoll is incomplete. Reinstall it: `pip install --force-reinstall --no-deps pycoll`, or "
        "`pip install .` in a clone."
    )


class _MissingNativeFinder:
    """Last on ``sys.meta_path``: reached for ``pycoll._C`` only when nothing else could find it."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname != NATIVE:
            return None
        package = sys.modules.get("pycoll")
        package_file = getattr(package, "__file__", None)
        if not package_file:
            return None
        # ImportError, not ModuleNotFoundError: ``from pycoll import _C`` would swallow the latter (a
        # missing submodule named in a fromlist) and say only "cannot import name '_C'".
        raise ImportError(message(os.path.dirname(os.path.abspath(package_file))), name=NATIVE)


def install() -> None:
    """Append the finder to ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MissingNativeFinder) for f in sys.meta_path):
        sys.meta_path.append(_MissingNativeFinder())
