"""Build any attention module by name, so blocks and configs choose the attention with a string."""

from collections.abc import Callable
from typing import Any

from torch import nn

from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.hybrid import HybridAttention
from linvit.attention.softmax import GlobalAttention
from linvit.attention.window import WindowAttention

__all__ = ["ATTENTION_NAMES", "create_attention"]

# The plain-kernel baselines are "vanilla" linear attention: no DWC and no positional encoding unless asked for
# (FLatten's ablation: vanilla 70.5, + focusing 71.8, + DWC 74.1 on DeiT-T). Keyword arguments override these.
_BASELINE_DEFAULTS = {"dwc_kernel_size": 0, "pos_encoding": "none"}

_BUILDERS: dict[str, tuple[Callable[..., nn.Module], dict[str, Any]]] = {
    "focused": (FocusedLinearAttention, {}),  # kernel="focused" by default, any kernel may be passed
    "linear": (FocusedLinearAttention, {"kernel": "relu", **_BASELINE_DEFAULTS}),
    "elu": (FocusedLinearAttention, {"kernel": "elu", **_BASELINE_DEFAULTS}),
    "favor": (FocusedLinearAttention, {"kernel": "favor", **_BASELINE_DEFAULTS}),
    "taylor": (FocusedLinearAttention, {"kernel": "taylor", **_BASELINE_DEFAULTS}),
    "window": (WindowAttention, {}),
    "softmax": (GlobalAttention, {}),
    "hybrid": (HybridAttention, {}),
}

ATTENTION_NAMES: tuple[str, ...] = tuple(_BUILDERS)
"""Valid names for `create_attention`:
"focused" (FLatten focused linear attention), "linear" (ReLU linear attention), "elu" (ELU+1 linear attention),
"favor" (FAVOR+ random features), "taylor" (second-order Taylor features), "window" (Swin window softmax),
"softmax" (global softmax), "hybrid" (window softmax + global focused linear)."""


def create_attention(name: str, dim: int, num_heads: int, **kwargs: Any) -> nn.Module:
    """An attention module by name: `create_attention("focused", 96, 3, pos_size=(56, 56))`.

    Every module's forward is `forward(x, hw)` with x (B, N, C) and hw = (H, W). Keyword arguments go to the
    module's constructor (see `FocusedLinearAttention`, `WindowAttention`, `GlobalAttention`, `HybridAttention`).
    The kernel-named entries ("linear", "elu", "favor", "taylor") are `FocusedLinearAttention` with that kernel,
    without DWC or positional encoding unless `dwc_kernel_size` / `pos_encoding` are passed.
    """
    if name not in _BUILDERS:
        raise ValueError(f"Unknown attention {name!r}; valid names are {', '.join(ATTENTION_NAMES)}.")
    builder, defaults = _BUILDERS[name]
    if "kernel" in kwargs and "kernel" in defaults and kwargs["kernel"] != defaults["kernel"]:
        raise ValueError(
            f"create_attention({name!r}) fixes kernel={defaults['kernel']!r} but got kernel={kwargs['kernel']!r}; "
            f"to choose the kernel yourself use create_attention('focused', dim, num_heads, kernel=...)."
        )
    return builder(dim, num_heads, **{**defaults, **kwargs})
