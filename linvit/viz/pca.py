"""Feature maps as colours: the first three principal components of a (C, H, W) map as RGB."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from linvit.io.destination import save_figure

__all__ = ["pca_components", "pca_rgb", "plot_feature_pca"]


def pca_components(feature: Tensor, num_components: int = 3, max_samples: int = 20000, seed: int = 0) -> Tensor:
    """Project every position of ``feature`` (C, H, W) on its first principal components → (k, H, W).

    The components are fitted on at most ``max_samples`` random positions (large maps: 2560×1600 at stride 4 has
    256k) and applied to all. Signs are fixed so that each component's largest-magnitude loading is positive.
    """
    channels, height, width = feature.shape
    tokens = feature.reshape(channels, -1).T.double()  # (N, C)
    fit = tokens
    if tokens.shape[0] > max_samples:
        generator = torch.Generator().manual_seed(seed)
        fit = tokens[torch.randperm(tokens.shape[0], generator=generator)[:max_samples]]
    mean = fit.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(fit - mean, full_matrices=False)
    k = min(num_components, vh.shape[0])
    basis = vh[:k]  # (k, C)
    signs = torch.sign(basis.gather(1, basis.abs().argmax(1, keepdim=True)))
    basis = basis * torch.where(signs == 0, torch.ones_like(signs), signs)
    projected = (tokens - mean) @ basis.T  # (N, k)
    if k < num_components:  # fewer channels than components: pad with zeros
        projected = torch.cat([projected, projected.new_zeros(projected.shape[0], num_components - k)], dim=1)
    return projected.T.reshape(num_components, height, width).float()


def pca_rgb(feature: Tensor, low: float = 1.0, high: float = 99.0) -> np.ndarray:
    """(C, H, W) → (H, W, 3) floats in [0, 1]: the first three components, each stretched between percentiles."""
    components = pca_components(feature, 3).numpy()
    rgb = np.empty(components.shape[1:] + (3,), dtype=np.float32)
    for i in range(3):
        lo, hi = np.percentile(components[i], [low, high])
        rgb[..., i] = np.clip((components[i] - lo) / max(hi - lo, 1e-12), 0, 1)
    return rgb


def plot_feature_pca(
    image: np.ndarray,
    features: Sequence[Tensor],
    strides: Sequence[int],
    path: str | os.PathLike,
    title: str | None = None,
    dpi: int = 100,
    force: bool = False,
) -> Path:
    """The image beside the PCA colours of each level's features; one row, written to ``path`` (PNG) through
    :func:`linvit.io.destination.save_figure` (a file linvit did not write there: refused unless ``force``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = 1 + len(features)
    aspect = image.shape[1] / image.shape[0]
    figure, axes = plt.subplots(1, panels, figsize=(3.2 * aspect * panels, 3.6), squeeze=False)
    axes = axes[0]
    axes[0].imshow(image)
    axes[0].set_title(f"input {image.shape[0]}×{image.shape[1]}", fontsize=9)
    for axis, feature, stride in zip(axes[1:], features, strides):
        axis.imshow(pca_rgb(feature), interpolation="nearest")
        axis.set_title(f"level stride {stride}: {feature.shape[0]}×{feature.shape[1]}×{feature.shape[2]}", fontsize=9)
    for axis in axes:
        axis.axis("off")
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    try:
        path = save_figure(figure, path, dpi=dpi, force=force)  # a file linvit did not write: refused unless force
    finally:
        plt.close(figure)
    return path
