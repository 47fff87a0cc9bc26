"""Softmax attention with the N×N matrix written out: what Nyströmformer and Linformer reduce to in their limits."""

import torch


def softmax_attention(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """softmax(q kᵀ/√d) v per head for qkv (B, N, 3C) = q | k | v; (B, N, C)."""
    batch, tokens, three_c = qkv.shape
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, three_c // 3 // num_heads).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
    return (weights @ v).transpose(1, 2).reshape(batch, tokens, three_c // 3)
