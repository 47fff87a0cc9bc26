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

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed, to_2tuple, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from linvit.models._checkpoint import extract_model_state_dict, load_pretrained_file
from linvit.models._flatten_common import create_flatten_model, flatten_cfg
from linvit.models._validation import check_image_batch
from linvit.models.flatten_swin_stages import FLattenSwinBlock, FLattenSwinStage, PatchMerging

__all__ = ["FLattenSwinTransformer", "FLattenSwinBlock", "FLattenSwinStage", "PatchMerging", "checkpoint_filter_fn"]


def _linear_pos_size(feat_size: tuple[int, int], linear_window: tuple[int, int]) -> tuple[int, int]:
    """Grid of a linear stage's positional encoding: its feature map at ``img_size``, clamped to the window."""
    return min(feat_size[0], linear_window[0]), min(feat_size[1], linear_window[1])


def _resize_grid_table(table: torch.Tensor, old_grid: Sequence[int], new_grid: Sequence[int]) -> torch.Tensor:
    """Bicubically resize a (..., gh*gw, C) table laid out row-major over a grid (positional encodings)."""
    if tuple(old_grid) == tuple(new_grid):
        return table
    lead = table.shape[:-2]
    channels = table.shape[-1]
    grid = table.reshape(-1, old_grid[0], old_grid[1], channels).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(*lead, new_grid[0] * new_grid[1], channels)
    return grid.to(table.dtype)


def _resize_bias_table(table: torch.Tensor, new_length: int) -> torch.Tensor:
    """Bicubically resize a Swin relative-position-bias table ((2w-1)^2, heads) of a square window."""
    old_side = math.isqrt(table.shape[0])
    new_side = math.isqrt(new_length)
    if old_side * old_side != table.shape[0] or new_side * new_side != new_length:
        raise ValueError(
            f"relative_position_bias_table of {table.shape[0]} rows cannot be resized to {new_length}: expected "
            "square (2w-1)^2 tables on both sides."
        )
    grid = table.transpose(0, 1).reshape(1, -1, old_side, old_side).float()
    grid = F.interpolate(grid, size=(new_side, new_side), mode="bicubic", align_corners=False)
    return grid.reshape(-1, new_length).transpose(0, 1).to(table.dtype)


