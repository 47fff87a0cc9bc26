"""Matrix products that stay in float32 under autocast.

Autocast on CPU and GPU runs `mm`/`bmm`/`matmul` in bf16/fp16. The key-value state S = kᵀv/N and the normaliser of
linear attention are long sums of products of the (large, cubed) kernel features: in fp16 they overflow and in bf16
they lose most of their digits. These helpers switch autocast off for the product itself and compute in at least
float32 (float64 stays float64).

Modules that call them register them with `torch.fx.wrap("full_precision_bmm")`, so FX records one call instead of
tracing into the autocast context (whose device argument would be a Proxy). TorchScript cannot switch autocast off
for a device chosen at run time; a scripted module computes the products in the precision it is called with.
"""

import torch
from torch import Tensor


def at_least_float32(x: Tensor) -> Tensor:
    """`x` in float32 when it is a half type (fp16/bf16), unchanged otherwise (float32, float64)."""
    if x.dtype == torch.float16 or x.dtype == torch.bfloat16:
        return x.float()
    return x


def autocast_device_type(x: Tensor) -> str:
    """The device type whose autocast state governs `x`; "cpu" for devices that autocast does not know (meta).

    `torch.autocast(device_type="meta")` raises, and timm builds and checks models on the meta device.
    """
    device_type = x.device.type
    return device_type if torch.amp.is_autocast_available(device_type) else "cpu"


def full_precision_bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched `a @ b` in at least float32 with autocast off (a: (..., n, k), b: (..., k, m))."""
    a = at_least_float32(a)
    b = at_least_float32(b)
    if torch.jit.is_scripting():
        return torch.matmul(a, b)
    with torch.autocast(device_type=autocast_device_type(a), enabled=False):
        return torch.matmul(a, b)
