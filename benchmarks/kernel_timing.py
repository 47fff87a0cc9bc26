"""``python -m benchmarks.kernel_timing --out DIR``: on a GPU, each kernel of the focused attention's forward and
backward timed at the cost figure's benchmark shape (:mod:`linvit.bench.kernel_timing`)."""

import sys

from linvit.bench.kernel_timing import main

if __name__ == "__main__":
    sys.exit(main())
