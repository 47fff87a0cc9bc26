"""``linvit bench``: run the benchmark suite of a linvit checkout (a thin wrapper of ``python -m benchmarks.run``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Benchmark linvit's attention and backbones against timm baselines (speed, memory, MFU); writes tables/plots."

_CHECKOUT = Path(__file__).resolve().parents[2]


def _benchmarks_run():
    """The suite lives in the checkout's ``benchmarks/`` folder, next to the ``linvit`` package (not installed)."""
    if not (_CHECKOUT / "benchmarks" / "run.py").is_file():
        raise SystemExit(
            f"linvit bench: no benchmarks/ folder next to the linvit package in {_CHECKOUT}; "
            "the suite ships with the source checkout: install linvit editable (pip install -e .) from a clone"
        )
    if str(_CHECKOUT) not in sys.path:
        sys.path.insert(0, str(_CHECKOUT))
    import benchmarks.run

    return benchmarks.run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        _benchmarks_run().add_arguments(parser)
    except SystemExit as error:  # keep `linvit --help` working from a non-editable install
        parser.description = f"{HELP} ({error})"


# Installed without the checkout (a wheel): take any arguments (linvit.cli passes them unparsed) and say where the
# suite is, instead of argparse's "unrecognized arguments: --quick".
RAW_ARGUMENTS = not (_CHECKOUT / "benchmarks" / "run.py").is_file()


def run_arguments(arguments: list[str]) -> int:
    try:
        _benchmarks_run()
    except SystemExit as error:
        sys.stderr.write(f"{error}\n")
    return 2


def run(args: argparse.Namespace) -> int:
    module = _benchmarks_run()
    command = list(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "bench" else []
    return module.run(args, command=command)
