"""WindowAttention: Swin's (shifted) window softmax attention with relative position bias, for any (H, W).

The module does what Swin's block does around its attention: pads the map to a multiple of the window, rolls it by
the shift, partitions it into windows, and undoes all three afterwards. Softmax runs through
`F.scaled_dot_product_attention` with the relative position bias (and the masks below) as an additive mask in q's
dtype, laid out as the fused kernels read it.

The windows and masks come from `linvit.ops.windows` and `linvit.ops.window_masks`, shared with the windowed linear
attention. With a shift, tokens attend only to tokens of their own region of the rolled map (Swin's mask). With
padding, real tokens do not attend to padded ones (Swin pads with zeros and lets padding take part; linvit masks it so
results do not depend on the padding, and pads with copies of the last row/column, which the gather gets for free).
"""

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.attention._checks import to_pair
from linvit.attention.projected import ProjectedAttention
from linvit.ops.window_masks import window_attention_mask, window_bias_index, window_mask_layout
from linvit.ops.windows import (
    check_token_grid,
    exporting,
    merge_windows,
    partition_windows,
    symbolic_min,
    symbolic_window_layout,
)

__all__ = [
    "WindowAttention",
    "centre_relative_position_bias",
    "relative_position_index",
    "relative_position_bias",
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


@torch.fx.wrap
def relative_position_bias(
    table: Tensor, index: Tensor, full_window: tuple[int, int], window: tuple[int, int]
) -> Tensor:
    """(heads, n, n) bias for a window, possibly smaller than the table's (see `window_bias_index`)."""
    tokens = window[0] * window[1]
    index = window_bias_index(index, full_window, window, tokens)
    return table[index.reshape(-1)].view(tokens, tokens, -1).permute(2, 0, 1)


class WindowAttention(ProjectedAttention):
    """Swin window softmax attention with relative position bias, shifted windows and padding, for any (H, W).

    State dict: `qkv.*`, `proj.*`, `relative_position_bias_table` ((2wh-1)(2ww-1), heads), as Swin;
    `relative_position_index` is a non-persistent buffer.

    Args:
        dim, num_heads, qkv_bias, proj_drop, with_projections: see `ProjectedAttention`.
        window_size: int or (h, w). Clamped to the map per dimension when the map is not larger (then that
            dimension is not shifted either), like Swin.
        shift_size: int or (h, w) cyclic shift, 0 <= shift < window (Swin uses window // 2 in every other block).
        attn_drop: dropout on the attention probabilities (training only).
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
        super().__init__(dim, num_heads, qkv_bias, proj_drop, with_projections, None, device, dtype)
        dd = {"device": device, "dtype": dtype}
        self.window_size = to_pair(window_size, "window_size")
        shift = (shift_size, shift_size) if isinstance(shift_size, int) else tuple(int(s) for s in shift_size)
        if len(shift) != 2 or not all(0 <= s < w for s, w in zip(shift, self.window_size)):
            raise ValueError(
                f"shift_size must satisfy 0 <= shift < window_size per dimension, got shift_size={shift_size!r} with "
                f"window_size={self.window_size}; Swin uses window_size // 2."
            )
        self.shift_size: tuple[int, int] = (shift[0], shift[1])
        self.attn_drop = attn_drop
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
        windows = partition_windows(x, hw, window, shift)  # (B * nW, n, C), or 3C when already projected
        tokens = window[0] * window[1]
        qkv = self.project_in(windows).view(-1, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B * nW, heads, n, d)
        bias_index, mask = window_mask_layout(
            hw, window, shift, self.window_size, self.relative_position_index, self.num_heads, q.dtype
        )
        attn_mask = window_attention_mask(self.relative_position_bias_table, bias_index, mask, batch, q.dtype)
        dropout = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        # (B * nW, heads, n, d) -> (B * nW, n, C): a view for the fused kernels, whose output is token-major
        out = out.transpose(1, 2).reshape(-1, tokens, self.dim)
        return self.project_out(merge_windows(out, batch, hw, window, shift))

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
        qkv = self.project_in(windows).view(batch, windows_per_image, tokens, 3, self.num_heads, self.head_dim)
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
        out = out.transpose(2, 3).reshape(batch * windows_per_image, tokens, self.dim)
        if self.proj is not None:
            out = self.proj(out)
        out = out.view(batch, windows_per_image * tokens, out.shape[-1]).index_select(1, position_index)
        return self.proj_drop(out)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, shift_size={self.shift_size}"
        )
