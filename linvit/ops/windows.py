"""Windows of a token map, in one place for every windowed attention: clamping, padding, shifting, partitioning and
reversing, as copies or as one gather through indices cached per size; the key mask of padded positions; and the same
layout with no branch on the sizes, for torch.export with dynamic H and W.

Sizes (H, W, window) are Python ints taken from `hw`, never from traced tensor shapes, so the helpers trace under FX
when `hw` is concrete. Functions whose control flow depends on the sizes are wrapped with `torch.fx.wrap`.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "aligned_length",
    "check_token_grid",
    "clamp_window",
    "exporting",
    "merge_windows",
    "pad_grid",
    "padded_grid_size",
    "padding_valid_map",
    "partition_windows",
    "size_cached",
    "symbolic_min",
    "symbolic_window_layout",
    "window_key_mask",
    "window_keys",
    "window_layout",
    "window_partition",
    "window_position_index",
    "window_reverse",
    "window_token_index",
    "wrap_index",
]


def check_token_grid(x: Tensor, hw: tuple[int, int]) -> Tensor:
    """Return x after checking it is (B, N, C) with N == H * W; raises ValueError otherwise."""
    if x.dim() != 3:
        raise ValueError(
            f"Attention expects tokens (B, N, C), got shape {x.shape}; flatten a (B, C, H, W) map with "
            "x.flatten(2).transpose(1, 2) and pass hw=(H, W)."
        )
    if x.shape[1] != hw[0] * hw[1]:
        raise ValueError(
            f"hw={tuple(hw)} gives {hw[0] * hw[1]} tokens but x has N={x.shape[1]}; pass the (H, W) of the token map "
            "x was flattened from (N must equal H * W)."
        )
    return x


def exporting() -> bool:
    """Whether `torch.export` is tracing: sizes may then be symbolic (dynamic H and W), and modules take branch-free
    paths (always pad, always mask, windows as `symbolic_min` of window and map) instead of branching on the sizes, so
    one exported program serves every size. Eager calls, TorchScript and FX keep their size-specialised fast paths.
    """
    if torch.jit.is_scripting():
        return False
    else:
        return torch.compiler.is_exporting()


def symbolic_min(a: int, b: int) -> int:
    """min(a, b) that stays symbolic for symbolic sizes (`torch.sym_min`) instead of adding a guard."""
    if torch.jit.is_scripting():
        return min(a, b)
    else:
        return torch.sym_min(a, b)


def clamp_window(window: tuple[int, int], hw: tuple[int, int]) -> tuple[int, int]:
    """The window clamped to the map, per dimension (a map smaller than the window is one window)."""
    return min(window[0], hw[0]), min(window[1], hw[1])


def pad_grid(x: Tensor, pad_h: int, pad_w: int) -> Tensor:
    """Zero-pad a (B, H, W, C) grid at the bottom and right."""
    if pad_h == 0 and pad_w == 0:
        return x
    return F.pad(x, (0, 0, 0, pad_w, 0, pad_h))


def window_partition(x: Tensor, window: tuple[int, int]) -> Tensor:
    """(B, H, W, C) with H, W multiples of the window -> (B * num_windows, wh * ww, C), windows row-major."""
    _, height, width, channels = x.shape
    wh, ww = window
    x = x.view(-1, height // wh, wh, width // ww, ww, channels)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, wh * ww, channels)


def window_reverse(windows: Tensor, window: tuple[int, int], hw: tuple[int, int]) -> Tensor:
    """Inverse of `window_partition`: (B * num_windows, wh * ww, C) -> (B, H, W, C)."""
    wh, ww = window
    height, width = hw
    channels = windows.shape[-1]
    x = windows.view(-1, height // wh, width // ww, wh, ww, channels)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, height, width, channels)


def padding_valid_map(hw: tuple[int, int], padded_hw: tuple[int, int], device: torch.device) -> Tensor:
    """(1, Hp, Wp, 1) bool: True on the real map, False on the bottom/right padding."""
    rows = torch.arange(padded_hw[0], device=device) < hw[0]
    cols = torch.arange(padded_hw[1], device=device) < hw[1]
    return (rows.view(1, -1, 1, 1) & cols.view(1, 1, -1, 1)).contiguous()


def aligned_length(length: int, multiple: int = 8) -> int:
    """The smallest multiple of `multiple` that is >= length (row strides that fused attention kernels read as is)."""
    return (length + multiple - 1) // multiple * multiple


def padded_grid_size(hw: tuple[int, int], window: tuple[int, int]) -> tuple[int, int]:
    """(H, W) rounded up to multiples of the window (the map after bottom/right padding)."""
    return aligned_length(hw[0], window[0]), aligned_length(hw[1], window[1])


def window_token_index(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> Tensor:
    """(num_windows * wh * ww,) token of the (H, W) map found at each position of the windows.

    The windows are those of the map zero-padded at the bottom/right to a multiple of the window, rolled by -shift and
    split by `window_partition` (row-major windows, row-major inside each). `x.index_select(1, index)` on (B, H*W, C)
    tokens does the pad, roll and partition in one gather. Padded positions repeat the last real row/column: callers
    mask them out as keys and drop them as queries, so their values never reach a real token.
    """
    padded_h, padded_w = padded_grid_size(hw, window)
    rows = torch.remainder(torch.arange(padded_h, device=device) + shift[0], padded_h).clamp(max=hw[0] - 1)
    cols = torch.remainder(torch.arange(padded_w, device=device) + shift[1], padded_w).clamp(max=hw[1] - 1)
    grid = rows.unsqueeze(1) * hw[1] + cols.unsqueeze(0)  # (Hp, Wp), rolled
    grid = grid.view(padded_h // window[0], window[0], padded_w // window[1], window[1])
    return grid.permute(0, 2, 1, 3).reshape(-1)


def window_position_index(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> Tensor:
    """(H * W,) position of each token of the (H, W) map among the windows of `window_token_index`.

    `windows.index_select(1, index)` on (B, num_windows * wh * ww, C) undoes the partition, roll and padding in one
    gather (padded positions are skipped).
    """
    padded_h, padded_w = padded_grid_size(hw, window)
    tokens = window[0] * window[1]
    # row and column in the rolled map; by comparisons, not torch.remainder, whose value range inductor misreads
    # (torch.compile failed in an index_select on this index: 'AssertionError: (VR[-int_oo, oo], VR[-int_oo, -1])')
    rows = wrap_index(torch.arange(hw[0], device=device) - shift[0], padded_h)
    cols = wrap_index(torch.arange(hw[1], device=device) - shift[1], padded_w)
    row_offset = torch.div(rows, window[0], rounding_mode="floor") * (padded_w // window[1]) * tokens
    row_offset = row_offset + torch.remainder(rows, window[0]) * window[1]
    col_offset = torch.div(cols, window[1], rounding_mode="floor") * tokens + torch.remainder(cols, window[1])
    return (row_offset.unsqueeze(1) + col_offset.unsqueeze(0)).reshape(-1)


def wrap_index(index: Tensor, size: int) -> Tensor:
    """index mod size for index in [-size, 2 size), by comparisons (exporters have no remainder by a symbolic size)."""
    index = torch.where(index >= size, index - size, index)
    return torch.where(index < 0, index + size, index)


def symbolic_window_layout(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`window_token_index`, `window_position_index`, then per window position (num_windows * wh * ww,): whether it
    holds a real (unpadded) token, and its row and column in the padded map rolled by -shift (Swin's mask regions).

    For symbolic sizes (torch.export with dynamic H, W): the same indices with no branch on the sizes and no remainder
    op. The window must be clamped to the map and the shift zero where the map is not larger.
    """
    height, width = hw
    (wh, ww), (sh, sw) = window, shift
    rows_of_windows, cols_of_windows = (height + wh - 1) // wh, (width + ww - 1) // ww
    padded_h, padded_w = rows_of_windows * wh, cols_of_windows * ww
    tokens = wh * ww
    # every index is computed on a flat arange (no reshape of a permuted tensor: its strides would add guards)
    position = torch.arange(padded_h * padded_w, device=device)  # window-major, row-major inside each window
    window_index = torch.div(position, tokens, rounding_mode="floor")
    inner = position - window_index * tokens
    window_row = torch.div(window_index, cols_of_windows, rounding_mode="floor")
    inner_row = torch.div(inner, ww, rounding_mode="floor")
    rolled_row = window_row * wh + inner_row  # in the map rolled by -shift
    rolled_col = (window_index - window_row * cols_of_windows) * ww + (inner - inner_row * ww)
    row = wrap_index(rolled_row + sh, padded_h)  # in the map
    col = wrap_index(rolled_col + sw, padded_w)
    valid = (row < height) & (col < width)
    token_index = row.clamp(max=height - 1) * width + col.clamp(max=width - 1)
    token = torch.arange(height * width, device=device)
    row = torch.div(token, width, rounding_mode="floor")
    col = token - row * width
    row = wrap_index(row - sh, padded_h)  # where each token lands in the rolled map
    col = wrap_index(col - sw, padded_w)
    row_of_windows = torch.div(row, wh, rounding_mode="floor")
    col_of_windows = torch.div(col, ww, rounding_mode="floor")
    window_index = row_of_windows * cols_of_windows + col_of_windows
    position_index = window_index * tokens + (row - row_of_windows * wh) * ww + (col - col_of_windows * ww)
    return token_index, position_index, valid, rolled_row, rolled_col


