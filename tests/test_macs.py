import torch
import torch.nn.functional as F
from torch import nn

from linvit.utils import count_macs, count_params


class _Attention(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.fused = fused

    def forward(self, x):  # x: (B, 3, N, d) read as one head of q, k, v
        q, k, v = x.unbind(1)
        if self.fused:
            return F.scaled_dot_product_attention(q, k, v)
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_fused_attention_counts_like_its_matmuls():
    # Reference: the explicit two matmuls, N*N*d MACs each.
    size = (3, 64, 16)
    explicit = count_macs(_Attention(fused=False), size)
    assert explicit == 2 * 64 * 64 * 16
    assert count_macs(_Attention(fused=True), size) == explicit


def test_linear_and_conv_macs_match_their_definition():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 10 * 12, 5))
    expected = 8 * 3 * 9 * 10 * 12 + 8 * 10 * 12 * 5
    assert count_macs(model, (3, 10, 12)) == expected
    assert count_params(model) == sum(p.numel() for p in model.parameters())
