"""A model's stages as timm's ``feature_info`` names them, and the attention each one runs."""

from __future__ import annotations

import math
from collections import Counter

from torch import nn

from linvit.attention import (
    FocusedLinearAttention,
    GlobalAttention,
    HybridAttention,
    LePEAttention,
    StripeAttention,
    WindowAttention,
)

__all__ = ["attention_label", "padding_free_multiple", "stage_modules"]


def stage_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every stage in ``model.feature_info`` (timm's feature taps); [] for a model without it."""
    infos = getattr(model, "feature_info", None) or []
    stages = []
    for info in infos:
        name = info.get("module") if isinstance(info, dict) else None
        if name:
            stages.append((name, model.get_submodule(name)))
    return stages


def _pair(size) -> str:
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return f"{height}×{width}"


def _describe(module: nn.Module) -> str:
    """What one attention module computes, in a few words ("focused linear", "window softmax 7×7", ...)."""
    inner = list(module.modules())
    if any(isinstance(m, HybridAttention) for m in inner):
        return "hybrid window softmax + linear"
    if any(isinstance(m, (StripeAttention, LePEAttention)) or "LePE" in type(m).__name__ for m in inner):
        linear = any(isinstance(m, FocusedLinearAttention) for m in inner)
        return "stripe linear" if linear else "stripe softmax"
    for m in inner:
        if isinstance(m, FocusedLinearAttention):
            label = "focused linear" if m.kernel == "focused" else f"{m.kernel} linear"
            window = getattr(m, "window_size", None)
            return f"{label} in windows {_pair(window)}" if window else label
        if isinstance(m, WindowAttention):
            return f"window softmax {_pair(m.window_size)}"
        if isinstance(m, GlobalAttention):
            return "global softmax"
    window = getattr(module, "window_size", None)  # other libraries' window attention (timm's Swin)
    return f"{type(module).__name__} {_pair(window)}" if window else type(module).__name__


def attention_label(stage: nn.Module) -> str:
    """The attention modules of a stage, counted: "focused linear ×2", "window softmax 7×7 ×6"; "-" for none.

    Counts the outermost modules whose class name ends in "Attention" (linvit's and other libraries' alike).
    """
    outer: list[nn.Module] = []
    inside: set[int] = set()
    for module in stage.modules():
        if id(module) in inside or not type(module).__name__.endswith("Attention"):
            continue
        outer.append(module)
        inside.update(id(m) for m in module.modules())
    if not outer:
        return "-"
    counts = Counter(_describe(module) for module in outer)
    return ", ".join(label if count == 1 else f"{label} ×{count}" for label, count in counts.items())


def _window_sides(module: nn.Module) -> list[int]:
    """The window (or stripe) sides, in tokens, that ``module`` pads its map to a multiple of."""
    sides = []
    window = getattr(module, "window_size", None)
    if window:
        sides += [window, window] if isinstance(window, int) else list(window)
    split = getattr(module, "split_size", None)
    if isinstance(split, int) and split > 0:
        sides.append(split)
    return sides


def padding_free_multiple(model: nn.Module, limit: int = 384) -> int:
    """The smallest input side (pixels) at which no stage pads: a multiple of every stage's stride times its
    windows' sides. Falls back to the largest stride when that exceeds ``limit`` (a coarser grid helps nobody)."""
    infos = [info for info in getattr(model, "feature_info", None) or [] if isinstance(info, dict)]
    stride = max([int(info.get("reduction", 1)) for info in infos] or [1])
    multiple = stride
    for info in infos:
        reduction = int(info.get("reduction", 1))
        for module in model.get_submodule(info["module"]).modules():
            for side in _window_sides(module):
                multiple = math.lcm(multiple, reduction * side)
    return multiple if multiple <= limit else stride
