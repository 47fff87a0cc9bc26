"""``linvit bench``: the benchmark suite of :mod:`linvit.bench` (``python -m benchmarks.run`` in a checkout)."""

from __future__ import annotations

import argparse
import sys

HELP = "Benchmark linvit's attention and backbones against timm baselines (speed, memory, MFU); writes tables/plots."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from linvit.bench.run import add_arguments as add_suite_arguments

    add_suite_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from linvit.bench.run import run as run_suite

    command = list(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "bench" else []
    return run_suite(args, command=command)
