"""Every Triton launch of linear_attention_qkv is idempotent: run twice with the same arguments, it leaves the same
outputs as run once.

`triton.autotune` runs each launch of a new shape many times while it times the configurations (and a CUDA-graph
replay runs it again), so a kernel that adds into its own output (``tl.store(p, tl.load(p) + x)``) gives wrong
results on a GPU that no test through the interpreter sees, since the interpreter never autotunes. These tests run
every launch of the forward and the backward twice back to back through Triton's interpreter (wrapping its launch,
so no kernel is left out) and compare the op's output and every gradient with the naive reference, over head groups
(whose focused map adds a cross-head term in a launch of its own), windows, masks, positional tables, class tokens
and DWC sizes. On a CUDA machine (where tests/conftest.py leaves the interpreter off) they run in a subprocess with
the interpreter on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from test_linear_attention import CASES, _assert_close, _case, _cast, _inputs, _run

from linvit.ops._backend import interpreting

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

# the kernels the plans launch (`triton_launch.py`): the forward's, the backward's, and what head groups add
FORWARD = {"state_kernel"}
# and one output kernel: the tiled one, or on a whole map with 16-bit inputs the rows kernel
# (`triton_launch.streams_rows`; these fp32 cases take the tiled one, test_the_rows_kernel_... the rows kernel)
OUTPUT = {"output_kernel", "output_rows_kernel"}
BACKWARD = {"query_grad_kernel", "key_value_grad_kernel", "sum_rows_kernel"}
HEAD_GROUPS = {"token_norms_kernel", "cross_head_grad_kernel"}  # the focused map in head groups adds these

# the default tier, small: head groups of 2 × 64 (they reach the cross-head term) on a whole map (mask, shared
# positional table, 3×3 DWC) and in windows of a padded map (a table per window; windows take no mask); the relu map
# in windows with a 5×5 DWC and no head groups (no norms, no cross-head term)
DEFAULT_CASES = {
    "groups_2x64_map": _case("focused", (3, 4), 2, 64, kernel=3, mask=True),
    "groups_2x64_windows": _case("focused", (3, 4), 2, 64, kernel=3, window=(2, 4), position="batched", batch=1),
    "relu_windows_small": _case("relu", (4, 2), 2, 16, kernel=5, window=(2, 2), batch=1),
}
# the slow tier: every interpreter case of test_linear_attention.py (class tokens, odd head dims, head dims 64 and
# 128, batched tables, no DWC, elu) and more head groups
WIDE_CASES = {
    **CASES,
    "focused_head_groups_6x24_windows": _case("focused", (3, 5), 6, 24, kernel=3, window=(2, 3), position="batched"),
    "focused_head_groups_8x32_windows": _case("focused", (6, 5), 8, 32, kernel=5, window=(3, 4)),
    "focused_head_groups_2x64_conv_free": _case("focused", (4, 6), 2, 64, kernel=0, prefix=2, position="batched"),
    "focused_head_groups_3x64_no_position": _case("focused", (5, 5), 3, 64, kernel=3, position=None, power=2.0),
}


@contextlib.contextmanager
def every_launch_twice() -> Iterator[list[str]]:
    """Run each Triton launch in the block twice back to back with the same arguments (the interpreter's launch
    wrapped); yields the names of the kernels launched, once per launch."""
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run
    launched: list[str] = []

    def twice(self, *args, grid, warmup, **kwargs):
        if not warmup:
            launched.append(self.__name__)
            original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InterpretedFunction, "run", twice)
        yield launched


def _assert_idempotent(case: dict) -> set[str]:
    """The Triton op with every launch run twice equals the naive reference in float64 (value 2e-5, gradients 5e-5,
    as the single-launch tests); returns the kernels it launched. ``case``: as test_linear_attention.py's, with an
    optional batch size (2)."""
    qkv, kwargs = _inputs(case, batch=case.get("batch", 2))
    generator = torch.Generator().manual_seed(1)
    grad_out = torch.randn(qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3, generator=generator, dtype=torch.float64)
    expected, expected_grads = _run("naive", qkv, kwargs, grad_out)
    qkv32, kwargs32 = _cast(qkv, kwargs, torch.float32, torch.device("cpu"))
    with every_launch_twice() as launched:
        out, grads = _run("triton", qkv32, kwargs32, grad_out.float())
    leaves = ["qkv"] + [key for key, value in kwargs.items() if isinstance(value, torch.Tensor) and value.requires_grad]
    checks = [("output", out, expected, 2e-5)] + [
        (f"d{leaf}", got, want, 5e-5) for leaf, got, want in zip(leaves, grads, expected_grads)
    ]
    errors = []
    for what, got, want, tolerance in checks:
        try:
            _assert_close(got, want, tolerance)
        except AssertionError as error:
            errors.append(f"{what}: {str(error).splitlines()[0]}")
    assert not errors, "with every launch run twice: " + "; ".join(errors)
    return set(launched)


def _in_interpreter_subprocess(node: str) -> None:
    """Run this test file's test ``node`` in a process with the interpreter on and no GPU (a CUDA machine)."""
    environment = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "pytest", "-n0", "-q", "-p", "no:cacheprovider", f"{__file__}::{node}"]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(DEFAULT_CASES))
