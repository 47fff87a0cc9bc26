"""Positional tables at another grid: the one resize every table goes through.

- `resize_positional_table`: a (1, h*w, C) table laid out row-major over an (h, w) token grid: FLatten's learnable
  `positional_encoding` added to the keys, PVT's absolute `pos_embed`;
- `resize_relative_position_bias`: Swin's ((2w-1)^2, heads) relative position bias table of a square window;
- `square_grid`: the grid a checkpoint's table was saved for, when only its length is known.
"""

import math

import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch import Tensor

from linvit.ops._numerics import at_least_float32
from linvit.ops.positional import resize_positional_table

__all__ = ["resize_positional_table", "resize_relative_position_bias", "square_grid"]

# a branch on the sizes: FX records one call (timm's feature extraction)
register_notrace_function(resize_positional_table)


def resize_relative_position_bias(table: Tensor, length: int) -> Tensor:
    """A ((2w-1)^2, heads) relative position bias table of a square window -> (length, heads), bicubically.

    Raises ValueError when either side is not a square (2w-1)^2 table.
    """
    old_side = math.isqrt(table.shape[0])
    new_side = math.isqrt(length)
    if old_side * old_side != table.shape[0] or new_side * new_side != length:
        raise ValueError(
            f"relative_position_bias_table of {table.shape[0]} rows cannot be resized to {length}: expected "
            "square (2w-1)^2 tables on both sides."
        )
    grid = at_least_float32(table.transpose(0, 1).reshape(1, -1, old_side, old_side))
    grid = F.interpolate(grid, size=(new_side, new_side), mode="bicubic", align_corners=False)
    return grid.reshape(-1, length).transpose(0, 1).to(table.dtype)


def square_grid(tokens: int, what: str) -> tuple[int, int]:
    """The (side, side) grid of a table with `tokens` rows; ValueError naming `what` when it is not a square."""
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(
            f"cannot resize {what}: its {tokens} positions are not a square grid, so the grid it was saved for is "
            "unknown; convert it at the resolution it was trained at."
        )
    return side, side
