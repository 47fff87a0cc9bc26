"""Nyströmformer attention straight from a qkv projection: softmax attention through m landmarks.

One keyword-only signature, two implementations (see :mod:`linvit.ops._backend`): `naive.py` (the reference, every
matrix written out) and `torch.py` (eager, two fused softmax-attention calls). There is no Triton kernel: "triton"
(and "auto" on CUDA) runs the eager path, whose work is already in PyTorch's fused attention kernels.
(Importing the submodule `torch` binds that name in this package: this file never uses `torch.` itself.)
"""

from __future__ import annotations

from torch import Tensor

from linvit.ops._backend import resolve_backend
from linvit.ops._cells import cell_grid
from linvit.ops.nystrom import naive
from linvit.ops.nystrom import torch as eager

__all__ = ["nystrom_attention_qkv"]


def _check(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    pinv_iterations: int,
    conv_weight: Tensor | None,
) -> None:
    if qkv.dim() != 3 or qkv.shape[-1] % 3 != 0 or (qkv.shape[-1] // 3) % num_heads != 0:
        raise ValueError(
            f"qkv must be (B, N, 3C) with C divisible by num_heads={num_heads} (a qkv projection's output), got "
            f"{tuple(qkv.shape)}."
        )
    if qkv.shape[1] != hw[0] * hw[1]:
        raise ValueError(f"hw={tuple(hw)} gives {hw[0] * hw[1]} tokens but qkv has {qkv.shape[1]}; N must be H * W.")
    if pinv_iterations < 0:
        raise ValueError(f"pinv_iterations must be >= 0, got {pinv_iterations}; the paper uses 6.")
    if conv_weight is not None and (
        conv_weight.dim() != 4 or conv_weight.shape[:2] != (num_heads, 1) or conv_weight.shape[-1] % 2 == 0
    ):
        raise ValueError(
            f"conv_weight must be (num_heads, 1, k, k) = ({num_heads}, 1, k, k) with odd k, one kernel per head; got "
            f"{tuple(conv_weight.shape)}."
        )


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
    hw = (int(hw[0]), int(hw[1]))
    landmark_grid = cell_grid(landmark_grid, "landmark_grid")
    _check(qkv, hw, num_heads, pinv_iterations, conv_weight)
    arguments = {
        "hw": hw,
        "num_heads": num_heads,
        "landmark_grid": landmark_grid,
        "pinv_iterations": int(pinv_iterations),
        "conv_weight": conv_weight,
        "scale": scale,
    }
    if resolve_backend(backend, qkv.device) == "naive":
        return naive.nystrom_attention_qkv(qkv, **arguments)
    return eager.nystrom_attention_qkv(qkv, **arguments)
