"""TorchScript and FX for every attention module, and the factory."""

import pytest
import torch
import torch.fx
from torch import nn

from linvit.attention import ATTENTION_NAMES, HybridAttention, WindowAttention, create_attention

CONFIGS = [
    ("focused", {"pos_size": (4, 4)}),
    ("focused", {"window_size": 4}),  # windowed, padded at (5, 7)
    ("focused", {"pos_encoding": "conv", "dwc_kernel_size": 3}),
    ("linear", {}),
    ("elu", {}),
    ("favor", {}),
    ("taylor", {}),
    ("window", {"window_size": 4, "shift_size": 2}),
    ("softmax", {}),
    ("hybrid", {"window_size": 4, "shift_size": 2}),
    ("stripe", {"split_size": 3}),  # vertical and horizontal stripes, padded at (5, 7)
    ("nystrom", {"landmark_grid": (2, 3)}),  # cells that do not divide (5, 7)
    ("linformer", {"projected_size": 3}),  # pooled
    ("linformer", {"projection": "learned", "pos_size": (4, 4), "projected_size": (2, 3)}),  # resized to (5, 7)
    ("hybrid", {"window_size": 4, "shift_size": 2, "global_branch": "nystrom", "global_options": {"landmark_grid": 2}}),
    ("hybrid", {"window_size": 4, "global_branch": "linformer", "global_options": {"projected_size": 2}}),
]
# Compiled with torch.compile (aot_eager) in the default tier; the other modules' own files test theirs.
COMPILED = [config for config in CONFIGS if config[0] in ("nystrom", "linformer") or "global_branch" in config[1]]
HW = (5, 7)


def _build(name, kwargs):
    torch.manual_seed(0)
    return create_attention(name, 16, 2, **kwargs).eval()


class FixedGrid(nn.Module):
    """Wrapper with a concrete (H, W), as a traced block with a known resolution sees it."""

    def __init__(self, attention, hw):
        super().__init__()
        self.attention = attention
        self.hw = hw

    def forward(self, x):
        return self.attention(x, self.hw)


class ImageWrapper(nn.Module):
    """(B, C, H, W) in and out, with (H, W) read from the input, as a backbone does."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x):
        height, width = x.shape[-2:]
        tokens = x.flatten(2).transpose(1, 2)
        out = self.attention(tokens, (height, width))
        return out.transpose(1, 2).reshape(x.shape)


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_torchscript_matches_eager(name, kwargs):
    module = _build(name, kwargs)
    scripted = torch.jit.script(module)
    x = torch.randn(2, HW[0] * HW[1], 16)
    torch.testing.assert_close(scripted(x, HW), module(x, HW))


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_fx_symbolic_trace_with_concrete_grid(name, kwargs):
    """Traced through (not a leaf): the graph holds the attention's own operations."""
    module = FixedGrid(_build(name, kwargs), HW)
    graph_module = torch.fx.symbolic_trace(module)
    assert len(graph_module.graph.nodes) > 5
    x = torch.randn(2, HW[0] * HW[1], 16)
    torch.testing.assert_close(graph_module(x), module(x))


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_timm_feature_extractor_with_traced_sizes(name, kwargs):
    """timm's FX feature extraction keeps the attentions as leaves when (H, W) come from traced shapes."""
    from timm.layers import create_feature_extractor

    module = ImageWrapper(_build(name, kwargs))
    extractor = create_feature_extractor(module, return_nodes=["attention"])
    for hw in (HW, (6, 3)):
        x = torch.randn(2, 16, *hw)
        torch.testing.assert_close(extractor(x)["attention"], module.attention(x.flatten(2).transpose(1, 2), hw))


@pytest.mark.parametrize("name,kwargs", COMPILED)
def test_torch_compile_without_graph_breaks_matches_eager_with_gradients(name, kwargs):
    import torch._dynamo

    module = _build(name, kwargs).train()
    x = torch.randn(2, HW[0] * HW[1], 16, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break raises
    results = []
    for forward in (compiled, module):
        x.grad = None
        module.zero_grad()
        out = forward(x, HW)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in module.parameters()]
        results.append((out.detach(), x.grad.clone(), *grads))
    for fast, slow in zip(*results):
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


def test_factory_names_and_errors():
    assert set(ATTENTION_NAMES) == {
        "focused", "linear", "elu", "favor", "taylor", "window", "softmax", "hybrid", "stripe", "nystrom", "linformer"
    }  # fmt: skip
    assert isinstance(create_attention("window", 16, 2), WindowAttention)
    assert isinstance(create_attention("hybrid", 16, 2), HybridAttention)
    baseline = create_attention("linear", 16, 2)
    assert baseline.dwc is None and baseline.positional_encoding is None and baseline.kernel == "relu"
    assert create_attention("elu", 16, 2, dwc_kernel_size=5).dwc is not None
    with pytest.raises(ValueError, match="valid names are focused, linear"):
        create_attention("performer", 16, 2)
    with pytest.raises(ValueError, match="kernel"):
        create_attention("linear", 16, 2, kernel="elu")
    focused = create_attention("focused", 16, 2, kernel="taylor", pos_encoding="none")
    assert focused.kernel == "taylor"


def test_functional_cores_compile_under_torchscript():
    from linvit.attention import (
        elu_feature_map,
        favor_feature_map,
        focused_feature_map,
        linear_attention,
        linear_attention_tokens,
        relu_feature_map,
        resize_positional_table,
        taylor_feature_map,
    )

    q, k, v = (torch.rand(1, 2, 6, 4) for _ in range(3))
    scripted = torch.jit.script(linear_attention)
    torch.testing.assert_close(scripted(q, k, v), linear_attention(q, k, v))
    tokens = [t.transpose(1, 2) for t in (q, k, v)]
    torch.testing.assert_close(torch.jit.script(linear_attention_tokens)(*tokens), linear_attention_tokens(*tokens))
    for function in (elu_feature_map, focused_feature_map, relu_feature_map, taylor_feature_map):
        torch.testing.assert_close(torch.jit.script(function)(q), function(q))
    projection = torch.randn(8, 4)
    torch.testing.assert_close(
        torch.jit.script(favor_feature_map)(q, projection, True), favor_feature_map(q, projection, True)
    )
    table = torch.randn(1, 16, 3)
    torch.testing.assert_close(
        torch.jit.script(resize_positional_table)(table, (4, 4), (5, 3)), resize_positional_table(table, (4, 4), (5, 3))
    )


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_every_module_builds_on_meta_with_dtype(name, kwargs):
    module = create_attention(name, 16, 2, device="meta", dtype=torch.float64, **kwargs)
    tensors = list(module.parameters()) + list(module.buffers())
    assert all(t.device.type == "meta" for t in tensors)
    assert all(t.dtype == torch.float64 for t in tensors if t.is_floating_point())
