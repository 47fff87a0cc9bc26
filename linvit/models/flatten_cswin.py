"""FLatten-CSwin: CSWin Transformer with focused linear attention in its first two stages (FLatten, ICCV 2023).

Papers:
* FLatten Transformer: Vision Transformer using Focused Linear Attention - https://arxiv.org/abs/2308.00442
* CSWin Transformer: A General Vision Transformer Backbone with Cross-Shaped Windows - https://arxiv.org/abs/2107.00652

Architecture as in the FLatten authors' release (LeapLabTHU/FLatten-Transformer, `attn_type: LLSS`):
- stem: 7x7/4 convolution + LayerNorm; between stages a 3x3/2 convolution + LayerNorm doubling the channels;
- every block: `qkv` Linear at block level, the attention branches, `proj`, then an MLP;
- linear ("L") blocks, stages 1-2: their stripe equals the stage resolution (56/28 at 224, 96/48 at 384), so each
  block is ONE global focused linear attention over all channels and heads (learnable positional encoding on k,
  shared 5x5 depthwise conv on v) plus CSWin's locally-enhanced positional encoding: a 3x3 depthwise conv of v
  (`get_v`) added to the output;
- softmax ("S") blocks, stages 3-4: CSWin's cross-shaped window attention with LePE: in stage 3 half the channels
  and heads attend within vertical stripes (full height x `split_size` columns), the other half within horizontal
  stripes; in stage 4 one branch attends over the whole map;
- final LayerNorm, average of the tokens, linear classifier.

Any input size: the linear blocks resize their positional encoding to the map (bicubic); the stripe attention pads
the map to a multiple of the stripe width and masks the padded keys out of the softmax (padded values are zeros,
exactly the LePE convolution's own zero padding at the border), then crops. The structure (branches per block) is
fixed by the stage index, not by `img_size`, so any checkpoint loads at any resolution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from timm.layers import DropPath, LayerNorm2d, Mlp
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import (
    FocusedLinearLePEAttention,
    LePEAttention,
    StripeBranches,
    stage_attention_specs,
    stripe_branches,
)
from linvit.layers import (
    ClassifierHeadMixin,
    StagedBackbone,
    TokenStage,
    conv_grids,
    drop_path_rates,
    init_linear_weights,
    stage_attention_kwargs,
)
from linvit.models._family import (
    PretrainedFileMixin,
    create_family_model,
    family_cfg,
    is_converted,
    one_based_stage,
    rename_keys,
    resize_positional_encodings,
    unwrap_checkpoint,
)

__all__ = ["FlattenCSwin", "FlattenCSwinBlock", "LePEAttention", "checkpoint_filter_fn"]

# The 7x7/4 stem (padding 2) gives an empty map below 3x3; from 3x3 up every stage has at least one token.
MIN_INPUT_SIZE = (3, 3)
# the authors' per-stage letters (`attn_type: LLSS`): L = focused linear attention, S = stripe softmax
ATTN_ALIASES = {"L": "focused", "S": "stripe"}
# what each kind's branches take (the block owns qkv and proj)
_BRANCH_ARGUMENTS = {
    "focused": ("pos_size", "focusing_factor", "dwc_kernel_size"),
    "stripe": ("split_size", "directions", "attn_drop"),
}


def _attention_branches(name: str, dim: int, num_heads: int, kwargs: dict[str, Any], device=None, dtype=None):
    """The branches of a block of attention ``name`` ("focused" or "stripe") from its stage's keywords."""
    if name == "focused":
        branch = FocusedLinearLePEAttention(
            dim, num_heads, kwargs["pos_size"], kwargs["focusing_factor"], kwargs["dwc_kernel_size"], device, dtype
        )
        return StripeBranches([branch])
    return stripe_branches(
        dim, num_heads, kwargs["split_size"], kwargs["directions"], kwargs["attn_drop"], device=device, dtype=dtype
    )


