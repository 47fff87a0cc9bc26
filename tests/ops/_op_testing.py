"""Shared by the tests of the softmax approximations (Nyströmformer, Linformer): random inputs, the materialised
softmax attention they reduce to in their limits, and the comparison of the torch backend with the naive one."""

import torch


def random_qkv(batch: int, hw: tuple[int, int], channels: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    """(B, H·W, 3C) float64 q | k | v of std ``scale``, requiring grad."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, hw[0] * hw[1], 3 * channels)
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).requires_grad_(True)


def softmax_attention(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """softmax(q kᵀ/√d) v per head with the N×N matrix written out, for qkv (B, N, 3C) = q | k | v; (B, N, C)."""
    batch, tokens, three_c = qkv.shape
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, three_c // 3 // num_heads).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
    return (weights @ v).transpose(1, 2).reshape(batch, tokens, three_c // 3)


def assert_torch_backend_equals_naive(operator, qkv: torch.Tensor, arguments: dict) -> None:
    """``operator(qkv, backend=..., **arguments)`` on "torch" equals "naive" in value and in the gradients of qkv and
    of every tensor argument (float64)."""
    leaves = [qkv] + [value for value in arguments.values() if isinstance(value, torch.Tensor)]
    grad_out = torch.randn(qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3, dtype=torch.float64)
    results = []
    for backend in ("naive", "torch"):
        out = operator(qkv, backend=backend, **arguments)
        results.append((out, torch.autograd.grad(out, leaves, grad_out)))
    (expected, expected_grads), (out, grads) = results
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