# Indices and masks depend only on sizes, device and dtype (no parameter), so eager calls share them: rebuilding them
# costs a dozen small ops per block and call. Keyed by every size they depend on; never mutated after insertion.
_SIZE_CACHE: dict[tuple, Any] = {}
_SIZE_CACHE_LIMIT = 128


def _fake_mode_active() -> bool:
    """Whether tensors are fake here (FakeTensorMode: `linvit models`' MAC count, memory estimates, export)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


def _size_key(argument: Any) -> Any:
    # a tensor argument is a buffer built from the other arguments (a window's relative index): its device keys it
    if isinstance(argument, Tensor):
        return str(argument.device)
    if isinstance(argument, (torch.device, torch.dtype)):
        return str(argument)
    return argument


def _on_meta(arguments: tuple) -> bool:
    for argument in arguments:
        device = argument.device if isinstance(argument, Tensor) else argument
        if isinstance(device, torch.device) and device.type == "meta":
            return True
    return False


def size_cached(build: Callable[..., Any], *arguments: Any) -> Any:
    """build(*arguments), shared by eager calls with the same sizes, device and dtype (treat it as read-only).

    Built outside inference mode: tensors first made under `torch.inference_mode()` could not be saved for backward
    by later training calls (index_select saves its index). Built afresh under torch.compile (a constant of the sizes
    there anyway), on the meta device and under fake tensors (a fake index would turn later real outputs fake).
    TorchScript cannot call it: callers build directly under `torch.jit.is_scripting()`, and pass themselves as
    `build` with a last argument that tells them to build.
    """
    if torch.compiler.is_compiling() or _on_meta(arguments) or _fake_mode_active():
        return build(*arguments)
    key = (build.__name__, *(_size_key(a) for a in arguments))
    if key not in _SIZE_CACHE:
        if len(_SIZE_CACHE) >= _SIZE_CACHE_LIMIT:
            _SIZE_CACHE.clear()
        with torch.inference_mode(False):
            _SIZE_CACHE[key] = build(*arguments)
    return _SIZE_CACHE[key]


def _plain_partition(hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> bool:
    """No shift and no padding: the windows are a reshape of the map."""
    return shift[0] == 0 and shift[1] == 0 and hw[0] % window[0] == 0 and hw[1] % window[1] == 0


@torch.fx.wrap
def window_layout(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device, cached: bool = True
) -> tuple[Tensor, Tensor]:
    """(`window_token_index`, `window_position_index`): the gathers into and out of the windows of an (H, W) map.
    Eager calls share one cached pair per size (`size_cached`; ``cached=False`` builds a new one)."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if cached:
            return size_cached(window_layout, hw, window, shift, device, False)
    return window_token_index(hw, window, shift, device), window_position_index(hw, window, shift, device)


