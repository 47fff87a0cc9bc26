"""The ``linvit`` command: one sub-command per module in :mod:`linvit.commands`.

Each module there defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; one that sets
``RAW_ARGUMENTS = True`` gets its arguments unparsed through ``run_arguments(list) -> int`` (``linvit train``).
The console script (:mod:`linvit_cli`) builds the parser before ``linvit/__init__.py`` has run; a command module
imports nothing heavy at its top or in ``add_arguments`` (torch, timm, Lightning: inside ``run``), so ``linvit --help``
and ``linvit CMD --help`` answer at once. :func:`load_library` finishes ``import linvit`` (the models registered with
timm) before any command runs.
A command with ``--json`` writes its JSON to ``args.data_stream`` (stdout); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys

import linvit.commands


def load_library() -> None:
    """Finish ``import linvit`` if the console script deferred it: every linvit model registered with timm.

    A no-op when ``linvit`` was imported the ordinary way (``python -m linvit.cli``, ``from linvit.cli import main``).
    """
    finish_import = sys.modules["linvit"].__dict__.pop("_finish_import", None)
    if finish_import is not None:
        finish_import()


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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].replace("-", "_") in _command_names():
        module = _load(argv[0].replace("-", "_"))
        if getattr(module, "RAW_ARGUMENTS", False):  # e.g. `linvit train`: Hydra parses the rest
            return int(module.run_arguments(argv[1:]) or 0)  # loads the library when it needs it
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    load_library()
    if not getattr(args, "json", False):
        return int(args._run(args) or 0)
    # --json: the data, and only the data, on stdout; whatever else writes to stdout while the command runs (progress
    # bars, tables, prints of libraries) goes to stderr. A command writes its JSON to `args.data_stream`.
    args.data_stream = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
