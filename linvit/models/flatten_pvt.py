"""FLatten-PVT (v1): PVT with focused linear attention in every block (FLatten Transformer, ICCV 2023).

Papers:
* FLatten Transformer: Vision Transformer using Focused Linear Attention - https://arxiv.org/abs/2308.00442
* Pyramid Vision Transformer: A Versatile Backbone for Dense Prediction without Convolutions
  - https://arxiv.org/abs/2102.12122

Architecture as in the FLatten authors' release (LeapLabTHU/FLatten-Transformer, config `PVT_LA_SR_RATIOS: 1111`):
non-overlapping patch embeddings (4x4 stem, 2x2 downsampling) each with LayerNorm, a learnable absolute position
embedding added per stage, and blocks whose attention is a global focused linear attention without spatial
reduction (learnable positional encoding on the keys, depthwise 5x5 enhancement of the values) followed by a plain
MLP. The classifier averages the last stage's tokens; there is no final norm. Their options ``la_sr_ratios`` and
``attn_type`` (``attn_layers="LLSS"``: PVT's softmax attention with spatial reduction by ``sr_ratios`` in the ``S``
stages) work as in `FlattenPvtV2`.

Differences from the authors' code that do not change outputs at their resolution:
* their final `norm` is built but never used (an unused parameter under DDP); it is not built here and
  `checkpoint_filter_fn` drops it;
* `q`/`kv` are fused into linvit's `FocusedLinearAttention.qkv` by `checkpoint_filter_fn`;
* any input size: the input of each patch embedding is zero-padded on the right/bottom to a multiple of its
  stride (the authors' convolution silently drops the remainder), the position embeddings are resized bilinearly
  to the map (as the authors do) and the attention tables bicubically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import resize_positional_table, square_grid
from linvit.layers import PreNormBlock, TokenStage, conv_grids
from linvit.layers.position import tokens_to_map
from linvit.models._family import authors_release, create_family_model, one_based_stage, resize_positional_encodings
from linvit.models.flatten_pvt_v2 import (
    PVT_STAGE_SHAPES,
    FlattenPvtV2,
    PatchEmbedStage,
    _cfg,
    build_block,
    convert_authors_checkpoint,
)

__all__ = ["FlattenPvt", "checkpoint_filter_fn"]

torch.fx.wrap("resize_positional_table")


class PatchEmbed(nn.Module):
    """Non-overlapping `patch_size` convolution and LayerNorm over channels; pads the input up to a multiple of the
    patch. (B, C, H, W) -> (B, C', ceil(H / p), ceil(W / p))."""

    def __init__(self, in_chans: int, out_chans: int, patch_size: int, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, out_chans, patch_size, stride=patch_size, **dd)
        self.norm = nn.LayerNorm(out_chans, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad_h = (self.patch_size - x.shape[2] % self.patch_size) % self.patch_size
        pad_w = (self.patch_size - x.shape[3] % self.patch_size) % self.patch_size
        x = self.proj(F.pad(x, (0, pad_w, 0, pad_h)))
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class FlattenPvtStage(PatchEmbedStage):
    """Patch embedding plus an absolute position embedding (``pos_embed``, resized bilinearly to the map), then
    blocks; keys ``pos_embed``, ``patch_embed.*``, ``blocks.*``."""

    def __init__(
        self,
        patch_embed: nn.Module,
        blocks: Sequence[nn.Module],
        dim: int,
        pos_size: tuple[int, int],
        pos_drop: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__(patch_embed, blocks)
        self.pos_size = tuple(pos_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_size[0] * pos_size[1], dim, device=device, dtype=dtype))
        self.pos_drop = nn.Dropout(pos_drop)

    def downsample_map(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        hw = (x.shape[2], x.shape[3])
        position = resize_positional_table(self.pos_embed, self.pos_size, hw, "bilinear")
        return self.pos_drop(x + tokens_to_map(position, hw))

    @torch.jit.ignore
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Resize the position embedding (bilinear) and the blocks' tables (bicubic) to a new token grid."""
        if self.pos_size != tuple(grid):
            old = self.pos_embed
            with torch.no_grad():
                resized = resize_positional_table(old.detach(), self.pos_size, grid, "bilinear")
            self.pos_embed = nn.Parameter(resized, requires_grad=old.requires_grad)
            self.pos_size = tuple(grid)
        super().set_grid(grid)


class FlattenPvt(FlattenPvtV2):
    """FLatten-PVT backbone and classifier. Features are NCHW at strides 4, 8, 16, 32.

    Keyword arguments as `FlattenPvtV2`'s (``la_sr_ratios``, ``sr_ratios`` and the authors' letters in
    ``attn_layers`` too, not ``linear``, which PVT v1 lacks), plus
    ``pos_drop_rate`` (dropout after the position embeddings); the stages are PVT's (non-overlapping patch embeddings
    with position embeddings, plain MLPs, no stage norm).
    """

    group_stem = r"^stages\.0\.(?:patch_embed|pos_embed)"
    no_weight_decay_extra = ("pos_embed",)

    def __init__(self, *, pos_drop_rate: float = 0.0, **kwargs: Any):
        if "linear" in kwargs:
            raise TypeError("FlattenPvt has no linear option (PVTv2-Li's pooled keys); use FlattenPvtV2 for it.")
        self.pos_drop_rate = pos_drop_rate  # read by build_stage during the frame's construction below
        super().__init__(**kwargs)

    def build_stage(self, index: int, in_dim: int, blocks: list[dict[str, Any]], grid: tuple[int, int]) -> TokenStage:
        """Stage ``index``: 4x4 (then 2x2) patch embedding, position embedding, blocks with a plain MLP."""
        dim, dd = blocks[0]["dim"], {"device": blocks[0]["device"], "dtype": blocks[0]["dtype"]}
        patch_embed = PatchEmbed(in_dim, dim, 4 if index == 0 else 2, **dd)
        layers = [build_block(PreNormBlock, block) for block in blocks]
        return FlattenPvtStage(patch_embed, layers, dim, grid, self.pos_drop_rate, **dd)

    def init_tables(self) -> None:
        for stage in self.stages:
            trunc_normal_(stage.pos_embed, std=0.02)

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """4x4 patches, then 2x2 patches, on inputs padded up to a multiple of the patch."""
        return conv_grids(img_size, self.num_stages, stem=(1, 4, 0), downsample=(1, 2, 0))


def _resize_pos_embeds_to_model(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    for i, stage in enumerate(model.stages):
        key = f"stages.{i}.pos_embed"
        if key in state_dict and state_dict[key].shape != stage.pos_embed.shape:
            source = square_grid(state_dict[key].shape[1], key)
            state_dict[key] = resize_positional_table(state_dict[key], source, stage.pos_size, "bilinear")
    return state_dict


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-PVT checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Fuses `attn.q`/`attn.kv` into `attn.qkv`, renames `patch_embed{s}`, `pos_embed{s}`, `block{s}` and `head`,
    drops the never-used final `norm`, checks that every block attends (``L`` or ``S``) and reduces its keys and
    values as the model's (``attn_layers``, ``la_sr_ratios``, ``sr_ratios``), and resizes position tables when the
    model was built for another size.
    """
    rules = [
        (r"^patch_embed(\d+)\.", one_based_stage("stages.{stage}.patch_embed.")),
        (r"^pos_embed(\d+)$", one_based_stage("stages.{stage}.pos_embed")),
        (r"^block(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
        (r"^head\.", "head.fc."),
    ]
    # the authors' final norm is built but never applied by their model
    out = convert_authors_checkpoint(state_dict, model, rules, keep=lambda key: not key.startswith("norm."))
    return resize_positional_encodings(_resize_pos_embeds_to_model(out, model), model)


def _create_flatten_pvt(variant: str, pretrained: bool = False, **kwargs) -> FlattenPvt:
    return create_family_model(FlattenPvt, variant, pretrained, **kwargs)


def _pvt_cfg(**kwargs) -> dict[str, Any]:
    return _cfg("arXiv:2102.12122", **kwargs)


# Of this family the authors released only FLatten-PVT-T (Tsinghua Cloud link in `origin_url`; timm cannot fetch it
# itself: the link has no file name). Download it and load it with
# pretrained_cfg_overlay=dict(file="path/to/flatten_pvt_t.pth").
default_cfgs = generate_default_cfgs(
    {
        "flatten_pvt_tiny.in1k": _pvt_cfg(
            **authors_release("https://cloud.tsinghua.edu.cn/f/3ab1d773f19d45648690/?dl=1", "77.8% top-1")
        ),
        "flatten_pvt_small.in1k": _pvt_cfg(),
        "flatten_pvt_medium.in1k": _pvt_cfg(),
        "flatten_pvt_large.in1k": _pvt_cfg(),
    }
)


@register_model
def flatten_pvt_tiny(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-T: 12.2M params, 2.04G MACs, 77.8% ImageNet-1k top-1 (published)."""
    return _create_flatten_pvt(
        "flatten_pvt_tiny", pretrained, **dict(dict(PVT_STAGE_SHAPES, depths=(2, 2, 2, 2)), **kwargs)
    )


@register_model
def flatten_pvt_small(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-S: 21.7M params, 4.03G MACs, 81.7% ImageNet-1k top-1 (published)."""
    return _create_flatten_pvt(
        "flatten_pvt_small", pretrained, **dict(dict(PVT_STAGE_SHAPES, depths=(3, 4, 6, 3)), **kwargs)
    )


@register_model
def flatten_pvt_medium(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-M (PVT-M depths 3, 4, 18, 3); the paper publishes no size or accuracy for it."""
    return _create_flatten_pvt(
        "flatten_pvt_medium", pretrained, **dict(dict(PVT_STAGE_SHAPES, depths=(3, 4, 18, 3)), **kwargs)
    )


@register_model
def flatten_pvt_large(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-L (PVT-L depths 3, 8, 27, 3); the paper publishes no size or accuracy for it."""
    return _create_flatten_pvt(
        "flatten_pvt_large", pretrained, **dict(dict(PVT_STAGE_SHAPES, depths=(3, 8, 27, 3)), **kwargs)
    )
