"""Shared by the tests of the Nyström, Linformer and hybrid modules: random parameters and float64 tokens."""

import torch


def randomise(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn from N(0, 0.3²) (the initial ones leave some branches at zero), in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)
    return module


def tokens(batch: int, hw: tuple[int, int], channels: int, seed: int = 1) -> torch.Tensor:
    """(B, H·W, C) float64 standard normal tokens."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, hw[0] * hw[1], channels, generator=generator, dtype=torch.float64)
