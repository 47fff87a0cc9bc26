"""Linear layers on token tensors as ONNX ``Gemm``: a rewrite of an exported graph before int8 quantization.

PyTorch exports ``nn.Linear`` on a (B, N, C) tensor as ``MatMul`` then ``Add`` (the bias): ``Gemm`` takes 2-D
inputs only. Quantized, the ``MatMul`` becomes an int8 product and the ``Add`` stays a float pass over its result.
As ``Reshape`` to (B·N, C) -> ``Gemm`` (bias included) -> ``Reshape`` back, the layer quantizes into one ``QGemm``
that adds the bias in its kernel; the reshapes cost nothing. ``linvit_tiny`` int8 at 1024² on a 2-core Intel Xeon
(2026-12-06, ONNX Runtime 1.32, 8 interleaved runs each): 735 -> 681 ms. The fp32 files keep ``MatMul`` + ``Add``:
there ``Gemm`` was 2.5% slower (1,142 -> 1,170 ms; ONNX Runtime's ``Gemm`` writes the bias into its output first).

A ``MatMul`` is rewritten only where nothing else can see the difference: its second input is a 2-D float weight
(an initializer), its result goes to one ``Add`` and nowhere else (not a graph output), and that ``Add``'s other
input is a 1-D bias initializer of the product's width and the weight's type. Everything else stays as exported. A
bias that other nodes read as well (the exporter merges equal constants: zero biases, a norm's zero shift) is copied
for the ``Gemm``, so that quantizing the ``Gemm``'s bias leaves theirs in float.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["linear_layers_as_gemm"]

PREFIX = "linvit_gemm"
MIN_OPSET = 15  # Shape's ``end`` attribute


def _opset(model: Any) -> int:
    return max((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), default=0)


def linear_layers_as_gemm(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place: each linear layer's ``MatMul`` + bias ``Add`` becomes
    ``Reshape`` -> ``Gemm`` -> ``Reshape`` (module docstring). Returns how many were rewritten (0 below opset 15)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    if _opset(model) < MIN_OPSET:
        return 0
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    graph_outputs = {value.name for value in graph.output}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def bias_of(product, add) -> str | None:
        weight = weights[product.input[1]]
        others = [name for name in add.input if name != product.output[0]]
        if len(others) != 1 or others[0] not in weights:
            return None
        bias = weights[others[0]]
        if list(bias.dims) != [weight.dims[1]] or bias.data_type != weight.data_type:
            return None
        return others[0]

    def rewritable(node) -> tuple[Any, str] | None:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in weights:
            return None
        weight = weights[node.input[1]]
        if len(weight.dims) != 2 or weight.data_type != TensorProto.FLOAT or node.output[0] in graph_outputs:
            return None
        users = readers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or users[0].domain not in ("", "ai.onnx"):
            return None
        bias = bias_of(node, users[0])
        return None if bias is None else (users[0], bias)

    taken = set(weights) | {name for node in graph.node for name in (*node.input, *node.output, node.name)}
    prefix = PREFIX
    while any(name.startswith(prefix) for name in taken):  # a file rewritten before: new names stay new
        prefix += "_"
    shapes: dict[tuple[int, ...], str] = {}  # the (-1, K) and (N,) constants, one per width

    def constant(*values: int) -> str:
        if values not in shapes:
            name = f"{prefix}_shape_{len(shapes)}"
            graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
            shapes[values] = name
        return shapes[values]

    rewritten: list = []
    replaced: set[int] = set()
    removed_values: set[str] = set()
    count = 0
    for node in graph.node:
        if id(node) in replaced:  # a rewritten layer's Add (it comes after its MatMul)
            continue
        found = rewritable(node)
        if found is None:
            rewritten.append(node)
            continue
        add, bias = found
        k, n = weights[node.input[1]].dims
        base = f"{prefix}_{count}"
        if len(readers[bias]) > 1:  # the exporter merges equal constants (zero biases and norms' shifts): a Gemm's
            own = copy.deepcopy(weights[bias])  # bias gets quantized to int32, the other readers' must not
            own.name = bias = f"{base}_bias"
            graph.initializer.append(own)
        tokens, leading, product, out_shape = (f"{base}_{part}" for part in ("tokens", "leading", "product", "shape"))
        rewritten += [
            helper.make_node("Shape", [node.input[0]], [leading], name=f"{base}_leading", end=-1),
            helper.make_node("Reshape", [node.input[0], constant(-1, k)], [tokens], name=f"{base}_flatten"),
            helper.make_node("Gemm", [tokens, node.input[1], bias], [product], name=f"{base}_gemm"),
            helper.make_node("Concat", [leading, constant(n)], [out_shape], name=f"{base}_shape", axis=0),
            helper.make_node("Reshape", [product, out_shape], [add.output[0]], name=f"{base}_unflatten"),
        ]
        replaced.add(id(add))
        removed_values.add(node.output[0])
        count += 1
    del graph.node[:]
    graph.node.extend(rewritten)
    kept_info = [value for value in graph.value_info if value.name not in removed_values]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return count
