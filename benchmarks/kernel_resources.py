"""``python -m benchmarks.kernel_resources``: registers, spills and shared memory of every Triton kernel for a CUDA
target, without a GPU (:mod:`linvit.bench.kernel_resources`)."""

import sys

from linvit.bench.kernel_resources import main

if __name__ == "__main__":
    sys.exit(main())
