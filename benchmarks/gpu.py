"""``python -m benchmarks.gpu`` (``bash benchmarks/run_gpu.sh``): the GPU target table (:mod:`linvit.bench.gpu`),
results in ``benchmarks/results/cuda``."""

import sys
from pathlib import Path

from linvit.bench import gpu

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    return gpu.main(argv, results_dir=RESULTS, prog="python -m benchmarks.gpu")


if __name__ == "__main__":
    sys.exit(main())
