"""Fake tensors that lay out views as eager PyTorch does.

``FakeTensorMode`` computes a view's strides with PyTorch's Python reference, which can give a size-1 dimension
another stride than the eager kernel gives (a (1, N, C) tensor transposed and reshaped to (1, C, H, W): eager
strides (C, 1, W·C, C), fake (N·C, 1, W·C, C)). The strides of a size-1 dimension change no element's address,
but the CPU's oneDNN convolution reads them: with the eager ones it copies its input twice over (measured on
torch 2.14), so a prediction must see those. :class:`EagerViewStrides` recomputes such views on the meta device,
whose kernels are eager's, and hands on the fake view with eager's strides.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map

__all__ = ["EagerViewStrides"]


def _meta_twin(value):
    """A meta tensor with ``value``'s dtype, shape, strides and offset (other values unchanged)."""
    if not isinstance(value, torch.Tensor):
        return value
    storage = torch.empty(value.untyped_storage().nbytes() // value.element_size(), dtype=value.dtype, device="meta")
    return storage.as_strided(value.shape, value.stride(), value.storage_offset())


class EagerViewStrides(TorchDispatchMode):
    """Inside ``FakeTensorMode``: views whose size-1 dimensions got strides other than eager's get eager's."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not (isinstance(func, torch._ops.OpOverload) and func.is_view and isinstance(out, torch.Tensor)):
            return out
        if 1 not in out.shape:
            return out
        with _disable_current_modes():
            eager = func(*tree_map(_meta_twin, args), **tree_map(_meta_twin, kwargs))
        if eager.shape != out.shape or eager.stride() == out.stride():
            return out
        return out.as_strided(out.shape, eager.stride(), out.storage_offset())
