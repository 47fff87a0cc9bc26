"""Every family, forward and backward, under bf16 and fp16 autocast (CPU; also CUDA where present) with activations
scaled up to std 16 and down to 1e-3: no NaN/Inf, and outputs and gradients close to fp32.

Each family runs as its smallest registered variant, with fewer blocks, at 32x32. The scaling multiplies the input
image and, through forward pre-hooks, the input of every linear-attention module, where the kernel maps and the
key/value reductions live. Softmax (window) attention inputs are not scaled: with q and k x16 its logits grow 256x and
the softmax turns into an argmax that no low precision reproduces (timm's own swin_tiny: relative error 0.65, gradient
cosine 0.01 in bf16), which says nothing about linvit. At x1e-3 the gradients of a random network are dominated by
rounding in LayerNorm's backward (timm's own pvt_v2_b0: gradient cosine 0.52 in bf16), so there only finiteness of the
gradients is asserted.
"""

import pytest
import torch
from _families import create_shallow, smallest_variant_per_family

import linvit  # noqa: F401
from linvit.attention import FocusedLinearAttention

SCALES = (16.0, 1.0, 1e-3)
# relative L2 error of the features / cosine of the gradient against fp32, through a whole (random) network
# measured (CPU): at most 0.015 (bf16) and 0.002 (fp16) relative error, gradient cosine >= 0.98 / 0.999
FEATURE_TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}
GRADIENT_COSINE = {torch.bfloat16: 0.95, torch.float16: 0.99}
GRADIENT_SCALES = (16.0, 1.0)


def _is_linear_attention(module: torch.nn.Module) -> bool:
    name = type(module).__name__
    return isinstance(module, FocusedLinearAttention) or (name.endswith("Attention") and "Linear" in name)


def _scale_attention_inputs(model: torch.nn.Module, scale: float) -> list:
    handles = []
    for module in model.modules():
        if _is_linear_attention(module):

            def pre_hook(_, args, scale=scale):
                return (args[0] * scale, *args[1:])

            handles.append(module.register_forward_pre_hook(pre_hook))
    return handles


def _run(model, x, scale, device_type, dtype):
    handles = _scale_attention_inputs(model, scale)
    try:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
            features = model.forward_features(x * scale)
        loss = features.float().pow(2).mean()
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    return features.detach().float(), grads


def _precisions(device_type: str) -> tuple:
    # CPU autocast runs matmuls in fp16 too (torch >= 2.1), so fp16's narrow range is exercised without a GPU
    return (torch.bfloat16, torch.float16)


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(  # in the GPU tier (pytest -m cuda): the fused kernels under autocast on a GPU
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")],
    ),
]


@pytest.mark.parametrize("device_type", DEVICES)
@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_autocast_forward_backward_is_finite_and_close_to_fp32(name, device_type):
    torch.manual_seed(0)
    model = create_shallow(name, num_classes=0).eval().to(device_type)
    x = torch.randn(2, 3, 32, 32, device=device_type)
    for scale in SCALES:
        reference, reference_grads = _run(model, x, scale, device_type, None)
        assert torch.isfinite(reference).all() and torch.isfinite(reference_grads).all(), f"fp32 at scale {scale}"
        for dtype in _precisions(device_type):
            features, grads = _run(model, x, scale, device_type, dtype)
            where = f"{name} {device_type} {dtype} activations x{scale}"
            assert torch.isfinite(features).all(), f"{where}: non-finite features"
            assert torch.isfinite(grads).all(), f"{where}: non-finite gradients"
            error = ((features - reference).norm() / reference.norm().clamp_min(1e-12)).item()
            assert error < FEATURE_TOLERANCE[dtype], f"{where}: features off by {error:.3g} (relative L2)"
            if scale in GRADIENT_SCALES:
                cosine = torch.nn.functional.cosine_similarity(grads, reference_grads, dim=0).item()
                assert cosine > GRADIENT_COSINE[dtype], f"{where}: gradient cosine {cosine:.4f} against fp32"
