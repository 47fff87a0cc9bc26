"""Materialised attention rows/matrices against the factorised linear attention, DWC as a matrix, rank, figures."""

import math

import pytest
import torch
import torch.nn.functional as F

from linvit.attention import elu_feature_map, focused_feature_map, linear_attention, relu_feature_map
from linvit.viz.attention import (
    attention_matrix,
    attention_row,
    depthwise_conv_matrix,
    numerical_rank,
    perplexity,
)


@pytest.mark.parametrize("kernel, feature_map", [("relu", relu_feature_map), ("elu", elu_feature_map)])
def test_matrix_times_v_equals_factorised_linear_attention(kernel, feature_map):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 50, 8, dtype=torch.float64).unbind(0)
    matrix = attention_matrix(q, k, kernel, eps=0.0)
    # linvit.attention's factorised O(N) form (mean form, its own eps): same outputs up to that eps
    expected = linear_attention(feature_map(q)[None, None], feature_map(k)[None, None], v[None, None], eps=1e-12)[0, 0]
    torch.testing.assert_close(matrix @ v, expected.double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(matrix.sum(-1), torch.ones(50, dtype=torch.float64))


def test_focused_row_matches_definition_and_softmax_row():
    torch.manual_seed(1)
    q, k = torch.randn(2, 30, 6, dtype=torch.float64).unbind(0)
    phi_q, phi_k = focused_feature_map(q, None, 3.0), focused_feature_map(k, None, 3.0)
    scores = phi_k @ phi_q[7]
    torch.testing.assert_close(attention_row(q, k, 7, "focused", eps=0.0), scores / scores.sum())
    torch.testing.assert_close(attention_row(q, k, 7, "softmax"), torch.softmax(k @ q[7] / math.sqrt(6), 0))
    torch.testing.assert_close(attention_matrix(q, k, "focused")[7], attention_row(q, k, 7, "focused"))
    with pytest.raises(ValueError, match="query_index"):
        attention_row(q, k, 30, "relu")


def test_focusing_sharpens_relative_to_relu():
    # higher focusing power concentrates the distribution: perplexity falls as p grows
    torch.manual_seed(2)
    x = torch.randn(400, 16, dtype=torch.float64)
    spreads = [perplexity(attention_row(x, x, 5, "focused", focusing_factor=p)) for p in (1.0, 3.0, 8.0)]
    assert spreads[0] > spreads[1] > spreads[2]
    assert perplexity(torch.full((10,), 0.1)) == pytest.approx(10.0)


def test_depthwise_conv_matrix_equals_conv2d():
    torch.manual_seed(3)
    weight = torch.randn(5, 5, dtype=torch.float64)
    image = torch.randn(7, 9, dtype=torch.float64)
    expected = F.conv2d(image[None, None], weight[None, None], padding=2)[0, 0]
    torch.testing.assert_close(depthwise_conv_matrix(weight, (7, 9)) @ image.flatten(), expected.flatten())


def test_linear_attention_rank_bounded_by_d_and_dwc_restores_full_rank():
    torch.manual_seed(4)
    d, side = 6, 10
    x = torch.randn(side * side, d, dtype=torch.float64)
    linear = attention_matrix(x, x, "focused")
    assert numerical_rank(linear) <= d
    conv = depthwise_conv_matrix(torch.randn(5, 5, dtype=torch.float64), (side, side))
    assert numerical_rank(linear + conv) == side * side
    assert numerical_rank(attention_matrix(x, x, "softmax"), rtol=1e-12) > d