class FlattenCSwinBlock(nn.Module):
    """CSWin block: LN -> qkv -> attention branches -> proj, residual; LN -> MLP, residual.

    ``attention`` is "focused" (one branch of focused linear attention with LePE over the whole map) or "stripe"
    (cross-shaped stripe branches), with the stage's keywords ``attn_kwargs``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str,
        attn_kwargs: dict[str, Any],
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attns = _attention_branches(attention, dim, num_heads, attn_kwargs, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        attended = self.attns(self.qkv(self.norm1(x)), hw)
        x = x + self.drop_path(self.proj_drop(self.proj(attended)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvNorm(nn.Module):
    """Strided convolution + LayerNorm over channels: CSwin's stem (7x7/4, pad 2) and Merge_Block (3x3/2, pad 1)."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int, device=None, dtype=None):
        super().__init__()
        padding = (kernel_size - stride + 1) // 2  # 2 for the 7x7/4 stem, 1 for the 3x3/2 merges, as CSwin
        self.conv = nn.Conv2d(in_chans, out_chans, kernel_size, stride, padding, device=device, dtype=dtype)
        self.norm = LayerNorm2d(out_chans, eps=1e-5, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class FlattenCSwin(PretrainedFileMixin, ClassifierHeadMixin, StagedBackbone):
    """FLatten-CSwin backbone and classifier. Features are NCHW at strides 4, 8, 16, 32.

    ``attn_layers``: "focused" or "stripe" per stage (or the authors' letters, ``"LLSS"``); ``split_size``: the
    stripe width per stage (the last stage's stripes cover the whole map, as CSwin's).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 64,
        depths: Sequence[int] = (2, 4, 18, 1),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        split_size: Sequence[int] = (1, 2, 7, 7),
        attn_layers: Any = "LLSS",
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__(in_chans, num_classes, global_pool, img_size, MIN_INPUT_SIZE)
        dd = {"device": device, "dtype": dtype}
        self.num_stages = num_stages = len(depths)
        if not (len(num_heads) == len(split_size) == num_stages):
            raise ValueError(
                f"depths {tuple(depths)}, num_heads {tuple(num_heads)} and split_size {tuple(split_size)} need one "
                "entry per stage; give them the same length."
            )
        specs = stage_attention_specs(attn_layers, num_stages, self.model_name, ATTN_ALIASES, tuple(_BRANCH_ARGUMENTS))
        self.attn_layers = tuple(name for name, _ in specs)
        dims = [embed_dim * 2**i for i in range(num_stages)]
        self.num_features = self.head_hidden_size = dims[-1]

        self.stem = ConvNorm(in_chans, embed_dim, 7, 4, **dd)
        grids = self.stage_grids(self.img_size)
        stages = []
        for i, rates in enumerate(drop_path_rates(drop_path_rate, depths)):
            name, explicit = specs[i]
            options = {
                "focusing_factor": focusing_factor,
                "dwc_kernel_size": dwc_kernel_size,
                "split_size": split_size[i],
                "directions": ("full",) if i == num_stages - 1 else ("vertical", "horizontal"),
                "attn_drop": attn_drop_rate,
            }
            unknown = sorted(set(explicit) - set(_BRANCH_ARGUMENTS[name]))
            if unknown:
                raise TypeError(
                    f"FlattenCSwin's {name!r} stages take {', '.join(_BRANCH_ARGUMENTS[name])} in a spec, got "
                    f"{', '.join(unknown)}."
                )
            attn_kwargs = stage_attention_kwargs(name, explicit, options, pos_size=grids[i])
            downsample = ConvNorm(dims[i - 1], dims[i], 3, 2, **dd) if i > 0 else None
            blocks = [
                FlattenCSwinBlock(
                    dims[i],
                    num_heads[i],
                    name,
                    attn_kwargs,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop_rate,
                    drop_path=rate,
                    **dd,
                )
                for rate in rates
            ]
            stages.append(TokenStage(blocks, downsample))
            self.add_feature_info(dims[i], 4 * 2**i)
        norm = nn.LayerNorm(self.num_features, eps=1e-5, **dd)
        self.add_stages_norm_head(stages, norm, num_classes, global_pool, drop_rate, **dd)
        self.apply(init_linear_weights)

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """7x7/4 stem with padding 2, then 3x3/2 merges with padding 1."""
        return conv_grids(img_size, self.num_stages, stem=(7, 4, 2), downsample=(3, 2, 1))


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-CSwin checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Renames `stage1_conv_embed.{0,2}` -> `stem.{conv,norm}`, `merge{s}` -> `stages.{s}.downsample`,
    `stage{s}.{j}` -> `stages.{s-1}.blocks.{j}`, a linear branch's `attns.0.{scale,positional_encoding,dwc}` ->
    `attns.0.focused.*`, `head` -> `head.fc`, and resizes the linear blocks' positional encodings when the model
    was built for another resolution.
    """
    state_dict = unwrap_checkpoint(state_dict)
    if is_converted(state_dict):
        return resize_positional_encodings(dict(state_dict), model)
    rules = [
        (r"stage1_conv_embed\.0\.", "stem.conv."),
        (r"stage1_conv_embed\.2\.", "stem.norm."),
        (r"^merge(\d+)\.", r"stages.\1.downsample."),
        (r"^stage(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
        (r"\.attns\.0\.(scale|positional_encoding|dwc\.)", r".attns.0.focused.\1"),
        (r"^head\.", "head.fc."),
    ]
    return resize_positional_encodings(rename_keys(state_dict, rules), model)


def _create_flatten_cswin(variant: str, pretrained: bool = False, **kwargs) -> FlattenCSwin:
    return create_family_model(FlattenCSwin, variant, pretrained, **kwargs)


def _cfg(**kwargs) -> dict[str, Any]:
    return family_cfg(
        first_conv="stem.conv", license="mit", paper_ids=["arXiv:2308.00442", "arXiv:2107.00652"], **kwargs
    )


# Of this family the authors released only FLatten-CSwin-T (Tsinghua Cloud link in `origin_url`; timm cannot fetch it
# itself: the link has no file name). Download it and load it with
# pretrained_cfg_overlay=dict(file="path/to/flatten_cswin_tiny.pth").
default_cfgs = generate_default_cfgs(
    {
        "flatten_cswin_tiny_224.in1k": _cfg(
            origin_url="https://cloud.tsinghua.edu.cn/f/48ba765ba8b0451d9d5a/?dl=1",
            notes=("authors' release (83.1% top-1, its 'model' weights); pass pretrained_cfg_overlay=dict(file=...)",),
        ),
        "flatten_cswin_small_224.in1k": _cfg(),
        "flatten_cswin_base_224.in1k": _cfg(),
        "flatten_cswin_base_384.in1k": _cfg(input_size=(3, 384, 384), pool_size=(12, 12), crop_pct=1.0),
    }
)


@register_model
def flatten_cswin_tiny_224(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-T: 21.2M params, 4.32G MACs, 83.1% ImageNet-1k top-1 (published)."""
    args = {"embed_dim": 64, "depths": (2, 4, 18, 1), "num_heads": (2, 4, 8, 16), "split_size": (1, 2, 7, 7)}
    return _create_flatten_cswin("flatten_cswin_tiny_224", pretrained, **dict(args, **kwargs))


@register_model
def flatten_cswin_small_224(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-S (CSWin-S depths 2, 4, 32, 2)."""
    args = {"embed_dim": 64, "depths": (2, 4, 32, 2), "num_heads": (2, 4, 8, 16), "split_size": (1, 2, 7, 7)}
    return _create_flatten_cswin("flatten_cswin_small_224", pretrained, **dict(args, **kwargs))


@register_model
def flatten_cswin_base_224(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-B (CSWin-B: width 96, depths 3, 6, 29, 2)."""
    args = {"embed_dim": 96, "depths": (3, 6, 29, 2), "num_heads": (4, 8, 16, 32), "split_size": (1, 2, 7, 7)}
    return _create_flatten_cswin("flatten_cswin_base_224", pretrained, **dict(args, **kwargs))


@register_model
def flatten_cswin_base_384(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-B at 384 (stripes 12 in stages 3-4, linear tables 96x96 / 48x48)."""
    args = {
        "img_size": 384,
        "embed_dim": 96,
        "depths": (3, 6, 29, 2),
        "num_heads": (4, 8, 16, 32),
        "split_size": (1, 2, 12, 12),
    }
    return _create_flatten_cswin("flatten_cswin_base_384", pretrained, **dict(args, **kwargs))
