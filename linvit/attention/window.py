"""WindowAttention: Swin's (shifted) window softmax attention with relative position bias, for any (H, W).

The module does what Swin's block does around its attention: zero-pads the map to a multiple of the window, rolls it
by the shift, partitions it into windows, and undoes all three afterwards. Softmax runs through
`F.scaled_dot_product_attention` with the relative position bias (and the masks below) as an additive float mask.

Masks: with a shift, tokens attend only to tokens of their own region of the rolled map (Swin's mask). With padding,
real tokens do not attend to padded ones (Swin pads and lets padding take part; linvit masks it so results do not
depend on the padding). Padded queries may still see padded keys, so no softmax row is ever fully masked.
"""

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.attention._windows import check_token_grid, pad_grid, to_pair, window_partition, window_reverse

__all__ = ["WindowAttention", "relative_position_index", "relative_position_bias", "shifted_window_mask"]

torch.fx.wrap("check_token_grid")


def relative_position_index(window: tuple[int, int]) -> Tensor:
    """(n, n) index into a ((2wh-1)(2ww-1), heads) table for the offsets between the n = wh*ww window tokens."""
    coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]), indexing="ij")).flatten(1)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, n, n)
    return (offsets[0] + window[0] - 1) * (2 * window[1] - 1) + (offsets[1] + window[1] - 1)


@torch.fx.wrap
def relative_position_bias(
    table: Tensor, index: Tensor, full_window: tuple[int, int], window: tuple[int, int]
) -> Tensor:
    """(heads, n, n) bias for a window, possibly smaller than the table's (clamped to a small map).

    A smaller window uses the same learned bias for the same offsets: its tokens are a top-left sub-grid of the
    full window, so their rows and columns of the full index carry exactly their offsets.
    """
    if window[0] != full_window[0] or window[1] != full_window[1]:
        rows = torch.arange(window[0], device=index.device).unsqueeze(1) * full_window[1]
        keep = (rows + torch.arange(window[1], device=index.device).unsqueeze(0)).flatten()
        index = index[keep][:, keep]
    tokens = window[0] * window[1]
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


# The masks depend only on sizes and the device (no parameter), so eager calls share them: rebuilding them costs a
# dozen small ops per block and call. Keyed by every size they depend on; never mutated after insertion.
_MASK_CACHE: dict[tuple, Tensor | None] = {}
_MASK_CACHE_LIMIT = 64


@torch.jit.ignore
def _cached_shifted_window_mask(
    hw: tuple[int, int],
    padded_hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device,
) -> Tensor | None:
    key = (hw, padded_hw, window, shift, str(device))
    if key not in _MASK_CACHE:
        if len(_MASK_CACHE) >= _MASK_CACHE_LIMIT:
            _MASK_CACHE.clear()
        _MASK_CACHE[key] = _shifted_window_mask(hw, padded_hw, window, shift, device)
    return _MASK_CACHE[key]


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


@torch.fx.wrap
def window_attention_mask(bias: Tensor, mask: Tensor | None, x: Tensor) -> Tensor:
    """The additive SDPA mask for (B * nW, heads, n, n) windows of x: the bias, plus the shift/padding mask.

    Always 4-D, which keeps SDPA on its fused (flash) CPU kernel; 5-D inputs (windows split from the batch, to
    broadcast the mask) fall back to the unfused math path (explicit matmuls, softmax, fully-masked-row checks).
    """
    attn_mask = bias.unsqueeze(0)  # (1, heads, n, n), gathered once per call (the table is a parameter)
    if mask is None:
        return attn_mask
    attn_mask = attn_mask + mask  # (nW, heads, n, n)
    batch = x.shape[0]
    if batch > 1:
        attn_mask = attn_mask.repeat(batch, 1, 1, 1)  # windows are batch-major
    return attn_mask


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
        if dim % num_heads != 0:
            raise ValueError(
                f"dim={dim} is not divisible by num_heads={num_heads}; choose num_heads that divides dim "
                f"(e.g. {dim // 32 or 1} heads of 32 channels)."
            )
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
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
        height, width = hw
        window, shift = self.window_and_shift(hw)
        pad_h = (window[0] - height % window[0]) % window[0]
        pad_w = (window[1] - width % window[1]) % window[1]
        padded_hw = (height + pad_h, width + pad_w)
        grid = pad_grid(x.view(-1, height, width, x.shape[-1]), pad_h, pad_w)
        if shift[0] > 0 or shift[1] > 0:
            grid = torch.roll(grid, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        windows = window_partition(grid, window)  # (B * nW, n, C), or 3C when already projected
        tokens = window[0] * window[1]

        # the projection runs on the partitioned C-channel input: pad, roll and partition copy C channels, not 3C
        # (padded tokens project to the bias; padded keys are masked out and padded queries cropped)
        qkv = self.qkv(windows)
        qkv = qkv.view(-1, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B * nW, heads, n, d)
        bias = relative_position_bias(
            self.relative_position_bias_table, self.relative_position_index, self.window_size, window
        )
        mask = shifted_window_mask(hw, padded_hw, window, shift, x.device)
        dropout = self.attn_drop if self.training else 0.0
        attn_mask = window_attention_mask(bias, mask, x)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask.to(q.dtype), dropout_p=dropout)
        out = out.reshape(-1, self.num_heads, tokens, self.head_dim).transpose(1, 2).reshape(-1, tokens, self.dim)

        grid = window_reverse(out, window, padded_hw)
        if shift[0] > 0 or shift[1] > 0:
            grid = torch.roll(grid, shifts=(shift[0], shift[1]), dims=(1, 2))
        out = grid[:, :height, :width, :].reshape(-1, height * width, self.dim)
        return self.proj_drop(self.proj(out))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, shift_size={self.shift_size}"
        )
