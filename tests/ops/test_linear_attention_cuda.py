"""The Triton kernels compiled on a real GPU (``pytest -m cuda``; skipped without CUDA).

The interpreter tests (test_linear_attention.py) check the kernels' logic on the CPU in float32; these check what
only a GPU shows: the compiled code (tensor-core products in bf16 operands or tf32, autotuned tile configs, the
chunking at the GPU's size) against the naive reference, in bf16, fp16 and fp32, and whole models on the Triton
backend against the torch backend.
"""

from __future__ import annotations

import contextlib
import zlib

import pytest
import torch
from test_linear_attention import CASES, _assert_close, _cast, _inputs, _relative_error, _run, off_a_word

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# tf32 keeps 10 mantissa bits, bf16 7, fp16 10: the tolerances of each input dtype, relative to the largest value
TOLERANCES = {torch.float32: (2e-3, 5e-3), torch.bfloat16: (3e-2, 6e-2), torch.float16: (1e-2, 3e-2)}
# ...or this many times what rounding the inputs to the dtype alone moves the reference, where that is more: the
# plain ReLU map's normalizer is ill-conditioned at some keys, and bf16 inputs alone move its qkv and positional
# gradients by 0.07 / 0.23 of their largest value ("relu", measured in float64 on the CPU), whatever the kernel does
ROUNDING_FACTOR = 3.0


def _rounding_error(reference: str, qkv, kwargs, grad_out, expected, expected_grads, dtype) -> list[float]:
    """Per output (value, then each gradient): how far ``reference`` moves, in float64, when its inputs are first
    rounded to ``dtype``."""
    rounded_qkv, rounded_kwargs = _cast(qkv, kwargs, dtype, torch.device("cpu"))
    qkv64, kwargs64 = _cast(rounded_qkv, rounded_kwargs, torch.float64, torch.device("cpu"))
    out, grads = _run(reference, qkv64, kwargs64, grad_out.to(dtype).double())
    return [_relative_error(got, want) for got, want in zip([out, *grads], [expected, *expected_grads])]


def _pinned_config(label: str) -> tuple[int, int, int]:
    """A tile configuration for one test, rotated over TILE_CONFIGS by its name: every configuration is compiled and
    checked by some case, each case compiles once instead of once per configuration (autotuning every small case
    would take most of an hour of compiles)."""
    from linvit.ops.linear_attention.triton_geometry import TILE_CONFIGS

    return TILE_CONFIGS[zlib.crc32(label.encode()) % len(TILE_CONFIGS)]


OFF_A_WORD_CASE = "focused_head_dim_64"  # bf16 at head_dim 64: the forward's DWC multiply-adds too


def _compiled_agrees(reference: str, qkv, kwargs, dtype, pin: str | None = None, shift: bool = False) -> None:
    """The Triton backend on the GPU in ``dtype`` against ``reference`` on the CPU, in value and every gradient;
    with ``pin`` in the tile configuration :func:`_pinned_config` gives that label, else autotuned; with ``shift``
    q|k|v :func:`off_a_word`."""
    from linvit.ops.linear_attention.triton import pinned_tiles

    grad_out = torch.randn(qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3, dtype=qkv.dtype)
    expected, expected_grads = _run(reference, qkv, kwargs, grad_out)
    qkv_gpu, kwargs_gpu = _cast(qkv, kwargs, dtype, torch.device("cuda"))
    if shift:
        qkv_gpu = off_a_word(qkv_gpu)
    with pinned_tiles(_pinned_config(pin)) if pin else contextlib.nullcontext():
        out, grads = _run("triton", qkv_gpu, kwargs_gpu, grad_out.to("cuda", dtype))
    value_tolerance, grad_tolerance = TOLERANCES[dtype]
    rounding = _rounding_error(reference, qkv, kwargs, grad_out, expected, expected_grads, dtype)
    tolerances = [value_tolerance] + [grad_tolerance] * len(grads)
    for got, want, tolerance, moved in zip([out, *grads], [expected, *expected_grads], tolerances, rounding):
        _assert_close(got.float().cpu(), want, max(tolerance, ROUNDING_FACTOR * moved))


