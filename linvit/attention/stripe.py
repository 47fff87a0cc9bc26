"""CSwin's cross-shaped stripe attention with locally-enhanced positional encoding (LePE), for any (H, W).

CSWin Transformer (Dong et al., CVPR 2022, arXiv 2107.00652): the channels and heads of a block are split between
branches that attend within stripes of the map: "vertical" (full height x ``split_size`` columns), "horizontal"
(``split_size`` rows x full width) or "full" (the whole map, CSwin's last stage). Each branch adds LePE, a 3x3
depthwise convolution of its values within the stripe. FLatten-CSwin's linear blocks are one branch of focused linear
attention plus LePE over the whole map.

- `LePEAttention`, `FocusedLinearLePEAttention`: one branch on the block's q|k|v (B, N, 3C) -> (B, N, C);
- `StripeBranches`: the branches of a block, each on its share of q, k and v (keys ``attns.{i}.*``, as CSwin);
- `StripeAttention`: qkv projection, branches, output projection: the registry's ``"stripe"`` for any model;
- `stripe_attention_reference`: the slow reference the fast path is tested against.

Any (H, W): the map is zero-padded to a multiple of the stripe (zeros are the LePE convolution's own border padding),
padded keys are masked out of the softmax, and the output is cropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx
from torch import Tensor, nn

from linvit.attention._checks import check_heads
from linvit.attention.focused import FocusedLinearAttention
from linvit.ops.windows import (
    exporting,
    pad_grid,
    padding_valid_map,
    symbolic_min,
    symbolic_window_layout,
    window_partition,
    window_reverse,
)

__all__ = [
    "DIRECTIONS",
    "WHOLE_MAP",
    "FocusedLinearLePEAttention",
    "LePEAttention",
    "StripeAttention",
    "StripeBranches",
    "stripe_attention_reference",
    "stripe_branches",
    "stripe_window",
]

DIRECTIONS = ("vertical", "horizontal", "full")
# a window extent longer than any map: windows (WHOLE_MAP, s) are clamped to (H, s), vertical stripes of the map
WHOLE_MAP = 2**31 - 1

torch.fx.wrap("padding_valid_map")


def _depthwise_conv3x3(dim: int, device=None, dtype=None) -> nn.Conv2d:
    """CSwin's LePE convolution (`get_v`)."""
    return nn.Conv2d(dim, dim, 3, padding=1, groups=dim, device=device, dtype=dtype)


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}.")


def stripe_window(direction: str, split_size: int, hw: tuple[int, int]) -> tuple[int, int]:
    """The (rows, columns) of one stripe of an (H, W) map: (H, split_size) vertical, (split_size, W) horizontal,
    (H, W) full; a stripe never wider than the map."""
    if direction == "vertical":
        return hw[0], symbolic_min(split_size, hw[1])
    if direction == "horizontal":
        return symbolic_min(split_size, hw[0]), hw[1]
    return hw[0], hw[1]


