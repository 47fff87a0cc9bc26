"""The torch ops the cost figure finds by tracing (linvit.bench.torch_launches): a known op sequence with its bytes by
hand, and the focused and window attention modules at a small shape (fake tensors: nothing is computed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from linvit.bench import torch_launches
from linvit.bench.cost_model import op_launches, ops_ms


def _known_sequence():
    def build():
        inputs = {"x": torch.empty(4, 8).requires_grad_(), "w": torch.empty(8).requires_grad_()}

        def module(x, w):
            scaled = (x * w).t()  # a view: no launch
            return scaled.sum(dim=1)[2:].clone()  # a slice (view) of the sum, then a copy

        return module, inputs

    return torch_launches.trace(build)


def test_a_known_sequence_is_traced_with_its_bytes():
    trace = _known_sequence()
    assert [op.name for op in trace.forward] == ["aten.mul.Tensor", "aten.sum.dim_IntList", "aten.clone.default"]
    mul, total, copy = (op.bytes for op in trace.forward)
    assert mul == (4 * 8 + 8 + 4 * 8) * 4  # x and w read, the product written (fp32)
    assert total == (4 * 8 + 8) * 4
    assert copy == (6 + 6) * 4
    # the backward of a slice is a zero fill of the sum's shape and a copy of the gradient into it: two launches
    slices = [op for op in trace.backward if op.name.startswith("aten.slice_backward")]
    assert len(slices) == 1 and slices[0].launches == 2
    assert slices[0].bytes == 6 * 4 + 2 * 8 * 4  # the gradient read, the output written by the fill and the copy
    assert all(not op.name.startswith(("aten.t.", "aten.expand", "aten.empty", "aten.view")) for op in trace.backward)
    # the floors: x, w and the output once forward; the output's gradient, x and w read, their gradients written
    assert trace.floor_forward_bytes == (32 + 8 + 6) * 4
    assert trace.floor_backward_bytes == (6 + 32 + 8 + 32 + 8) * 4


def test_a_broadcast_tensor_is_counted_once():
    assert torch_launches.tensor_bytes(torch.empty(8).expand(4, 8)) == 8 * 4
    assert torch_launches.tensor_bytes(torch.empty(3, 5, dtype=torch.bfloat16)) == 3 * 5 * 2


def test_the_flash_core_s_bytes_and_flops():
    q = k = v = torch.empty(2, 3, 49, 16, dtype=torch.bfloat16)
    forward = torch_launches.flash_attention(q, k, v, backward=False)
    backward = torch_launches.flash_attention(q, k, v, backward=True)
    tensor = 2 * 3 * 49 * 16 * 2
    assert forward.bytes == 4 * tensor + 2 * 3 * 49 * 4  # q, k, v, out and the log-sum-exp
    assert forward.flops == 4 * 2 * 3 * 49 * 49 * 16
    assert backward.bytes == 8 * tensor + 2 * 3 * 49 * 4 and backward.flops == 2.5 * forward.flops


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_focused_module_s_launches_around_its_fused_ops():
    """Traced, not listed: the fused forward and backward ops once each, no fill and no copy of the table, the
    positional table's gradient summed over the batch by the backward's last kernel, and nothing for the temperature
    (its parameter goes into the kernels, which take 1 / softplus of it and its gradient themselves): no launch around
    either op. In windows the table's gradient is still a torch sum over the windows' keys."""
    trace = torch_launches.focused_module(2, 2, 16, (8, 8), None, 5, torch.bfloat16, multiprocessors=4)
    fused = [op.name for op in trace.forward + trace.backward if op.kind == "fused"]
    assert fused == list(torch_launches.FUSED_OPS)
    names = [op.name.split(".")[1] for op in trace.forward + trace.backward if op.kind == "torch"]
    assert not {"zeros", "zero_", "fill_", "select_backward", "slice_backward", "copy_"} & set(names), names
    assert not {"softplus", "softplus_backward", "reciprocal", "mul", "neg"} & set(names), names
    assert not [op for op in trace.backward if op.name.startswith("aten.sum")]
    windowed = torch_launches.focused_module(2, 2, 16, (8, 8), (4, 4), 5, torch.bfloat16, multiprocessors=4)
    sums = [op for op in windowed.backward if op.name.startswith("aten.sum")]
    assert len(sums) == 1 and sums[0].bytes == 2 * 64 * 32 * 2 + 16 * 32 * 4  # dk (bf16) read, the table's (fp32)
    channels = 32
    forward_floor = 2 * 64 * 3 * channels * 2 + (channels + 64 * channels + 16 * 25 + 16) * 4 + 2 * 64 * channels * 2
    assert trace.floor_forward_bytes == forward_floor
    assert op_launches(trace.forward) == 0 and ops_ms(trace.forward) == 0
    assert op_launches(trace.backward) == 0 and ops_ms(trace.backward) == 0


def test_the_window_module_s_copies_and_flash_core():
    """timm's Swin window attention at 14² in 7×7 windows: the partition and reverse copies, one flash core per pass
    with its FLOPs by hand, and no projection (answered by an allocation)."""
    trace = torch_launches.window_module(1, 2, 16, (14, 14), 7, torch.bfloat16)
    cores = [op for op in trace.forward + trace.backward if op.kind == "attention"]
    assert [op.name for op in cores] == ["flash_attention_forward", "flash_attention_backward"]
    assert cores[0].flops == 4 * (4 * 2) * 49 * 49 * 16  # 4 windows × 2 heads
    names = [op.name for op in trace.forward]
    assert "aten.clone.default" in names  # partition and reverse
    assert not any(op.startswith(("aten.addmm", "aten.mm", "aten.linear")) for op in names)
