"""Nyströmformer attention straight from a qkv projection: softmax attention through m landmarks.

Its arguments are checked once (`arguments.py`) and handed to `naive.py` (the reference, every matrix written out) or
to `torch.py` (eager, two fused softmax-attention calls; also what "triton" runs, see :mod:`linvit.ops`).
"""

from __future__ import annotations

from torch import Tensor

from linvit.ops._backend import resolve_backend
from linvit.ops.nystrom import naive
from linvit.ops.nystrom import torch as eager
from linvit.ops.nystrom.arguments import NystromArguments, checked_arguments

__all__ = ["NystromArguments", "nystrom_attention_qkv"]


def nystrom_attention_qkv(
    qkv: Tensor,
    *,
    hw: tuple[int, int],
    num_heads: int,
    landmark_grid: int | tuple[int, int] = (8, 8),
    pinv_iterations: int = 6,
    conv_weight: Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Nyström approximation of softmax attention of the tokens of ``qkv``, plus the per-head conv skip; (B, N, C).

    The steps are in :mod:`linvit.ops.nystrom.naive`. Everything after the projection is computed in at least
    float32 (autocast off); the output has qkv's dtype. Time and memory are linear in N for a fixed grid.

    Args:
        qkv: (B, N, 3C), q | k | v along the last dimension: the qkv projection's output.
        hw: (H, W) of the N tokens (row-major); a sequence is (1, N).
        num_heads: h; the head dimension is d = C / h.
        landmark_grid: (mh, mw), or s for s×s: m = mh·mw landmarks, the means of q and k over a grid of cells on the
            map (clamped to the map per dimension: a grid as large as the map makes every token a landmark, and the
            result softmax attention up to the convergence of the pseudo-inverse).
        pinv_iterations: steps of the iterative Moore–Penrose pseudo-inverse (the paper's 6).
        conv_weight: (h, 1, k, k), odd k: the depthwise conv of each head's values added to its output (the paper's
            skip); None for none.
        scale: of the logits; d^-1/2 when None.
        backend: "auto", "torch", "triton" (runs "torch": no fused kernel of its own) or "naive".
    """
    arguments = checked_arguments(
        qkv, NystromArguments(hw, num_heads, landmark_grid, pinv_iterations, conv_weight, scale)
    )
    if resolve_backend(backend, qkv.device) == "naive":
        return naive.nystrom_attention_qkv(qkv, arguments)
    return eager.scriptable_nystrom_attention_qkv(qkv, *arguments)
