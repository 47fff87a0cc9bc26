"""WindowAttention: Swin's (shifted) window softmax attention with relative position bias, for any (H, W).

The module does what Swin's block does around its attention: pads the map to a multiple of the window, rolls it by
the shift, partitions it into windows, and undoes all three afterwards; with a shift or padding each way is one
gather (`index_select` with an index cached per size) instead of a copy per step, otherwise a reshape. Softmax runs
through `F.scaled_dot_product_attention` with the relative position bias (and the masks below) as an additive mask in
q's dtype, laid out as the fused kernels read it.

Masks: with a shift, tokens attend only to tokens of their own region of the rolled map (Swin's mask). With padding,
real tokens do not attend to padded ones (Swin pads with zeros and lets padding take part; linvit masks it so results
do not depend on the padding, and pads with copies of the last row/column, which the gather gets for free). Padded
queries may still see padded keys, so no softmax row is ever fully masked; their outputs are dropped.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.attention._windows import (
    aligned_length,
    check_heads,
    check_token_grid,
    exporting,
    padded_grid_size,
    symbolic_min,
    symbolic_window_layout,
    to_pair,
    window_partition,
    window_position_index,
    window_reverse,
    window_token_index,
)

__all__ = [
    "WindowAttention",
    "centre_relative_position_bias",
    "relative_position_index",
    "relative_position_bias",
    "shifted_window_mask",
]

torch.fx.wrap("check_token_grid")


def relative_position_index(window: tuple[int, int]) -> Tensor:
    """(n, n) index into a ((2wh-1)(2ww-1), heads) table for the offsets between the n = wh*ww window tokens."""
    coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]), indexing="ij")).flatten(1)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, n, n)
    return (offsets[0] + window[0] - 1) * (2 * window[1] - 1) + (offsets[1] + window[1] - 1)


def centre_relative_position_bias(table: Tensor, window: tuple[int, int], new_window: tuple[int, int]) -> Tensor:
    """A ((2wh-1)(2ww-1), heads) relative position bias table of a `window` as the table of `new_window`, by offset.

    The table is indexed by the offset between two tokens, so a window clamped to a small map reads the central rows
    and columns of its full table (`window_bias_index`). Here the same offsets keep the same bias: a larger window's
    table is cropped to its centre, a smaller one lands in the centre of the new table, whose offsets beyond the old
    ones take the bias of the nearest old offset (the edge row or column repeated). Exact where the old window was the
    clamped form of the new one (the FLatten authors shrink windows and tables to maps smaller than the window).
    """
    old_rows, old_cols = 2 * window[0] - 1, 2 * window[1] - 1
    if table.shape[0] != old_rows * old_cols:
        raise ValueError(
            f"a relative position bias table of a {window[0]}x{window[1]} window has {old_rows * old_cols} rows, got "
            f"{table.shape[0]}; pass the window the table was made for."
        )
    rows = (torch.arange(2 * new_window[0] - 1) + window[0] - new_window[0]).clamp(0, old_rows - 1)
    cols = (torch.arange(2 * new_window[1] - 1) + window[1] - new_window[1]).clamp(0, old_cols - 1)
    index = (rows.unsqueeze(1) * old_cols + cols.unsqueeze(0)).flatten().to(table.device)
    return table[index]


def window_bias_index(index: Tensor, full_window: tuple[int, int], window: tuple[int, int], columns: int) -> Tensor:
    """(n, columns) rows of the bias-table index for a window of n tokens, possibly smaller than the table's.

    A smaller window (clamped to a small map) uses the same learned bias for the same offsets: its tokens are a
    top-left sub-grid of the full window, so their rows and columns of the full index carry exactly their offsets.
    Columns past n repeat the first one (padding that aligns the rows; callers slice it off).
    """
    if window[0] != full_window[0] or window[1] != full_window[1]:
        rows = torch.arange(window[0], device=index.device).unsqueeze(1) * full_window[1]
        keep = (rows + torch.arange(window[1], device=index.device).unsqueeze(0)).flatten()
        index = index[keep][:, keep]
    tokens = window[0] * window[1]
    if columns > tokens:
        index = torch.cat([index, index[:, :1].expand(tokens, columns - tokens)], dim=1)
    return index.contiguous()


@torch.fx.wrap
def relative_position_bias(
    table: Tensor, index: Tensor, full_window: tuple[int, int], window: tuple[int, int]
) -> Tensor:
    """(heads, n, n) bias for a window, possibly smaller than the table's (see `window_bias_index`)."""
    tokens = window[0] * window[1]
    index = window_bias_index(index, full_window, window, tokens)
    return table[index.reshape(-1)].view(tokens, tokens, -1).permute(2, 0, 1)


