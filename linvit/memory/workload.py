"""The work whose memory is predicted and measured: the same code runs on fake tensors and on real ones.

Inference: ``calls`` forward passes under ``torch.no_grad()``. Training: ``calls`` steps of AdamW on the
cross-entropy of the logits (``zero_grad(set_to_none=True)``, forward, backward, step). Two calls by default, so
that the peak is that of a steady loop: the second call finds the first one's leftovers (AdamW's state, caches
that modules build for a new input size) in place. Reduced precision is autocast, weights stay fp32 (as in
mixed-precision training and the benchmarks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DTYPES", "CALLS", "autocast", "fresh_size_caches", "make_optimizer", "run_workload"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CALLS = 2


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` ("bf16", "fp16"); nothing for "fp32"."""
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}.")
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def make_optimizer(model: nn.Module, foreach: bool | None = None) -> torch.optim.Optimizer:
    """AdamW with PyTorch's defaults. ``foreach``: its multi-tensor path, by default PyTorch's choice for the
    parameters' device (CUDA runs it, the CPU updates one tensor at a time); stated, because PyTorch does not
    choose it for fake tensors."""
    params = [p for p in model.parameters() if p.requires_grad]
    if foreach is None:
        foreach = bool(params) and params[0].device.type == "cuda"
    return torch.optim.AdamW(params, foreach=foreach)


@contextlib.contextmanager
def fresh_size_caches() -> Iterator[None]:
    """Run with an empty, private copy of the cache of size-dependent tensors that ``linvit.ops.windows``
    keeps per input size (window masks, gather indices), serving fake tensors too; the process's cache is back
    afterwards.

    A real run builds those tensors on its first call and keeps them; a dry run must do the same to count them
    (the windows module serves no fake tensors from its own cache, so that none reach a real run: this private
    copy is dropped after the dry run for that reason). A measured run must build its own rather than find the
    warm-up's.
    """
    from linvit.ops import windows

    cache, fake_switch = getattr(windows, "_SIZE_CACHE", None), getattr(windows, "_fake_mode_active", None)
    if not isinstance(cache, dict):  # the cache moved or went: nothing to isolate
        yield
        return
    windows._SIZE_CACHE = {}
    if fake_switch is not None:
        windows._fake_mode_active = lambda: False
    try:
        yield
    finally:
        windows._SIZE_CACHE = cache
        if fake_switch is not None:
            windows._fake_mode_active = fake_switch


@contextlib.contextmanager
def _phase(phase: Callable[[str], contextlib.AbstractContextManager] | None, label: str) -> Iterator[None]:
    if phase is None:
        yield
    else:
        with phase(label):
            yield


def run_workload(
    model: nn.Module,
    images: torch.Tensor,
    *,
    train: bool,
    dtype: str = "fp32",
    calls: int = CALLS,
    optimizer: torch.optim.Optimizer | None = None,
    phase: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> None:
    """Run ``calls`` inference passes or training steps of ``model`` on ``images``.

    ``optimizer``: AdamW from :func:`make_optimizer` when training and none is given. ``phase(label)``: an optional
    context manager entered around "forward", "backward" and "optimizer step" (the tracker's scopes).
    """
    device = images.device
    model.train(train)
    if not train:
        for _ in range(calls):
            with _phase(phase, "forward"), torch.no_grad(), autocast(device, dtype):
                model(images)
        return
    optimizer = optimizer if optimizer is not None else make_optimizer(model)
    # class 0 for every image: the loss's memory does not depend on the labels
    targets = torch.zeros(images.shape[0], dtype=torch.long, device=device)
    for _ in range(calls):
        optimizer.zero_grad(set_to_none=True)
        with _phase(phase, "forward"), autocast(device, dtype):
            logits = model(images)
            loss = F.cross_entropy(logits.float(), targets)
        del logits
        with _phase(phase, "backward"):
            loss.backward()
        del loss
        with _phase(phase, "optimizer step"):
            optimizer.step()
