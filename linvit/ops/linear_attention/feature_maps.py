"""Kernel feature maps φ for linear attention, so that exp(q·k) or a similarity is replaced by φ(q)·φ(k).

Functions on any (..., d) tensor (FAVOR+ on (B, N, heads, d)); the modules that hold their state (FAVOR+'s random
projection) are in :mod:`linvit.attention.feature_maps`.
"""

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._numerics import at_least_float32, full_precision_bmm

__all__ = [
    "elu_feature_map",
    "favor_feature_map",
    "focused_feature_map",
    "focused_feature_parts",
    "orthogonal_random_projection",
    "relu_feature_map",
    "taylor_feature_map",
]

# FX: record the float32 product as a call (its autocast guard needs a concrete device).
torch.fx.wrap("full_precision_bmm")
torch.fx.wrap("at_least_float32")


def relu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = relu(x) (EfficientViT / "plain" linear attention)."""
    return F.relu(x)


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020); strictly positive."""
    return F.elu(x) + 1.0


def _power(x: Tensor, p: float) -> Tensor:
    # pow special-cases the exponents 2 and 3 as products (x*x, x*x*x: exact, one pass, no exp/log).
    if p == 1.0:
        return x
    return x.pow(p)


def focused_feature_parts(
    x: Tensor,
    scale: Tensor | None,
    focusing_factor: float = 3.0,
    eps: float = 1e-6,
    dim: int = -1,
) -> tuple[Tensor, Tensor]:
    """The focused map split as φ(x) = x_p · α, with α a per-token factor (size 1 along `dim`).

    x_p = ((relu(x) + eps) / softplus(scale))^p elementwise and α = ‖x'‖ / ‖x'^p‖ with the norms over `dim` (all C
    channels of a token, before any head split). Returning α separately lets the attention fold it into the small
    per-token normaliser instead of rescaling the whole tensor. `scale` must broadcast against x.

    With autograd off the map uses a single new buffer, updated in place; with autograd on, every step is out of
    place.
    """
    if torch.is_grad_enabled():
        x = F.relu(x) + eps
        if scale is not None:
            x = x / F.softplus(scale)
        norm = torch.linalg.vector_norm(x, ord=2, dim=dim, keepdim=True)
        x_p = _power(x, focusing_factor)
    else:
        # One buffer updated in place: large temporaries are costly on CPUs, where freed blocks often go back to the
        # operating system and the next allocation page-faults again.
        x = F.relu(x).add_(eps)
        if scale is not None:
            x = x.div_(F.softplus(scale))
        norm = torch.linalg.vector_norm(x, ord=2, dim=dim, keepdim=True)
        x_p = x if focusing_factor == 1.0 else x.pow_(focusing_factor)
    return x_p, norm / torch.linalg.vector_norm(x_p, ord=2, dim=dim, keepdim=True)


def focused_feature_map(
    x: Tensor, scale: Tensor | None = None, focusing_factor: float = 3.0, eps: float = 1e-6
) -> Tensor:
    """Focused map of FLatten: f_p((relu(x) + eps) / softplus(scale)), f_p(y) = ‖y‖/‖y^p‖ · y^p.

    Args:
        x: (..., C) tokens; norms are over the last dimension (all channels, before the head split).
        scale: learnable temperature parameter broadcastable to x (the authors' (1, 1, C)), or None for none.
        focusing_factor: the power p (3 in every published model).
        eps: added after the ReLU (the authors' 1e-6), keeping every feature strictly positive.
    """
    x_p, factor = focused_feature_parts(x, scale, focusing_factor, eps)
    return x_p * factor


def taylor_feature_map(x: Tensor) -> Tensor:
    """Second-order Taylor features [1, x, vec(x xᵀ)/√2], (..., d) -> (..., 1 + d + d²).

    φ(x)·φ(y) = 1 + x·y + (x·y)²/2 exactly, the second-order expansion of exp(x·y); it is ≥ 1/2, so the
    normaliser never vanishes.
    """
    ones = torch.ones_like(x[..., :1])
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) * (0.5**0.5)
    return torch.cat([ones, x, outer], dim=-1)


def favor_feature_map(x: Tensor, projection: Tensor, is_query: bool, eps: float = 1e-6) -> Tensor:
    """Positive orthogonal random features (FAVOR+, Performer): φ(x) = exp(wᵀx − ‖x‖²/2 − c) / √m + eps.

    E[φ(q)·φ(k)] ∝ exp(q·k). The stabiliser c is the row maximum for queries and the maximum over all keys of a
    (batch, head) for keys: both cancel in the normalised attention (up to eps), and keep exp from overflowing.

    Args:
        x: (B, N, heads, d), already scaled (the attention uses d**-0.25 so that φ(q)·φ(k) ≈ exp(q·k/√d)).
        projection: (m, d) random directions.
        is_query: selects the stabiliser.
    """
    x = at_least_float32(x)
    wx = full_precision_bmm(x, projection.to(x.dtype).t())  # (B, N, h, m), float32 even under autocast
    half_sq_norm = 0.5 * (x * x).sum(dim=-1, keepdim=True)
    if is_query:
        stabiliser = wx.amax(dim=-1, keepdim=True)
    else:
        stabiliser = wx.amax(dim=-1, keepdim=True).amax(dim=1, keepdim=True)  # over all keys of a (batch, head)
    return torch.exp(wx - half_sq_norm - stabiliser) * (projection.shape[0] ** -0.5) + eps


def orthogonal_random_projection(
    num_features: int, dim: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """(num_features, dim) Gaussian directions, orthogonal within each block of `dim` rows, with chi-distributed norms.

    Built on the CPU (for a reproducible generator), in float64 for the QR, then cast.
    """
    blocks = []
    remaining = num_features
    while remaining > 0:
        gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, _ = torch.linalg.qr(gaussian)
        rows = min(remaining, dim)
        blocks.append(q.t()[:rows])
        remaining -= rows
    directions = torch.cat(blocks, dim=0)
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(p=2, dim=1, keepdim=True)
    return (directions * norms).to(dtype)
