"""What `linformer_attention_qkv` takes besides qkv, checked and normalised once by the public entry
(:func:`linvit.ops.linformer_attention_qkv`) and handed to every backend as one :class:`LinformerArguments`."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from linvit.ops._cells import cell_grid
from linvit.ops._checks import check_qkv

__all__ = ["LinformerArguments", "checked_arguments"]


class LinformerArguments(NamedTuple):
    """The arguments of :func:`linvit.ops.linformer_attention_qkv` after qkv, but the backend; every backend takes
    ``(qkv, arguments)``. The order is that of `torch.scriptable_linformer_attention_qkv(qkv, *arguments)`."""

    hw: tuple[int, int]
    num_heads: int
    key_projection: Tensor | None
    value_projection: Tensor | None
    pool_grid: tuple[int, int] | None
    dropout_p: float
    scale: float | None


def checked_arguments(qkv: Tensor, arguments: LinformerArguments) -> LinformerArguments:
    """``arguments`` checked against qkv (ValueError saying what is wrong) and normalised: (H, W) as ints, the pooled
    grid as a pair, dropout_p as a float."""
    hw = (int(arguments.hw[0]), int(arguments.hw[1]))
    key_projection, value_projection = arguments.key_projection, arguments.value_projection
    dropout_p = arguments.dropout_p
    pool_grid = None if arguments.pool_grid is None else cell_grid(arguments.pool_grid, "pool_grid")
    check_qkv(qkv, arguments.num_heads, hw)
    learned = key_projection is not None or value_projection is not None
    if learned == (pool_grid is not None):
        raise ValueError(
            "give either key_projection and value_projection (the learned (k, N) projections) or pool_grid (the "
            f"cells of the pooled projection), not {'both' if learned else 'neither'}."
        )
    if learned:
        if key_projection is None or value_projection is None:
            raise ValueError("the learned form needs both key_projection and value_projection, (k, N) each.")
        for name, projection in (("key_projection", key_projection), ("value_projection", value_projection)):
            if projection.dim() != 2 or projection.shape[1] != qkv.shape[1] or projection.shape != key_projection.shape:
                raise ValueError(
                    f"{name} must be (k, N) = (k, {qkv.shape[1]}) for hw={hw}, the same for keys and values; got "
                    f"{tuple(projection.shape)}. Resize a projection learned on another grid first "
                    "(LinformerAttention does, see its docstring)."
                )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}.")
    return arguments._replace(hw=hw, pool_grid=pool_grid, dropout_p=float(dropout_p))
