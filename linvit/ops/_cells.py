"""Means over a grid of cells of a token map: Nyströmformer's landmarks and Linformer's pooled projection.

A (gh, gw) grid of cells covers an (H, W) map as adaptive average pooling does: cell (i, j) holds rows
floor(i·H/gh) .. ceil((i+1)·H/gh) - 1 and columns floor(j·W/gw) .. ceil((j+1)·W/gw) - 1, so every token belongs to
a cell for any H and W, and neighbouring cells overlap by one row or column where the sizes do not divide. When gh
divides H and gw divides W the cells are the paper's segments (consecutive, equal, disjoint). A sequence is the map
(1, N) with the grid (1, m).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["cell_bounds", "cell_grid", "cell_means", "cell_means_reference", "clamp_cells"]


def cell_grid(cells, name: str) -> tuple[int, int]:
    """An int s (an s×s grid) or a pair (gh, gw) as a pair of positive ints; ValueError naming ``name`` otherwise."""
    pair = (cells, cells) if isinstance(cells, int) else tuple(cells)
    if len(pair) != 2 or not all(isinstance(c, int) and c >= 1 for c in pair):
        raise ValueError(f"{name} must be a positive int s (an s×s grid) or a pair (h, w) of them, got {cells!r}.")
    return int(pair[0]), int(pair[1])


def clamp_cells(cells: tuple[int, int], hw: tuple[int, int]) -> tuple[int, int]:
    """The grid clamped to the map per dimension: a map smaller than the grid has one cell per token there."""
    return min(cells[0], hw[0]), min(cells[1], hw[1])


def cell_bounds(size: int, cells: int) -> list[tuple[int, int]]:
    """[start, end) of each of ``cells`` cells along a dimension of ``size`` tokens (adaptive pooling's cells)."""
    return [((i * size) // cells, -((-(i + 1) * size) // cells)) for i in range(cells)]


def cell_means(x: Tensor, hw: tuple[int, int], cells: tuple[int, int]) -> Tensor:
    """(B, H·W, C) tokens -> (B, gh·gw, C): the mean of each cell, cells row-major (one adaptive average pool).

    ``cells`` must not exceed ``hw`` (see :func:`clamp_cells`). Runs in x's dtype.
    """
    batch, channels = x.shape[0], x.shape[-1]
    image = x.reshape(batch, hw[0], hw[1], channels).permute(0, 3, 1, 2)  # channels-last (B, C, H, W)
    pooled = F.adaptive_avg_pool2d(image, [cells[0], cells[1]])
    return pooled.flatten(2).transpose(1, 2)


def cell_means_reference(x: Tensor, hw: tuple[int, int], cells: tuple[int, int]) -> Tensor:
    """:func:`cell_means` written out: one mean per cell over its tokens, by their bounds (slow, for references)."""
    grid = x.reshape(x.shape[0], hw[0], hw[1], x.shape[-1])
    means = [
        grid[:, top:bottom, left:right].mean(dim=(1, 2))
        for top, bottom in cell_bounds(hw[0], cells[0])
        for left, right in cell_bounds(hw[1], cells[1])
    ]
    return torch.stack(means, dim=1)
