"""Parameter and multiply-accumulate counts, measured by running the model once."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count


def _cpu_flash_attention_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# PyTorch's counter knows the CUDA attention kernels but not the fused CPU one that
# F.scaled_dot_product_attention dispatches to here; without this, softmax attention would count as zero.
_EXTRA_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention_flops}


def macs_counter() -> FlopCounterMode:
    """PyTorch's flop counter, also counting the fused CPU attention kernel (2 FLOPs per MAC)."""
    return FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS)


def count_params(model: nn.Module) -> int:
    """Number of parameters (trainable or not); buffers are not counted."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def count_macs(model: nn.Module, input_size: tuple[int, ...] = (3, 224, 224), batch_size: int = 1) -> int:
    """Multiply-accumulates of one forward pass per image, as PyTorch's flop counter measures them.

    Counts matrix products, convolutions and attention kernels, fused ones included (2 FLOPs per MAC); elementwise
    work is not counted, as in the papers' tables.
    """
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.zeros(batch_size, *input_size, device=device, dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with macs_counter() as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // 2 // batch_size
