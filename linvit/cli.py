"""The ``linvit`` command: one sub-command per module in :mod:`linvit.commands`.

Each module there defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
They are imported only when their sub-command runs, so ``linvit --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import linvit.commands


def _command_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(linvit.commands.__path__) if not m.name.startswith("_"))


def _load(name: str):
    return importlib.import_module(f"linvit.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="linvit", description="Linear-attention vision transformers, native to timm.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_names():
        module = _load(name)
        command = sub.add_parser(name.replace("_", "-"), help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
