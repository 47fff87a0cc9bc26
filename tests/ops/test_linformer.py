"""linformer_attention_qkv: both projections, the torch backend against the naive reference in value and every
gradient, and the anchor of the method: with an identity projection it is softmax attention."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _op_testing import assert_torch_backend_equals_naive, random_qkv, softmax_attention

from linvit.ops import linformer_attention_qkv
from linvit.ops._cells import cell_bounds


def _projections(count: int, tokens: int, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(count, tokens, generator=generator, dtype=torch.float64) * tokens**-0.5).requires_grad_(True)
        for name in ("key_projection", "value_projection")
    }


def cell_average_matrix(hw: tuple[int, int], cells: tuple[int, int]) -> torch.Tensor:
    """(gh·gw, H·W): row c averages the tokens of cell c (the pooled form as a projection)."""
    matrix = torch.zeros(cells[0] * cells[1], hw[0] * hw[1], dtype=torch.float64)
    grid = matrix.view(-1, hw[0], hw[1])
    cell = 0
    for top, bottom in cell_bounds(hw[0], cells[0]):
        for left, right in cell_bounds(hw[1], cells[1]):
            grid[cell, top:bottom, left:right] = 1.0 / ((bottom - top) * (right - left))
            cell += 1
    return matrix


CASES = {
    "pooled": {"hw": (6, 8), "heads": 2, "pool_grid": (2, 4)},
    "pooled_cells_that_do_not_divide": {"hw": (5, 7), "heads": 2, "pool_grid": (2, 3)},
    "pooled_grid_larger_than_the_map": {"hw": (3, 9), "heads": 1, "pool_grid": (8, 4)},
    "learned": {"hw": (5, 7), "heads": 2, "projected": 6},
    "learned_more_rows_than_tokens": {"hw": (2, 3), "heads": 3, "projected": 9, "scale": 0.3},
}


def _arguments(case: dict) -> dict:
    arguments = {"hw": case["hw"], "num_heads": case["heads"], "scale": case.get("scale")}
    if "pool_grid" in case:
        arguments["pool_grid"] = case["pool_grid"]
    else:
        arguments.update(_projections(case["projected"], case["hw"][0] * case["hw"][1]))
    return arguments


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_backend_equals_naive_in_value_and_gradients(name):
    case = CASES[name]
    qkv = random_qkv(2, case["hw"], case["heads"] * 8)
    arguments = _arguments(case)
    assert_torch_backend_equals_naive(linformer_attention_qkv, qkv, arguments)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_with_an_identity_projection_it_is_softmax_attention(backend):
    hw = (3, 5)
    qkv = random_qkv(2, hw, 16, scale=1.5)
    expected = softmax_attention(qkv, 2)
    identity = torch.eye(15, dtype=torch.float64)
    learned = linformer_attention_qkv(
        qkv, hw=hw, num_heads=2, key_projection=identity, value_projection=identity, backend=backend
    )
    torch.testing.assert_close(learned, expected)
    pooled = linformer_attention_qkv(qkv, hw=hw, num_heads=2, pool_grid=hw, backend=backend)  # one token per cell
    torch.testing.assert_close(pooled, expected)
    permuted = identity[torch.randperm(15)]  # the order of the projected tokens does not matter
    out = linformer_attention_qkv(qkv, hw=hw, num_heads=2, key_projection=permuted, value_projection=permuted)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("hw,cells", [((6, 8), (2, 4)), ((5, 7), (2, 3))])
def test_pooling_is_the_learned_form_with_cell_averages_as_projection(hw, cells):
    qkv = random_qkv(2, hw, 16).detach()
    average = cell_average_matrix(hw, cells)
    learned = linformer_attention_qkv(qkv, hw=hw, num_heads=2, key_projection=average, value_projection=average)
    torch.testing.assert_close(linformer_attention_qkv(qkv, hw=hw, num_heads=2, pool_grid=cells), learned)


def test_dropout_acts_on_the_attention_probabilities():
    qkv = random_qkv(2, (4, 4), 16).detach()
    arguments = {"hw": (4, 4), "num_heads": 2, "pool_grid": 2}
    plain = linformer_attention_qkv(qkv, **arguments)
    torch.manual_seed(0)
    dropped = linformer_attention_qkv(qkv, dropout_p=0.5, **arguments)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_autocast_stay_finite_through_float32_math(dtype):
    qkv = random_qkv(2, (6, 7), 32, scale=30.0).detach()
    projections = {name: value.detach().float() for name, value in _projections(5, 42).items()}
    for form in ({"pool_grid": 3}, projections):
        reference = linformer_attention_qkv(qkv.float(), hw=(6, 7), num_heads=2, **form)
        half_form = {
            name: value.to(dtype) if isinstance(value, torch.Tensor) else value for name, value in form.items()
        }
        out = linformer_attention_qkv(qkv.to(dtype), hw=(6, 7), num_heads=2, **half_form)
        assert out.dtype == dtype and torch.isfinite(out).all()
        with torch.autocast("cpu", dtype=dtype):
            inside = linformer_attention_qkv(qkv.float(), hw=(6, 7), num_heads=2, **form)
        torch.testing.assert_close(inside, reference)  # autocast is off inside the op
        assert ((out.float() - reference).norm() / reference.norm()) < 0.05


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_gradcheck_float64(backend):
    qkv = random_qkv(1, (2, 3), 8)
    projections = _projections(4, 6)

    def function(qkv, key_projection, value_projection):
        return linformer_attention_qkv(
            qkv, hw=(2, 3), num_heads=2, key_projection=key_projection, value_projection=value_projection,
            backend=backend,
        )  # fmt: skip

    assert torch.autograd.gradcheck(function, (qkv, *projections.values()), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_backend_runs_the_eager_path():
    qkv = random_qkv(1, (3, 4), 16).detach().float()
    expected = linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2, pool_grid=2, backend="torch")
    torch.testing.assert_close(
        linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2, pool_grid=2, backend="triton"), expected
    )


def test_an_empty_batch_returns_an_empty_output():
    qkv = random_qkv(1, (3, 4), 16).detach()[:0]
    assert linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2, pool_grid=2).shape == (0, 12, 16)


def test_bad_arguments_say_what_is_expected():
    qkv = random_qkv(1, (3, 4), 16).detach()
    projection = torch.randn(5, 12, dtype=torch.float64)
    with pytest.raises(ValueError, match="not neither"):
        linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2)
    with pytest.raises(ValueError, match="not both"):
        linformer_attention_qkv(
            qkv, hw=(3, 4), num_heads=2, pool_grid=2, key_projection=projection, value_projection=projection
        )
    with pytest.raises(ValueError, match="needs both key_projection and value_projection"):
        linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2, key_projection=projection)
    with pytest.raises(ValueError, match=r"value_projection must be \(k, N\) = \(k, 12\) for hw=\(3, 4\).*Resize"):
        linformer_attention_qkv(
            qkv, hw=(3, 4), num_heads=2, key_projection=projection, value_projection=torch.randn(5, 16)
        )
    with pytest.raises(ValueError, match=r"hw=\(4, 4\) gives 16 tokens but qkv has 12"):
        linformer_attention_qkv(qkv, hw=(4, 4), num_heads=2, pool_grid=2)
    with pytest.raises(ValueError, match="pool_grid must be a positive int"):
        linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2, pool_grid=(2, 0))
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        linformer_attention_qkv(qkv, hw=(3, 4), num_heads=2, pool_grid=2, dropout_p=1.0)