def test_every_launch_twice_gives_the_reference_result(name, request):
    """Forward and backward with each launch run twice equal the naive reference, and every kernel was launched
    (the cross-head term's with head groups)."""
    if not interpreting():
        _in_interpreter_subprocess(request.node.name)
        return
    launched = _assert_idempotent(DEFAULT_CASES[name])
    expected = FORWARD | BACKWARD | {"dwc_weight_grad_kernel", "output_kernel"}
    if name.startswith("groups"):
        expected |= HEAD_GROUPS
    assert launched == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WIDE_CASES))
def test_every_launch_twice_gives_the_reference_result_wide(name, request):
    """Every interpreter case of test_linear_attention.py, and more head groups: a ragged group of 6 × 24 and 8 × 32
    in windows (groups of 4 heads), 2 × 64 without a DWC and with class tokens, 3 × 64 without a positional table."""
    if not interpreting():
        _in_interpreter_subprocess(request.node.name)
        return
    launched = _assert_idempotent(WIDE_CASES[name])
    assert launched >= FORWARD | BACKWARD and len(launched & OUTPUT) == 1


@pytest.mark.parametrize("kernel", [3, 5])
def test_the_rows_kernels_run_twice_give_the_same_result(kernel):
    """Forward and backward of 16-bit inputs on a whole map (`triton_rows.output_rows_kernel`,
    `triton_rows_backward.dwc_weight_rows_kernel` and `value_conv_rows_kernel`; with head groups and their norms and
    cross-head passes, and with four heads in one program, whose output takes the conv in halves of 16 channels)
    give the same output and gradients, bit for bit, with every launch run twice as run once."""
    if not interpreting():
        _in_interpreter_subprocess(f"test_the_rows_kernels_run_twice_give_the_same_result[{kernel}]")
        return
    for heads in (8, 4):
        qkv, kwargs = _inputs(_case("focused", (6, 19), heads, 32, kernel=kernel, mask=True), batch=2)
        qkv16, kwargs16 = _cast(qkv, kwargs, torch.bfloat16, torch.device("cpu"))
        grad_out = torch.randn(2, qkv.shape[1], qkv.shape[2] // 3, generator=torch.Generator().manual_seed(3))
        once, once_grads = _run("triton", qkv16, kwargs16, grad_out.to(torch.bfloat16))
        with every_launch_twice() as launched:
            twice, twice_grads = _run("triton", qkv16, kwargs16, grad_out.to(torch.bfloat16))
        rows = {"output_rows_kernel", "dwc_weight_rows_kernel", "value_conv_rows_kernel"}
        assert rows <= set(launched) and not {"output_kernel", "dwc_weight_grad_kernel"} & set(launched)
        assert torch.equal(once, twice)
        assert all(torch.equal(a, b) for a, b in zip(once_grads, twice_grads))


def test_a_launch_that_adds_into_its_output_is_caught():
    """The wrapper sees what it is for: a kernel that adds into its output gives another result run twice."""
    if not interpreting():
        _in_interpreter_subprocess("test_a_launch_that_adds_into_its_output_is_caught")
        return
    import triton
    import triton.language as tl

    @triton.jit
    def add_into(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(out_ptr + offsets) + tl.load(x_ptr + offsets))

    x, out = torch.ones(16), torch.zeros(16)
    with every_launch_twice() as launched:
        add_into[(1,)](x, out, BLOCK=16)
    assert launched == ["add_into"] and torch.equal(out, 2 * x)
