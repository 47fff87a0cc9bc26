"""FLatten-PVT (v1): PVT with focused linear attention in every block (FLatten Transformer, ICCV 2023).

Papers:
* FLatten Transformer: Vision Transformer using Focused Linear Attention - https://arxiv.org/abs/2308.00442
* Pyramid Vision Transformer: A Versatile Backbone for Dense Prediction without Convolutions
  - https://arxiv.org/abs/2102.12122

Architecture as in the FLatten authors' release (LeapLabTHU/FLatten-Transformer, config `PVT_LA_SR_RATIOS: 1111`):
non-overlapping patch embeddings (4x4 stem, 2x2 downsampling) each with LayerNorm, a learnable absolute position
embedding added per stage, and blocks whose attention is a global focused linear attention without spatial
reduction (learnable positional encoding on the keys, depthwise 5x5 enhancement of the values) followed by a plain
MLP. The classifier averages the last stage's tokens; there is no final norm.

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
import torch.nn.functional as F
from timm.layers import ClassifierHead, register_notrace_function, to_2tuple, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn
from torch.utils.checkpoint import checkpoint

from linvit.models._checkpoint import load_pretrained_file
from linvit.models._flatten_common import (
    create_flatten_model,
    drop_path_rates,
    fuse_q_kv,
    is_converted,
    one_based_stage,
    rename_keys,
    resize_tables_to_model,
    set_attention_grid,
    unwrap_checkpoint,
)
from linvit.models.flatten_pvt_v2 import FlattenPvtV2, FlattenPvtV2Block, _cfg

__all__ = ["FlattenPvt", "checkpoint_filter_fn"]


def _ceil_div(size: int, stride: int) -> int:
    return -(-size // stride)


def stage_grids(img_size: tuple[int, int], num_stages: int = 4) -> list[tuple[int, int]]:
    """Token grid of every stage for an input of `img_size` (4x4 stem, then 2x2 patches; inputs padded up)."""
    h, w = _ceil_div(img_size[0], 4), _ceil_div(img_size[1], 4)
    grids = [(h, w)]
    for _ in range(num_stages - 1):
        h, w = _ceil_div(h, 2), _ceil_div(w, 2)
        grids.append((h, w))
    return grids


@register_notrace_function
def resize_pos_embed(pos_embed: torch.Tensor, pos_size: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of a (1, h*w, C) position embedding from grid `pos_size` to `hw` (identity when equal)."""
    if pos_size[0] == hw[0] and pos_size[1] == hw[1]:
        return pos_embed
    channels = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, pos_size[0], pos_size[1], channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=hw, mode="bilinear", align_corners=False)
    return grid.flatten(2).transpose(1, 2)


class PatchEmbed(nn.Module):
    """Non-overlapping `patch_size` convolution and LayerNorm; pads the input up to a multiple of the patch."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, **dd)
        self.norm = nn.LayerNorm(embed_dim, **dd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        pad_h = (self.patch_size - x.shape[2] % self.patch_size) % self.patch_size
        pad_w = (self.patch_size - x.shape[3] % self.patch_size) % self.patch_size
        x = F.pad(x, (0, pad_w, 0, pad_h))
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        return self.norm(x.flatten(2).transpose(1, 2)), hw


class TokenMlp(nn.Module):
    """fc1 -> GELU -> fc2 on tokens (PVT v1's feed-forward); takes hw like PVTv2's MLP so both share one block."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.fc1 = nn.Linear(dim, hidden_dim, **dd)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim, **dd)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class FlattenPvtStage(nn.Module):
    """Patch embedding, absolute position embedding, blocks; (B, C_in, H, W) -> (B, C, H', W')."""

    def __init__(
        self,
        in_chans: int,
        dim: int,
        depth: int,
        num_heads: int,
        pos_size: tuple[int, int],
        patch_size: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        pos_drop: float = 0.0,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: Sequence[float] = (),
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.grad_checkpointing = False
        self.patch_embed = PatchEmbed(in_chans, dim, patch_size, **dd)
        self.pos_size = tuple(pos_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_size[0] * pos_size[1], dim, **dd))
        self.pos_drop = nn.Dropout(pos_drop)
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
                    mlp_layer=TokenMlp,
                    **dd,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, hw = self.patch_embed(x)
        x = self.pos_drop(x + resize_pos_embed(self.pos_embed, self.pos_size, hw))
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], hw[0], hw[1])


