"""FocusedLinearAttention against a line-by-line re-statement of the published steps (reference document, §1)."""

import pytest
import torch
import torch.nn.functional as F

from linvit.attention import FocusedLinearAttention, create_attention, linear_attention
from linvit.attention.feature_maps import elu_feature_map, relu_feature_map, taylor_feature_map
from linvit.ops import linear_attention_qkv


def reference_focused(module, x, hw, table=None, p=3.0):
    """The module's math by the package's reference (the published steps, the N×N attention written out)."""
    out = linear_attention_qkv(
        module.qkv(x),
        backend="naive",
        hw=hw,
        num_heads=module.num_heads,
        inverse_temperature=1.0 / F.softplus(module.scale.view(-1)),
        focusing_factor=p,
        key_position=table,
        dwc_weight=None if module.dwc is None else module.dwc.weight,
        dwc_bias=None if module.dwc is None else module.dwc.bias,
    )
    return module.proj(out)


def _randomise(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)
    return module


def _tokens(batch, hw, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, hw[0] * hw[1], channels, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("heads", [1, 2, 8])
@pytest.mark.parametrize("hw", [(6, 6), (5, 9), (7, 3)])
def test_global_focused_equals_reference(heads, hw):
    module = _randomise(FocusedLinearAttention(32, heads, pos_size=hw, dtype=torch.float64))
    x = _tokens(2, hw, 32)
    expected = reference_focused(module, x, hw, table=module.positional_encoding)
    torch.testing.assert_close(module(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_focused_float32_equals_reference():
    module = _randomise(FocusedLinearAttention(32, 2, pos_size=(5, 7)))
    x = _tokens(2, (5, 7), 32).float()
    expected = reference_focused(module, x, (5, 7), table=module.positional_encoding)
    torch.testing.assert_close(module(x, (5, 7)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [2.0, 2.5, 4.0])
def test_focusing_factor(p):
    module = _randomise(FocusedLinearAttention(16, 2, focusing_factor=p, pos_size=(4, 5), dtype=torch.float64))
    x = _tokens(1, (4, 5), 16)
    expected = reference_focused(module, x, (4, 5), table=module.positional_encoding, p=p)
    torch.testing.assert_close(module(x, (4, 5)), expected, rtol=1e-10, atol=1e-10)


def test_learnable_table_is_resized_bicubically_to_the_map():
    module = _randomise(FocusedLinearAttention(16, 2, pos_size=(4, 4), dtype=torch.float64))
    hw = (6, 9)
    image = module.positional_encoding.reshape(1, 4, 4, 16).permute(0, 3, 1, 2)
    resized = F.interpolate(image, size=hw, mode="bicubic", align_corners=False)
    table = resized.permute(0, 2, 3, 1).reshape(1, 54, 16)
    x = _tokens(2, hw, 16)
    torch.testing.assert_close(module(x, hw), reference_focused(module, x, hw, table=table), rtol=1e-10, atol=1e-10)


def test_conv_positional_encoding_and_no_dwc():
    module = _randomise(FocusedLinearAttention(16, 2, pos_encoding="conv", dwc_kernel_size=0, dtype=torch.float64))
    hw = (5, 6)
    x = _tokens(2, hw, 16)
    k = module.qkv(x)[..., 16:32]
    k_image = k.transpose(1, 2).reshape(2, 16, *hw)
    table = module.positional_conv(k_image).flatten(2).transpose(1, 2)  # k + conv(k): the table is per sample
    assert module.dwc is None
    torch.testing.assert_close(module(x, hw), reference_focused(module, x, hw, table=table), rtol=1e-10, atol=1e-10)


def test_no_positional_encoding():
    module = _randomise(FocusedLinearAttention(16, 2, pos_encoding="none", dtype=torch.float64))
    x = _tokens(2, (3, 8), 16)
    torch.testing.assert_close(module(x, (3, 8)), reference_focused(module, x, (3, 8)), rtol=1e-10, atol=1e-10)
    assert "positional_encoding" not in module.state_dict()


def reference_windowed(module, x, hw, window):
    """Each window on its own: only the real tokens of the window (edge windows are smaller), the table entries
    of their positions, DWC over the real sub-window with zero padding. Padding cannot take part."""
    height, width = hw
    batch, _, channels = x.shape
    grid = x.reshape(batch, height, width, channels)
    out = torch.zeros_like(grid)
    wh, ww = min(window[0], height), min(window[1], width)
    table = module.positional_encoding.reshape(1, wh, ww, channels) if module.positional_encoding is not None else None
    for top in range(0, height, wh):
        for left in range(0, width, ww):
            patch = grid[:, top : top + wh, left : left + ww]
            ph, pw = patch.shape[1:3]
            patch_table = None if table is None else table[:, :ph, :pw].reshape(1, ph * pw, channels)
            result = reference_focused(module, patch.reshape(batch, ph * pw, channels), (ph, pw), patch_table)
            out[:, top : top + wh, left : left + ww] = result.reshape(batch, ph, pw, channels)
    return out.reshape(batch, height * width, channels)


@pytest.mark.parametrize("hw", [(8, 8), (9, 7), (5, 11)])
def test_windowed_focused_equals_per_window_reference(hw):
    module = _randomise(FocusedLinearAttention(16, 2, window_size=4, dtype=torch.float64))
    assert module.positional_encoding.shape == (1, 16, 16)
    x = _tokens(2, hw, 16)
    expected = reference_windowed(module, x, hw, (4, 4))
    torch.testing.assert_close(module(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_window_larger_than_map_is_global():
    """FLatten-Swin at 224: window 56 on a 28×28 map is one 28×28 window with a (1, 784, C) table."""
    module = _randomise(FocusedLinearAttention(16, 2, window_size=56, pos_size=(6, 6), dtype=torch.float64))
    x = _tokens(1, (6, 6), 16)
    expected = reference_focused(module, x, (6, 6), table=module.positional_encoding)
    torch.testing.assert_close(module(x, (6, 6)), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kernel,phi", [("linear", relu_feature_map), ("elu", elu_feature_map), ("taylor", None)])
def test_other_kernels_equal_materialised_attention(kernel, phi):
    module = _randomise(create_attention(kernel, 16, 2, dtype=torch.float64))
    assert module.scale is None and "scale" not in module.state_dict()
    hw = (4, 5)
    x = _tokens(2, hw, 16)
    q, k, v = module.qkv(x).reshape(2, 20, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
    if phi is None:
        phi = lambda t: taylor_feature_map(t * 8**-0.25)  # noqa: E731
    scores = phi(q) @ phi(k).transpose(-2, -1) / 20
    out = (scores @ v) / (scores.sum(-1, keepdim=True) + 1e-6)
    expected = module.proj(out.transpose(1, 2).reshape(2, 20, 16))
    torch.testing.assert_close(module(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_favor_kernel_module_uses_the_functional_core():
    module = _randomise(create_attention("favor", 16, 2, dtype=torch.float64))
    module.feature_map.redraw_features(torch.Generator().manual_seed(0))
    hw = (3, 4)
    x = _tokens(2, hw, 16)
    q, k, v = module.qkv(x).reshape(2, 12, 3, 2, 8).unbind(2)  # (B, N, h, d)
    phi_q = module.feature_map(q, True).transpose(1, 2)
    phi_k = module.feature_map(k, False).transpose(1, 2)
    out = linear_attention(phi_q, phi_k, v.transpose(1, 2))
    expected = module.proj(out.transpose(1, 2).reshape(2, 12, 16))
    torch.testing.assert_close(module(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_state_dict_matches_authors_checkpoints():
    module = FocusedLinearAttention(96, 3, pos_size=(56, 56))
    shapes = {key: tuple(value.shape) for key, value in module.state_dict().items()}
    assert shapes == {
        "qkv.weight": (288, 96),
        "qkv.bias": (288,),
        "proj.weight": (96, 96),
        "proj.bias": (96,),
        "scale": (1, 1, 96),
        "positional_encoding": (1, 3136, 96),
        "dwc.weight": (32, 1, 5, 5),
        "dwc.bias": (32,),
    }
    assert torch.count_nonzero(module.scale) == 0 and torch.count_nonzero(module.positional_encoding) == 0


def test_device_and_dtype_are_threaded_through():
    module = FocusedLinearAttention(16, 2, pos_size=(4, 4), device="meta", dtype=torch.float64)
    assert all(t.device.type == "meta" and t.dtype == torch.float64 for t in module.state_dict().values())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dim": 30, "num_heads": 4}, "divisible"),
        ({"kernel": "cosine"}, "valid kernels"),
        ({"pos_encoding": "sine"}, "valid values"),
        ({"dwc_kernel_size": 4}, "odd"),
        ({"pos_size": None}, "pos_size"),
    ],
)
def test_constructor_errors(kwargs, match):
    arguments = {"dim": 16, "num_heads": 2, "pos_size": (4, 4), **kwargs}
    with pytest.raises(ValueError, match=match):
        FocusedLinearAttention(**arguments)


def test_hw_that_disagrees_with_tokens_is_an_error():
    module = FocusedLinearAttention(16, 2, pos_size=(4, 4))
    with pytest.raises(ValueError, match="N must equal H \\* W"):
        module(torch.randn(1, 17, 16), (4, 4))


@pytest.mark.parametrize("kwargs", [{"pos_size": (5, 6)}, {"window_size": 4}, {"pos_encoding": "conv"}])
def test_inference_path_equals_autograd_path(kwargs):
    """Without autograd the module overwrites its own qkv buffer in place; results must not change."""
    module = _randomise(FocusedLinearAttention(16, 2, dtype=torch.float64, **kwargs))
    x = _tokens(2, (5, 6), 16)
    with torch.no_grad():
        inference = module(x, (5, 6))
    torch.testing.assert_close(inference, module(x, (5, 6)), rtol=1e-12, atol=1e-12)
    x_copy = x.clone()
    with torch.inference_mode():
        module(x, (5, 6))
    assert torch.equal(x, x_copy)  # the input is never written


def test_temperature_is_folded_into_the_projection_only_in_full_precision():
    from linvit.ops.linear_attention.attend import _folds_temperature

    weight, inverse, x = torch.randn(48, 16), torch.rand(16) + 0.5, torch.randn(2, 16)
    assert not _folds_temperature(x, weight, inverse, None, "torch")  # autograd on: the map runs out of place
    with torch.no_grad():
        assert _folds_temperature(x, weight, inverse, None, "torch")
        assert not _folds_temperature(x.double(), weight, inverse, None, "torch")  # mixed dtypes: no
        assert not _folds_temperature(x, weight, None, None, "torch")  # no temperature (not the focused map)
        assert not _folds_temperature(x, weight, inverse, torch.randn(16, 1, 3, 3), "torch")  # conv reads raw keys
        assert not _folds_temperature(x, weight, inverse, None, "naive")  # only the eager backend maps in place
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not _folds_temperature(x, weight, inverse, None, "torch")  # the GEMM would run in bf16


def test_focused_without_projections_equals_the_module_with_them():
    """with_projections=False (shared q|k|v from the caller, as in HybridAttention) takes the unfolded path."""
    full = _randomise(FocusedLinearAttention(16, 2, pos_size=(5, 6), dtype=torch.float64))
    bare = FocusedLinearAttention(16, 2, pos_size=(5, 6), with_projections=False, dtype=torch.float64)
    bare.load_state_dict({k: v for k, v in full.state_dict().items() if not k.startswith(("qkv.", "proj."))})
    x = _tokens(2, (5, 6), 16)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            qkv = full.qkv(x)
            qkv_copy = qkv.clone()
            torch.testing.assert_close(full.proj(bare(qkv, (5, 6))), full(x, (5, 6)), rtol=1e-10, atol=1e-12)
            assert torch.equal(qkv, qkv_copy)  # the caller's q|k|v is never written
