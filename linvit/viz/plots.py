"""Figures: attention distributions side by side for one query point, and attention rank with / without DWC.

Features come from a backbone's feature level (random-init weights unless a checkpoint is given: the figures say
which). Queries and keys are the standardised feature tokens themselves (q = k, one head over all channels), so
the maps show which image regions each kernel considers similar to the query.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.io.destination import save_figure
from linvit.viz.attention import (
    KERNEL_LABELS,
    VIZ_KERNELS,
    attention_matrix,
    attention_row,
    depthwise_conv_matrix,
    numerical_rank,
    perplexity,
    standardize_tokens,
)

__all__ = ["backbone_features", "query_token", "plot_attention_comparison", "rank_study", "plot_rank_study"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def backbone_features(
    image: np.ndarray,
    model: str,
    checkpoint: str | os.PathLike | None = None,
    level: int = 0,
    size: tuple[int, int] | None = None,
    seed: int = 0,
) -> tuple[Tensor, int]:
    """Feature map (C, h, w) of ``image`` at ``level`` of timm model ``model``, and that level's stride.

    ``seed`` fixes the random initialisation when no checkpoint is given, so figures are reproducible."""
    import timm

    from linvit.dense.backbone import create_feature_backbone
    from linvit.dense.extract import image_to_tensor

    torch.manual_seed(seed)
    backbone = create_feature_backbone(model, checkpoint=checkpoint).eval()
    if not 0 <= level < len(backbone.strides):
        raise ValueError(f"level {level} does not exist: {model} has levels 0..{len(backbone.strides) - 1}.")
    config = timm.data.resolve_data_config({}, model=backbone.model)
    tensor = image_to_tensor(image, config["mean"], config["std"], size)
    with torch.inference_mode():
        features = backbone(tensor[None])
    return features[level][0].float(), backbone.strides[level]


def query_token(query: Sequence[float], image_hw: tuple[int, int], grid_hw: tuple[int, int]) -> tuple[int, int, int]:
    """(row, col, flat index) on the token grid of a query point (y, x): fractions in [0, 1] or pixels."""
    y, x = float(query[0]), float(query[1])
    if max(y, x) <= 1.0:  # fractions of the image
        y, x = y * image_hw[0], x * image_hw[1]
    if not (0 <= y <= image_hw[0] and 0 <= x <= image_hw[1]):
        raise ValueError(f"Query point ({query[0]}, {query[1]}) lies outside the {image_hw[0]}×{image_hw[1]} image.")
    row = min(grid_hw[0] - 1, int(y / image_hw[0] * grid_hw[0]))
    col = min(grid_hw[1] - 1, int(x / image_hw[1] * grid_hw[1]))
    return row, col, row * grid_hw[1] + col


def plot_attention_comparison(
    image: np.ndarray,
    features: Tensor,
    query: Sequence[float],
    path: str | os.PathLike,
    kernels: Sequence[str] = VIZ_KERNELS,
    focusing_factor: float = 3.0,
    note: str = "",
    dpi: int = 100,
    force: bool = False,
) -> dict[str, float]:
    """One PNG: the image with the query point, then each kernel's attention row over the image.

    ``path`` is written through :func:`linvit.io.destination.save_figure`: a file linvit did not write there is
    refused unless ``force``.

    Returns each kernel's perplexity (tokens the row effectively spreads over), also shown in the titles.
    """
    plt = _pyplot()
    grid = tuple(features.shape[-2:])
    row, col, index = query_token(query, image.shape[:2], grid)
    tokens = standardize_tokens(features)
    rows = {kernel: attention_row(tokens, tokens, index, kernel, focusing_factor) for kernel in kernels}
    spread = {kernel: perplexity(values) for kernel, values in rows.items()}

    aspect = image.shape[1] / image.shape[0]
    figure, axes = plt.subplots(1, 1 + len(kernels), figsize=(3.0 * aspect * (1 + len(kernels)), 3.9), squeeze=False)
    axes = axes[0]
    point_y = (row + 0.5) / grid[0] * image.shape[0]
    point_x = (col + 0.5) / grid[1] * image.shape[1]
    axes[0].imshow(image)
    axes[0].set_title("query point", fontsize=9)
    grey = image.mean(-1, keepdims=True).repeat(3, -1) / 255.0
    for axis, kernel in zip(axes[1:], kernels):
        heat = rows[kernel].reshape(grid).float()[None, None]
        heat = F.interpolate(heat, size=image.shape[:2], mode="nearest")[0, 0].numpy()
        axis.imshow(grey * 0.45)
        axis.imshow(heat / max(heat.max(), 1e-12), cmap="inferno", alpha=0.8, vmin=0, vmax=1)
        label = KERNEL_LABELS[kernel].format(p=focusing_factor)
        share = 100.0 * spread[kernel] / tokens.shape[0]
        axis.set_title(f"{label}\nspread over {spread[kernel]:.0f} tokens ({share:.1f}%)", fontsize=8)
    for axis in axes:
        axis.plot([point_x], [point_y], marker="+", color="cyan", markersize=12, markeredgewidth=2)
        axis.axis("off")
    caption = (
        f"attention of one query over {grid[0]}×{grid[1]} = {tokens.shape[0]} tokens (q = k = standardised features). "
        "Linear kernels: the row of the N×N matrix their O(N) factorised form never builds, materialised for display. "
        "Each panel is coloured up to its own maximum."
    )
    figure.text(0.5, 0.01, caption + (f"\n{note}" if note else ""), ha="center", va="bottom", fontsize=7.5)
    figure.tight_layout(rect=(0, 0.09, 1, 1))
    try:
        path = save_figure(figure, path, dpi=dpi, force=force)  # a file linvit did not write: refused unless force
    finally:
        plt.close(figure)
    return spread


def rank_study(
    features: Tensor,
    grid_sizes: Sequence[int] = (4, 6, 8, 12, 16, 24),
    head_dim: int = 16,
    dwc_kernel_size: int = 5,
    focusing_factor: float = 3.0,
    rtol: float = 1e-10,
    seed: int = 0,
) -> dict[str, object]:
    """Numerical rank of the N×N attention matrix for N = s² tokens, s in ``grid_sizes``.

    Tokens: the feature map average-pooled to s×s, standardised, projected on a fixed random orthonormal basis of
    ``head_dim`` dimensions (one head, q = k). DWC: the kernel of channel 0 of a freshly initialised
    ``FocusedLinearAttention``'s depthwise conv (PyTorch's default init), written as an N×N matrix M; the
    effective attention of that channel is A + M.

    Returns ``{"N": [...], "rank": {name: [...]}, "singular_values": {name: array at the largest N}, ...}``.
    """
    from linvit.attention import FocusedLinearAttention

    generator = torch.Generator().manual_seed(seed)
    channels = features.shape[0]
    head_dim = min(head_dim, channels)
    basis, _ = torch.linalg.qr(torch.randn(channels, head_dim, generator=generator, dtype=torch.float64))
    torch.manual_seed(seed)
    attention = FocusedLinearAttention(head_dim, 1, dwc_kernel_size=dwc_kernel_size, pos_encoding="none")
    dwc_weight = attention.dwc.weight[0, 0].detach().double()

    names = ("softmax", "focused", "focused + DWC", "relu", "relu + DWC")
    ranks: dict[str, list[int]] = {name: [] for name in names}
    spectra: dict[str, np.ndarray] = {}
    sizes = sorted({int(s) for s in grid_sizes})
    for s in sizes:
        pooled = F.adaptive_avg_pool2d(features[None].double(), (s, s))[0]
        tokens = standardize_tokens(pooled) @ basis
        tokens = tokens * (head_dim**0.5) / tokens.norm(p=2, dim=-1, keepdim=True).clamp_min(1e-12)
        conv = depthwise_conv_matrix(dwc_weight, (s, s))
        matrices = {
            "softmax": attention_matrix(tokens, tokens, "softmax"),
            "focused": attention_matrix(tokens, tokens, "focused", focusing_factor),
            "relu": attention_matrix(tokens, tokens, "relu"),
        }
        matrices["focused + DWC"] = matrices["focused"] + conv
        matrices["relu + DWC"] = matrices["relu"] + conv
        for name in names:
            ranks[name].append(numerical_rank(matrices[name], rtol))
            if s == sizes[-1]:
                values = torch.linalg.svdvals(matrices[name]).numpy()
                spectra[name] = values / values[0]
    return {
        "N": [s * s for s in sizes],
        "grid_sizes": sizes,
        "head_dim": head_dim,
        "rank": ranks,
        "singular_values": spectra,
        "rtol": rtol,
    }


def plot_rank_study(
    study: dict[str, object], path: str | os.PathLike, note: str = "", dpi: int = 110, force: bool = False
) -> Path:
    """Two panels: rank versus N (with the N and d bounds), and normalised singular values at the largest N (written
    as :func:`plot_attention_comparison` writes)."""
    plt = _pyplot()
    n_values = study["N"]
    head_dim = study["head_dim"]
    styles = {
        "softmax": {"color": "black", "marker": "o"},
        "focused": {"color": "tab:blue", "marker": "s"},
        "focused + DWC": {"color": "tab:blue", "marker": "s", "linestyle": "--", "markerfacecolor": "none"},
        "relu": {"color": "tab:orange", "marker": "^"},
        "relu + DWC": {"color": "tab:orange", "marker": "^", "linestyle": "--", "markerfacecolor": "none"},
    }
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    left.plot(n_values, n_values, color="grey", linewidth=0.8, label="full rank (N)")
    left.axhline(head_dim, color="grey", linestyle=":", linewidth=0.8, label=f"head dim d = {head_dim}")
    for name, ranks in study["rank"].items():
        left.plot(n_values, ranks, label=name, **styles.get(name, {}))
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xticks(n_values, [str(n) for n in n_values])
    left.minorticks_off()
    left.set_xlabel("tokens N")
    left.set_ylabel(f"numerical rank (σ > {study['rtol']:g}·σ_max)")
    left.set_title("rank of the N×N attention matrix")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, which="both")
    for name, values in study["singular_values"].items():
        right.semilogy(
            np.arange(1, len(values) + 1),
            np.clip(values, 1e-18, None),
            label=name,
            **{k: v for k, v in styles.get(name, {}).items() if k != "marker"},
        )
    right.set_xlabel("index i")
    right.set_ylabel("σ_i / σ_1")
    right.set_title(f"singular values at N = {n_values[-1]}")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, which="both")
    if note:
        figure.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=7.5)
    figure.tight_layout(rect=(0, 0.05 if note else 0, 1, 1))
    try:
        path = save_figure(figure, path, dpi=dpi, force=force)  # a file linvit did not write: refused unless force
    finally:
        plt.close(figure)
    return path
