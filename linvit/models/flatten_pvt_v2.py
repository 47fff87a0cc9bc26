"""FLatten-PVTv2: PVTv2 with focused linear attention in every block (FLatten Transformer, ICCV 2023).

Papers:
* FLatten Transformer: Vision Transformer using Focused Linear Attention - https://arxiv.org/abs/2308.00442
* PVT v2: Improved Baselines with Pyramid Vision Transformer - https://arxiv.org/abs/2106.13797

Architecture as in the FLatten authors' release (LeapLabTHU/FLatten-Transformer, config `PVT_LA_SR_RATIOS: 1111`):
overlapping patch embeddings (7x7/4 stem, 3x3/2 downsampling), every block a global focused linear attention
without spatial reduction (learnable positional encoding added to the keys, depthwise 5x5 enhancement of the
values), an MLP with a 3x3 depthwise convolution, and a LayerNorm closing every stage.

The authors' attention keeps separate `q` and `kv` projections; here the attention is linvit's one
`FocusedLinearAttention` with a fused `qkv`, and `checkpoint_filter_fn` concatenates `q` and `kv` (same outputs).

Any input size works: the convolutions handle any map and each attention resizes its positional-encoding table
(bicubic) when the map differs from the grid it was built for (`img_size`); `set_input_size` resizes the tables
themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from timm.layers import ClassifierHead, to_2tuple, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from linvit.attention import FocusedLinearAttention
from linvit.layers import PreNormBlock
from linvit.models._checkpoint import load_pretrained_file
from linvit.models._classifier import ClassifierHeadMixin
from linvit.models._flatten_common import (
    conv_stage_grids,
    create_flatten_model,
    drop_path_rates,
    fuse_q_kv,
    is_converted,
    one_based_stage,
    rename_keys,
    resize_tables_to_model,
    set_attention_grid,
    stage_model_cfg,
    unwrap_checkpoint,
)
from linvit.models._validation import check_image_batch

__all__ = ["FlattenPvtV2", "checkpoint_filter_fn"]


def stage_grids(img_size: tuple[int, int], num_stages: int = 4) -> list[tuple[int, int]]:
    """Token grid of every stage for an input of `img_size` (7x7/4 stem, then 3x3/2 overlapping convolutions)."""
    return conv_stage_grids(img_size, num_stages, stem_padding=3)


class OverlapPatchEmbed(nn.Module):
    """Overlapping strided convolution followed by LayerNorm; image/map (B, C, H, W) -> tokens (B, N, C)."""

    def __init__(
        self,
        in_chans: int,
        embed_dim: int,
        patch_size: int = 7,
        stride: int = 4,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=stride, padding=patch_size // 2, **dd)
        self.norm = nn.LayerNorm(embed_dim, **dd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        x = self.norm(x.flatten(2).transpose(1, 2))
        return x, hw


class MlpWithDepthwiseConv(nn.Module):
    """fc1 -> 3x3 depthwise conv over the token grid -> GELU -> fc2 (PVTv2's feed-forward)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.fc1 = nn.Linear(dim, hidden_dim, **dd)
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim, **dd)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim, **dd)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.fc1(x)
        batch, _, channels = x.shape
        x = x.transpose(1, 2).reshape(batch, channels, hw[0], hw[1])
        x = self.dwconv(x).flatten(2).transpose(1, 2)
        x = self.drop1(self.act(x))
        return self.drop2(self.fc2(x))


