"""The ``pycoll`` console script: ``pycoll <command> ...``.

Adding a command: write ``pycoll/cli/<name>.py`` with ``add_parser(subparsers) -> ArgumentParser`` that
calls ``subparsers.add_parser("<name>", ...)``, adds its options and ``set_defaults(func=...)``, where
``func(args: argparse.Namespace) -> int`` returns the exit code; then list the module in
``SUBCOMMANDS`` below. Keep heavy imports (numpy, torch, the native module) inside ``func`` so that
``pycoll --help`` and ``pycoll run`` stay fast and work when those are missing. A command module that
fails to import does not break the others: invoking it reports the import error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, Callable

from pycoll._version import __version__

__all__ = ["SUBCOMMANDS", "add_command", "build_parser", "main"]

#: (command name, module defining ``add_parser``), in the order ``pycoll --help`` lists them.
SUBCOMMANDS: list[tuple[str, str]] = [
    ("run", "pycoll.cli.run"),
    ("bench", "pycoll.cli.bench"),
    ("doctor", "pycoll.cli.doctor"),
    ("model", "pycoll.cli.model"),
    ("trace", "pycoll.cli.trace"),
]


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    description: str,
    epilog: str | None,
    configure: Callable[[argparse.ArgumentParser], None],
    func: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """The usual ``add_parser`` body of a command module: register ``name`` with its help, description
    and (raw-formatted) epilog, add its options with ``configure``, and point ``func`` at its main."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(parser)
    parser.set_defaults(func=func)
    return parser


def _broken_command(name: str, module: str, error: BaseException) -> Any:
    def func(_args: argparse.Namespace) -> int:
        print(f"pycoll {name}: cannot load {module}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1

    return func


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pycoll", description="pycoll: collective communication with compression."
    )
    parser.add_argument("--version", action="version", version=f"pycoll {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    subparsers.required = True
    for name, module in SUBCOMMANDS:
        try:
            importlib.import_module(module).add_parser(subparsers)
        except Exception as exc:  # noqa: BLE001 - one broken command must not hide the others
            sub = subparsers.add_parser(name, help=f"(unavailable: {exc})", add_help=False)
            sub.add_argument("rest", nargs=argparse.REMAINDER)
            sub.set_defaults(func=_broken_command(name, module, exc))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
