"""Input checks every family calls at its entry, so a wrong input fails with a clear message instead of deep inside.

``check_image_batch(x, in_chans, min_size=None, model_name="...", weight_dtype=None)`` raises ``TypeError`` /
``ValueError`` naming what was given, what is expected and how to fix it. It is an FX leaf
(``register_notrace_function``), so symbolic tracing never sees proxies inside it, and it returns at once under
``torch.jit.trace`` (the traced graph would not keep Python checks anyway) and under FX symbolic tracing (plain
``torch.fx.symbolic_trace`` included). Under TorchScript it compiles and runs like any scripted function (all but the
dtype check, which needs the autocast state).

Every family calls it through its backbone frame (:meth:`linvit.layers.StagedBackbone.check_input`), at the entry
of ``forward_features`` and ``forward_intermediates``.
"""

import torch
import torch.fx
from timm.layers import register_notrace_function, to_2tuple
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

__all__ = ["check_image_batch", "min_size_pair"]


def min_size_pair(min_size: object | None) -> tuple[int, int] | None:
    """Normalise ``min_size`` (None, an int or an (h, w) pair) to None or an (h, w) tuple of ints."""
    if min_size is None:
        return None
    height, width = to_2tuple(min_size)
    return int(height), int(width)


@register_notrace_function
def check_image_batch(
    x: torch.Tensor,
    in_chans: int,
    min_size: tuple[int, int] | None = None,
    model_name: str = "the model",
    weight_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Check that ``x`` is a float (B, in_chans, H, W) batch with H, W >= ``min_size``; return ``x`` unchanged.

    Args:
        x: the model input.
        in_chans: the channel count the model was built with (``in_chans=`` at creation).
        min_size: smallest accepted (H, W), or None for no limit (use ``min_size_pair`` to turn an int into a pair).
        model_name: named in the messages, e.g. ``"linvit_tiny"`` or the class name.
        weight_dtype: the dtype of the model's first layer; outside autocast the input must have it (checked in
            eager mode and under torch.compile, not in TorchScript).

    Raises:
        TypeError: ``x`` is not a tensor, not floating point, or of another dtype than the weights (no autocast).
        ValueError: ``x`` is not 4-D, has the wrong number of channels, or is smaller than ``min_size``.
    """
    if not torch.jit.is_scripting():
        # tracers record tensor ops only: the checks would either vanish from the graph or see proxies
        if torch.jit.is_tracing() or is_fx_symbolic_tracing() or isinstance(x, torch.fx.Proxy):
            return x
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{model_name} expects a torch.Tensor image batch of shape (B, C, H, W), got {type(x).__name__}; "
                "convert it first, e.g. with torchvision.transforms.functional.to_tensor or torch.as_tensor"
            )
    if x.dim() != 4:
        hint = "add a batch dimension with x.unsqueeze(0) for a single image"
        if x.dim() == 5:
            hint = "merge the extra dimension into the batch, e.g. x.flatten(0, 1), for video or multi-crop input"
        raise ValueError(
            f"{model_name} expects a 4-D image batch (B, C, H, W), got a {x.dim()}-D tensor of shape "
            f"{list(x.shape)}; {hint}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{model_name} expects a floating-point image tensor, got dtype {x.dtype} (shape {list(x.shape)}); "
            "convert with x.float() and normalise (e.g. x / 255, then the model's mean/std) first"
        )
    if x.shape[1] != in_chans:
        hint = f"create the model with in_chans={x.shape[1]}"
        if x.shape[-1] == in_chans and x.shape[1] != in_chans:
            hint = "the batch looks channels-last (B, H, W, C): use x.permute(0, 3, 1, 2), or " + hint
        raise ValueError(
            f"{model_name} was built for {in_chans} input channels, got {x.shape[1]} (input shape "
            f"{list(x.shape)}); convert the images to {in_chans} channels or {hint}"
        )
    if min_size is not None and (x.shape[2] < min_size[0] or x.shape[3] < min_size[1]):
        raise ValueError(
            f"{model_name} needs images of at least {min_size[0]}x{min_size[1]} (H x W), got "
            f"{x.shape[2]}x{x.shape[3]} (input shape {list(x.shape)}); resize or pad the images, "
            "e.g. torch.nn.functional.interpolate(x, size=...)"
        )
    if not torch.jit.is_scripting():
        _check_dtype(x, weight_dtype, model_name)
    return x


# the Tensor method that converts to a dtype, for the messages (x.float(), model.half(), ...)
_DTYPE_METHODS = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16", torch.float64: "double"}


def _check_dtype(x: torch.Tensor, weight_dtype: torch.dtype | None, model_name: str) -> None:
    """Outside autocast, a layer refuses an input of another dtype than its weights, deep inside and without a fix."""
    if weight_dtype is None or x.dtype == weight_dtype or torch.is_autocast_enabled(x.device.type):
        return
    to_weights = f"x.{_DTYPE_METHODS[weight_dtype]}()" if weight_dtype in _DTYPE_METHODS else f"x.to({weight_dtype})"
    to_input = f"model.{_DTYPE_METHODS[x.dtype]}()" if x.dtype in _DTYPE_METHODS else f"model.to({x.dtype})"
    fixes = f"convert the input with {to_weights} or the model with {to_input}"
    if x.dtype in (torch.float16, torch.bfloat16):  # a low-precision input: mixed precision is the usual intent
        fixes += f", or run the model under torch.autocast({x.device.type!r}, dtype={x.dtype}) (mixed precision)"
    raise TypeError(
        f"{model_name} has {weight_dtype} weights but got a {x.dtype} input (shape {list(x.shape)}); the dtypes must "
        f"match: {fixes}"
    )