class FlattenPvtV2Block(PreNormBlock):
    """Pre-norm block: focused linear attention over all tokens, then an MLP taking (tokens, hw).

    PVTv2 uses the depthwise-conv MLP (the default); PVT v1 passes its plain MLP (`flatten_pvt.TokenMlp`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        pos_size: tuple[int, int],
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        mlp_layer: type[nn.Module] = MlpWithDepthwiseConv,
        device=None,
        dtype=None,
    ):
        dd = {"device": device, "dtype": dtype}
        attn = FocusedLinearAttention(
            dim,
            num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            focusing_factor=focusing_factor,
            dwc_kernel_size=dwc_kernel_size,
            pos_encoding="learnable",
            pos_size=pos_size,
            **dd,
        )
        mlp = mlp_layer(dim, int(dim * mlp_ratio), drop=proj_drop, **dd)
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        super().__init__(dim, attn, mlp, drop_path=drop_path, norm_layer=norm_layer, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        return x + self.drop_path2(self.mlp(self.norm2(x), hw))  # the MLP's depthwise conv needs the grid


class FlattenPvtV2Stage(nn.Module):
    """Overlapping patch embedding, blocks, LayerNorm; (B, C_in, H, W) -> (B, C, H', W')."""

    def __init__(
        self,
        in_chans: int,
        dim: int,
        depth: int,
        num_heads: int,
        pos_size: tuple[int, int],
        first: bool,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: Sequence[float] = (),
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.grad_checkpointing = False
        self.patch_embed = OverlapPatchEmbed(
            in_chans, dim, patch_size=7 if first else 3, stride=4 if first else 2, **dd
        )
        self.blocks = nn.ModuleList(
            [
                FlattenPvtV2Block(
                    dim,
                    num_heads,
                    pos_size,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    proj_drop=proj_drop,
                    attn_drop=attn_drop,
                    drop_path=drop_path[i] if len(drop_path) else 0.0,
                    **dd,
                )
                for i in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, hw = self.patch_embed(x)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
        x = self.norm(x)
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], hw[0], hw[1])


class FlattenPvtV2(ClassifierHeadMixin, nn.Module):
    """FLatten-PVTv2 backbone and classifier. Features are NCHW at strides 4, 8, 16, 32."""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        depths: Sequence[int] = (3, 4, 6, 3),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8.0, 8.0, 4.0, 4.0),
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
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not (len(embed_dims) == len(depths) == len(num_heads) == len(mlp_ratios)):
            raise ValueError(
                f"embed_dims {tuple(embed_dims)}, depths {tuple(depths)}, num_heads {tuple(num_heads)} and "
                f"mlp_ratios {tuple(mlp_ratios)} must have one entry per stage; give them the same length."
            )
        if global_pool not in ("avg", "max", "avgmax", ""):
            raise ValueError(f"global_pool must be one of 'avg', 'max', 'avgmax' or '', got {global_pool!r}.")
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.model_name = type(self).__name__  # named in input errors (FlattenPvt for the v1 subclass)
        self.global_pool = global_pool
        self.output_fmt = "NCHW"
        self.img_size = to_2tuple(img_size)
        self.num_stages = len(depths)
        self.drop_rate = drop_rate

        grids = self._stage_grids(self.img_size)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        stages = []
        self.feature_info = []
        prev_dim, cursor = in_chans, 0
        for i in range(self.num_stages):
            stages.append(
                FlattenPvtV2Stage(
                    prev_dim,
                    embed_dims[i],
                    depths[i],
                    num_heads[i],
                    grids[i],
                    first=i == 0,
                    mlp_ratio=mlp_ratios[i],
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=rates[cursor : cursor + depths[i]],
                    **dd,
                )
            )
            prev_dim, cursor = embed_dims[i], cursor + depths[i]
            self.feature_info.append({"num_chs": embed_dims[i], "reduction": 4 * 2**i, "module": f"stages.{i}"})
        self.stages = nn.Sequential(*stages)
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.head = ClassifierHead(self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)
        self.apply(self._init_weights)

    @staticmethod
    def _stage_grids(img_size: tuple[int, int]) -> list[tuple[int, int]]:
        return stage_grids(img_size)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
            nn.init.normal_(module.weight, std=(2.0 / fan_out) ** 0.5)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        # the learnable positional encodings and the focusing scales are not decayed
        return {"*.positional_encoding", "*.scale"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^stages\.0\.patch_embed",
            "blocks": r"^stages\.(\d+)"
            if coarse
            else [
                (r"^stages\.(\d+)\.patch_embed", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^stages\.(\d+)\.norm", (99999,)),
            ],
        }

    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int]) -> None:
        """Rebuild every positional-encoding table for a new input resolution (bicubic resize)."""
        self.img_size = to_2tuple(img_size)
        for stage, grid in zip(self.stages, self._stage_grids(self.img_size)):
            for block in stage.blocks:
                set_attention_grid(block.attn, grid)

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        """timm's `custom_load` entry: read the authors' .pth (or a converted file) safely and convert it."""
        load_pretrained_file(self, checkpoint_path, filter_fn=checkpoint_filter_fn)

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        """The entry check of every forward path: shape, channels, dtype (and the smallest size, where one exists)."""
        return check_image_batch(
            x, self.in_chans, model_name=self.model_name, weight_dtype=self.stages[0].patch_embed.proj.weight.dtype
        )

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward and collect stage outputs (NCHW). Every stage ends in its own LayerNorm; `norm` changes nothing."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW' (the layout these stages produce), got {output_fmt!r}.")
        x = self._check_input(x)
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        if torch.jit.is_scripting() or not stop_early:
            stages = self.stages
        else:
            stages = self.stages[: max_index + 1]
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take_indices:
                intermediates.append(x)
        if intermediates_only:
            return intermediates
        return x, intermediates

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x)  # the convolutions take any size
        return self.stages(x)


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-PVTv2 checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Accepts the authors' whole file (`model`, maybe `state_dict_ema`, `optimizer`, `config`) or its `model` dict;
    fuses `attn.q`/`attn.kv` into `attn.qkv`, renames `patch_embed{s}`, `block{s}`, `norm{s}`, `dwconv.dwconv`
    and `head`, and resizes the positional encodings when the model was built for another resolution.
    """
    state_dict = unwrap_checkpoint(state_dict)
    if is_converted(state_dict):
        return resize_tables_to_model(dict(state_dict), model)
    rules = [
        (r"^patch_embed(\d+)\.", one_based_stage("stages.{stage}.patch_embed.")),
        (r"^block(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
        (r"^norm(\d+)\.", one_based_stage("stages.{stage}.norm.")),
        (r"\.mlp\.dwconv\.dwconv\.", ".mlp.dwconv."),
        (r"^head\.", "head.fc."),
    ]
    return resize_tables_to_model(rename_keys(fuse_q_kv(state_dict), rules), model)


def _create_flatten_pvt_v2(variant: str, pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    return create_flatten_model(FlattenPvtV2, variant, pretrained, checkpoint_filter_fn, (0, 1, 2, 3), **kwargs)


def _cfg(**kwargs) -> dict[str, Any]:
    return stage_model_cfg("stages.0.patch_embed.proj", "apache-2.0", "arXiv:2106.13797", **kwargs)


# Of this family the authors released only FLatten-PVTv2-B0 (Tsinghua Cloud link in `origin_url`; timm cannot fetch it
# itself: the link has no file name). Download it and load it with
# pretrained_cfg_overlay=dict(file="path/to/flatten_pvt_v2_b0.pth").
default_cfgs = generate_default_cfgs(
    {
        "flatten_pvt_v2_b0.in1k": _cfg(
            origin_url="https://cloud.tsinghua.edu.cn/f/5d1f01532b104da28e7b/?dl=1",
            notes=("authors' release (71.1% top-1); download it and pass pretrained_cfg_overlay=dict(file=...)",),
        ),
        "flatten_pvt_v2_b1.in1k": _cfg(),
        "flatten_pvt_v2_b2.in1k": _cfg(),
        "flatten_pvt_v2_b3.in1k": _cfg(),
        "flatten_pvt_v2_b4.in1k": _cfg(),
    }
)

_B1_PLUS = {"embed_dims": (64, 128, 320, 512), "num_heads": (1, 2, 5, 8), "mlp_ratios": (8, 8, 4, 4)}


@register_model
def flatten_pvt_v2_b0(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B0: 3.6M params, 0.58G MACs, 71.1% ImageNet-1k top-1 (published)."""
    args = {
        "embed_dims": (32, 64, 160, 256),
        "num_heads": (1, 2, 5, 8),
        "mlp_ratios": (8, 8, 4, 4),
        "depths": (2, 2, 2, 2),
    }
    return _create_flatten_pvt_v2("flatten_pvt_v2_b0", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b1(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B1: 12.9M params, 2.22G MACs, 79.5% ImageNet-1k top-1 (published)."""
    args = dict(_B1_PLUS, depths=(2, 2, 2, 2))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b1", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b2(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B2: 22.6M params, 4.25G MACs, 82.5% ImageNet-1k top-1 (published)."""
    args = dict(_B1_PLUS, depths=(3, 4, 6, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b2", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b3(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B3 (PVTv2-B3 depths 3, 4, 18, 3); the paper publishes no size or accuracy for it."""
    args = dict(_B1_PLUS, depths=(3, 4, 18, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b3", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b4(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B4 (PVTv2-B4 depths 3, 8, 27, 3); the paper publishes no size or accuracy for it."""
    args = dict(_B1_PLUS, depths=(3, 8, 27, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b4", pretrained=pretrained, **dict(args, **kwargs))