@torch.fx.wrap
def window_key_mask(
    hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device, cached: bool = True
) -> Tensor | None:
    """(num_windows, wh * ww) bool: True where a window position holds a real token, False on padding; None when
    nothing is padded. Linear attention masks the padded keys out of its sums with it. Cached like `window_layout`."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if cached:
            return size_cached(window_key_mask, hw, window, shift, device, False)
    padded_hw = padded_grid_size(hw, window)
    if padded_hw[0] == hw[0] and padded_hw[1] == hw[1]:
        return None
    valid = torch.roll(padding_valid_map(hw, padded_hw, device), shifts=(-shift[0], -shift[1]), dims=(1, 2))
    return window_partition(valid.contiguous(), window).squeeze(-1)


def partition_windows(x: Tensor, hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> Tensor:
    """(B, H*W, C) tokens -> (B * num_windows, wh * ww, C) windows of the map padded at the bottom/right to whole
    windows and rolled by -shift, batch-major.

    Without shift and padding one reshaping copy (whose backward is a copy too); otherwise one gather does pad, roll
    and partition, and padded positions hold copies of edge tokens: callers mask them out as keys
    (`window_key_mask`) and `merge_windows` drops them as queries.
    """
    if _plain_partition(hw, window, shift):
        return window_partition(x.view(x.shape[0], hw[0], hw[1], x.shape[-1]), window)
    token_index, _ = window_layout(hw, window, shift, x.device)
    return x.index_select(1, token_index).view(-1, window[0] * window[1], x.shape[-1])


def window_keys(x: Tensor, hw: tuple[int, int], window: tuple[int, int]) -> tuple[Tensor, Tensor | None]:
    """(B, H*W, C) tokens -> their unshifted windows (`partition_windows`) and which of their positions hold a real
    token, (B * num_windows, wh * ww) bool, batch-major like the windows (None when nothing is padded): what linear
    attention in windows masks its keys with."""
    valid = window_key_mask(hw, window, (0, 0), x.device)
    if valid is not None:
        valid = valid.repeat(x.shape[0], 1)
    return partition_windows(x, hw, window, (0, 0)), valid


def merge_windows(
    windows: Tensor, batch: int, hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]
) -> Tensor:
    """(B * num_windows, wh * ww, C) windows -> (B, H*W, C) tokens: the inverse of `partition_windows` on the real
    tokens."""
    if _plain_partition(hw, window, shift):
        return window_reverse(windows, window, hw).view(batch, hw[0] * hw[1], windows.shape[-1])
    token_index, position_index = window_layout(hw, window, shift, windows.device)
    return windows.view(batch, token_index.numel(), windows.shape[-1]).index_select(1, position_index)
