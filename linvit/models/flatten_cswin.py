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
import torch.nn.functional as F
from timm.layers import (
    ClassifierHead,
    DropPath,
    LayerNorm2d,
    Mlp,
    register_notrace_module,
    to_2tuple,
    trunc_normal_,
)
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from linvit.attention import FocusedLinearAttention
from linvit.models._checkpoint import load_pretrained_file
from linvit.models._classifier import ClassifierHeadMixin
from linvit.models._flatten_common import (
    conv_stage_grids,
    create_flatten_model,
    drop_path_rates,
    is_converted,
    one_based_stage,
    rename_keys,
    resize_tables_to_model,
    set_attention_grid,
    stage_model_cfg,
    unwrap_checkpoint,
)
from linvit.models._validation import check_image_batch

__all__ = ["FlattenCSwin", "checkpoint_filter_fn"]

# The 7x7/4 stem (padding 2) gives an empty map below 3x3; from 3x3 up every stage has at least one token.
MIN_INPUT_SIZE = (3, 3)


def stage_grids(img_size: tuple[int, int], num_stages: int = 4) -> list[tuple[int, int]]:
    """Token grid of every stage (7x7/4 stem with padding 2, then 3x3/2 merges with padding 1)."""
    return conv_stage_grids(img_size, num_stages, stem_padding=2)


class FocusedLinearLePEAttention(nn.Module):
    """FLatten's global focused linear attention plus CSWin's LePE, on the block's q|k|v (no projections).

    forward(qkv, hw): qkv (B, N, 3C) = [q | k | v] -> (B, N, C) = focused(q, k, v) + DWC(v) + get_v(v), where
    `focused` is linvit's `FocusedLinearAttention` without projections (its `scale`, `positional_encoding`, `dwc`
    are the authors' `attns.0.{scale, positional_encoding, dwc}`) and `get_v` is CSWin's 3x3 depthwise LePE conv.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        pos_size: tuple[int, int],
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.dim = dim
        self.focused = FocusedLinearAttention(
            dim,
            num_heads,
            focusing_factor=focusing_factor,
            dwc_kernel_size=dwc_kernel_size,
            pos_encoding="learnable",
            pos_size=pos_size,
            with_projections=False,
            device=device,
            dtype=dtype,
        )
        self.get_v = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        out = self.focused(x, hw)
        batch = x.shape[0]
        v = x[:, :, 2 * self.dim :]
        image = v.transpose(1, 2).reshape(batch, self.dim, hw[0], hw[1])
        return out + self.get_v(image).flatten(2).transpose(1, 2)


def _stripe_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(B, Hp, Wp, C) -> (B * nH * nW, wh * ww, C), windows batch-major, tokens row-major inside a window."""
    batch, height, width, channels = x.shape
    x = x.reshape(batch, height // window[0], window[0], width // window[1], window[1], channels)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window[0] * window[1], channels)


def _stripe_reverse(windows: torch.Tensor, window: tuple[int, int], padded_hw: tuple[int, int]) -> torch.Tensor:
    """(B * nH * nW, wh * ww, C) -> (B, Hp, Wp, C)."""
    channels = windows.shape[-1]
    n_h, n_w = padded_hw[0] // window[0], padded_hw[1] // window[1]
    x = windows.reshape(-1, n_h, n_w, window[0], window[1], channels)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, padded_hw[0], padded_hw[1], channels)


