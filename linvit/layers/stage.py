"""The generic stage of every hierarchical family: downsample a map, run token blocks, back to a map.

- :class:`TokenStage`: (B, C_in, H, W) -> downsampling -> blocks on (B, N, C) tokens with the map's (H, W) ->
  optional norm -> (B, C, H', W'); gradient checkpointing per block; `set_grid` resizes its blocks' positional
  tables to a new token grid;
- :func:`conv_grids`: the token grid of every stage for an input size;
- :func:`drop_path_rates`: stochastic depth rising linearly over all blocks, split per stage;
- :func:`family_attention_options`: the settings a FLatten family gives every attention it builds;
- :func:`stage_attention_kwargs`: the keyword arguments of a stage's attention from its spec and the traits of its
  registry entry (window, positional grid, family options).

A family supplies the blocks and the downsampling (built in its own order, which fixes the seeded weights); the
stage's keys are ``downsample.*`` (or the family's name for it, e.g. PVT's ``patch_embed``), ``blocks.{i}.*`` and
``norm.*``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from linvit.attention import FocusedLinearAttention, attention_kind, attention_options
from linvit.layers.position import map_to_tokens, tokens_to_map

__all__ = ["TokenStage", "conv_grids", "drop_path_rates", "family_attention_options", "stage_attention_kwargs"]


def conv_grids(
    img_size: tuple[int, int], num_stages: int, stem: tuple[int, int, int], downsample: tuple[int, int, int]
) -> list[tuple[int, int]]:
    """The token grid of every stage behind a stem and downsamplings given as (kernel, stride, padding)
    convolutions; (1, s, 0) stands for any stride-s step that rounds up (a padded patchify, a merge of a padded map).
    """

    def out(size: int, conv: tuple[int, int, int]) -> int:
        kernel, stride, padding = conv
        return (size + 2 * padding - kernel) // stride + 1

    grids = [(out(img_size[0], stem), out(img_size[1], stem))]
    for _ in range(num_stages - 1):
        grids.append((out(grids[-1][0], downsample), out(grids[-1][1], downsample)))
    return grids


def drop_path_rates(drop_path_rate: float, depths: Sequence[int]) -> list[list[float]]:
    """Per stage, the stochastic-depth rate of each block: rising linearly from 0 to ``drop_path_rate`` over all
    blocks (plain Python: works under the meta device)."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
    starts = [sum(depths[:i]) for i in range(len(depths))]
    return [rates[start : start + depth] for start, depth in zip(starts, depths)]


def family_attention_options(
    qkv_bias: bool, attn_drop: float, proj_drop: float, focusing_factor: float, dwc_kernel_size: int, **extra: Any
) -> dict[str, Any]:
    """The ``options`` of `stage_attention_kwargs` that a FLatten family's constructor takes for every attention it
    builds: the qkv bias, the dropouts, FLatten's focusing power and depthwise-conv kernel, and ``extra``."""
    return {
        "qkv_bias": qkv_bias,
        "attn_drop": attn_drop,
        "proj_drop": proj_drop,
        "focusing_factor": focusing_factor,
        "dwc_kernel_size": dwc_kernel_size,
        **extra,
    }


def stage_attention_kwargs(
    name: str,
    explicit: Mapping[str, Any],
    options: Mapping[str, Any],
    *,
    window_size: Any = None,
    pos_size: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of a stage's attention ``name`` (a registry name).

    ``options`` are the family's settings for any attention (``qkv_bias``, dropouts, ``focusing_factor``, ...), kept
    where the module takes them; ``window_size`` goes to windowed kinds and ``pos_size`` (the stage's token grid) to
    kinds with a positional table, unless ``None``; ``explicit`` (the stage's spec) overrides them all.
    """
    kind = attention_kind(name)
    options = dict(options)
    if kind.windowed and window_size is not None:
        options["window_size"] = window_size
    if kind.positional_size and pos_size is not None:
        options["pos_size"] = pos_size
    return attention_options(name, options, explicit)


class TokenStage(nn.Module):
    """Downsampling, then blocks on tokens, then an optional norm; NCHW maps in and out.

    Args:
        blocks: modules called as ``block(x, hw)`` on (B, N, C) tokens, hw = (H, W).
        downsample: (B, C_in, H, W) -> (B, C, H', W'), or None in a stage that keeps its input's size.
        norm: a norm over the channels of the tokens after the blocks, or None.
        downsample_name: the key of the downsampling (``downsample``; PVT's ``patch_embed``). A stage that names it
            otherwise overrides `downsample_map` to call it.
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        downsample: nn.Module | None = None,
        norm: nn.Module | None = None,
        downsample_name: str = "downsample",
    ):
        super().__init__()
        self.grad_checkpointing = False
        self.add_module(downsample_name, downsample if downsample is not None else nn.Identity())
        self.blocks = nn.ModuleList(blocks)
        self.norm = norm if norm is not None else nn.Identity()

    def downsample_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample_map(x)
        hw = (x.shape[2], x.shape[3])
        x = map_to_tokens(x)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
        return tokens_to_map(self.norm(x), hw)

    @torch.jit.ignore
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Resize the blocks' positional tables to a new token grid (`FocusedLinearAttention.set_pos_size`)."""
        for module in self.blocks.modules():
            if isinstance(module, FocusedLinearAttention):
                module.set_pos_size(grid)
