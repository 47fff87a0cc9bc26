"""PVT's spatial reduction for FLatten's focused linear attention: queries from every token, keys and values from a
smaller map (the FLatten authors' ``la_sr_ratios`` and PVTv2's ``linear``).

Their steps, per block with tokens x (B, N, C) of an (H, W) map:
    q = x Wq;  r = reduce(x);  k, v = r Wk, r Wv                       (n reduced tokens)
    reduce: LayerNorm(Conv_{s x s, stride s}(x))                        (``sr_ratio`` s > 1)
            GELU(LayerNorm(Conv_{1x1}(AdaptiveAvgPool_{7x7}(x))))      (``linear``: PVTv2-Li, n = 49 at any size)
    k = k + P                                                          (P: a table of the reduced grid)
    o = focused linear attention of q over (k, v)                      (mean form, as `FocusedLinearAttention`)
    o = o + DWC(v'),  v' = v linearly interpolated from n to N along the flattened tokens, as an (H, W) image
    out = proj(o)
The DWC input is their 1-D interpolation of the token sequence, kept as it is so that their checkpoints compute the
same. Any (H, W): the s x s convolution drops a remainder as theirs does, and P is resized (bicubic) to the grid.
"""

from __future__ import annotations

import re

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import Tensor, nn

from linvit.attention import FocusedLinearAttention, focused_feature_map, linear_attention, resize_positional_table
from linvit.models._family import positive_per_stage
from linvit.ops._numerics import at_least_float32

__all__ = ["POOLED_GRID", "ReducedKeysFocusedAttention", "check_reductions", "reduction_ratios"]

# PVTv2-Li pools the keys and values to this grid at every input size
POOLED_GRID = (7, 7)

torch.fx.wrap("resize_positional_table")


def reduction_ratios(la_sr_ratios: int | str | tuple[int, ...] | list[int], num_stages: int) -> tuple[int, ...]:
    """``la_sr_ratios`` as one positive int per stage: an int for every stage, a sequence, or the authors' digit
    string (``"8421"``, one digit per stage)."""
    parts = [la_sr_ratios] * num_stages if isinstance(la_sr_ratios, int) else la_sr_ratios  # a str: its digits
    return positive_per_stage(
        parts,
        num_stages,
        f"la_sr_ratios needs one positive reduction ratio per stage ({num_stages}), got {la_sr_ratios!r}; e.g. 1 "
        f"(no reduction), '8421' or (8, 4, 2, 1).",
    )


