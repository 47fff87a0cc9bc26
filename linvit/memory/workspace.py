"""Memory that CPU kernels allocate inside one op and free before it returns, which a dispatch-level count misses.

Two kernels of PyTorch's CPU backend hold such workspaces where these models reach their inference peak (measured
with ``torch.profiler``'s allocation events on torch 2.14, oneDNN convolutions, fp32; tests/memory compares each
rule with the profiler, so a PyTorch whose kernels behave otherwise fails there):

- convolution (oneDNN): an input in dense channels-last order is read in place (only the weight is reordered:
  twice its bytes); a dense NCHW input is reordered for the kernel, or the output computed aside (the larger of
  the input's bytes plus the weight's and the output's bytes), except an input of fewer than 4 channels (an
  image), read in place while the output is computed aside (the output's bytes); any other strides, a size-1
  batch whose stride is not the dense one included (tokens (1, N, C) viewed as a (1, C, H, W) map), are first
  copied and then reordered (the input's bytes plus the larger of input and output).
- layer norm: a non-contiguous input is copied to a contiguous one (its bytes).

Smaller workspaces (matrix products of non-contiguous operands, backward kernels) are left out; their effect on
the measured peaks is within a few percent (docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["cpu_workspace_bytes"]

aten = torch.ops.aten


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _dense_strides(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense tensor of ``shape`` whose dimensions, innermost first, are ``order``."""
    strides = [0] * len(shape)
    step = 1
    for dim in order:
        strides[dim] = step
        step *= shape[dim]
    return tuple(strides)


def _is_dense(tensor: torch.Tensor, order: tuple[int, ...]) -> bool:
    """Exactly dense in that order, size-1 dimensions included (``is_contiguous`` ignores their strides)."""
    return tuple(tensor.stride()) == _dense_strides(tuple(tensor.shape), order)


_NCHW = (3, 2, 1, 0)
_NHWC = (1, 3, 2, 0)


def _convolution(args: tuple, out: object) -> int:
    images, weight = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    if images.dim() != 4 or transposed or not isinstance(out, torch.Tensor):
        return 0
    if _is_dense(images, _NHWC):
        return 2 * _bytes(weight)
    if _is_dense(images, _NCHW):
        return max(_bytes(images) + _bytes(weight), _bytes(out)) if images.shape[1] >= 4 else _bytes(out)
    return _bytes(images) + max(_bytes(images), _bytes(out))


def _layer_norm(args: tuple, out: object) -> int:
    return 0 if args[0].is_contiguous() else _bytes(args[0])


_RULES: dict[object, Callable[[tuple, object], int]] = {
    aten.convolution.default: _convolution,
    aten.native_layer_norm.default: _layer_norm,
}


def cpu_workspace_bytes(func, args: tuple, kwargs: dict, out: object) -> int:
    """Bytes the CPU kernel of ``func`` holds besides its inputs and outputs while it runs (0 for other ops)."""
    rule = _RULES.get(func)
    if rule is None or kwargs or not args or not isinstance(args[0], torch.Tensor) or args[0].device.type != "cpu":
        return 0
    return rule(args, out)
