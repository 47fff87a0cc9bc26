"""How the Triton ops register with torch: as Triton ops where torch takes their schema, else as custom ops."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def test_where_triton_op_refuses_the_schema_the_op_registers_as_a_custom_op(monkeypatch):
    """torch 2.11's triton_op infers the schema and refuses the ops' ``*scalars`` (every GPU test failed at import on
    the H200): the op is then a custom op with the schema, which runs the same function."""
    from linvit.ops.linear_attention import triton as fused

    def refusing_triton_op(name, mutates_args, schema):
        raise ValueError("infer_schema(func): We do not support positional-only args, varargs, or varkwargs.")

    monkeypatch.setattr(fused, "triton_op", refusing_triton_op)
    monkeypatch.setattr(fused, "interpreting", lambda: False)

    def twice(x: torch.Tensor, *scalars: float) -> torch.Tensor:
        return x * 2 * scalars[0]

    op = fused._custom_op("linvit_test::twice_scaled", "(Tensor x, float a) -> Tensor", torch.empty_like)(twice)
    assert torch.equal(op(torch.ones(3), 1.5), torch.full((3,), 3.0))
