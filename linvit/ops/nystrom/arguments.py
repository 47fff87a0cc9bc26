"""What `nystrom_attention_qkv` takes besides qkv, checked and normalised once by the public entry
(:func:`linvit.ops.nystrom_attention_qkv`) and handed to every backend as one :class:`NystromArguments`."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from linvit.ops._cells import cell_grid
from linvit.ops._checks import check_qkv

__all__ = ["NystromArguments", "checked_arguments"]


class NystromArguments(NamedTuple):
    """The arguments of :func:`linvit.ops.nystrom_attention_qkv` after qkv, but the backend; every backend takes
    ``(qkv, arguments)``. The order is that of `torch.scriptable_nystrom_attention_qkv(qkv, *arguments)`."""

    hw: tuple[int, int]
    num_heads: int
    landmark_grid: tuple[int, int]
    pinv_iterations: int
    conv_weight: Tensor | None
    scale: float | None


def checked_arguments(qkv: Tensor, arguments: NystromArguments) -> NystromArguments:
    """``arguments`` checked against qkv (ValueError saying what is wrong) and normalised: (H, W) as ints, the
    landmark grid as a pair, pinv_iterations as an int."""
    hw = (int(arguments.hw[0]), int(arguments.hw[1]))
    num_heads, pinv_iterations, conv_weight = arguments.num_heads, arguments.pinv_iterations, arguments.conv_weight
    landmark_grid = cell_grid(arguments.landmark_grid, "landmark_grid")
    check_qkv(qkv, num_heads, hw)
    if pinv_iterations < 0:
        raise ValueError(f"pinv_iterations must be >= 0, got {pinv_iterations}; the paper uses 6.")
    if conv_weight is not None and (
        conv_weight.dim() != 4 or conv_weight.shape[:2] != (num_heads, 1) or conv_weight.shape[-1] % 2 == 0
    ):
        raise ValueError(
            f"conv_weight must be (num_heads, 1, k, k) = ({num_heads}, 1, k, k) with odd k, one kernel per head; got "
            f"{tuple(conv_weight.shape)}."
        )
    return arguments._replace(hw=hw, landmark_grid=landmark_grid, pinv_iterations=int(pinv_iterations))
