"""Transition: the window helpers moved to linvit.ops.windows (removed once every importer is updated)."""

from linvit.attention._checks import check_heads, to_pair  # noqa: F401
from linvit.ops.windows import *  # noqa: F401,F403
from linvit.ops.windows import check_token_grid, exporting, wrap_index  # noqa: F401
