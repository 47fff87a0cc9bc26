"""``python -m benchmarks.profile_ops``: where the time goes, per kind of work (:mod:`linvit.bench.profile_ops`)."""

import sys

from linvit.bench.profile_ops import main

if __name__ == "__main__":
    sys.exit(main())
