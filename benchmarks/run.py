"""``python -m benchmarks.run``: the benchmark suite (:mod:`linvit.bench.run`), results in ``benchmarks/results/``."""

import sys
from pathlib import Path

from linvit.bench import run as suite

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    return suite.main(argv, results_dir=RESULTS, prog="python -m benchmarks.run")


if __name__ == "__main__":
    sys.exit(main())
