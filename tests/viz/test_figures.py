"""Figures from real photos: PCA colours, attention comparison and rank study write PNGs with the right content."""

import numpy as np
import pytest
import torch

from linvit.viz.pca import pca_components, pca_rgb, plot_feature_pca
from linvit.viz.plots import plot_attention_comparison, plot_rank_study, query_token, rank_study


def test_pca_components_reference():
    torch.manual_seed(0)
    # a map whose channels vary along one dominant direction: the first component recovers it (up to sign)
    direction = torch.randn(12)
    strength = torch.linspace(-3, 3, 8 * 10).reshape(8, 10)
    feature = direction[:, None, None] * strength + 0.01 * torch.randn(12, 8, 10)
    first = pca_components(feature, 3)[0]
    correlation = np.corrcoef(first.flatten().numpy(), strength.flatten().numpy())[0, 1]
    assert abs(correlation) > 0.999
    rgb = pca_rgb(feature)
    assert rgb.shape == (8, 10, 3) and rgb.min() >= 0 and rgb.max() <= 1
    assert pca_components(torch.randn(2, 4, 4), 3)[2].abs().max() == 0  # fewer channels than components


def test_query_token():
    assert query_token((0.5, 0.25), (100, 200), (25, 50)) == (12, 12, 12 * 50 + 12)
    assert query_token((99, 199), (100, 200), (25, 50)) == (24, 49, 24 * 50 + 49)
    with pytest.raises(ValueError, match="outside"):
        query_token((150, 10), (100, 200), (25, 50))


@pytest.fixture(scope="module")
def photo():
    data = pytest.importorskip("skimage.data", reason="real photos need scikit-image: pip install 'linvit[photos]'")
    return data.chelsea()[::4, ::4].copy()  # 75×113 real photo, small for speed


def test_figures_from_real_photo(tmp_path, photo):
    from linvit.viz.plots import backbone_features

    features, stride = backbone_features(photo, "test_convnext", level=0)
    assert stride == 4 and features.shape[-2:] == (photo.shape[0] // 4, photo.shape[1] // 4)
    spread = plot_attention_comparison(photo, features, (0.4, 0.4), tmp_path / "attention.png", note="test")
    assert set(spread) == {"focused", "relu", "elu", "softmax"}
    assert all(1 <= v <= features.shape[-1] * features.shape[-2] for v in spread.values())
    plot_feature_pca(photo, [features], [stride], tmp_path / "pca.png")
    study = rank_study(features, grid_sizes=(3, 5, 7), head_dim=4)
    assert study["N"] == [9, 25, 49]
    assert all(r <= 4 for r in study["rank"]["focused"])
    assert study["rank"]["focused + DWC"] == [9, 25, 49]
    plot_rank_study(study, tmp_path / "rank.png")
    for name in ("attention.png", "pca.png", "rank.png"):
        with open(tmp_path / name, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