# every case in bf16 (the training dtype); fp16 and fp32 on a few that cover the kernels' paths: the focused map with
# a mask, head groups (ragged, with class token), windows
OTHER_DTYPE_CASES = ("focused", "focused_head_groups_ragged", "relu_windows")
DTYPE_CASES = [(name, torch.bfloat16) for name in sorted(CASES)] + [
    (name, dtype) for dtype in (torch.float16, torch.float32) for name in OTHER_DTYPE_CASES
]


@pytest.mark.parametrize("name, dtype", DTYPE_CASES, ids=lambda value: str(value).replace("torch.", ""))
def test_compiled_kernels_equal_naive(name, dtype):
    qkv, kwargs = _inputs(CASES[name], batch=3)
    _compiled_agrees("naive", qkv, kwargs, dtype, pin=f"{name}-{dtype}")


def test_compiled_bf16_values_off_a_word_are_read_without_pairs():
    """bf16 q|k|v whose rows do not start at whole 32-bit words (a paired read of v there would be misaligned): the
    forward's DWC reads v by values, the backward's reads dL/dout (a fresh tensor) in pairs."""
    qkv, kwargs = _inputs(CASES[OFF_A_WORD_CASE], batch=3)
    _compiled_agrees("naive", qkv, kwargs, torch.bfloat16, pin="off-a-word", shift=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_kernels_at_a_large_map_span_many_chunks(dtype):
    """A 96×80 map over several programs per batch element: the partial states and their reduction as a GPU runs
    them (the small cases fit one chunk)."""
    case = {"feature_map": "focused", "hw": (96, 80), "heads": 4, "head_dim": 32, "kernel": 5, "mask": True}
    qkv, kwargs = _inputs(case, dtype=torch.float32, batch=2)
    _compiled_agrees("torch", qkv, kwargs, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_head_groups_at_a_large_map_span_many_chunks(dtype):
    """5 × 64 heads (FLatten-PVTv2's third stage) in five head groups over many chunks: the norms pass, the
    per-group partial states and the cross-head pass as a GPU runs them."""
    case = {"feature_map": "focused", "hw": (64, 48), "heads": 5, "head_dim": 64, "kernel": 3, "mask": True}
    qkv, kwargs = _inputs(case, dtype=torch.float32, batch=2)
    _compiled_agrees("torch", qkv, kwargs, dtype)


# flatten_swin_tiny's 6 × 32 and flatten_pvt_v2_b1's 2, 5 and 8 × 64 heads run in head groups
MODEL_NAMES = ("linvit_nano", "flatten_swin_tiny_patch4_224", "flatten_pvt_v2_b0", "flatten_pvt_v2_b1")


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_models_on_the_triton_backend_equal_the_torch_backend(model_name):
    import timm

    import linvit  # noqa: F401
    from linvit.ops import use_backend
    from linvit.ops.linear_attention.triton import pinned_tiles

    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10).cuda().train()
    x = torch.randn(2, 3, 224, 224, device="cuda")
    outputs, gradients = {}, {}
    for backend in ("torch", "triton"):
        model.zero_grad(set_to_none=True)
        pin = pinned_tiles(_pinned_config(model_name)) if backend == "triton" else contextlib.nullcontext()
        with pin, use_backend(backend), torch.autocast("cuda", dtype=torch.bfloat16):
            torch.manual_seed(1)  # the same drop-path draws
            out = model(x)
        out.float().square().mean().backward()
        outputs[backend] = out.float()
        gradients[backend] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    _assert_close(outputs["triton"].cpu(), outputs["torch"].cpu(), 5e-2)
    _assert_close(gradients["triton"].cpu(), gradients["torch"].cpu(), 1e-1)
