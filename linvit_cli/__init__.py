"""The ``linvit`` console script: :func:`linvit.cli.main` without importing torch or timm until a command runs.

``import linvit`` runs ``linvit/__init__.py``, which registers every model with timm (torch and timm: seconds). This
entry point lives outside the package so that ``linvit --help`` and ``linvit CMD --help`` skip that: it puts the
``linvit`` package in ``sys.modules`` with its ``__init__`` not yet run, builds the parser from :mod:`linvit.cli` and
the command modules (which import nothing heavy at the top), and leaves ``linvit.cli`` to finish the import
(:func:`linvit.cli.load_library`) just before a command runs, so every command finds linvit as ``import linvit``
leaves it.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``linvit`` command line on ``argv`` (default ``sys.argv[1:]``)."""
    if "linvit" not in sys.modules:
        spec = importlib.util.find_spec("linvit")
        package = importlib.util.module_from_spec(spec)
        # linvit.cli.load_library calls this (once) before a command runs: the package's __init__, run in place
        package._finish_import = lambda: spec.loader.exec_module(package)
        sys.modules["linvit"] = package
    from linvit.cli import main as linvit_main

    return linvit_main(argv)