class LePEAttention(nn.Module):
    """CSWin's stripe softmax attention with locally-enhanced positional encoding, on the block's q|k|v.

    direction: "vertical" = windows of full height x `split_size` columns, "horizontal" = `split_size` rows x full
    width, "full" = the whole map. forward(qkv, hw): qkv (B, N, 3C) -> (B, N, C). Keys: `get_v.*`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        split_size: int,
        direction: str,
        attn_drop: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if direction not in ("vertical", "horizontal", "full"):
            raise ValueError(f"direction must be 'vertical', 'horizontal' or 'full', got {direction!r}.")
        if dim % num_heads != 0:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; choose heads that divide dim.")
        self.dim = dim
        self.num_heads = num_heads
        self.split_size = split_size
        self.direction = direction
        self.attn_drop = nn.Dropout(attn_drop)
        self.get_v = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, device=device, dtype=dtype)

    def _window(self, hw: tuple[int, int]) -> tuple[int, int]:
        if self.direction == "vertical":
            return hw[0], min(self.split_size, hw[1])
        if self.direction == "horizontal":
            return min(self.split_size, hw[0]), hw[1]
        return hw[0], hw[1]

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        batch = x.shape[0]
        height, width = hw
        window = self._window(hw)
        pad_h = (window[0] - height % window[0]) % window[0]
        pad_w = (window[1] - width % window[1]) % window[1]
        padded_hw = (height + pad_h, width + pad_w)
        grid = x.reshape(batch, height, width, 3 * self.dim)
        grid = F.pad(grid, (0, 0, 0, pad_w, 0, pad_h))  # zeros: the LePE conv's own border padding
        windows = _stripe_partition(grid, window)  # (B', n, 3C)
        num_windows, tokens = windows.shape[0], windows.shape[1]
        head_dim = self.dim // self.num_heads
        q, k, v = windows.reshape(num_windows, tokens, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        # softmax(q k^T / sqrt(d)) v written out, as CSWin computes it: the stripes are short, and torch's flop
        # counter sees these matmuls (it misses the CPU kernel behind F.scaled_dot_product_attention)
        attn = (q * head_dim**-0.5) @ k.transpose(-2, -1)  # (B', heads, n, n)
        if pad_h > 0 or pad_w > 0:
            valid = torch.zeros(1, padded_hw[0], padded_hw[1], 1, dtype=torch.bool, device=x.device)
            valid[:, :height, :width, :] = True
            keep = _stripe_partition(valid, window).reshape(-1, 1, 1, tokens).repeat(batch, 1, 1, 1)
            attn = attn.masked_fill(~keep, float("-inf"))  # padded keys take no part
        attn = self.attn_drop(attn.softmax(dim=-1))
        out = attn @ v  # (B', heads, n, d)

        # LePE: the depthwise 3x3 conv of v, per window (zero padding at the window border, as CSWin does)
        v_image = windows[:, :, 2 * self.dim :].transpose(1, 2).reshape(num_windows, self.dim, window[0], window[1])
        lepe = self.get_v(v_image).reshape(num_windows, self.num_heads, head_dim, tokens).transpose(2, 3)
        out = (out + lepe).transpose(1, 2).reshape(num_windows, tokens, self.dim)
        out = _stripe_reverse(out, window, padded_hw)[:, :height, :width, :]
        return out.reshape(batch, height * width, self.dim)


register_notrace_module(FocusedLinearLePEAttention)
register_notrace_module(LePEAttention)


class FlattenCSwinBlock(nn.Module):
    """CSWin block: LN -> qkv -> attention branches -> proj, residual; LN -> MLP, residual."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attn_type: str,
        split_size: int,
        last_stage: bool,
        pos_size: tuple[int, int],
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if attn_type not in ("L", "S"):
            raise ValueError(f"attn_type must be 'L' (focused linear) or 'S' (stripe softmax), got {attn_type!r}.")
        self.dim = dim
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        if attn_type == "L":
            branches = [FocusedLinearLePEAttention(dim, num_heads, pos_size, focusing_factor, dwc_kernel_size, **dd)]
        elif last_stage:
            branches = [LePEAttention(dim, num_heads, split_size, "full", attn_drop, **dd)]
        else:
            if num_heads % 2 or dim % 2:
                raise ValueError(f"stripe blocks split dim={dim} and num_heads={num_heads} in halves; use even ones.")
            branches = [
                LePEAttention(dim // 2, num_heads // 2, split_size, direction, attn_drop, **dd)
                for direction in ("vertical", "horizontal")
            ]
        self.num_branches = len(branches)
        self.attns = nn.ModuleList(branches)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        qkv = self.qkv(self.norm1(x))
        if self.num_branches == 1:
            attended = self.attns[0](qkv, hw)
        else:
            # each branch takes its half of q, of k and of v
            batch, tokens, _ = qkv.shape
            half = self.dim // 2
            parts = qkv.reshape(batch, tokens, 3, self.dim)
            outs = []
            for i, branch in enumerate(self.attns):
                outs.append(branch(parts[:, :, :, i * half : (i + 1) * half].reshape(batch, tokens, 3 * half), hw))
            attended = torch.cat(outs, dim=-1)
        x = x + self.drop_path(self.proj_drop(self.proj(attended)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvNorm(nn.Module):
    """Strided convolution + LayerNorm over channels: CSWin's stem (7x7/4, pad 2) and Merge_Block (3x3/2, pad 1)."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int, device=None, dtype=None):
        super().__init__()
        padding = (kernel_size - stride + 1) // 2  # 2 for the 7x7/4 stem, 1 for the 3x3/2 merges, as CSWin
        self.conv = nn.Conv2d(in_chans, out_chans, kernel_size, stride, padding, device=device, dtype=dtype)
        self.norm = LayerNorm2d(out_chans, eps=1e-5, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class FlattenCSwinStage(nn.Module):
    """Optional downsample, then blocks; (B, C_in, H, W) -> (B, C, H', W')."""

    def __init__(
        self,
        in_chans: int,
        dim: int,
        depth: int,
        num_heads: int,
        attn_type: str,
        split_size: int,
        last_stage: bool,
        pos_size: tuple[int, int],
        downsample: bool,
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
        self.downsample = ConvNorm(in_chans, dim, 3, 2, **dd) if downsample else nn.Identity()
        self.blocks = nn.ModuleList(
            [
                FlattenCSwinBlock(
                    dim,
                    num_heads,
                    attn_type,
                    split_size,
                    last_stage,
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        batch, channels, height, width = x.shape
        hw = (height, width)
        x = x.flatten(2).transpose(1, 2)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
        return x.transpose(1, 2).reshape(batch, channels, height, width)


class FlattenCSwin(ClassifierHeadMixin, nn.Module):
    """FLatten-CSwin backbone and classifier. Features are NCHW at strides 4, 8, 16, 32."""

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
        attn_types: str = "LLSS",
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
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        num_stages = len(depths)
        if not (len(num_heads) == len(split_size) == len(attn_types) == num_stages):
            raise ValueError(
                f"depths {tuple(depths)}, num_heads {tuple(num_heads)}, split_size {tuple(split_size)} and "
                f"attn_types {attn_types!r} must have one entry per stage; give them the same length."
            )
        if global_pool not in ("avg", "max", "avgmax", ""):
            raise ValueError(f"global_pool must be one of 'avg', 'max', 'avgmax' or '', got {global_pool!r}.")
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.min_input_size = MIN_INPUT_SIZE
        self.global_pool = global_pool
        self.output_fmt = "NCHW"
        self.img_size = to_2tuple(img_size)
        self.attn_types = attn_types

        self.stem = ConvNorm(in_chans, embed_dim, 7, 4, **dd)
        grids = stage_grids(self.img_size, num_stages)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        stages = []
        self.feature_info = []
        prev_dim, dim, cursor = embed_dim, embed_dim, 0
        for i in range(num_stages):
            stages.append(
                FlattenCSwinStage(
                    prev_dim,
                    dim,
                    depths[i],
                    num_heads[i],
                    attn_types[i],
                    split_size[i],
                    last_stage=i == num_stages - 1,
                    pos_size=grids[i],
                    downsample=i > 0,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=rates[cursor : cursor + depths[i]],
                    **dd,
                )
            )
            self.feature_info.append({"num_chs": dim, "reduction": 4 * 2**i, "module": f"stages.{i}"})
            prev_dim, cursor = dim, cursor + depths[i]
            dim = dim * 2
        self.stages = nn.Sequential(*stages)
        self.num_features = self.head_hidden_size = prev_dim
        self.norm = LayerNorm2d(prev_dim, eps=1e-5, **dd)
        self.head = ClassifierHead(prev_dim, num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"*.positional_encoding", "*.scale"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^stem",
            "blocks": r"^stages\.(\d+)"
            if coarse
            else [
                (r"^stages\.(\d+)\.downsample", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        }

    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int]) -> None:
        """Resize the linear blocks' positional encodings (bicubic) for a new input resolution."""
        self.img_size = to_2tuple(img_size)
        for stage, grid in zip(self.stages, stage_grids(self.img_size, len(self.stages))):
            for block in stage.blocks:
                for branch in block.attns:
                    if isinstance(branch, FocusedLinearLePEAttention):
                        set_attention_grid(branch.focused, grid)

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        """timm's `custom_load` entry: read the authors' .pth (or a converted file) safely and convert it."""
        load_pretrained_file(self, checkpoint_path, filter_fn=checkpoint_filter_fn)

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        """The entry check of every forward path: shape, channels, dtype (and the smallest size, where one exists)."""
        return check_image_batch(
            x, self.in_chans, self.min_input_size, "FlattenCSwin", weight_dtype=self.stem.conv.weight.dtype
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
        """Forward and collect stage outputs (NCHW); `norm` applies the final LayerNorm to the last stage's tap."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW' (the layout these stages produce), got {output_fmt!r}.")
        x = self._check_input(x)
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last_index = len(self.stages) - 1
        x = self.stem(x)
        if torch.jit.is_scripting() or not stop_early:
            stages = self.stages
        else:
            stages = self.stages[: max_index + 1]
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm and i == last_index else x)
        if intermediates_only:
            return intermediates
        if len(stages) - 1 == last_index:
            x = self.norm(x)
        return x, intermediates

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x)
        return self.norm(self.stages(self.stem(x)))


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-CSwin checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Renames `stage1_conv_embed.{0,2}` -> `stem.{conv,norm}`, `merge{s}` -> `stages.{s}.downsample`,
    `stage{s}.{j}` -> `stages.{s-1}.blocks.{j}`, a linear branch's `attns.0.{scale,positional_encoding,dwc}` ->
    `attns.0.focused.*`, `head` -> `head.fc`, and resizes the linear blocks' positional encodings when the model
    was built for another resolution.
    """
    state_dict = unwrap_checkpoint(state_dict)
    if is_converted(state_dict):
        return resize_tables_to_model(dict(state_dict), model)
    rules = [
        (r"stage1_conv_embed\.0\.", "stem.conv."),
        (r"stage1_conv_embed\.2\.", "stem.norm."),
        (r"^merge(\d+)\.", r"stages.\1.downsample."),
        (r"^stage(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
        (r"\.attns\.0\.(scale|positional_encoding|dwc\.)", r".attns.0.focused.\1"),
        (r"^head\.", "head.fc."),
    ]
    return resize_tables_to_model(rename_keys(state_dict, rules), model)


def _create_flatten_cswin(variant: str, pretrained: bool = False, **kwargs) -> FlattenCSwin:
    return create_flatten_model(FlattenCSwin, variant, pretrained, checkpoint_filter_fn, (0, 1, 2, 3), **kwargs)


def _cfg(**kwargs) -> dict[str, Any]:
    return stage_model_cfg("stem.conv", "mit", "arXiv:2107.00652", **kwargs)


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
