"""The argument check every operator's public entry makes of its qkv input."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_qkv"]


def check_qkv(qkv: Tensor, num_heads: int, hw: tuple[int, int], num_prefix_tokens: int | None = None) -> int:
    """ValueError unless qkv is (B, N, 3C) with C divisible by ``num_heads`` and N = num_prefix_tokens + H·W (H·W
    for an operator without prefix tokens, ``num_prefix_tokens`` None); returns C."""
    if qkv.dim() != 3 or qkv.shape[-1] % 3 != 0 or (qkv.shape[-1] // 3) % num_heads != 0:
        raise ValueError(
            f"qkv must be (B, N, 3C) with C divisible by num_heads={num_heads} (a qkv projection's output), got "
            f"{tuple(qkv.shape)}."
        )
    if qkv.shape[1] - (num_prefix_tokens or 0) != hw[0] * hw[1]:
        if num_prefix_tokens is not None:
            raise ValueError(
                f"hw={tuple(hw)} gives {hw[0] * hw[1]} tokens but qkv has {qkv.shape[1]} tokens with "
                f"num_prefix_tokens={num_prefix_tokens}; N must be num_prefix_tokens + H * W."
            )
        raise ValueError(f"hw={tuple(hw)} gives {hw[0] * hw[1]} tokens but qkv has {qkv.shape[1]}; N must be H * W.")
    return qkv.shape[-1] // 3