class FLattenSwinTransformer(nn.Module):
    """FLatten-Swin backbone and classifier (timm-native).

    Args:
        img_size: input size the positional encodings of the linear stages are sized for (see module docstring).
        patch_size: stem patch size.
        in_chans: input channels.
        num_classes: classifier classes (0 = no classifier).
        global_pool: ``"avg"`` or ``""`` (no pooling; ``forward`` then returns NCHW maps).
        embed_dim: channels of stage 1 (doubled at every stage).
        depths, num_heads: blocks and heads per stage.
        attn_types: ``"linear"`` (focused linear attention) or ``"softmax"`` (shifted windows) per stage.
        linear_window_size: the linear window (56 at 224, 96 at 384 in the paper), clamped to each feature map.
        window_size: softmax window (7, or 12 at 384).
        mlp_ratio, qkv_bias: block widths and qkv bias.
        focusing_factor: focusing power p (3 in the paper).
        dwc_kernel_size: kernel of the depthwise-convolution enhancement (5).
        drop_rate: dropout before the classifier; proj_drop_rate: after attention projections and MLPs (the
            authors' ``drop_rate``); attn_drop_rate: attention dropout; drop_path_rate: stochastic depth, linearly
            increasing over blocks.
    """

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
        attn_types: Sequence[str] = ("linear", "linear", "softmax", "softmax"),
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
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if global_pool not in ("avg", ""):
            raise ValueError(f"global_pool must be 'avg' or '' (no pooling), got {global_pool!r}.")
        num_stages = len(depths)
        if not (len(num_heads) == len(attn_types) == num_stages):
            raise ValueError(
                f"depths, num_heads and attn_types need one entry per stage; got {len(depths)}, {len(num_heads)}, "
                f"{len(attn_types)}."
            )
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.output_fmt = "NCHW"
        self.patch_size = patch_size
        self.linear_window_size = to_2tuple(linear_window_size)
        self.window_size = window_size
        self.attn_types = tuple(attn_types)
        embed_dims = [int(embed_dim * 2**i) for i in range(num_stages)]
        self.num_features = self.head_hidden_size = embed_dims[-1]

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            norm_layer=norm_layer,
            output_fmt="NHWC",  # its norm is over channels; _stem turns the result into NCHW
            strict_img_size=False,
            dynamic_img_pad=True,
            **dd,
        )
        feat_sizes = self._stage_feat_sizes(self.patch_embed.grid_size, num_stages)
        drop_paths = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()

        stages = []
        self.feature_info = []
        in_dim = embed_dim
        for i in range(num_stages):
            linear = attn_types[i] == "linear"
            stages.append(
                FLattenSwinStage(
                    in_dim,
                    embed_dims[i],
                    depth=depths[i],
                    num_heads=num_heads[i],
                    attn_type=attn_types[i],
                    downsample=i > 0,
                    window_size=window_size,
                    pos_size=_linear_pos_size(feat_sizes[i], self.linear_window_size) if linear else None,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=drop_paths[sum(depths[:i]) : sum(depths[: i + 1])],
                    act_layer=act_layer,
                    norm_layer=norm_layer,
                    **dd,
                )
            )
            in_dim = embed_dims[i]
            self.feature_info.append(
                {"num_chs": embed_dims[i], "reduction": patch_size * 2**i, "module": f"layers.{i}"}
            )
        self.layers = nn.Sequential(*stages)
        self.norm = norm_layer(self.num_features, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _stage_feat_sizes(grid_size: Sequence[int], num_stages: int) -> list[tuple[int, int]]:
        sizes = [(int(grid_size[0]), int(grid_size[1]))]
        for _ in range(1, num_stages):
            h, w = sizes[-1]
            sizes.append(((h + 1) // 2, (w + 1) // 2))  # patch merging pads odd maps
        return sizes

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # The authors' init: truncated-normal linears with zero bias; attention tables are set by their modules.
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ timm API
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"*.positional_encoding", "*.attn.scale", "*.relative_position_bias_table"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^patch_embed",
            "blocks": r"^layers\.(\d+)"
            if coarse
            else [
                (r"^layers\.(\d+)\.downsample", (0,)),
                (r"^layers\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        }

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.layers:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None:
            if global_pool not in ("avg", ""):
                raise ValueError(f"global_pool must be 'avg' or '', got {global_pool!r}.")
            self.global_pool = global_pool
        self.num_classes = num_classes
        weight = next(self.parameters())  # the new head lives on the model's device and dtype
        self.head = (
            nn.Linear(self.num_features, num_classes, device=weight.device, dtype=weight.dtype)
            if num_classes > 0
            else nn.Identity()
        )
        self.head.train(self.training)

    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: Any = None) -> None:
        """Re-size the linear stages' positional encodings for ``img_size`` (bicubic; ``requires_grad`` kept)."""
        if patch_size is not None and to_2tuple(patch_size) != to_2tuple(self.patch_size):
            raise ValueError("FLatten-Swin cannot change its patch size; pass img_size only.")
        if img_size is None:
            return
        self.patch_embed.set_input_size(img_size=img_size)
        feat_sizes = self._stage_feat_sizes(self.patch_embed.grid_size, len(self.layers))
        for stage, feat_size in zip(self.layers, feat_sizes):
            for block in stage.blocks:
                if block.attn_type != "linear":
                    continue
                new_size = _linear_pos_size(feat_size, self.linear_window_size)
                old = block.attn.positional_encoding
                with torch.no_grad():
                    resized = _resize_grid_table(old.data, block.pos_size, new_size)
                block.attn.positional_encoding = nn.Parameter(resized, requires_grad=old.requires_grad)
                block.pos_size = new_size
                _set_attention_grid(block.attn, new_size)

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        """timm's hook for ``pretrained_cfg['custom_load']``: read the authors' raw file safely (model weights)."""
        load_pretrained_file(self, checkpoint_path, checkpoint_filter_fn)

    # ------------------------------------------------------------------ forward
    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_embed(x).permute(0, 3, 1, 2)

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        """The entry check of every forward path: shape, channels, dtype (and the smallest size, where one exists)."""
        return check_image_batch(
            x, self.in_chans, model_name="FLattenSwinTransformer", weight_dtype=self.patch_embed.proj.weight.dtype
        )

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x)  # pads any size
        x = self._stem(x)
        x = self.layers(x)
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x.mean(dim=(2, 3))
        x = self.head_drop(x)
        if pre_logits:
            return x
        if self.global_pool == "":
            return self.head(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Stage outputs (NCHW, strides 4/8/16/32) and, unless ``intermediates_only``, the final features.

        ``norm=True`` applies the final norm to the last stage's output (the only one it is sized for).
        """
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}.")
        x = self._check_input(x)
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.layers), indices)
        num_stages = len(self.layers)
        x = self._stem(x)
        if torch.jit.is_scripting() or not stop_early:
            stages = self.layers
        else:
            stages = self.layers[: max_index + 1]
        last = 0
        for i, stage in enumerate(stages):
            x = stage(x)
            last = i
            if i in take_indices:
                if norm and i == num_stages - 1:
                    intermediates.append(self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
                else:
                    intermediates.append(x)
        if intermediates_only:
            return intermediates
        if last == num_stages - 1:
            x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return x, intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stages (and norm/head) that the given intermediates do not need."""
        take_indices, max_index = feature_take_indices(len(self.layers), indices)
        prune_end = max_index < len(self.layers) - 1
        self.layers = self.layers[: max_index + 1]
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


def _set_attention_grid(attn: nn.Module, grid: tuple[int, int]) -> None:
    """Tell a FocusedLinearAttention its positional-encoding grid (and window) changed."""
    for name in ("pos_size", "window_size"):
        if hasattr(attn, name):
            setattr(attn, name, grid)


# ---------------------------------------------------------------------- checkpoints
_DROPPED_SUFFIXES = ("relative_position_index", "attn_mask", "relative_coords_table")


def _square_grid(length: int, key: str) -> tuple[int, int]:
    side = math.isqrt(length)
    if side * side != length:
        raise ValueError(f"{key}: {length} positions do not form a square grid; cannot infer the source grid.")
    return side, side


def checkpoint_filter_fn(state_dict: dict[str, Any], model: FLattenSwinTransformer) -> dict[str, torch.Tensor]:
    """Map the authors' (or a timm-layout) FLatten-Swin state dict onto ``model``.

    Unwraps a full training checkpoint, moves ``layers.{i}.downsample`` (end of stage, the authors' layout) to
    ``layers.{i+1}.downsample``, drops computed buffers, and resizes positional encodings and relative position
    bias tables (bicubic) when the resolution or window differs from the model's.
    """
    if not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        state_dict = extract_model_state_dict(state_dict)
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
        if key.startswith("head.") and key not in target and "head.fc." + key[5:] in target:
            key = "head.fc." + key[5:]
        if key in target and value.shape != target[key].shape:
            if key.endswith("positional_encoding"):
                block = model.get_submodule(key.rsplit(".attn.", 1)[0])
                value = _resize_grid_table(value, _square_grid(value.shape[1], key), block.pos_size)
            elif key.endswith("relative_position_bias_table"):
                value = _resize_bias_table(value, target[key].shape[0])
        out[key] = value
    return out


# ---------------------------------------------------------------------- registration
def _create_flatten_swin(variant: str, pretrained: bool = False, **kwargs: Any) -> FLattenSwinTransformer:
    out_indices = tuple(range(len(kwargs.get("depths", (2, 2, 6, 2)))))
    # the authors' files need the model's own (safe) loader: create_flatten_model routes them there
    return create_flatten_model(
        FLattenSwinTransformer,
        variant,
        pretrained,
        checkpoint_filter_fn,
        out_indices,
        flatten_sequential=True,
        **kwargs,
    )


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return flatten_cfg(
        **{
            "pool_size": (7, 7),
            "crop_pct": 0.875,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": "mit",
            "paper_ids": "arXiv:2308.00442",
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
def flatten_swin_tiny_patch4_224(pretrained: bool = False, **kwargs: Any) -> FLattenSwinTransformer:
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
def flatten_swin_small_patch4_224(pretrained: bool = False, **kwargs: Any) -> FLattenSwinTransformer:
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
def flatten_swin_base_patch4_224(pretrained: bool = False, **kwargs: Any) -> FLattenSwinTransformer:
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
def flatten_swin_base_patch4_384(pretrained: bool = False, **kwargs: Any) -> FLattenSwinTransformer:
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
