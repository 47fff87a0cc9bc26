"""linvit.utils.onnx_gemm: linear layers of an exported graph as 2-D Gemm, and only where nothing else can tell."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from linvit.utils.onnx_gemm import linear_layers_as_gemm

onnx = pytest.importorskip("onnx", reason="the onnx extra (pip install 'linvit[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra (pip install 'linvit[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

K, N = 6, 5


def _graph(nodes, outputs, weights, opset: int = 18):
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name) for name, shape, dtype in weights
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", K])
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "tokens", N]) for name in outputs]
    graph = helper.make_graph(nodes, "g", [x], outs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _ops(model):
    return [node.op_type for node in model.graph.node]


LINEAR = [("w", (K, N), np.float32), ("b", (N,), np.float32)]


def test_a_linear_layer_becomes_gemm_with_the_same_outputs_at_every_leading_shape():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["b", "p"], ["y"]),  # the bias first: Add is commutative
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    model = _graph(nodes, ["out"], LINEAR)
    before = copy.deepcopy(model)
    assert linear_layers_as_gemm(model) == 1
    onnx.checker.check_model(model)
    assert "Gemm" in _ops(model) and "MatMul" not in _ops(model) and "Add" not in _ops(model)
    for shape in ((2, 3, K), (1, 7, K)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        (expected,), (got,) = _run(before, x), _run(model, x)
        assert got.shape == expected.shape == (*shape[:2], N)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "case",
    ["product read twice", "product is an output", "bias computed", "bias of another width", "weight computed"],
)
def test_what_another_node_could_tell_apart_stays_as_exported(case):
    weights = list(LINEAR)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
    outputs = ["y"]
    if case == "product read twice":
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs.append("r")
    elif case == "product is an output":
        outputs.append("p")
    elif case == "bias computed":
        nodes.insert(0, helper.make_node("Relu", ["b0"], ["b"]))
        weights = [("w", (K, N), np.float32), ("b0", (N,), np.float32)]
    elif case == "bias of another width":
        weights = [("w", (K, N), np.float32), ("b", (1, N), np.float32)]
    elif case == "weight computed":
        nodes.insert(0, helper.make_node("Neg", ["w0"], ["w"]))
        weights = [("w0", (K, N), np.float32), ("b", (N,), np.float32)]
    model = _graph(nodes, outputs, weights)
    assert linear_layers_as_gemm(model) == 0
    assert "Gemm" not in _ops(model)


def test_a_bias_other_nodes_read_is_copied_for_the_gemm():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["y"]),
        helper.make_node("Add", ["y", "b"], ["out"]),  # the same constant, read by another node too
    ]
    model = _graph(nodes, ["out"], LINEAR)
    before = copy.deepcopy(model)
    assert linear_layers_as_gemm(model) == 1
    gemm = next(node for node in model.graph.node if node.op_type == "Gemm")
    other = next(node for node in model.graph.node if node.op_type == "Add")
    assert gemm.input[2] != "b" and "b" in other.input
    x = np.random.default_rng(2).standard_normal((2, 3, K)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x)[0], _run(before, x)[0], rtol=1e-6, atol=1e-6)


def test_a_second_rewrite_of_a_rewritten_file_makes_no_name_twice():
    layer = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
    model = _graph(layer, ["y"], LINEAR)
    assert linear_layers_as_gemm(model) == 1
    model.graph.node.extend(
        [helper.make_node("MatMul", ["y", "w2"], ["p2"]), helper.make_node("Add", ["p2", "b2"], ["z"])]
    )
    rng = np.random.default_rng(3)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(rng.standard_normal((N, N)).astype(np.float32), "w2"),
            numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b2"),
        ]
    )
    model.graph.output[0].name = "z"
    assert linear_layers_as_gemm(model) == 1
    onnx.checker.check_model(model)  # unique names
    names = [name for node in model.graph.node for name in node.output] + [t.name for t in model.graph.initializer]
    assert len(names) == len(set(names))
    assert _run(model, np.ones((1, 2, K), np.float32))[0].shape == (1, 2, N)


def test_below_opset_15_nothing_is_rewritten():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
    model = _graph(nodes, ["y"], LINEAR, opset=14)
    assert linear_layers_as_gemm(model) == 0


def test_an_exported_model_rewritten_holds_no_linear_layer_as_matmul_and_add(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="the onnx extra (pip install 'linvit[onnx]')")
    import timm

    import linvit  # noqa: F401  (registers the models)
    from linvit.utils.deploy import export_onnx

    torch.manual_seed(0)
    model = timm.create_model("linvit_nano", num_classes=10, img_size=32, depths=(1, 1, 1, 1)).eval()
    exported = onnx.load(str(export_onnx(model, tmp_path / "model.onnx")))
    assert linear_layers_as_gemm(exported) >= 4 * 4  # qkv, proj, fc1, fc2 in each block
    onnx.checker.check_model(exported)
    graph = exported.graph
    weights = {tensor.name for tensor in graph.initializer}
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    leftover = [
        node.name
        for node in graph.node
        if node.op_type == "MatMul" and node.input[1] in weights and readers.get(node.output[0]) == ["Add"]
    ]
    assert not leftover
    x = torch.randn(2, 3, 40, 48)
    with torch.no_grad():
        expected = model(x).numpy()
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"image": x.numpy()})[0], expected, rtol=1e-4, atol=1e-5)
