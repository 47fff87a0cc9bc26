"""ProjectedAttention: what every attention module with its own q|k|v shares, the projections around the mixing."""

import torch
from torch import Tensor, nn

from linvit.attention._checks import check_heads
from linvit.ops import BACKENDS
from linvit.ops.onednn import linear_layer

__all__ = ["ProjectedAttention"]


class ProjectedAttention(nn.Module):
    """Base of the attention modules that project (B, N, C) tokens to q|k|v, mix them, and project the mixture back.

    Holds `qkv` (C -> 3C) and `proj` (C -> C), created first so that every subclass keeps the checkpoint keys and the
    parameter order of timm's attention modules; `proj_drop`; `dim`, `num_heads`, `head_dim`; and `backend` (when
    given) for the modules whose core runs through `linvit.ops`. With ``with_projections=False`` the module holds
    neither projection: forward then takes the concatenated (B, N, 3C) q|k|v of a caller that shares one projection
    between branches (`HybridAttention`) and returns the mixture before the output projection.

    Args:
        dim: channels C.
        num_heads: heads h (C must be divisible by h).
        qkv_bias: bias in the qkv projection.
        proj_drop: dropout after the output projection.
        with_projections: False drops `qkv` and `proj` (see above).
        backend: "auto", "torch", "triton" or "naive" (`linvit.ops`), for the modules whose core runs there.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        with_projections: bool = True,
        backend: str | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"Unknown backend {backend!r}; valid backends are {', '.join(BACKENDS)}.")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        if backend is not None:
            self.backend = backend
        self.qkv: nn.Linear | None = None
        self.proj: nn.Linear | None = None
        if with_projections:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, device=device, dtype=dtype)
            self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)
        self.proj_drop = nn.Dropout(proj_drop)

    def project_in(self, x: Tensor) -> Tensor:
        """(B', n, C) tokens -> (B', n, 3C) q|k|v; the caller's q|k|v as it is without projections."""
        if self.qkv is None:
            return x
        if not torch.jit.is_scripting():  # the bias inside oneDNN's GEMM where that runs (linvit.ops.onednn)
            return linear_layer(self.qkv, x)
        return self.qkv(x)

    def project_out(self, out: Tensor) -> Tensor:
        """The mixture (B', n, C) -> the module's output: projected (without projections, as it is), then dropout."""
        if self.proj is not None:
            if not torch.jit.is_scripting():  # TorchScript compiles only the other branch
                out = linear_layer(self.proj, out)
            else:
                out = self.proj(out)
        return self.proj_drop(out)