class FlattenPvt(FlattenPvtV2):
    """FLatten-PVT backbone and classifier. Features are NCHW at strides 4, 8, 16, 32.

    Shares the timm plumbing (heads, taps, pruning, grad checkpointing) with `FlattenPvtV2`; the stages differ.
    """

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
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        device=None,
        dtype=None,
    ):
        nn.Module.__init__(self)
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
        self.model_name = type(self).__name__  # named in input errors (see FlattenPvtV2.forward_features)
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
                FlattenPvtStage(
                    prev_dim,
                    embed_dims[i],
                    depths[i],
                    num_heads[i],
                    grids[i],
                    patch_size=4 if i == 0 else 2,
                    mlp_ratio=mlp_ratios[i],
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    pos_drop=pos_drop_rate,
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
        for stage in self.stages:
            trunc_normal_(stage.pos_embed, std=0.02)
        self.apply(self._init_weights)

    @staticmethod
    def _stage_grids(img_size: tuple[int, int]) -> list[tuple[int, int]]:
        return stage_grids(img_size)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"*.pos_embed", "*.positional_encoding", "*.scale"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^stages\.0\.(?:patch_embed|pos_embed)",
            "blocks": r"^stages\.(\d+)"
            if coarse
            else [(r"^stages\.(\d+)\.(?:patch_embed|pos_embed)", (0,)), (r"^stages\.(\d+)\.blocks\.(\d+)", None)],
        }

    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int]) -> None:
        """Resize the position embeddings (bilinear) and attention tables (bicubic) for a new input resolution."""
        self.img_size = to_2tuple(img_size)
        for stage, grid in zip(self.stages, self._stage_grids(self.img_size)):
            if stage.pos_size != grid:
                old = stage.pos_embed
                with torch.no_grad():
                    resized = resize_pos_embed(old.data, stage.pos_size, grid)
                stage.pos_embed = nn.Parameter(resized, requires_grad=old.requires_grad)
                stage.pos_size = grid
            for block in stage.blocks:
                set_attention_grid(block.attn, grid)

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        """timm's `custom_load` entry: read the authors' .pth (or a converted file) safely and convert it."""
        load_pretrained_file(self, checkpoint_path, filter_fn=checkpoint_filter_fn)


def _resize_pos_embeds_to_model(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    for i, stage in enumerate(model.stages):
        key = f"stages.{i}.pos_embed"
        if key in state_dict and state_dict[key].shape != stage.pos_embed.shape:
            tokens = state_dict[key].shape[1]
            side = int(round(tokens**0.5))
            if side * side != tokens:
                raise ValueError(f"cannot resize {key}: its {tokens} tokens are not a square grid.")
            state_dict[key] = resize_pos_embed(state_dict[key], (side, side), stage.pos_size)
    return state_dict


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-PVT checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Fuses `attn.q`/`attn.kv` into `attn.qkv`, renames `patch_embed{s}`, `pos_embed{s}`, `block{s}` and `head`,
    drops the never-used final `norm`, and resizes position tables when the model was built for another size.
    """
    state_dict = unwrap_checkpoint(state_dict)
    if is_converted(state_dict):
        out = dict(state_dict)
    else:
        # the authors' final norm is built but never applied by their model
        used = {key: value for key, value in fuse_q_kv(state_dict).items() if not key.startswith("norm.")}
        rules = [
            (r"^patch_embed(\d+)\.", one_based_stage("stages.{stage}.patch_embed.")),
            (r"^pos_embed(\d+)$", one_based_stage("stages.{stage}.pos_embed")),
            (r"^block(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
            (r"^head\.", "head.fc."),
        ]
        out = rename_keys(used, rules)
    return resize_tables_to_model(_resize_pos_embeds_to_model(out, model), model)


def _create_flatten_pvt(variant: str, pretrained: bool = False, **kwargs) -> FlattenPvt:
    return create_flatten_model(FlattenPvt, variant, pretrained, checkpoint_filter_fn, (0, 1, 2, 3), **kwargs)


def _pvt_cfg(**kwargs) -> dict[str, Any]:
    return _cfg(paper_ids=["arXiv:2308.00442", "arXiv:2102.12122"], **kwargs)


# Of this family the authors released only FLatten-PVT-T (Tsinghua Cloud link in `origin_url`; timm cannot fetch it
# itself: the link has no file name). Download it and load it with
# pretrained_cfg_overlay=dict(file="path/to/flatten_pvt_t.pth").
default_cfgs = generate_default_cfgs(
    {
        "flatten_pvt_tiny.in1k": _pvt_cfg(
            origin_url="https://cloud.tsinghua.edu.cn/f/3ab1d773f19d45648690/?dl=1",
            notes=("authors' release (77.8% top-1); download it and pass pretrained_cfg_overlay=dict(file=...)",),
        ),
        "flatten_pvt_small.in1k": _pvt_cfg(),
        "flatten_pvt_medium.in1k": _pvt_cfg(),
        "flatten_pvt_large.in1k": _pvt_cfg(),
    }
)

_PVT = {"embed_dims": (64, 128, 320, 512), "num_heads": (1, 2, 5, 8), "mlp_ratios": (8, 8, 4, 4)}


@register_model
def flatten_pvt_tiny(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-T: 12.2M params, 2.04G MACs, 77.8% ImageNet-1k top-1 (published)."""
    return _create_flatten_pvt("flatten_pvt_tiny", pretrained, **dict(dict(_PVT, depths=(2, 2, 2, 2)), **kwargs))


@register_model
def flatten_pvt_small(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-S: 21.7M params, 4.03G MACs, 81.7% ImageNet-1k top-1 (published)."""
    return _create_flatten_pvt("flatten_pvt_small", pretrained, **dict(dict(_PVT, depths=(3, 4, 6, 3)), **kwargs))


@register_model
def flatten_pvt_medium(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-M (PVT-M depths 3, 4, 18, 3); the paper publishes no size or accuracy for it."""
    return _create_flatten_pvt("flatten_pvt_medium", pretrained, **dict(dict(_PVT, depths=(3, 4, 18, 3)), **kwargs))


@register_model
def flatten_pvt_large(pretrained: bool = False, **kwargs) -> FlattenPvt:
    """FLatten-PVT-L (PVT-L depths 3, 8, 27, 3); the paper publishes no size or accuracy for it."""
    return _create_flatten_pvt("flatten_pvt_large", pretrained, **dict(dict(_PVT, depths=(3, 8, 27, 3)), **kwargs))
