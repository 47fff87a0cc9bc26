"""What `linear_attention_qkv` takes besides qkv, checked and normalised once by the public entry
(:func:`linvit.ops.linear_attention_qkv`) and handed to every backend as one :class:`LinearAttentionArguments`."""

from __future__ import annotations

from typing import NamedTuple

from torch import SymInt, Tensor
from torch import bool as torch_bool
from torch.nn.functional import softplus

from linvit.ops._checks import check_qkv
from linvit.ops._numerics import at_least_float32

__all__ = [
    "FEATURE_MAPS",
    "LinearAttentionArguments",
    "boolean_key_mask",
    "checked_arguments",
    "checked_window",
    "inverse_of_scale",
]

FEATURE_MAPS: tuple[str, ...] = ("focused", "relu", "elu")


class LinearAttentionArguments(NamedTuple):
    """The arguments of :func:`linvit.ops.linear_attention_qkv` after qkv, but the backend; every backend takes
    ``(qkv, arguments)``. The order is that of `torch.scriptable_linear_attention_qkv(qkv, *arguments)`."""

    hw: tuple[int, int]
    num_heads: int
    feature_map: str
    inverse_temperature: Tensor | None
    focusing_factor: float
    key_position: Tensor | None
    dwc_weight: Tensor | None
    dwc_bias: Tensor | None
    key_mask: Tensor | None
    num_prefix_tokens: int
    eps: float
    feature_eps: float
    prescaled: bool
    temperature_scale: Tensor | None = None


def inverse_of_scale(scale: Tensor) -> Tensor:
    """1 / softplus(scale) in at least float32: the focused map's inverse temperature from its parameter."""
    return 1.0 / softplus(at_least_float32(scale))


def boolean_key_mask(key_mask: Tensor | None) -> Tensor | None:
    """The key mask every backend receives: bool as given, 0/1 integers as bool (non-zero keeps); any other dtype is
    an error (a float mask is ambiguous: a soft weight or a threshold?). One check for all backends: the fused
    kernels read the mask's bytes, so an int32 or float mask would otherwise be silently misread."""
    if key_mask is None or key_mask.dtype == torch_bool:
        return key_mask
    if key_mask.dtype.is_floating_point or key_mask.dtype.is_complex:
        raise TypeError(
            f"key_mask must be bool (True = keep) or 0/1 integers, got {key_mask.dtype}; pass mask > 0.5 (or "
            "mask.bool()) for a float mask."
        )
    return key_mask != 0


def _grid(hw: tuple[int, int]) -> tuple[int, int]:
    """(H, W) as ints; symbolic sizes (torch.export with dynamic H and W) stay symbolic instead of specialising."""
    if isinstance(hw[0], SymInt) or isinstance(hw[1], SymInt):
        return hw[0], hw[1]
    return int(hw[0]), int(hw[1])


def checked_window(window: tuple[int, int] | None, arguments: LinearAttentionArguments) -> tuple[int, int] | None:
    """The attention window as two ints, or None for global attention (also for a window that is the whole map);
    ValueError for one larger than the map or combined with prefix tokens or a key mask."""
    if window is None:
        return None
    hw = arguments.hw
    window = (int(window[0]), int(window[1]))
    if not (1 <= window[0] <= hw[0] and 1 <= window[1] <= hw[1]):
        raise ValueError(
            f"window {window} must fit the {tuple(hw)} map (1 <= window <= map per dimension); clamp it first "
            "(linvit.ops.windows.clamp_window)."
        )
    if window[0] == hw[0] and window[1] == hw[1]:
        return None
    if arguments.num_prefix_tokens or arguments.key_mask is not None:
        raise ValueError(
            "window attention takes no prefix tokens and no key_mask (the padding of the map to whole windows is "
            "masked already); attend globally for those."
        )
    return window


def checked_arguments(
    qkv: Tensor, arguments: LinearAttentionArguments, window: tuple[int, int] | None = None
) -> LinearAttentionArguments:
    """``arguments`` checked against qkv (and the window, whose tokens key_position then has) (ValueError/TypeError
    saying what is wrong) and normalised: (H, W) and the focusing factor as numbers, the key mask as bool."""
    hw, num_heads, feature_map = arguments.hw, arguments.num_heads, arguments.feature_map
    inverse_temperature, key_position = arguments.inverse_temperature, arguments.key_position
    dwc_weight, key_mask = arguments.dwc_weight, arguments.key_mask
    spatial = hw[0] * hw[1] if window is None else window[0] * window[1]
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"Unknown feature_map {feature_map!r}; valid ones are {', '.join(FEATURE_MAPS)}.")
    channels = check_qkv(qkv, num_heads, hw, arguments.num_prefix_tokens)
    scale = arguments.temperature_scale
    if inverse_temperature is not None and scale is not None:
        raise ValueError("give the focused map's temperature once: inverse_temperature or temperature_scale, not both.")
    if scale is not None:
        inverse_temperature = scale
    if (feature_map == "focused") != (inverse_temperature is not None):
        raise ValueError(
            "inverse_temperature (1 / softplus(scale), shape (C,)) or temperature_scale (scale, shape (C,)) is "
            f"required for feature_map='focused' and only for it; got feature_map={feature_map!r} with "
            f"{'one' if inverse_temperature is not None else 'none'}."
        )
    name = "temperature_scale" if scale is not None else "inverse_temperature"
    if inverse_temperature is not None and inverse_temperature.shape != (channels,):
        raise ValueError(f"{name} must have shape ({channels},), got {tuple(inverse_temperature.shape)}.")
    if key_position is not None and key_position.shape[-2:] != (spatial, channels):
        raise ValueError(
            f"key_position must be ({spatial}, {channels}) or (B, {spatial}, {channels}) (one row per spatial token), "
            f"got {tuple(key_position.shape)}; resize a positional table to the grid first."
        )
    if dwc_weight is not None and (dwc_weight.dim() != 4 or dwc_weight.shape[0] * num_heads != channels):
        raise ValueError(
            f"dwc_weight must be (head_dim, 1, k, k) = ({channels // num_heads}, 1, k, k), shared by the heads; got "
            f"{tuple(dwc_weight.shape)}."
        )
    if key_mask is not None and key_mask.shape != qkv.shape[:2]:
        raise ValueError(f"key_mask must be (B, N) = {tuple(qkv.shape[:2])} bool, got {tuple(key_mask.shape)}.")
    return arguments._replace(
        hw=_grid(hw), focusing_factor=float(arguments.focusing_factor), key_mask=boolean_key_mask(key_mask)
    )
