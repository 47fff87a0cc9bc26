"""``python -m linvit_cli ...``: the ``linvit`` console script."""

import sys

from linvit_cli import main

sys.exit(main())
