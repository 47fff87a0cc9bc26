"""Operator suite: one attention module on one (B, H·W, C) map, forward or forward+backward."""

from __future__ import annotations

import torch
from torch import nn

from linvit.bench.measure import autocast_context


class Unavailable(RuntimeError):
    """The thing to measure does not exist (yet) in this checkout: the case is skipped with this note."""


def _linvit_attention():
    try:
        import linvit.attention as attention
    except ImportError as error:  # pragma: no cover - depends on the checkout
        raise Unavailable(f"linvit.attention does not import: {error}") from error
    return attention


def build_operator(name: str, dim: int, num_heads: int, hw: tuple[int, int], device=None) -> nn.Module:
    """The module called ``name`` in :data:`linvit.bench.cases.OPERATORS`."""
    from linvit.bench import baselines

    dd = {"device": device}
    if name == "authors_focused":
        return baselines.AuthorsFocusedLinearAttention(dim, num_heads, hw, **dd)
    if name == "timm_window_sdpa":
        return baselines.SwinWindowSoftmax(dim, num_heads, window_size=7, fused=True, **dd)
    if name == "timm_window_eager":
        return baselines.SwinWindowSoftmax(dim, num_heads, window_size=7, fused=False, **dd)
    if name == "sdpa_global":
        return baselines.GlobalSoftmaxSDPA(dim, num_heads, **dd)
    attention = _linvit_attention()
    if name == "linvit_focused":
        if not hasattr(attention, "FocusedLinearAttention"):
            raise Unavailable("linvit.attention.FocusedLinearAttention is not there yet")
        return attention.FocusedLinearAttention(dim, num_heads, pos_size=hw, **dd)
    if not hasattr(attention, "create_attention"):
        raise Unavailable("linvit.attention.create_attention is not there yet")
    if name == "linvit_linear":
        return attention.create_attention("linear", dim, num_heads, **dd)
    if name == "linvit_window":
        return attention.create_attention("window", dim, num_heads, window_size=7, **dd)
    if name in ("linvit_nystrom", "linvit_linformer"):  # with their defaults: 8×8 landmarks, 16×16 pooled cells
        kind = name.removeprefix("linvit_")
        if kind not in getattr(attention, "ATTENTION_NAMES", ()):
            raise Unavailable(f"linvit.attention has no {kind!r} attention yet")
        return attention.create_attention(kind, dim, num_heads, **dd)
    raise ValueError(f"unknown operator {name!r}")


def operator_callable(case: dict, device: torch.device, dtype: str):
    """A no-argument callable running the case once, and a dict of facts about it."""
    size, num_heads, head_dim = case["map"], case["heads"], case["head_dim"]
    dim = num_heads * head_dim
    hw = (size, size)
    torch.manual_seed(0)
    module = build_operator(case["op"], dim, num_heads, hw, device=device)
    x = torch.randn(case["batch"], size * size, dim, device=device)
    info = {"tokens": size * size, "dim": dim}
    if case["mode"] == "fwd":
        module.eval()

        def run():
            with torch.no_grad(), autocast_context(device, dtype):
                return module(x, hw)

        return run, info
    module.train()
    x.requires_grad_(True)
    grad = torch.randn_like(x)

    def run_backward():
        with autocast_context(device, dtype):
            out = module(x, hw)
        out.backward(grad)
        module.zero_grad(set_to_none=True)
        x.grad = None

    return run_backward, info
