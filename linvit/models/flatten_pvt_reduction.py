"""PVT's spatial reduction: queries from every token, keys and values from a smaller map, for FLatten's focused linear
attention (the FLatten authors' ``la_sr_ratios`` and PVTv2's ``linear``) and for PVT's own softmax attention (the
stages their ``attn_type`` letter ``S`` builds: `SpatialReductionAttention`).

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

Their softmax stages (``S``) reduce the same way (s from their ``sr_ratios``, 8, 4, 2, 1; or the 7x7 pool with
``linear``; no reduction where s is 1), then, per head of width d:
    o = softmax(q k^T / sqrt(d)) v;  out = proj(o)                     (no positional table, no DWC)
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import Tensor, nn

from linvit.attention import (
    FocusedLinearAttention,
    ProjectedAttention,
    focused_feature_map,
    linear_attention,
    resize_positional_table,
)
from linvit.models._family import CreationOptionsError, positive_per_stage, spell_options
from linvit.ops._numerics import at_least_float32

__all__ = [
    "POOLED_GRID",
    "ReducedKeysFocusedAttention",
    "SpatialReductionAttention",
    "check_reductions",
    "reduction_ratios",
]

# PVTv2-Li pools the keys and values to this grid at every input size
POOLED_GRID = (7, 7)

torch.fx.wrap("resize_positional_table")


def reduction_ratios(
    la_sr_ratios: int | str | tuple[int, ...] | list[int], num_stages: int, option: str = "la_sr_ratios"
) -> tuple[int, ...]:
    """``la_sr_ratios`` (or another per-stage ratio ``option``, e.g. ``sr_ratios``) as one positive int per stage: an
    int for every stage, a sequence, or the authors' digit string (``"8421"``, one digit per stage)."""
    parts = [la_sr_ratios] * num_stages if isinstance(la_sr_ratios, int) else la_sr_ratios  # a str: its digits
    return positive_per_stage(
        parts,
        num_stages,
        f"{option} needs one positive reduction ratio per stage ({num_stages}), got {la_sr_ratios!r}; e.g. 1 "
        f"(no reduction), '8421' or (8, 4, 2, 1).",
    )


class KeyValueReduction:
    """What both reduced-key attentions share: the reduction of the map their keys and values come from (``pool``,
    ``sr``, ``norm``, ``act``: the authors' ``sr.*`` and ``norm.*`` keys), and the fused qkv projection split into
    the queries of every token and the keys and values of the reduced map."""

    def build_reduction(self, dim: int, sr_ratio: int, linear: bool, device=None, dtype=None) -> None:
        """The reduction layers: a 7x7 pool, 1x1 conv and GELU with ``linear``; an s x s, stride-s conv for
        ``sr_ratio`` s > 1; each followed by a LayerNorm (eps 1e-5: the authors' plain nn.LayerNorm); none for s 1."""
        reduces = linear or sr_ratio > 1
        kernel = 1 if linear else sr_ratio
        self.pool: nn.Module = nn.AdaptiveAvgPool2d(POOLED_GRID) if linear else nn.Identity()
        self.sr: nn.Module = (
            nn.Conv2d(dim, dim, kernel, stride=kernel, device=device, dtype=dtype) if reduces else nn.Identity()
        )
        self.norm: nn.Module = nn.LayerNorm(dim, device=device, dtype=dtype) if reduces else nn.Identity()
        self.act: nn.Module = nn.GELU() if linear else nn.Identity()

    def queries_and_reduced_keys_values(
        self, x: Tensor, hw: tuple[int, int], weight: Tensor, bias: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, tuple[int, int]]:
        """q (B, N, C) of every token, k and v (B, n, C) of the reduced map, and its (h, w) grid; ``weight`` and
        ``bias`` are the fused (3C, C) qkv projection's."""
        batch, _, channels = x.shape
        q = F.linear(x, weight[:channels], None if bias is None else bias[:channels])
        reduced = self.sr(self.pool(x.transpose(1, 2).reshape(batch, channels, hw[0], hw[1])))
        grid = (reduced.shape[2], reduced.shape[3])
        reduced = self.act(self.norm(reduced.flatten(2).transpose(1, 2)))
        k, v = F.linear(reduced, weight[channels:], None if bias is None else bias[channels:]).chunk(2, dim=-1)
        return q, k, v, grid


