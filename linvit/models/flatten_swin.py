"""FLatten-Swin: Swin Transformer with focused linear attention in its high-resolution stages.

FLatten Transformer: Vision Transformer using Focused Linear Attention (Han et al., ICCV 2023, arXiv 2308.00442).
Stages 1-2 use focused linear attention inside a large "linear window" (56 at 224, 96 at 384) clamped to the
feature map, i.e. one global window without shift at the native resolution; stages 3-4 keep Swin's shifted-window
softmax attention (window 7, 12 at 384) with relative position bias. Loads the authors' released checkpoints.

Resolution policy (any input size; non-square and not a multiple of 32 is fine, padding happens inside):
- ``img_size`` at creation sets the positional-encoding grid of each linear stage to its feature map at that size,
  clamped to the linear window; so a model created for 512 keeps 56x56 linear windows in stage 1 (the config's
  window), and one created for 160 holds a 40x40 table.
- At run time a linear stage whose map is larger than its table splits into padded windows of the table's size
  (linear cost, no interpolation); a map smaller than the table in some dimension attends globally over that
  dimension with the table interpolated bicubically. ``set_input_size(img_size=...)`` resizes the tables instead.
- Softmax stages keep their window (clamped to the map, without shift, when the map is not larger than it).

Layout differences to the authors' code, mapped by :func:`checkpoint_filter_fn`: patch merging sits at the start
of the next stage (``layers.{i+1}.downsample``, as in timm's Swin) instead of the end of the current one, so stage
outputs are at their own resolution; ``relative_position_index`` / ``attn_mask`` are computed, not stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed, to_2tuple
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import (
    attention_kind,
    resize_relative_position_bias,
    shifted_block_kwargs,
    stage_attention_specs,
)
from linvit.layers import (
    LinearHeadMixin,
    PreNormBlock,
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
    resize_positional_encodings,
    unwrap_checkpoint,
)

__all__ = ["FlattenSwin", "PatchMerging", "checkpoint_filter_fn"]

# the authors' per-stage letters: L = focused linear attention (in a linear window), S = shifted-window softmax
ATTN_ALIASES = {"L": "focused", "S": "window"}


class PatchMerging(nn.Module):
    """2x2 neighbour concatenation, LayerNorm and a linear reduction (Swin's down-sampling); pads odd maps.

    (B, C, H, W) -> (B, C_out, ceil(H/2), ceil(W/2)) in channels-last memory. The concatenation order (top-left,
    bottom-left, top-right, bottom-right) is Swin's, so the authors' ``reduction`` / ``norm`` weights apply unchanged.
    """

    def __init__(
        self,
        in_chans: int,
        out_chans: int | None = None,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.in_chans = in_chans
        self.out_chans = out_chans or 2 * in_chans
        self.norm = norm_layer(4 * in_chans, **dd)
        self.reduction = nn.Linear(4 * in_chans, self.out_chans, bias=False, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        x = F.pad(x, (0, W % 2, 0, H % 2))
        x = x.reshape(B, C, (H + 1) // 2, 2, (W + 1) // 2, 2)
        # (B, H/2, W/2, w-offset, h-offset, C): flattening gives Swin's [x00, x10, x01, x11] channel blocks
        x = x.permute(0, 2, 4, 5, 3, 1).flatten(3)
        return self.reduction(self.norm(x)).permute(0, 3, 1, 2)


class FlattenSwin(PretrainedFileMixin, LinearHeadMixin, StagedBackbone):
    """FLatten-Swin backbone and classifier (timm-native).

    Args:
        img_size: input size the positional encodings of the linear stages are sized for (see module docstring).
        patch_size: stem patch size.
        in_chans: input channels.
        num_classes: classifier classes (0 = no classifier).
        global_pool: ``"avg"`` or ``""`` (no pooling; ``forward`` then returns NCHW maps).
        embed_dim: channels of stage 1 (doubled at every stage).
        depths, num_heads: blocks and heads per stage.
        attn_layers: the attention of each stage (see ``linvit.attention.ATTENTION_NAMES``; the authors' letters
            ``"L"``/``"S"`` or ``"LLSS"`` are accepted). Linear kinds ("focused", ...) attend within the linear
            window with a positional table of its size; windowed kinds ("window", "hybrid") use ``window_size`` and
            shift every other block.
        linear_window_size: the linear window (56 at 224, 96 at 384 in the paper), clamped to each feature map.
        window_size: softmax window (7, or 12 at 384).
        mlp_ratio, qkv_bias: block widths and qkv bias.
        focusing_factor: focusing power p (3 in the paper).
        dwc_kernel_size: kernel of the depthwise-convolution enhancement (5).
        drop_rate: dropout before the classifier; proj_drop_rate: after attention projections and MLPs (the
            authors' ``drop_rate``); attn_drop_rate: attention dropout; drop_path_rate: stochastic depth, linearly
            increasing over blocks.
    """

    stage_container = "layers"
    group_stem = r"^patch_embed"

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        attn_layers: Any = ("focused", "focused", "window", "window"),
        linear_window_size: int | tuple[int, int] = 56,
        window_size: int = 7,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__(in_chans, num_classes, global_pool, img_size)
        dd = {"device": device, "dtype": dtype}
        self.num_stages = num_stages = len(depths)
        if len(num_heads) != num_stages:
            raise ValueError(f"depths and num_heads need one entry per stage; got {len(depths)} and {len(num_heads)}.")
        specs = stage_attention_specs(attn_layers, num_stages, "FlattenSwin", ATTN_ALIASES)
        self.attn_layers = tuple(name for name, _ in specs)
        self.patch_size = patch_size
        self.linear_window_size = to_2tuple(linear_window_size)
        self.window_size = window_size
        embed_dims = [int(embed_dim * 2**i) for i in range(num_stages)]
        self.num_features = self.head_hidden_size = embed_dims[-1]

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            norm_layer=norm_layer,
            output_fmt="NHWC",  # its norm is over channels; forward_stem turns the result into NCHW
            strict_img_size=False,
            dynamic_img_pad=True,
            **dd,
        )
        grids = self.stage_grids(self.img_size)
        options = {
            "qkv_bias": qkv_bias,
            "attn_drop": attn_drop_rate,
            "proj_drop": proj_drop_rate,
            "focusing_factor": focusing_factor,
            "dwc_kernel_size": dwc_kernel_size,
        }
        stages = []
        for i, ((name, explicit), rates) in enumerate(zip(specs, drop_path_rates(drop_path_rate, depths))):
            stage_options = dict(options)
            if not attention_kind(name).windowed:  # linear kinds attend within the linear window
                stage_options["window_size"] = grids[i]
            stage_kwargs = stage_attention_kwargs(
                name, explicit, stage_options, window_size=window_size, pos_size=grids[i]
            )
            downsample = PatchMerging(embed_dims[i - 1], embed_dims[i], norm_layer, **dd) if i > 0 else None
            blocks = [
                PreNormBlock.build(
                    embed_dims[i],
                    num_heads[i],
                    name,
                    shifted_block_kwargs(name, stage_kwargs, j),
                    mlp_ratio,
                    proj_drop=proj_drop_rate,
                    drop_path=rate,
                    norm_layer=norm_layer,
                    act_layer=act_layer,
                    **dd,
                )
                for j, rate in enumerate(rates)
            ]
            stages.append(TokenStage(blocks, downsample))
            self.add_feature_info(embed_dims[i], patch_size * 2**i)
        self.add_stages_norm_head(
            stages, norm_layer(self.num_features, **dd), num_classes, global_pool, drop_rate, **dd
        )
        self.apply(init_linear_weights)  # the authors' init; attention tables are set by their modules

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The grid of each stage's positional tables: its map at ``img_size`` (the patch grid, then halved with
        padding by each merge), clamped to the linear window."""
        grids = conv_grids(img_size, self.num_stages, (self.patch_size, self.patch_size, 0), downsample=(1, 2, 0))
        window = self.linear_window_size
        return [(min(h, window[0]), min(w, window[1])) for h, w in grids]

    def resize_stem(self, img_size: tuple[int, int]) -> None:
        self.patch_embed.set_input_size(img_size=img_size)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_embed(x).permute(0, 3, 1, 2)

    def forward_stages(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


# ---------------------------------------------------------------------- checkpoints
_DROPPED_SUFFIXES = ("relative_position_index", "attn_mask", "relative_coords_table")


def checkpoint_filter_fn(state_dict: dict[str, Any], model: FlattenSwin) -> dict[str, torch.Tensor]:
    """Map the authors' (or a linvit-layout) FLatten-Swin state dict onto ``model``.

    Unwraps a full training checkpoint, moves ``layers.{i}.downsample`` (end of stage, the authors' layout) to
    ``layers.{i+1}.downsample``, drops computed buffers, and resizes positional encodings and relative position
    bias tables (bicubic) when the resolution or window differs from the model's.
    """
    state_dict = unwrap_checkpoint(state_dict)
    authors_layout = any(k.startswith("layers.0.downsample.") for k in state_dict)
    target = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(_DROPPED_SUFFIXES):
            continue
        parts = key.split(".")
        if authors_layout and len(parts) > 2 and parts[0] == "layers" and parts[2] == "downsample":
            parts[1] = str(int(parts[1]) + 1)
            key = ".".join(parts)
        if key.endswith("relative_position_bias_table") and key in target and value.shape != target[key].shape:
            value = resize_relative_position_bias(value, target[key].shape[0])
        out[key] = value
    return resize_positional_encodings(out, model)


# ---------------------------------------------------------------------- registration
def _create_flatten_swin(variant: str, pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    out_indices = tuple(range(len(kwargs.get("depths", (2, 2, 6, 2)))))
    return create_family_model(FlattenSwin, variant, pretrained, out_indices, **kwargs)


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return family_cfg(
        **{
            "crop_pct": 0.875,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": "mit",
            "origin_url": "https://github.com/LeapLabTHU/FLatten-Transformer",
            **kwargs,
        }
    )


# Sizes at the native resolution, linvit vs the paper: params 29.19M / 50.51M / 88.97M / 91.43M (29.2 / 50.5 / 89.0 /
# 91.4); MACs 4.483G / 8.734G / 15.42G / 46.38G (4.48 / 8.73 / 15.4 / 46.4). MACs are counted with
# linvit.utils.count_macs (PyTorch's flop counter: linears, convolutions, matmuls; elementwise work not counted) with
# every product of the definition made visible to it: window softmax through explicit matmuls (the counter misses
# PyTorch's fused CPU attention kernel) and linear attention per head. tests/models/test_flatten_swin.py checks them.
default_cfgs = generate_default_cfgs(
    {
        "flatten_swin_tiny_patch4_224.in1k": _cfg(
            notes=("ImageNet-1k top-1 82.1; weights: https://cloud.tsinghua.edu.cn/f/e1518e76703e4e57a7f2/?dl=1",),
        ),
        "flatten_swin_small_patch4_224.in1k": _cfg(
            notes=("ImageNet-1k top-1 83.5; weights: https://cloud.tsinghua.edu.cn/f/94188e52af354bf4a88b/?dl=1",),
        ),
        "flatten_swin_base_patch4_224.in1k": _cfg(
            notes=("ImageNet-1k top-1 83.8; weights: https://cloud.tsinghua.edu.cn/f/7a9e5186bad04e7fb3a9/?dl=1",),
        ),
        "flatten_swin_base_patch4_384.in1k": _cfg(
            input_size=(3, 384, 384),
            pool_size=(12, 12),
            crop_pct=1.0,
            notes=("ImageNet-1k top-1 85.0; weights: https://cloud.tsinghua.edu.cn/f/0d0330cf2e5249f1abb6/?dl=1",),
        ),
    }
)


@register_model
def flatten_swin_tiny_patch4_224(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-T: 29.2M params, 4.48 GMACs, 82.1% ImageNet-1k (paper)."""
    args = {
        "embed_dim": 96,
        "depths": (2, 2, 6, 2),
        "num_heads": (3, 6, 12, 24),
        "linear_window_size": 56,
        "window_size": 7,
    }
    return _create_flatten_swin("flatten_swin_tiny_patch4_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_swin_small_patch4_224(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-S: 50.5M params, 8.73 GMACs, 83.5% ImageNet-1k (paper)."""
    args = {
        "embed_dim": 96,
        "depths": (2, 2, 18, 2),
        "num_heads": (3, 6, 12, 24),
        "linear_window_size": 56,
        "window_size": 7,
    }
    return _create_flatten_swin("flatten_swin_small_patch4_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_swin_base_patch4_224(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-B: 89.0M params, 15.4 GMACs, 83.8% ImageNet-1k (paper)."""
    args = {
        "embed_dim": 128,
        "depths": (2, 2, 18, 2),
        "num_heads": (4, 8, 16, 32),
        "linear_window_size": 56,
        "window_size": 7,
    }
    return _create_flatten_swin("flatten_swin_base_patch4_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_swin_base_patch4_384(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-B at 384: 91.4M params, 46.4 GMACs, 85.0% ImageNet-1k (paper)."""
    args = {
        "img_size": 384,
        "embed_dim": 128,
        "depths": (2, 2, 18, 2),
        "num_heads": (4, 8, 16, 32),
        "linear_window_size": 96,
        "window_size": 12,
    }
    return _create_flatten_swin("flatten_swin_base_patch4_384", pretrained=pretrained, **dict(args, **kwargs))
