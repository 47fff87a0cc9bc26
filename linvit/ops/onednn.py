"""oneDNN's fused CPU ops for inference: linear layers with the bias (and fc1's GELU) inside the GEMM, and
convolutions with a folded bias and their GELU.

Eager ``F.linear`` on a CPU runs ``addmm``: it first copies the bias into every row of a new output and then
accumulates the product into it, and the MLP's GELU reads and writes that output once more. oneDNN's matmul adds the
bias and applies the activation as it stores each tile (``torch.ops.mkldnn._linear_pointwise``, the op that
inductor's CPU fusions call), so the output is written once; its convolution (``_convolution_pointwise``) does the
same for a conv whose BatchNorm the caller folded into its weight and bias. ``linvit_tiny`` at 1024², batch 1,
2 threads, on an Intel Xeon (2026-12-06, the two paths interleaved in one process): fp32 1,050 -> 972 ms, bf16
autocast 519 -> 458 ms (the stem alone, fp32: 57 -> 27 ms).

The fused ops have no autograd formula and no export or ONNX form, so they run only where nothing but the result is
asked for: autograd off, a CPU tensor in float32 (or bf16 where oneDNN runs it natively, by the tensors' dtype or
bf16 autocast), oneDNN on (``torch.backends.mkldnn``), and no tracing, compiling, exporting, FX proxy, or torch
function / dispatch mode (a FLOP counter, say) watching. Everywhere else these are ``F.linear``, ``F.conv2d`` and
timm's GELU.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as module_hooks
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = [
    "autocast_operands",
    "bf16_native",
    "conv2d",
    "linear",
    "linear_gelu",
    "linear_layer",
    "onednn_linear_ready",
    "onednn_ready",
    "plain_linear",
    "watched",
]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; with the bias inside oneDNN's GEMM where :func:`onednn_linear_ready`."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if onednn_linear_ready(x, weight, bias):
            return _onednn_linear(x, weight, bias, "none", "")
    return F.linear(x, weight, bias)


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str = "none") -> Tensor:
    """``F.gelu(F.linear(x, weight, bias), approximate=approximate)``, in one oneDNN GEMM where ready."""
    if not torch.jit.is_scripting():  # noqa: SIM102
        if onednn_linear_ready(x, weight, bias):
            return _onednn_linear(x, weight, bias, "gelu", approximate)
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


@torch.jit.unused
def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    gelu: str | None = None,
) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding)``, then GELU (``approximate=gelu``) unless ``gelu`` is None, in
    one oneDNN convolution where :func:`onednn_ready` (the caller's test: it has no TorchScript form)."""
    x, weight, bias = autocast_operands(x, weight, bias)
    attr, algorithm = ("none", "") if gelu is None else ("gelu", gelu)
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, padding, stride, [1, 1], 1, attr, [], algorithm)


@torch.jit.unused
def linear_layer(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)``; for an ``nn.Linear`` that :func:`plain_linear` allows, :func:`linear` on its weight and bias."""
    if plain_linear(layer):
        return linear(x, layer.weight, layer.bias)
    return layer(x)


@torch.jit.unused
def plain_linear(module: nn.Module) -> bool:
    """``module`` is an ``nn.Linear`` itself (no subclass with a forward of its own) that no forward hook watches:
    calling it is ``F.linear`` on its weight and bias, which :func:`linear` may run instead."""
    return type(module) is nn.Linear and not watched(module)


def watched(module: nn.Module) -> bool:
    """Whether a forward hook (the module's own or a global one) would see this module's call."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module_hooks._global_forward_hooks
        or module_hooks._global_forward_pre_hooks
    )


@torch.jit.unused
def onednn_linear_ready(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether the fused oneDNN op may stand in for ``F.linear(x, weight, bias)`` here (module docstring)."""
    return onednn_ready(x, weight, bias, "_linear_pointwise") and weight.dim() == 2  # x first: an FX proxy is out


@torch.jit.unused
def onednn_ready(x: Tensor, weight: Tensor, bias: Tensor | None, op: str) -> bool:
    """Whether ``torch.ops.mkldnn.<op>`` may run on ``x`` with ``weight`` and ``bias`` here: only the result is
    asked for, on the CPU, in a dtype oneDNN runs natively (module docstring)."""
    if not isinstance(x, Tensor) or torch.is_grad_enabled() or torch.jit.is_tracing() or torch.compiler.is_compiling():
        return False
    if x.device.type != "cpu" or x.numel() == 0 or not _onednn_enabled(op):
        return False
    if torch._C._is_torch_function_mode_enabled() or _get_current_dispatch_mode() is not None:
        return False
    if not weight.is_contiguous() or (bias is not None and bias.dtype != weight.dtype):
        return False
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16 and bf16_native()
    if x.dtype != weight.dtype:
        return False
    return x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and bf16_native())


@torch.jit.unused
def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None, attr: str, algorithm: str) -> Tensor:
    x, weight, bias = autocast_operands(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm)


@torch.jit.unused
def autocast_operands(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Under bf16 autocast, the operands in bf16 (what autocast does for F.linear and convolutions); else as given."""
    if not torch.is_autocast_enabled("cpu"):
        return x, weight, bias
    bias = None if bias is None else bias.to(torch.bfloat16)
    return x.to(torch.bfloat16), weight.to(torch.bfloat16), bias


def _onednn_enabled(op: str) -> bool:
    return torch.backends.mkldnn.enabled and _onednn_op(op)


@functools.cache
def _onednn_op(op: str) -> bool:
    """This build of torch has oneDNN and its fused op ``op`` (inductor's ops, not public API)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, op)


@functools.cache
def bf16_native() -> bool:
    """oneDNN runs bf16 in hardware on this CPU (AVX512-BF16 or AMX); elsewhere it would emulate it, slowly."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