def _shifted_window_mask(
    hw: tuple[int, int],
    padded_hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device,
) -> Tensor | None:
    padded = padded_hw[0] != hw[0] or padded_hw[1] != hw[1]
    if shift[0] == 0 and shift[1] == 0 and not padded:
        return None
    # Region labels of the rolled map, as Swin's slices (0, -window), (-window, -shift), (-shift, None).
    rows = torch.arange(padded_hw[0], device=device)
    cols = torch.arange(padded_hw[1], device=device)
    # (With no shift, the second comparison is never true.)
    row_label = (rows >= padded_hw[0] - window[0]).long() + (rows >= padded_hw[0] - shift[0]).long()
    col_label = (cols >= padded_hw[1] - window[1]).long() + (cols >= padded_hw[1] - shift[1]).long()
    labels = (row_label.unsqueeze(1) * 3 + col_label.unsqueeze(0)).view(1, padded_hw[0], padded_hw[1], 1)
    labels = window_partition(labels, window).squeeze(-1)  # (nW, n)
    blocked = labels.unsqueeze(2) != labels.unsqueeze(1)  # (nW, query, key)
    if padded:
        valid = (rows < hw[0]).view(1, -1, 1, 1) & (cols < hw[1]).view(1, 1, -1, 1)
        valid = torch.roll(valid, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        valid = window_partition(valid.contiguous(), window).squeeze(-1)  # (nW, n)
        blocked = blocked | (valid.unsqueeze(2) & ~valid.unsqueeze(1))
    mask = torch.zeros(blocked.shape, device=device).masked_fill(blocked, float("-inf"))
    return mask.unsqueeze(1)


# Masks and gather indices depend only on sizes, device and dtype (no parameter), so eager calls share them:
# rebuilding them costs a dozen small ops per block and call. Keyed by every size they depend on; never mutated after
# insertion.
_SIZE_CACHE: dict[tuple, Any] = {}
_SIZE_CACHE_LIMIT = 128


def _fake_mode_active() -> bool:
    """Whether tensors are fake here (FakeTensorMode: `linvit models`' MAC count, memory estimates, export)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


def _remember(key: tuple, build: Callable[[], Any]) -> Any:
    """The cached value for key, built on first use. Built outside inference mode: tensors first made under
    `torch.inference_mode()` could not be saved for backward by later training calls (index_select saves its index).
    Under fake tensors nothing is cached or reused: a fake index would turn later real outputs fake.
    """
    if _fake_mode_active():
        return build()
    if key not in _SIZE_CACHE:
        if len(_SIZE_CACHE) >= _SIZE_CACHE_LIMIT:
            _SIZE_CACHE.clear()
        with torch.inference_mode(False):
            _SIZE_CACHE[key] = build()
    return _SIZE_CACHE[key]


@torch.jit.ignore
def _cached_shifted_window_mask(
    hw: tuple[int, int],
    padded_hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device,
) -> Tensor | None:
    key = ("shift_mask", hw, padded_hw, window, shift, str(device))
    return _remember(key, lambda: _shifted_window_mask(hw, padded_hw, window, shift, device))


@torch.fx.wrap
def shifted_window_mask(
    hw: tuple[int, int],
    padded_hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device,
) -> Tensor | None:
    """(num_windows, 1, n, n) additive mask (0 / -inf) for the rolled, padded map; None when nothing is masked.

    Eager calls return a shared cached tensor (treat it as read-only); TorchScript, tracing and torch.compile
    build it in the graph (under compile it is a constant of the sizes anyway).
    """
    if torch.jit.is_scripting():
        return _shifted_window_mask(hw, padded_hw, window, shift, device)
    if torch.compiler.is_compiling() or device.type == "meta":
        return _shifted_window_mask(hw, padded_hw, window, shift, device)
    return _cached_shifted_window_mask(hw, padded_hw, window, shift, device)


def _plain_partition(hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> bool:
    """No shift and no padding: the windows are a reshape of the map."""
    return shift[0] == 0 and shift[1] == 0 and hw[0] % window[0] == 0 and hw[1] % window[1] == 0


def _window_layout(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> tuple[Tensor, Tensor]:
    return window_token_index(hw, window, shift, device), window_position_index(hw, window, shift, device)


@torch.jit.ignore
def _cached_window_layout(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> tuple[Tensor, Tensor]:
    key = ("layout", hw, window, shift, str(device))
    return _remember(key, lambda: _window_layout(hw, window, shift, device))


@torch.fx.wrap
def window_layout(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> tuple[Tensor, Tensor]:
    """(`window_token_index`, `window_position_index`): the gathers into and out of the windows of an (H, W) map.

    Eager calls share cached tensors (read-only); TorchScript, tracing and torch.compile build them in the graph.
    """
    if torch.jit.is_scripting():
        return _window_layout(hw, window, shift, device)
    if torch.compiler.is_compiling() or device.type == "meta":
        return _window_layout(hw, window, shift, device)
    return _cached_window_layout(hw, window, shift, device)


def _window_mask_layout(
    hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    full_window: tuple[int, int],
    relative_index: Tensor,
    num_heads: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    tokens = window[0] * window[1]
    columns = aligned_length(tokens)
    bias_index = window_bias_index(relative_index, full_window, window, columns)  # (n, n_pad) rows of the table
    # into the flattened (rows, heads) table: one gather writes the bias as contiguous (heads, n, n_pad)
    heads = torch.arange(num_heads, device=relative_index.device).view(-1, 1, 1)
    bias_index = bias_index.unsqueeze(0) * num_heads + heads
    mask = shifted_window_mask(hw, padded_grid_size(hw, window), window, shift, relative_index.device)
    if mask is not None:
        mask = F.pad(mask, (0, columns - tokens)).to(dtype)
    return bias_index, mask


@torch.jit.ignore
def _cached_window_mask_layout(
    hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    full_window: tuple[int, int],
    relative_index: Tensor,
    num_heads: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    # relative_index is a function of full_window (a buffer of the module), so the sizes identify it
    key = ("mask", hw, window, shift, full_window, num_heads, str(relative_index.device), str(dtype))
    return _remember(key, lambda: _window_mask_layout(hw, window, shift, full_window, relative_index, num_heads, dtype))


@torch.fx.wrap
def window_mask_layout(
    hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    full_window: tuple[int, int],
    relative_index: Tensor,
    num_heads: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    """What the attention mask of a window size needs besides the bias table: the (heads, n, n_pad) index into the
    flattened table (`window_bias_index`, rows padded to a multiple of 8 columns) and the shift/padding mask
    (num_windows, 1, n, n_pad) in `dtype` (None when nothing is masked). Cached for eager calls, like `window_layout`.
    """
    if torch.jit.is_scripting():
        return _window_mask_layout(hw, window, shift, full_window, relative_index, num_heads, dtype)
    if torch.compiler.is_compiling() or relative_index.device.type == "meta":
        return _window_mask_layout(hw, window, shift, full_window, relative_index, num_heads, dtype)
    return _cached_window_mask_layout(hw, window, shift, full_window, relative_index, num_heads, dtype)


@torch.fx.wrap
def window_attention_mask(
    table: Tensor, bias_index: Tensor, mask: Tensor | None, batch: int, dtype: torch.dtype
) -> Tensor:
    """The additive SDPA mask for (B * nW, heads, n, n) windows: the relative position bias, plus the mask.

    Returns (1, heads, n, n) without a mask, else (B * nW, heads, n, n) written by one add (the mask varies per window
    and the windows are batch-major, so no 4-D view broadcasts it over the batch; 5-D inputs would leave SDPA's fused
    kernels). Always in q's dtype and a view of storage whose rows are padded to a multiple of 8 elements, the layout
    the fused kernels read directly (the memory-efficient CUDA kernel copies a mask with unaligned rows first).
    """
    tokens = bias_index.shape[1]
    bias = table.reshape(-1)[bias_index].to(dtype)  # (heads, n, n_pad), contiguous, gathered per call
    if mask is None:
        return bias.unsqueeze(0)[..., :tokens]
    combined = mask.unsqueeze(0).expand(batch, -1, -1, -1, -1) + bias  # (B, nW, heads, n, n_pad), contiguous
    return combined.flatten(0, 1)[..., :tokens]


class WindowAttention(nn.Module):
    """Swin window softmax attention with relative position bias, shifted windows and padding, for any (H, W).

    State dict: `qkv.*`, `proj.*`, `relative_position_bias_table` ((2wh-1)(2ww-1), heads), as Swin;
    `relative_position_index` is a non-persistent buffer.

    Args:
        dim: channels C.
        num_heads: heads (C must be divisible by it).
        window_size: int or (h, w). Clamped to the map per dimension when the map is not larger (then that
            dimension is not shifted either), like Swin.
        shift_size: int or (h, w) cyclic shift, 0 <= shift < window (Swin uses window // 2 in every other block).
        qkv_bias: bias in the qkv projection.
        attn_drop: dropout on the attention probabilities (training only).
        proj_drop: dropout after the output projection.
        with_projections: False drops `qkv`/`proj`: forward then takes the concatenated (B, N, 3C) q|k|v and returns
            the output before projection (for HybridAttention).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size=7,
        shift_size=0,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        with_projections: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.window_size = to_pair(window_size, "window_size")
        shift = (shift_size, shift_size) if isinstance(shift_size, int) else tuple(int(s) for s in shift_size)
        if len(shift) != 2 or not all(0 <= s < w for s, w in zip(shift, self.window_size)):
            raise ValueError(
                f"shift_size must satisfy 0 <= shift < window_size per dimension, got shift_size={shift_size!r} with "
                f"window_size={self.window_size}; Swin uses window_size // 2."
            )
        self.shift_size: tuple[int, int] = (shift[0], shift[1])
        self.attn_drop = attn_drop

        if with_projections:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
            self.proj = nn.Linear(dim, dim, **dd)
        else:
            self.qkv = nn.Identity()
            self.proj = nn.Identity()
        self.proj_drop = nn.Dropout(proj_drop)
        table_size = (2 * self.window_size[0] - 1) * (2 * self.window_size[1] - 1)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(table_size, num_heads, **dd))
        self.register_buffer(
            "relative_position_index", relative_position_index(self.window_size).to(device), persistent=False
        )
        if self.relative_position_bias_table.device.type != "meta":
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def window_and_shift(self, hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """The window and shift used for an (H, W) map: clamped (and unshifted) where the map is not larger."""
        wh, ww = self.window_size
        sh, sw = self.shift_size
        if hw[0] <= wh:
            wh, sh = hw[0], 0
        if hw[1] <= ww:
            ww, sw = hw[1], 0
        return (wh, ww), (sh, sw)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W (or (B, N, 3C) without projections); returns (B, N, C)."""
        x = check_token_grid(x, hw)
        if exporting():  # symbolic sizes (torch.export with dynamic H, W): no branch on them
            return self._forward_symbolic(x, hw)
        batch = x.shape[0]
        window, shift = self.window_and_shift(hw)
        windows = self._to_windows(x, hw, window, shift)  # (B * nW, n, C), or 3C when already projected
        tokens = window[0] * window[1]
        qkv = self.qkv(windows).view(-1, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B * nW, heads, n, d)
        bias_index, mask = window_mask_layout(
            hw, window, shift, self.window_size, self.relative_position_index, self.num_heads, q.dtype
        )
        attn_mask = window_attention_mask(self.relative_position_bias_table, bias_index, mask, batch, q.dtype)
        dropout = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        # (B * nW, heads, n, d) -> (B * nW, n, C): a view for the fused kernels, whose output is token-major
        out = out.transpose(1, 2).reshape(-1, tokens, self.dim)
        return self.proj_drop(self.proj(self._from_windows(out, batch, hw, window, shift)))

    @torch.jit.unused
    def _forward_symbolic(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """`forward` without branches on the sizes, for torch.export with dynamic H and W.

        The same computation as the eager path at every size: the window is min(window, map) per dimension and the
        shift is kept only where the map is larger than the window (`window_and_shift` as arithmetic: shift *
        min(max(H - wh, 0), 1)); the gathers always pad and roll, and the mask (regions of the rolled map, padded
        keys) is always built, all zeros where nothing is shifted or padded.
        """
        height, width = hw
        batch = x.shape[0]
        wh = symbolic_min(self.window_size[0], height)
        ww = symbolic_min(self.window_size[1], width)
        sh = self.shift_size[0] * symbolic_min(torch.sym_max(height - self.window_size[0], 0), 1)
        sw = self.shift_size[1] * symbolic_min(torch.sym_max(width - self.window_size[1], 0), 1)
        rows, cols = (height + wh - 1) // wh, (width + ww - 1) // ww
        padded_h, padded_w = rows * wh, cols * ww
        windows_per_image, tokens = rows * cols, wh * ww
        device = x.device
        token_index, position_index, valid, row, col = symbolic_window_layout(hw, (wh, ww), (sh, sw), device)
        windows = x.index_select(1, token_index).view(batch * windows_per_image, tokens, x.shape[-1])
        qkv = self.qkv(windows).view(batch, windows_per_image, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # (B, nW, heads, n, d)
        # relative position bias of the (possibly clamped) window: its tokens are a top-left sub-grid of the full one
        full_w = self.window_size[1]
        keep = (torch.arange(wh, device=device).unsqueeze(1) * full_w + torch.arange(ww, device=device)).flatten()
        index = self.relative_position_index[keep][:, keep]
        bias = self.relative_position_bias_table[index.reshape(-1)].view(tokens, tokens, self.num_heads)
        bias = bias.permute(2, 0, 1).to(q.dtype)  # (heads, n, n)
        # Swin's regions of the rolled map (see `_shifted_window_mask`), and the padding
        row_label = (row >= padded_h - wh).long() + (row >= padded_h - sh).long()
        col_label = (col >= padded_w - ww).long() + (col >= padded_w - sw).long()
        labels = (row_label * 3 + col_label).view(windows_per_image, tokens)
        valid = valid.view(windows_per_image, tokens)
        blocked = (labels.unsqueeze(2) != labels.unsqueeze(1)) | (valid.unsqueeze(2) & ~valid.unsqueeze(1))
        mask = torch.zeros(blocked.shape, device=device, dtype=q.dtype).masked_fill(blocked, float("-inf"))
        attn_mask = mask.unsqueeze(1) + bias  # (nW, heads, n, n), broadcast over the batch
        # softmax attention as plain matmuls: exporters take SDPA only on 4-D inputs, and 4-D would need the mask
        # copied per image
        attn = torch.matmul(q * self.head_dim**-0.5, k.transpose(-2, -1)) + attn_mask
        attn = attn.softmax(dim=-1)
        if self.training and self.attn_drop > 0:
            attn = F.dropout(attn, self.attn_drop)
        out = torch.matmul(attn, v)
        out = self.proj(out.transpose(2, 3).reshape(batch * windows_per_image, tokens, self.dim))
        out = out.view(batch, windows_per_image * tokens, out.shape[-1]).index_select(1, position_index)
        return self.proj_drop(out)

    def _to_windows(self, x: Tensor, hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> Tensor:
        """(B, N, C) tokens -> (B * nW, n, C) windows of the padded, rolled map.

        The projection runs on these C-channel windows: partitioning copies C channels, not 3C. Without shift and
        padding the partition is one reshaping copy (whose backward is a copy too); otherwise one gather does pad, roll
        and partition, and padded positions hold copies of edge tokens (masked out as keys, dropped as queries).
        """
        if _plain_partition(hw, window, shift):
            return window_partition(x.view(x.shape[0], hw[0], hw[1], x.shape[-1]), window)
        token_index, _ = window_layout(hw, window, shift, x.device)
        return x.index_select(1, token_index).view(-1, window[0] * window[1], x.shape[-1])

    def _from_windows(
        self, out: Tensor, batch: int, hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]
    ) -> Tensor:
        """(B * nW, n, C) windows -> (B, N, C) tokens: the inverse of `_to_windows` on the real tokens."""
        if _plain_partition(hw, window, shift):
            return window_reverse(out, window, hw).view(batch, hw[0] * hw[1], out.shape[-1])
        token_index, position_index = window_layout(hw, window, shift, out.device)
        return out.view(batch, token_index.numel(), out.shape[-1]).index_select(1, position_index)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, shift_size={self.shift_size}"
        )