class ReducedKeysFocusedAttention(KeyValueReduction, FocusedLinearAttention):
    """Focused linear attention whose keys and values come from a reduced map (see the module docstring).

    Keys as the authors' after `checkpoint_filter_fn` fuses their ``q``/``kv``: ``qkv`` (rows q, k, v: q applied to
    every token, k and v to the reduced ones), ``proj``, ``scale``, ``positional_encoding`` (1, h*w, C) over the
    reduced grid, ``dwc``, and ``sr.*`` / ``norm.*`` (the reduction).

    Args:
        dim, num_heads: as `FocusedLinearAttention`, whose other keyword arguments it takes (the focused kernel with a
            learnable positional table, global attention only).
        sr_ratio: s of the s x s, stride-s reduction, at least 2 (any value with ``linear``, which takes 1).
        linear: pool to a 7x7 grid and reduce with a 1x1 convolution and GELU (PVTv2-Li) instead.
        pos_size: the (H, W) token grid of the map at the training size; the table covers its reduced grid.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        sr_ratio: int,
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
        self.build_reduction(dim, self.sr_ratio, linear, **dd)

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
        q, k, v, grid = self.queries_and_reduced_keys_values(x, hw, self.qkv.weight, self.qkv.bias)
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


class SpatialReductionAttention(KeyValueReduction, ProjectedAttention):
    """PVT's spatial-reduction softmax attention, as the FLatten authors' ``attn_type`` letter ``S`` builds it (see the
    module docstring): softmax attention of every token's query over keys and values of a reduced map.

    Keys as the authors' after `checkpoint_filter_fn` fuses their ``q``/``kv``: ``qkv`` (rows q, k, v), ``proj``,
    and where it reduces ``sr.*`` / ``norm.*``; it has no positional table and no DWC.

    Args:
        dim, num_heads, qkv_bias, proj_drop: see `ProjectedAttention`.
        sr_ratio: s of the s x s, stride-s reduction; 1 attends over every token (PVT's last stage).
        linear: pool to a 7x7 grid and reduce with a 1x1 convolution and GELU (PVTv2-Li) instead.
        attn_drop: dropout on the attention probabilities (training only).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        sr_ratio: int = 1,
        linear: bool = False,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        device=None,
        dtype=None,
    ):
        if sr_ratio < 1:
            raise ValueError(f"sr_ratio must be a positive reduction ratio (1: no reduction), got {sr_ratio}.")
        dd = {"device": device, "dtype": dtype}
        super().__init__(dim, num_heads, qkv_bias, proj_drop, **dd)
        self.sr_ratio = 1 if linear else sr_ratio
        self.linear = linear
        self.attn_drop = attn_drop
        self.build_reduction(dim, self.sr_ratio, linear, **dd)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W; returns (B, N, C)."""
        batch, tokens, channels = x.shape
        assert self.qkv is not None
        q, k, v, _ = self.queries_and_reduced_keys_values(x, hw, self.qkv.weight, self.qkv.bias)
        heads, head_dim = self.num_heads, self.head_dim
        out = F.scaled_dot_product_attention(  # scale 1 / sqrt(d), as the authors' qk_scale=None
            q.reshape(batch, tokens, heads, head_dim).transpose(1, 2),
            k.reshape(batch, -1, heads, head_dim).transpose(1, 2),
            v.reshape(batch, -1, heads, head_dim).transpose(1, 2),
            dropout_p=self.attn_drop if self.training else 0.0,
        )
        return self.project_out(out.transpose(1, 2).reshape(batch, tokens, channels))

    def extra_repr(self) -> str:
        reduction = "linear (7x7 pool)" if self.linear else f"sr_ratio={self.sr_ratio}"
        return f"dim={self.dim}, num_heads={self.num_heads}, softmax, {reduction}"


register_notrace_module(SpatialReductionAttention)

_BLOCK_KEY = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.attn\.qkv\.weight$")


def _describe(reduction: int | str, letter: str | None) -> str:
    if reduction == "linear":
        return "pools keys and values to 7x7 (linear=True)"
    if reduction == 1:
        return "takes keys and values from every token (no reduction)"
    option = "sr_ratios" if letter == "S" else "la_sr_ratios"
    return f"reduces keys and values {reduction}x{reduction} ({option})"


_KINDS = {"L": "focused linear attention (the authors' L)", "S": "softmax attention (the authors' S)"}


def _block_kind(state_dict: dict[str, torch.Tensor], prefix: str) -> str:
    """A checkpoint block's attention as the authors' letter: "L" with the focused kernel's ``scale``, else "S"."""
    return "L" if f"{prefix}.attn.scale" in state_dict else "S"


