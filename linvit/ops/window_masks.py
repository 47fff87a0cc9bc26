"""The masks of window softmax attention (Swin): the shifted-window and padding mask of a map, and the relative
position bias laid out as the additive mask the fused SDPA kernels read. Cached per size like the window layout
(`linvit.ops.windows.size_cached`).
"""

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor

from linvit.ops.windows import aligned_length, padded_grid_size, size_cached, window_key_mask, window_partition

__all__ = ["shifted_window_mask", "window_attention_mask", "window_bias_index", "window_mask_layout"]


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
def shifted_window_mask(
    hw: tuple[int, int],
    padded_hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device,
    cached: bool = True,
) -> Tensor | None:
    """(num_windows, 1, n, n) additive mask (0 / -inf) for the rolled, padded map; None when nothing is masked.

    With a shift, tokens attend only to tokens of their own region of the rolled map (Swin's mask). With padding, real
    tokens do not attend to padded ones; padded queries may still see padded keys, so no softmax row is ever fully
    masked (their outputs are dropped). Eager calls share one cached tensor per size (`size_cached`; ``cached=False``
    builds a new one).
    """
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if cached:
            return size_cached(shifted_window_mask, hw, padded_hw, window, shift, device, False)
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
        valid = window_key_mask(hw, window, shift, device)  # (nW, n)
        assert valid is not None
        blocked = blocked | (valid.unsqueeze(2) & ~valid.unsqueeze(1))
    mask = torch.zeros(blocked.shape, device=device).masked_fill(blocked, float("-inf"))
    return mask.unsqueeze(1)


@torch.fx.wrap
def window_mask_layout(
    hw: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    full_window: tuple[int, int],
    relative_index: Tensor,
    num_heads: int,
    dtype: torch.dtype,
    cached: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """What the attention mask of a window size needs besides the bias table: the (heads, n, n_pad) index into the
    flattened table (`window_bias_index`, rows padded to a multiple of 8 columns) and the shift/padding mask
    (num_windows, 1, n, n_pad) in `dtype` (None when nothing is masked). `relative_index` is the module's buffer for
    `full_window` (so only its device keys the cache).
    """
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if cached:
            return size_cached(
                window_mask_layout, hw, window, shift, full_window, relative_index, num_heads, dtype, False
            )
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
