"""``python -m benchmarks.kernel_resources [--cost [--json]]``: registers, spills and (with --cost) the
warp-instructions per token of every Triton kernel for sm_90, without a GPU (:mod:`linvit.bench.kernel_resources`);
--cost writes benchmarks/results/cuda/kernel_cost_sm90.md."""

import sys
from pathlib import Path

from linvit.bench.kernel_resources import main

if __name__ == "__main__":
    sys.exit(main(default_output=Path(__file__).parent / "results" / "cuda" / "kernel_cost_sm90.md"))
