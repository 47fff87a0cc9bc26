"""Linformer attention straight from a qkv projection: keys and values projected along the token axis to k ≪ N.

The signature below is checked once (`arguments.py`) and served by `naive.py` (the reference, the attention matrix
written out) or `torch.py` (eager, one fused softmax-attention call; also what "triton" runs, see :mod:`linvit.ops`).
"""

from __future__ import annotations

from torch import Tensor

from linvit.ops._backend import resolve_backend
from linvit.ops.linformer import naive
from linvit.ops.linformer import torch as eager
from linvit.ops.linformer.arguments import LinformerArguments, checked_arguments

__all__ = ["LinformerArguments", "linformer_attention_qkv"]


def linformer_attention_qkv(
    qkv: Tensor,
    *,
    hw: tuple[int, int],
    num_heads: int,
    key_projection: Tensor | None = None,
    value_projection: Tensor | None = None,
    pool_grid: int | tuple[int, int] | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Softmax attention of the queries of ``qkv`` over keys and values projected to k tokens; (B, N, C).

    The steps are in :mod:`linvit.ops.linformer.naive`. Everything after the qkv projection is computed in at least
    float32 (autocast off); the output has qkv's dtype. Time and memory are O(N·k).

    Args:
        qkv: (B, N, 3C), q | k | v along the last dimension: the qkv projection's output.
        hw: (H, W) of the N tokens (row-major).
        num_heads: h; the head dimension is d = C / h.
        key_projection, value_projection: (k, N) each, the learned projections E and F of the keys and values along
            the token axis, shared by the heads (for this grid: resize them for another). Or:
        pool_grid: (kh, kw), or s for s×s: project by averaging keys and values over a grid of k = kh·kw cells
            (clamped to the map), the resolution-free form.
        dropout_p: dropout on the attention probabilities (pass 0 outside training).
        scale: of the logits; d^-1/2 when None.
        backend: "auto", "torch", "triton" (runs "torch": no fused kernel of its own) or "naive".
    """
    arguments = checked_arguments(
        qkv, LinformerArguments(hw, num_heads, key_projection, value_projection, pool_grid, dropout_p, scale)
    )
    if resolve_backend(backend, qkv.device) == "naive":
        return naive.linformer_attention_qkv(qkv, arguments)
    return eager.scriptable_linformer_attention_qkv(qkv, *arguments)