def _block_reduction(state_dict: dict[str, torch.Tensor], prefix: str) -> int | str:
    """A checkpoint block's reduction: "linear" (a 1x1 ``attn.sr``), s (an s x s one), or 1 (none)."""
    weight = state_dict.get(f"{prefix}.attn.sr.weight")
    if weight is None:
        return 1
    return "linear" if weight.shape[-1] == 1 else int(weight.shape[-1])


def _model_block(attn: nn.Module) -> tuple[str | None, int | str]:
    """The model block's (letter or None for kinds a checkpoint cannot tell apart, reduction)."""
    if isinstance(attn, SpatialReductionAttention):
        return "S", "linear" if attn.linear else attn.sr_ratio
    if isinstance(attn, ReducedKeysFocusedAttention):
        return "L", "linear" if attn.linear else attn.sr_ratio
    return ("L" if isinstance(getattr(attn, "scale", None), nn.Parameter) else None), 1


def _build_with(theirs: dict[tuple[int, int], tuple[str, int | str]], model: nn.Module) -> dict[str, Any]:
    """The creation arguments that build a model whose blocks take the checkpoint's attention and reductions."""
    num_stages = len(model.stages)
    letters = ["L"] * num_stages
    reductions: list[int | str] = [1] * num_stages
    for (stage, _), (letter, reduction) in theirs.items():
        letters[stage], reductions[stage] = letter, reduction
    fix: dict[str, Any] = {"attn_layers": "".join(letters)} if "S" in letters else {}
    if "linear" in reductions:
        fix["linear"] = True
    else:
        la = [r if letter == "L" else 1 for letter, r in zip(letters, reductions)]
        if max(la) > 1:  # type: ignore[type-var]
            fix["la_sr_ratios"] = _ratios(la)
        ours = tuple(getattr(model, "sr_ratios", ()))
        if any(letter == "S" and r != o for letter, r, o in zip(letters, reductions, ours)):
            pvt = [2 ** (num_stages - 1 - i) for i in range(num_stages)]  # the others as PVT's default
            fix["sr_ratios"] = _ratios([r if letter == "S" else d for letter, r, d in zip(letters, reductions, pvt)])
    return fix


def _ratios(ratios: list) -> str | tuple[int, ...]:
    return "".join(map(str, ratios)) if max(ratios) < 10 else tuple(ratios)


def check_reductions(state_dict: dict[str, torch.Tensor], model: nn.Module) -> None:
    """ValueError when a block of a linvit-layout state dict attends otherwise than the model's: softmax (the authors'
    ``S``, without the focused kernel's ``scale``) or focused linear attention (``L``), and how it reduces its keys
    and values, which its ``attn.sr`` convolution tells (s x s, or 1x1 for the pooled ``linear`` form). One
    sentence, with the ``attn_layers`` / ``la_sr_ratios`` / ``sr_ratios`` / ``linear`` that build a model the
    checkpoint fits."""
    theirs: dict[tuple[int, int], tuple[str, int | str]] = {}  # (kind, reduction) of each block the checkpoint holds
    for key in state_dict:
        match = _BLOCK_KEY.match(key)
        if match and int(match.group(1)) < len(model.stages):
            prefix = key[: -len(".attn.qkv.weight")]
            theirs[(int(match.group(1)), int(match.group(2)))] = (
                _block_kind(state_dict, prefix),
                _block_reduction(state_dict, prefix),
            )
    for (stage, index), (letter, reduction) in sorted(theirs.items()):
        blocks = model.stages[stage].blocks
        if index >= len(blocks):
            continue
        our_letter, ours = _model_block(blocks[index].attn)
        if our_letter is not None and our_letter != letter:
            options = _build_with(theirs, model)
            raise CreationOptionsError(
                f"stage {stage + 1} of the checkpoint is {_KINDS[letter]} but the model's is {_KINDS[our_letter]}: "
                f"build the model with {spell_options(options)}",
                options,
            )
        if ours != reduction:
            options = _build_with(theirs, model)
            raise CreationOptionsError(
                f"stage {stage + 1} of the checkpoint {_describe(reduction, letter)} but the model's "
                f"{_describe(ours, our_letter)}: build the model with {spell_options(options)}",
                options,
            )
