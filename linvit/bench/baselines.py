"""Operators the benchmarks compare linvit against, written for the benchmarks only.

- :class:`AuthorsFocusedLinearAttention`: a line-by-line restatement of the FLatten authors' focused linear attention
  forward (LeapLabTHU/FLatten-Transformer, ``models/flatten_swin.py``), keeping their memory layout on purpose: the
  ``(B, N, 3, C)`` qkv permute, ``**`` powers and three-pass norms over all channels, head split by permute, the
  ``1/(q·mean(k))`` normaliser with ``N ** -0.5`` pre-scaling, and the depthwise convolution run on a
  ``(B·heads, d, H, W)`` view of a permuted ``v``. It is the baseline linvit must beat, and a test checks that
  ``linvit.attention.FocusedLinearAttention`` computes the same function with the same state dict.
- :class:`SwinWindowSoftmax`: timm's Swin ``WindowAttention`` wrapped with the padding, window partition and
  reverse that Swin's block does around it (no shift), so it does the same job as an attention operator on a map.
- :class:`GlobalSoftmaxSDPA`: global softmax attention through ``F.scaled_dot_product_attention``.

All three take ``(x, hw)`` with ``x`` of shape (B, N, C), like every linvit attention module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AuthorsFocusedLinearAttention(nn.Module):
    """The FLatten authors' focused linear attention, restated for benchmarking (global over one square map).

    State-dict keys and shapes match the authors' checkpoints and linvit's default ``FocusedLinearAttention``:
    ``qkv.*``, ``proj.*``, ``scale`` (1, 1, C), ``positional_encoding`` (1, H·W, C), ``dwc.*`` ((d, 1, k, k), (d,)).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        map_size: tuple[int, int],
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        kernel_size: int = 5,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.map_size = tuple(map_size)
        self.focusing_factor = focusing_factor
        head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, padding=kernel_size // 2, groups=head_dim, **dd)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim, **dd))
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.map_size[0] * self.map_size[1], dim, **dd))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        H, W = hw
        if self.map_size != (H, W) or H * W != N:
            raise ValueError(f"the authors' module is fixed to map {self.map_size}; got hw={hw} for N={N}")
        # Their layout: (B, N, 3, C) -> (3, B, N, C), then unbind (strided views, no head split yet).
        q, k, v = self.qkv(x).reshape(B, N, 3, C).permute(2, 0, 1, 3).unbind(0)
        k = k + self.positional_encoding
        q = F.relu(q) + 1e-6
        k = F.relu(k) + 1e-6
        scale = F.softplus(self.scale)
        q = q / scale
        k = k / scale
        # Focusing function over all C channels (before the head split): keep the norm, sharpen the direction.
        q_norm = q.norm(p=2, dim=-1, keepdim=True)
        k_norm = k.norm(p=2, dim=-1, keepdim=True)
        q = q**self.focusing_factor
        k = k**self.focusing_factor
        q = (q / q.norm(p=2, dim=-1, keepdim=True)) * q_norm
        k = (k / k.norm(p=2, dim=-1, keepdim=True)) * k_norm
        # Head split by permute: (B, heads, N, d).
        q = q.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        # Mean form: z from the mean key, S with both factors pre-scaled by N ** -0.5.
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (N**-0.5)) @ (v * (N**-0.5))
        out = q @ kv * z
        out = out.transpose(1, 2).reshape(B, N, C)
        # Their DWC layout: v as (B·heads, H, W, d) permuted to (B·heads, d, H, W), one conv shared by all heads.
        v_image = v.reshape(B * self.num_heads, H, W, -1).permute(0, 3, 1, 2)
        out = out + self.dwc(v_image).reshape(B, C, N).permute(0, 2, 1)
        return self.proj(out)


class SwinWindowSoftmax(nn.Module):
    """timm's Swin ``WindowAttention`` (7×7 window softmax with relative position bias) as a map operator.

    ``fused=True`` routes timm's module through ``F.scaled_dot_product_attention``; ``False`` keeps timm's default
    eager path (explicit ``q @ kᵀ``, softmax, ``@ v``). Pads the map to a multiple of the window like Swin's block.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, fused: bool = True, device=None, dtype=None):
        super().__init__()
        from timm.models.swin_transformer import WindowAttention

        self.window_size = window_size
        self.attn = WindowAttention(dim, num_heads, window_size=window_size, device=device, dtype=dtype)
        self.attn.fused_attn = fused

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        H, W = hw
        ws = self.window_size
        x = x.view(B, H, W, C)
        pad_h, pad_w = (ws - H % ws) % ws, (ws - W % ws) % ws
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        Hp, Wp = H + pad_h, W + pad_w
        windows = x.view(B, Hp // ws, ws, Wp // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)
        windows = self.attn(windows)
        x = windows.view(B, Hp // ws, Wp // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, Hp, Wp, C)
        return x[:, :H, :W, :].reshape(B, N, C)


class GlobalSoftmaxSDPA(nn.Module):
    """Global softmax attention over all tokens through ``F.scaled_dot_product_attention`` (O(N²))."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, device=device, dtype=dtype)
        self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))