class ReducedKeysFocusedAttention(FocusedLinearAttention):
    """Focused linear attention whose keys and values come from a reduced map (see the module docstring).

    Keys as the authors' after `checkpoint_filter_fn` fuses their ``q``/``kv``: ``qkv`` (rows q, k, v: q applied to
    every token, k and v to the reduced ones), ``proj``, ``scale``, ``positional_encoding`` (1, h*w, C) over the
    reduced grid, ``dwc``, and ``sr.*`` / ``norm.*`` (the reduction).

    Args:
        dim, num_heads: as `FocusedLinearAttention`, whose other keyword arguments it takes (the focused kernel with a
            learnable positional table, global attention only).
        sr_ratio: s of the s x s, stride-s reduction (1 with ``linear``).
        linear: pool to a 7x7 grid and reduce with a 1x1 convolution and GELU (PVTv2-Li) instead.
        pos_size: the (H, W) token grid of the map at the training size; the table covers its reduced grid.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        sr_ratio: int = 1,
        linear: bool = False,
        *,
        pos_size: tuple[int, int],
        device=None,
        dtype=None,
        **kwargs,
    ):
        if not linear and sr_ratio < 2:
            raise ValueError(
                f"sr_ratio must be at least 2 (or linear=True), got {sr_ratio}; without a reduction use "
                "FocusedLinearAttention."
            )
        unsupported = {
            key: kwargs[key]
            for key, default in (("kernel", "focused"), ("pos_encoding", "learnable"), ("window_size", None))
            if key in kwargs and kwargs[key] != default
        }
        if unsupported or kwargs.get("num_prefix_tokens", 0):
            raise ValueError(
                f"reduced keys and values work with the focused kernel, a learnable table and global attention; got "
                f"{unsupported or kwargs}; drop these options or the reduction (la_sr_ratios 1, linear=False)."
            )
        self.sr_ratio = 1 if linear else sr_ratio
        self.linear = linear
        dd = {"device": device, "dtype": dtype}
        super().__init__(dim, num_heads, pos_size=self.reduced_grid(tuple(pos_size)), **kwargs, **dd)
        if linear:
            self.pool = nn.AdaptiveAvgPool2d(POOLED_GRID)
            self.sr = nn.Conv2d(dim, dim, 1, **dd)
            self.act = nn.GELU()
        else:
            self.pool = nn.Identity()
            self.sr = nn.Conv2d(dim, dim, self.sr_ratio, stride=self.sr_ratio, **dd)
            self.act = nn.Identity()
        self.norm = nn.LayerNorm(dim, **dd)  # eps 1e-5: the authors' plain nn.LayerNorm

    def reduced_grid(self, grid: tuple[int, int]) -> tuple[int, int]:
        """The grid of the keys and values of an (H, W) map: pooled 7x7, or (H // s, W // s) (at least 1x1)."""
        if self.linear:
            return POOLED_GRID
        return max(grid[0] // self.sr_ratio, 1), max(grid[1] // self.sr_ratio, 1)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W; returns (B, N, C)."""
        batch, tokens, channels = x.shape
        assert self.qkv is not None and self.proj is not None and self.positional_encoding is not None
        assert self.pos_size is not None
        weight, bias = self.qkv.weight, self.qkv.bias
        q = F.linear(x, weight[:channels], None if bias is None else bias[:channels])
        image = x.transpose(1, 2).reshape(batch, channels, hw[0], hw[1])
        reduced = self.sr(self.pool(image))
        grid = (reduced.shape[2], reduced.shape[3])
        reduced = self.act(self.norm(reduced.flatten(2).transpose(1, 2)))
        k, v = F.linear(reduced, weight[channels:], None if bias is None else bias[channels:]).chunk(2, dim=-1)
        k = k + resize_positional_table(self.positional_encoding, self.pos_size, grid).to(k.dtype)
        q = focused_feature_map(at_least_float32(q), self.scale, self.focusing_factor, self.feature_eps)
        k = focused_feature_map(at_least_float32(k), self.scale, self.focusing_factor, self.feature_eps)
        heads, head_dim = self.num_heads, self.head_dim
        v = v.reshape(batch, -1, heads, head_dim).transpose(1, 2)  # (B, h, n, d)
        out = linear_attention(
            q.reshape(batch, tokens, heads, head_dim).transpose(1, 2),
            k.reshape(batch, -1, heads, head_dim).transpose(1, 2),
            v,
            None,
            self.eps,
        )
        out = out.transpose(1, 2).reshape(batch, tokens, channels)
        if self.dwc is not None:
            # the values stretched back to N tokens by linear interpolation along the token sequence, as an image
            sequence = v.transpose(2, 3).reshape(batch * heads, head_dim, -1)
            image = F.interpolate(sequence, size=tokens, mode="linear").reshape(batch * heads, head_dim, hw[0], hw[1])
            out = out + self.dwc(image).reshape(batch, channels, tokens).transpose(1, 2)
        return self.proj_drop(self.proj(out))

    @torch.jit.unused
    def set_pos_size(self, pos_size) -> None:
        """Resize the table to the reduced grid of an (H, W) token grid (bicubic, ``requires_grad`` kept)."""
        super().set_pos_size(self.reduced_grid(tuple(pos_size)))

    def extra_repr(self) -> str:
        reduction = "linear (7x7 pool)" if self.linear else f"sr_ratio={self.sr_ratio}"
        return f"{super().extra_repr()}, {reduction}"


register_notrace_module(ReducedKeysFocusedAttention)

_REDUCTION_KEY = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.attn\.sr\.weight$")


def _describe(reduction: int | str) -> str:
    if reduction == "linear":
        return "pools keys and values to 7x7 (linear=True)"
    if reduction == 1:
        return "takes keys and values from every token (no reduction)"
    return f"reduces keys and values {reduction}x{reduction} (la_sr_ratios)"


def check_reductions(state_dict: dict[str, torch.Tensor], model: nn.Module) -> None:
    """ValueError when a block of a linvit-layout state dict reduces its keys and values otherwise than the model's:
    its ``attn.sr`` convolution (s x s, or 1x1 for the pooled ``linear`` form) tells how. One sentence, with the
    ``la_sr_ratios`` / ``linear`` that build a model the checkpoint fits."""
    found: dict[tuple[int, int], int | str] = {}
    for key, value in state_dict.items():
        match = _REDUCTION_KEY.match(key)
        if match:
            found[(int(match.group(1)), int(match.group(2)))] = "linear" if value.shape[-1] == 1 else value.shape[-1]
    theirs: dict[tuple[int, int], int | str] = {}  # the reduction of each block the checkpoint holds
    for stage_index, stage in enumerate(model.stages):
        for j in range(len(stage.blocks)):
            if f"stages.{stage_index}.blocks.{j}.attn.qkv.weight" in state_dict:
                theirs[(stage_index, j)] = found.get((stage_index, j), 1)
    for (stage, index), reduction in theirs.items():
        attn = model.stages[stage].blocks[index].attn
        ours: int | str = 1
        if isinstance(attn, ReducedKeysFocusedAttention):
            ours = "linear" if attn.linear else attn.sr_ratio
        if ours != reduction:
            ratios = [1] * len(model.stages)
            for (i, _), ratio in theirs.items():
                ratios[i] = ratio if isinstance(ratio, int) else ratios[i]
            fix = f"la_sr_ratios={''.join(map(str, ratios)) if max(ratios) < 10 else tuple(ratios)!r}"
            if "linear" in theirs.values():
                fix = "linear=True"
            raise ValueError(
                f"stage {stage + 1} of the checkpoint {_describe(reduction)} but the model's {_describe(ours)}: "
                f"build the model with {fix}"
            )
