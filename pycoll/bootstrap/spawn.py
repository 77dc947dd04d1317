"""How pycoll starts its own modules in new interpreters: the ranks of ``pycoll bench``, of calibration,
of the baselines.

    cmd = module_command("pycoll.bench.worker", ["--job", ...])   # then launch(n, cmd)

``python -m pycoll.bench.worker`` would not do: ``-m`` puts the current directory first on ``sys.path``,
so a rank started in the root of a clone imports the clone's ``pycoll/`` (which may have no built
native module, or older code) instead of the pycoll that started it. ``module_command`` runs this file
as a script instead. Its first lines, before any other import, take the script's own directory off
``sys.path`` and make sure ``pycoll`` resolves to the package this file belongs to; then it runs the
module as ``-m`` would (``runpy``, as ``__main__``, with ``sys.argv`` as the module expects). So a rank
imports the very pycoll its launcher imported: installed, editable or on ``PYTHONPATH`` alike.

A user's own program started by ``pycoll run`` is not started this way: it keeps Python's usual path
rules (the script's directory, or the current directory with ``-m``, first).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # sys.path[0] is this script's directory, pycoll/bootstrap/: its modules (env, net, store...) must not
    # become top-level ones. Nothing but os and sys (both loaded at start-up) is imported before this.
    _package_dir = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]

import importlib.util  # noqa: E402
import runpy  # noqa: E402
from collections.abc import Sequence  # noqa: E402

__all__ = ["module_command"]


def module_command(module: str, args: Sequence[str] = ()) -> list[str]:
    """The command line that runs pycoll's module ``module`` (e.g. ``"pycoll.bench.worker"``) with
    ``args`` in a new interpreter that imports the same pycoll as this process (module docstring)."""
    if module != "pycoll" and not module.startswith("pycoll."):
        raise ValueError(f"module_command starts pycoll's own modules, not {module!r}")
    return [sys.executable, os.path.realpath(__file__), module, *args]


def _use_package(package_dir: str) -> None:
    """Make ``import pycoll`` load the package at ``package_dir``: put the directory that holds it first
    on ``sys.path``, unless the usual search already finds it there."""
    spec = importlib.util.find_spec("pycoll")
    found = spec.origin if spec is not None else None
    if found is None or os.path.dirname(os.path.realpath(found)) != package_dir:
        sys.path.insert(0, os.path.dirname(package_dir))


def _main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {sys.executable} {__file__} pycoll.MODULE [ARGS...]")
    _use_package(_package_dir)
    module = sys.argv[1]
    sys.argv = sys.argv[1:]  # run_module sets sys.argv[0] to the module's file, as -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
