"""nystrom_attention_qkv: the landmark cells, the iterative pseudo-inverse, the torch backend against the naive
reference in value and every gradient, and the anchor of the method: with m = N it is softmax attention."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from _op_testing import assert_torch_backend_equals_naive, random_qkv, softmax_attention

from linvit.ops import nystrom_attention_qkv
from linvit.ops._cells import cell_bounds, cell_means, cell_means_reference
from linvit.ops.nystrom import naive
from linvit.ops.nystrom import torch as eager


@pytest.mark.parametrize(
    "hw,cells", [((6, 8), (2, 4)), ((5, 7), (2, 3)), ((7, 5), (7, 5)), ((9, 4), (4, 3)), ((1, 12), (1, 5))]
)
def test_cell_means_are_the_means_over_adaptive_cells(hw, cells):
    x = torch.randn(2, hw[0] * hw[1], 6, dtype=torch.float64)
    torch.testing.assert_close(cell_means(x, hw, cells), cell_means_reference(x, hw, cells))
    rows = cell_bounds(hw[0], cells[0])
    assert rows[0][0] == 0 and rows[-1][1] == hw[0]  # every token is in a cell
    assert all(start < end for start, end in rows)


def test_cells_that_divide_the_sequence_are_the_papers_segments():
    x = torch.randn(2, 12, 6, dtype=torch.float64)
    segments = x.reshape(2, 4, 3, 6).mean(dim=2)  # 4 segments of 3 consecutive tokens
    torch.testing.assert_close(cell_means(x, (1, 12), (1, 4)), segments)


def _softmax_matrices(count: int, spread: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, count, count, generator=generator, dtype=torch.float64) * spread
    return torch.softmax(logits, dim=-1)


def test_iterative_pseudo_inverse_converges_to_the_moore_penrose_inverse():
    a = _softmax_matrices(10, 2.0)
    exact = torch.linalg.pinv(a)
    for module in (naive, eager):
        torch.testing.assert_close(module.iterative_pseudo_inverse(a, 30), exact, rtol=1e-8, atol=1e-8)
    errors = [(naive.iterative_pseudo_inverse(a, n) - exact).norm() for n in (2, 6, 10)]
    assert errors[0] > errors[1] > errors[2]
    torch.testing.assert_close(eager.iterative_pseudo_inverse(a, 6), naive.iterative_pseudo_inverse(a, 6))


def test_iterative_pseudo_inverse_of_a_singular_matrix_satisfies_the_penrose_identities():
    """Coinciding landmarks make A singular: the iteration still converges to A⁺ on A's range (measured 1e-12 at 10
    steps); run far past convergence it starts inverting the rounding noise (40 steps: off by 2e3)."""
    a = _softmax_matrices(8, 1.0)
    a = torch.cat([a[:, :4], a[:, :4]], dim=1)  # repeated rows: rank 4
    z = eager.iterative_pseudo_inverse(a, 10)
    torch.testing.assert_close(a @ z @ a, a, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(z @ a @ z, z, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(z, torch.linalg.pinv(a), rtol=1e-9, atol=1e-9)


CASES = {
    "square": {"hw": (6, 6), "heads": 2, "head_dim": 8, "landmark_grid": (3, 3), "conv": 3},
    "cells_that_do_not_divide": {"hw": (5, 7), "heads": 2, "head_dim": 8, "landmark_grid": (2, 3), "conv": 5},
    "grid_larger_than_the_map": {"hw": (3, 9), "heads": 1, "head_dim": 16, "landmark_grid": (8, 4), "conv": 0},
    "sequence": {"hw": (1, 15), "heads": 3, "head_dim": 4, "landmark_grid": (1, 5), "conv": 3, "scale": 0.2},
}


def _case_arguments(case: dict, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    arguments = {key: case[key] for key in ("hw", "landmark_grid")}
    arguments["num_heads"] = case["heads"]
    arguments["scale"] = case.get("scale")
    if case["conv"]:
        size = case["conv"]
        weight = torch.randn(case["heads"], 1, size, size, generator=generator, dtype=torch.float64) * 0.3
        arguments["conv_weight"] = weight.requires_grad_(True)
    return arguments


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_backend_equals_naive_in_value_and_gradients(name):
    case = CASES[name]
    qkv = random_qkv(2, case["hw"], case["heads"] * case["head_dim"])
    arguments = _case_arguments(case)
    assert_torch_backend_equals_naive(nystrom_attention_qkv, qkv, arguments)


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("hw", [(3, 4), (2, 5)])
def test_with_as_many_landmarks_as_tokens_it_is_softmax_attention(backend, hw):
    """m = N: every token its own cell, F = A = B, and F A⁺ B v = A v once the pseudo-inverse has converged."""
    qkv = random_qkv(2, hw, 32, scale=1.5)
    out = nystrom_attention_qkv(qkv, hw=hw, num_heads=2, landmark_grid=hw, pinv_iterations=30, backend=backend)
    torch.testing.assert_close(out, softmax_attention(qkv, 2), rtol=1e-8, atol=1e-8)
    # a grid larger than the map is clamped to it: the same
    larger = nystrom_attention_qkv(qkv, hw=hw, num_heads=2, landmark_grid=16, pinv_iterations=30, backend=backend)
    torch.testing.assert_close(larger, out)


def test_fewer_landmarks_approximate_softmax_on_maps_smooth_at_the_cell_scale():
    """The method's premise: where q and k vary slowly over the cells, 8×8 landmarks of a 16×16 map (m = N/4)
    reproduce softmax attention closely (measured 2.3%), unlike random maps (measured 56%)."""
    generator = torch.Generator().manual_seed(0)
    coarse = torch.randn(2, 3 * 64, 4, 4, generator=generator, dtype=torch.float64)
    smooth = F.interpolate(coarse, size=(16, 16), mode="bicubic", align_corners=False).flatten(2).transpose(1, 2)
    rough = torch.randn(2, 256, 3 * 64, generator=generator, dtype=torch.float64)
    errors = []
    for qkv in (smooth, rough):
        reference = softmax_attention(qkv, 2)
        out = nystrom_attention_qkv(qkv, hw=(16, 16), num_heads=2, landmark_grid=8)
        errors.append(((out - reference).norm() / reference.norm()).item())
    assert errors[0] < 0.05 < 0.3 < errors[1], errors


def test_the_skip_is_each_heads_conv_of_its_values():
    """The skip alone (no landmark mixing to compare against): the output minus the output without the conv is a
    depthwise conv of each head's channels with that head's kernel, computed here with nn.Conv2d per head."""
    hw, heads, head_dim = (4, 5), 2, 3
    qkv = random_qkv(1, hw, heads * head_dim).detach()
    weight = torch.randn(heads, 1, 3, 3, dtype=torch.float64)
    with_skip = nystrom_attention_qkv(qkv, hw=hw, num_heads=heads, landmark_grid=2, conv_weight=weight)
    without = nystrom_attention_qkv(qkv, hw=hw, num_heads=heads, landmark_grid=2)
    v = qkv[0, :, 2 * heads * head_dim :].reshape(hw[0], hw[1], heads, head_dim)
    for head in range(heads):
        conv = torch.nn.Conv2d(1, 1, 3, padding=1, bias=False, dtype=torch.float64)
        conv.weight.data.copy_(weight[head : head + 1])
        images = v[:, :, head].permute(2, 0, 1).unsqueeze(1)  # (d, 1, H, W)
        expected = conv(images).squeeze(1).permute(1, 2, 0).reshape(-1, head_dim)
        channels = slice(head * head_dim, (head + 1) * head_dim)
        torch.testing.assert_close((with_skip - without)[0, :, channels], expected.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_autocast_stay_finite_through_float32_math(dtype):
    qkv = random_qkv(2, (6, 7), 32, scale=30.0).detach()
    reference = nystrom_attention_qkv(qkv.float(), hw=(6, 7), num_heads=2, landmark_grid=(3, 3))
    out = nystrom_attention_qkv(qkv.to(dtype), hw=(6, 7), num_heads=2, landmark_grid=(3, 3))
    assert out.dtype == dtype and torch.isfinite(out).all()
    with torch.autocast("cpu", dtype=dtype):
        inside = nystrom_attention_qkv(qkv.float(), hw=(6, 7), num_heads=2, landmark_grid=(3, 3))
    torch.testing.assert_close(inside, reference)  # autocast is off inside the op
    assert ((out.float() - reference).norm() / reference.norm()) < 0.05


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_gradcheck_float64(backend):
    qkv = random_qkv(1, (2, 3), 8)
    weight = torch.randn(2, 1, 3, 3, dtype=torch.float64, requires_grad=True)

    def function(qkv, weight):
        return nystrom_attention_qkv(
            qkv, hw=(2, 3), num_heads=2, landmark_grid=(1, 2), conv_weight=weight, backend=backend
        )

    assert torch.autograd.gradcheck(function, (qkv, weight), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_backend_runs_the_eager_path():
    qkv = random_qkv(1, (3, 4), 16).detach().float()
    expected = nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, backend="torch")
    torch.testing.assert_close(nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, backend="triton"), expected)


def test_an_empty_batch_returns_an_empty_output():
    qkv = random_qkv(1, (3, 4), 16).detach()[:0]
    assert nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, landmark_grid=2).shape == (0, 12, 16)


def test_bad_arguments_say_what_is_expected():
    qkv = random_qkv(1, (3, 4), 16).detach()
    with pytest.raises(ValueError, match=r"hw=\(3, 5\) gives 15 tokens but qkv has 12"):
        nystrom_attention_qkv(qkv, hw=(3, 5), num_heads=2)
    with pytest.raises(ValueError, match="C divisible by num_heads=3"):
        nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=3)
    with pytest.raises(ValueError, match="landmark_grid must be a positive int"):
        nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, landmark_grid=(0, 2))
    with pytest.raises(ValueError, match="pinv_iterations must be >= 0"):
        nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, pinv_iterations=-1)
    with pytest.raises(ValueError, match=r"conv_weight must be \(num_heads, 1, k, k\) = \(2, 1, k, k\)"):
        nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, conv_weight=torch.randn(8, 1, 3, 3))
    with pytest.raises(ValueError, match="Unknown backend"):
        nystrom_attention_qkv(qkv, hw=(3, 4), num_heads=2, backend="cuda")
