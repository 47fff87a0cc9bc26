"""What the naive references of the operators share: the precision they compute in, and the split into heads."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from linvit.ops._numerics import autocast_device_type

__all__ = ["merge_heads", "reference_precision", "split_heads"]


def reference_precision(reference: Callable[[Tensor, tuple], Tensor]) -> Callable[[Tensor, tuple], Tensor]:
    """``reference(qkv, arguments)`` run on qkv in float64 when it is float64 and in float32 otherwise, with autocast
    off, and its result returned in qkv's dtype. (The reference converts its other tensors to qkv's dtype.)"""

    @functools.wraps(reference)
    def run(qkv: Tensor, arguments: tuple) -> Tensor:
        dtype = torch.float64 if qkv.dtype == torch.float64 else torch.float32
        with torch.autocast(autocast_device_type(qkv), enabled=False):
            return reference(qkv.to(dtype), arguments).to(qkv.dtype)

    return run


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, n, C) -> (B, h, n, d)."""
    return x.reshape(x.shape[0], x.shape[1], num_heads, x.shape[2] // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, h, n, d) -> (B, n, C)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])
