"""``python -m benchmarks.report [OUT]``: redraw ``RESULTS.md`` and the plots of a results folder without measuring
(:mod:`linvit.bench.report`; default ``benchmarks/results/cpu``)."""

import sys
from pathlib import Path

from linvit.bench import report

if __name__ == "__main__":
    sys.exit(report.main(default=Path(__file__).resolve().parent / "results" / "cpu"))
