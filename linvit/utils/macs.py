"""Parameter and multiply-accumulate counts, measured by running the model once."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_params(model: nn.Module) -> int:
    """Number of parameters (trainable or not); buffers are not counted."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def count_macs(model: nn.Module, input_size: tuple[int, ...] = (3, 224, 224), batch_size: int = 1) -> int:
    """Multiply-accumulates of one forward pass per image, as PyTorch's flop counter measures them.

    Counts matrix products, convolutions and attention kernels (2 FLOPs per MAC); elementwise work is not counted,
    as in the papers' tables.
    """
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.zeros(batch_size, *input_size, device=device, dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // 2 // batch_size
