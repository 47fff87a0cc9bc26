"""Linformer attention straight from a qkv projection: keys and values projected along the token axis to k ≪ N.

One keyword-only signature, two implementations (see :mod:`linvit.ops._backend`): `naive.py` (the reference, the
attention matrix written out) and `torch.py` (eager, one fused softmax-attention call). There is no Triton kernel:
"triton" (and "auto" on CUDA) runs the eager path, whose work is already in PyTorch's fused attention kernels.
(Importing the submodule `torch` binds that name in this package: this file never uses `torch.` itself.)
"""

from __future__ import annotations

from torch import Tensor

from linvit.ops._backend import resolve_backend
from linvit.ops._cells import cell_grid
from linvit.ops.linformer import naive
from linvit.ops.linformer import torch as eager

__all__ = ["linformer_attention_qkv"]


def _check(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    key_projection: Tensor | None,
    value_projection: Tensor | None,
    pool_grid: tuple[int, int] | None,
    dropout_p: float,
) -> None:
    if qkv.dim() != 3 or qkv.shape[-1] % 3 != 0 or (qkv.shape[-1] // 3) % num_heads != 0:
        raise ValueError(
            f"qkv must be (B, N, 3C) with C divisible by num_heads={num_heads} (a qkv projection's output), got "
            f"{tuple(qkv.shape)}."
        )
    tokens = hw[0] * hw[1]
    if qkv.shape[1] != tokens:
        raise ValueError(f"hw={tuple(hw)} gives {tokens} tokens but qkv has {qkv.shape[1]}; N must be H * W.")
    learned = key_projection is not None or value_projection is not None
    if learned == (pool_grid is not None):
        raise ValueError(
            "give either key_projection and value_projection (the learned (k, N) projections) or pool_grid (the "
            f"cells of the pooled projection), not {'both' if learned else 'neither'}."
        )
    if learned:
        if key_projection is None or value_projection is None:
            raise ValueError("the learned form needs both key_projection and value_projection, (k, N) each.")
        for name, projection in (("key_projection", key_projection), ("value_projection", value_projection)):
            if projection.dim() != 2 or projection.shape[1] != tokens or projection.shape != key_projection.shape:
                raise ValueError(
                    f"{name} must be (k, N) = (k, {tokens}) for hw={tuple(hw)}, the same for keys and values; got "
                    f"{tuple(projection.shape)}. Resize a projection learned on another grid first "
                    "(LinformerAttention does, see its docstring)."
                )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}.")


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
    hw = (int(hw[0]), int(hw[1]))
    if pool_grid is not None:
        pool_grid = cell_grid(pool_grid, "pool_grid")
    _check(qkv, hw, num_heads, key_projection, value_projection, pool_grid, dropout_p)
    arguments = {
        "hw": hw,
        "num_heads": num_heads,
        "key_projection": key_projection,
        "value_projection": value_projection,
        "pool_grid": pool_grid,
        "dropout_p": float(dropout_p),
        "scale": scale,
    }
    if resolve_backend(backend, qkv.device) == "naive":
        return naive.linformer_attention_qkv(qkv, **arguments)
    return eager.linformer_attention_qkv(qkv, **arguments)
