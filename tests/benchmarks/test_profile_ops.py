"""Where the time goes (`python -m benchmarks.profile_ops`): kinds of work from aten ops and ONNX Runtime nodes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from linvit.bench.profile_ops import kind_of, profile, profile_onnxruntime


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("aten::bmm", "matmul"),
        ("MatMul", "matmul"),
        ("FusedMatMul", "matmul"),
        ("QGemm", "matmul"),
        ("DequantizeLinear", "quantize"),  # not "linear": a matmul
        ("QuantizeLinear", "quantize"),
        ("Conv", "convolution"),
        ("FusedConv", "convolution"),
        ("QLinearConv", "convolution"),
        ("Transpose", "copy/layout"),
        ("Reshape", "copy/layout"),
        ("LayerNormalization", "norm/reduction"),
        ("SkipLayerNormalization", "norm/reduction"),
        ("ReduceSum", "norm/reduction"),
        ("Softmax", "sdpa/softmax"),
        ("Relu", "elementwise"),
        ("aten::native_layer_norm", "norm/reduction"),
        ("mkldnn::_linear_pointwise", "matmul"),  # linvit.ops.onednn's fused linear layers
        ("mkldnn::_convolution_pointwise", "convolution"),
    ],
)
def test_kind_of_names_aten_ops_and_onnxruntime_op_types(op, kind):
    assert kind_of(op) == kind


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter: fast for a small module
def test_onnxruntime_profile_counts_each_node_type_of_a_run(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 10)).eval()
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / "small.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["image"], dynamo=False)
    total, by_kind, rows = profile_onnxruntime(str(path), {"image": x.numpy()}, steps=2, threads=1)
    ops = {name: nodes for name, _, nodes in rows}
    assert total > 0 and abs(sum(by_kind.values()) - total) < 1e-6 * max(total, 1)
    assert ops.get("Conv", ops.get("FusedConv")) == 1  # one node of each, whatever ONNX Runtime fused
    assert "convolution" in by_kind and "matmul" in by_kind
    assert [ms for _, ms, _ in rows] == sorted((ms for _, ms, _ in rows), reverse=True)


def test_torch_profile_counts_the_fused_onednn_linear_layers_of_inference():
    from linvit.ops.onednn import _onednn_op, linear

    if not _onednn_op("_linear_pointwise"):
        pytest.skip("this torch has no oneDNN fused linear")
    weight, bias, x = torch.randn(64, 16), torch.randn(64), torch.randn(4, 100, 16)

    def forward():
        with torch.no_grad():
            return linear(x, weight, bias)

    total, by_kind, rows = profile(forward, steps=2)
    times = {name: ms for name, ms, _ in rows}
    assert times["mkldnn::_linear_pointwise"] > 0
    assert by_kind["matmul"] == pytest.approx(times["mkldnn::_linear_pointwise"])