def _gather_stripes(x: Tensor, hw: tuple[int, int], window: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """For symbolic sizes (torch.export): the (B * nW, n, C) stripes of (B, N, C) tokens by one gather, with padded
    positions zero (the LePE convolution's own border), the (B * nW, n) bool of the real positions, and the gather
    back to (B, N, C) (`index_select(1, ...)` on (B, nW * n, C)). No branch on the sizes."""
    batch, channels = x.shape[0], x.shape[-1]
    wh, ww = window
    windows_per_image = ((hw[0] + wh - 1) // wh) * ((hw[1] + ww - 1) // ww)
    token_index, position_index, valid, _, _ = symbolic_window_layout(hw, window, (0, 0), x.device)
    valid = valid.view(windows_per_image, wh * ww).repeat(batch, 1)
    stripes = x.index_select(1, token_index).view(batch * windows_per_image, wh * ww, channels)
    return stripes * valid.unsqueeze(-1).to(stripes.dtype), valid, position_index


class LePEAttention(nn.Module):
    """Stripe softmax attention with LePE on a block's q|k|v: (B, N, 3C) -> (B, N, C). Keys: `get_v.*`.

    direction: "vertical", "horizontal" or "full" (see the module docstring); ``split_size`` is the stripe width.
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
        _check_direction(direction)
        check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.split_size = split_size
        self.direction = direction
        self.attn_drop = nn.Dropout(attn_drop)
        self.get_v = _depthwise_conv3x3(dim, device, dtype)

    def stripe(self, hw: tuple[int, int]) -> tuple[int, int]:
        """The (rows, columns) of one stripe of an (H, W) map."""
        return stripe_window(self.direction, self.split_size, hw)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
            if exporting():  # symbolic sizes: no branch on them
                return self._forward_symbolic(x, hw)
        batch = x.shape[0]
        height, width = hw
        window = self.stripe(hw)
        pad_h = (window[0] - height % window[0]) % window[0]
        pad_w = (window[1] - width % window[1]) % window[1]
        padded_hw = (height + pad_h, width + pad_w)
        grid = pad_grid(x.reshape(batch, height, width, 3 * self.dim), pad_h, pad_w)
        windows = window_partition(grid, window)  # (B * nW, n, 3C)
        num_windows, tokens = windows.shape[0], windows.shape[1]
        head_dim = self.dim // self.num_heads
        q, k, v = windows.reshape(num_windows, tokens, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        # softmax(q k^T / sqrt(d)) v written out, as CSwin computes it: the stripes are short, and torch's flop
        # counter sees these matmuls (it misses the CPU kernel behind F.scaled_dot_product_attention)
        attn = (q * head_dim**-0.5) @ k.transpose(-2, -1)  # (B', heads, n, n)
        if pad_h > 0 or pad_w > 0:
            valid = window_partition(padding_valid_map(hw, padded_hw, x.device), window)  # (nW, n, 1)
            keep = valid.reshape(-1, 1, 1, tokens).repeat(batch, 1, 1, 1)
            attn = attn.masked_fill(~keep, float("-inf"))  # padded keys take no part
        out = self.attn_drop(attn.softmax(dim=-1)) @ v  # (B', heads, n, d)

        # LePE: the depthwise 3x3 conv of v, per stripe (zero padding at the stripe border, as CSwin does)
        v_image = windows[:, :, 2 * self.dim :].transpose(1, 2).reshape(num_windows, self.dim, window[0], window[1])
        lepe = self.get_v(v_image).reshape(num_windows, self.num_heads, head_dim, tokens).transpose(2, 3)
        out = (out + lepe).transpose(1, 2).reshape(num_windows, tokens, self.dim)
        out = window_reverse(out, window, padded_hw)[:, :height, :width, :]
        return out.reshape(batch, height * width, self.dim)

    def _forward_symbolic(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """`forward` for symbolic sizes (torch.export with dynamic H, W): always padded (by one gather, see
        `_gather_stripes`) and always masked; the same result at every size."""
        batch = x.shape[0]
        window = self.stripe(hw)
        windows, valid, position_index = _gather_stripes(x, hw, window)
        num_windows, tokens = windows.shape[0], windows.shape[1]
        head_dim = self.dim // self.num_heads
        q, k, v = windows.view(num_windows, tokens, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * head_dim**-0.5) @ k.transpose(-2, -1)  # (B', heads, n, n)
        attn = attn.masked_fill(~valid.view(num_windows, 1, 1, tokens), float("-inf"))  # padded keys take no part
        out = self.attn_drop(attn.softmax(dim=-1)) @ v
        v_image = windows[:, :, 2 * self.dim :].transpose(1, 2).reshape(num_windows, self.dim, window[0], window[1])
        lepe = self.get_v(v_image).reshape(num_windows, self.num_heads, head_dim, tokens).transpose(2, 3)
        out = (out + lepe).transpose(1, 2).reshape(num_windows, tokens, self.dim)
        return out.view(batch, num_windows // batch * tokens, self.dim).index_select(1, position_index)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, split_size={self.split_size}, {self.direction}"


class FocusedLinearLePEAttention(nn.Module):
    """FLatten's focused linear attention plus CSwin's LePE, on a block's q|k|v: (B, N, 3C) -> (B, N, C).

    out = focused(q, k, v) + DWC(v) + get_v(v), where `focused` is a `FocusedLinearAttention` without projections
    (keys `focused.{scale, positional_encoding, dwc.*}`) and `get_v` the 3x3 depthwise LePE convolution.

    ``direction`` "full" (default) attends over the whole map, with a positional table of the map's grid
    ``pos_size``. "vertical" / "horizontal" attend within stripes ``split_size`` wide, as tall / wide as the map
    (the FLatten authors' ``la_split_size`` stripes): the linear attention, its DWC and the LePE run per stripe, and
    ``pos_size`` is the grid of one stripe (resized bicubically to the stripe of another map). A map that is no
    multiple of the stripe is zero-padded and its padded keys are masked out, as `FocusedLinearAttention` windows.
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
        *,
        direction: str = "full",
        split_size: int = 0,
    ):
        super().__init__()
        _check_direction(direction)
        if direction != "full" and split_size < 1:
            raise ValueError(f"{direction} stripes need a split_size >= 1 (the stripe width), got {split_size}.")
        self.dim = dim
        self.direction = direction
        self.split_size = split_size
        window = None
        if direction == "vertical":
            window = (WHOLE_MAP, split_size)
        elif direction == "horizontal":
            window = (split_size, WHOLE_MAP)
        self.focused = FocusedLinearAttention(
            dim,
            num_heads,
            focusing_factor=focusing_factor,
            dwc_kernel_size=dwc_kernel_size,
            pos_encoding="learnable",
            pos_size=pos_size,
            window_size=window,
            with_projections=False,
            device=device,
            dtype=dtype,
        )
        self.get_v = _depthwise_conv3x3(dim, device, dtype)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        out = self.focused(x, hw)
        v = x[:, :, 2 * self.dim :]
        if self.direction == "full":
            image = v.transpose(1, 2).reshape(x.shape[0], self.dim, hw[0], hw[1])
            return out + self.get_v(image).flatten(2).transpose(1, 2)
        return out + self._stripe_lepe(v, hw, stripe_window(self.direction, self.split_size, hw))

    def _stripe_lepe(self, v: Tensor, hw: tuple[int, int], window: tuple[int, int]) -> Tensor:
        """LePE per stripe: `get_v` on each (window) stripe of the (B, N, C) values, zero-padded at the stripe's
        border, as CSwin convolves each stripe on its own; (B, N, C) out."""
        batch = v.shape[0]
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
            if exporting():  # symbolic sizes: stripes by one gather, zeros at the padded positions
                stripes, _, position_index = _gather_stripes(v, hw, window)
                lepe = self.get_v(stripes.transpose(1, 2).reshape(stripes.shape[0], self.dim, window[0], window[1]))
                lepe = lepe.flatten(2).transpose(1, 2)
                return lepe.reshape(batch, -1, self.dim).index_select(1, position_index)
        pad_h = (window[0] - hw[0] % window[0]) % window[0]
        pad_w = (window[1] - hw[1] % window[1]) % window[1]
        padded_hw = (hw[0] + pad_h, hw[1] + pad_w)
        stripes = window_partition(pad_grid(v.reshape(batch, hw[0], hw[1], self.dim), pad_h, pad_w), window)
        lepe = self.get_v(stripes.transpose(1, 2).reshape(-1, self.dim, window[0], window[1]))
        lepe = window_reverse(lepe.flatten(2).transpose(1, 2), window, padded_hw)[:, : hw[0], : hw[1], :]
        return lepe.reshape(batch, hw[0] * hw[1], self.dim)

    @torch.jit.ignore
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Resize the positional table to the stripe of a map of ``grid`` (the whole grid for "full")."""
        self.focused.set_pos_size(stripe_window(self.direction, self.split_size, grid))

    def extra_repr(self) -> str:
        return self.direction if self.direction == "full" else f"{self.direction}, split_size={self.split_size}"


class StripeBranches(nn.ModuleList):
    """A block's attention branches: forward(qkv, hw) gives each branch its equal share of q, of k and of v, and
    concatenates their (B, N, C_i) outputs. Keys `{i}.*` (CSwin's `attns.{i}.*`)."""

    def __init__(self, branches: Sequence[nn.Module]):
        super().__init__(branches)
        self.num_branches = len(branches)  # TorchScript has no len() of a module list

    def forward(self, qkv: Tensor, hw: tuple[int, int]) -> Tensor:
        count = self.num_branches
        batch, tokens, _ = qkv.shape
        channels = qkv.shape[-1] // 3
        share = channels // count
        parts = qkv.reshape(batch, tokens, 3, channels)
        outs: list[Tensor] = []
        for i, branch in enumerate(self):
            if count == 1:  # the whole of q, k and v: no copy
                outs.append(branch(qkv, hw))
            else:
                outs.append(branch(parts[:, :, :, i * share : (i + 1) * share].reshape(batch, tokens, 3 * share), hw))
        return outs[0] if count == 1 else torch.cat(outs, dim=-1)


def stripe_branches(
    dim: int,
    num_heads: int,
    split_size: int,
    directions: Sequence[str] = ("vertical", "horizontal"),
    attn_drop: float = 0.0,
    device=None,
    dtype=None,
) -> StripeBranches:
    """One `LePEAttention` per direction, each with an equal share of the channels and heads."""
    count = len(directions)
    if dim % count or num_heads % count:
        raise ValueError(
            f"{count} stripe branches split dim={dim} and num_heads={num_heads} evenly; use multiples of {count}."
        )
    return StripeBranches(
        [
            LePEAttention(dim // count, num_heads // count, split_size, direction, attn_drop, device, dtype)
            for direction in directions
        ]
    )


class StripeAttention(nn.Module):
    """Cross-shaped stripe attention as a stand-alone module: qkv, `StripeBranches`, projection.

    Keys: `qkv.*`, `attns.{i}.get_v.*`, `proj.*`. ``directions`` ("vertical", "horizontal") halves the channels and
    heads between vertical and horizontal stripes of width ``split_size``; ("full",) attends over the whole map.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        split_size: int = 7,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        directions: Sequence[str] = ("vertical", "horizontal"),
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attns = stripe_branches(dim, num_heads, split_size, directions, attn_drop, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        return self.proj_drop(self.proj(self.attns(self.qkv(x), hw)))


def stripe_attention_reference(attn: LePEAttention, qkv: Tensor, hw: tuple[int, int]) -> Tensor:
    """Slow reference of `LePEAttention`: cut the map into its stripes (the last one narrower), attend within each
    stripe with the softmax written out, convolve v per stripe. No padding, no masks."""
    batch, _, three_c = qkv.shape
    channels, heads = three_c // 3, attn.num_heads
    head_dim = channels // heads
    grid = qkv.reshape(batch, hw[0], hw[1], three_c)
    out = torch.zeros(batch, hw[0], hw[1], channels, dtype=qkv.dtype, device=qkv.device)
    step = attn.split_size
    rows, cols = [(0, hw[0])], [(0, hw[1])]
    if attn.direction == "horizontal":
        rows = [(r, min(r + step, hw[0])) for r in range(0, hw[0], step)]
    if attn.direction == "vertical":
        cols = [(c, min(c + step, hw[1])) for c in range(0, hw[1], step)]
    for r0, r1 in rows:
        for c0, c1 in cols:
            piece = grid[:, r0:r1, c0:c1, :]
            h, w = piece.shape[1], piece.shape[2]
            q, k, v = piece.reshape(batch, h * w, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            weights = torch.softmax(q @ k.transpose(-2, -1) * head_dim**-0.5, dim=-1)
            v_image = piece[..., 2 * channels :].permute(0, 3, 1, 2)
            lepe = attn.get_v(v_image).reshape(batch, heads, head_dim, h * w).transpose(2, 3)
            out[:, r0:r1, c0:c1, :] = (weights @ v + lepe).transpose(1, 2).reshape(batch, h, w, channels)
    return out.reshape(batch, hw[0] * hw[1], channels)
