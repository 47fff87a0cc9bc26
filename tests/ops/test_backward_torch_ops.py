"""The torch ops around the fused op's launches: the backward launches no zero fill and no copy of the positional
table, only the Triton kernels and the few sums the gradients need.

Autograd fills a zero gradient for every output of a custom op that got none (the forward's partial states, which
only the backward reads) unless the op asks it not to, and the backward of an index into the positional table
(``table[0]``) is a zero fill of the table's shape plus a copy. On a GPU each is a kernel launch and a pass over
memory (33.5 MB for the table at the benchmark shape, issue 35). The ops are recorded with a ``TorchDispatchMode``
while the Triton kernels run through the interpreter, which dispatches the same torch ops as a GPU would.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from linvit.attention.focused import FocusedLinearAttention

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

# ops that fill memory with a constant or scatter a gradient back into a larger zeroed tensor
FILLS = ("zeros", "zero_", "fill_", "new_zeros", "zeros_like", "full", "select_backward", "slice_backward", "index_put")


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _fills(ops: list[str]) -> list[str]:
    return [op for op in ops if op.split(".")[0] in FILLS]


@pytest.mark.parametrize("window", [None, (4, 4)], ids=["map", "windows"])
def test_the_backward_launches_no_zero_fill_and_no_copy_of_the_table(window):
    """A FocusedLinearAttention with a positional table and a 5×5 DWC, on the Triton backend: the backward's torch ops
    hold no fill, no select_backward, and the custom backward op once."""
    from linvit.ops._backend import interpreting

    if not interpreting():
        pytest.skip("runs through Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py without a GPU)")
    torch.manual_seed(0)
    hw = (8, 8)
    attention = FocusedLinearAttention(
        64, num_heads=2, dwc_kernel_size=5, pos_size=(6, 6), window_size=window, backend="triton"
    )
    x = torch.randn(2, hw[0] * hw[1], 64, requires_grad=True)
    out = attention(x, hw)
    recorder = _Recorder()
    with recorder:
        out.backward(torch.randn_like(out))
    assert "linear_attention_qkv_backward.default" in recorder.ops, recorder.ops
    assert not _fills(recorder.ops), f"the backward filled memory: {_fills(recorder.ops)} of {recorder.ops}"


def test_the_recorder_sees_a_fill_where_there_is_one():
    """The check can fail: indexing a table the old way records the select_backward and its zero fill."""
    table = torch.randn(1, 16, 8, requires_grad=True)
    recorder = _Recorder()
    loss = table[0].sum()
    with recorder:
        loss.backward()
    assert _fills(recorder.ops), recorder.ops
