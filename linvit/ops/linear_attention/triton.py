"""Fused Triton linear attention on a qkv projection, registered as torch custom ops.

``torch.ops.linvit.linear_attention_qkv_forward`` returns the output and the per-head fp32 state (S, z);
``torch.ops.linvit.linear_attention_qkv_backward`` recomputes the feature maps from q|k|v and returns the gradients
of qkv, the inverse temperature and the DWC weight and bias. They are Triton ops (``torch.library.triton_op``), so
``torch.compile`` sees the kernels and fuses the rest of the block around them, and autograd is registered on the
forward op. The kernels and their memory traffic are described in `triton_forward.py`.

Traffic per token (bf16, C channels): forward reads k|v (4C B) and q|v plus the conv halo from cache (4C B), writes
the output (2C B); backward reads q|k|v and dout (two passes, 14C B) and writes dq|dk|dv (6C B).
"""

import functools

import torch
import triton
from torch import Tensor

from linvit.ops._backend import interpreting
from linvit.ops.linear_attention import triton_backward, triton_forward
from linvit.ops.linear_attention.triton_tiles import ELU, FOCUSED, RELU

try:  # torch >= 2.6: Triton ops, whose kernels torch.compile sees
    from torch.library import triton_op, wrap_triton
except ImportError:  # pragma: no cover - older torch: opaque custom ops
    triton_op = wrap_triton = None


__all__ = ["linear_attention_qkv"]

_MAP_CODES = {"focused": FOCUSED, "relu": RELU, "elu": ELU}


def _launch(kernel):
    return kernel if wrap_triton is None or interpreting() else wrap_triton(kernel)


def _custom_op(name: str, fake):
    """Register ``fn`` as the op ``name``: a Triton op where torch has them, else (and under Triton's interpreter,
    whose kernels fake tensors cannot trace) a custom op with ``fake`` as its shape function."""

    def register(fn):
        if triton_op is not None and not interpreting():
            return triton_op(name, mutates_args=())(fn)
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        return op

    return register


def _forward_shapes(qkv: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
    """The forward op's outputs without running it: (B, N, C) in qkv's dtype, float32 S (B, h, d, d) and z (B, h, d)."""
    batch, tokens, channels = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    num_heads = args[7]
    head_dim = channels // num_heads
    out = qkv.new_empty(batch, tokens, channels)
    state = qkv.new_empty(batch, num_heads, head_dim, head_dim, dtype=torch.float32)
    return out, state, qkv.new_empty(batch, num_heads, head_dim, dtype=torch.float32)


def _backward_shapes(grad_out: Tensor, qkv: Tensor, state: Tensor, *args) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward op's outputs without running it: dqkv, d(1/s) (C,), dw (d, 1, k, k), db (d,)."""
    dwc_weight = args[3]
    channels, head_dim = qkv.shape[2] // 3, state.shape[-1]
    kernel_size = 1 if dwc_weight is None else dwc_weight.shape[-1]
    floats = {"dtype": torch.float32}
    return (
        torch.empty_like(qkv),
        qkv.new_empty(channels, **floats),
        qkv.new_empty(head_dim, 1, kernel_size, kernel_size, **floats),
        qkv.new_empty(head_dim, **floats),
    )


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _chunking(qkv: Tensor, tokens: int, block: int, programs_per_chunk: int) -> tuple[int, int]:
    """(chunk length, number of chunks) of the token axis so that ~4 programs per SM run the reductions.

    Partial states cost 4·d² bytes per (chunk, head): one chunk per program alone (B·heads programs) leaves most
    SMs idle, one chunk per token tile writes more partials than tokens; a few programs per SM is the middle.
    """
    target = 8 if qkv.device.type != "cuda" else 4 * _multiprocessors(qkv.device.index or 0)
    tiles = triton.cdiv(tokens, block)
    chunks = max(1, min(tiles, triton.cdiv(target, programs_per_chunk)))
    chunk = triton.cdiv(tiles, chunks) * block
    return chunk, triton.cdiv(tokens, chunk)


def kernel_sizes(channels: int, head_dim: int, half_inputs: bool) -> dict:
    """The compile-time sizes of one shape: C, d, d padded to a power of two, the norm loop's block, dot precision."""
    return {
        "C": channels,
        "D": head_dim,
        "D_PAD": max(16, triton.next_power_of_2(head_dim)),
        "BLOCK_C": min(32, triton.next_power_of_2(channels)),
        # fp32 inputs keep fp32 products; half inputs lose more to their own rounding than to tf32's
        "DOT_PRECISION": "tf32" if half_inputs and not interpreting() else "ieee",
    }


def compile_time_sizes(sizes: dict) -> dict:
    """The compile-time sizes every kernel takes."""
    return {key: sizes[key] for key in ("C", "D", "D_PAD", "BLOCK_C", "DOT_PRECISION")}


# Tokens per tile and warps per program, per kernel and padded head dim: tiles that compile without spilling registers
# on sm_90 and leave room for 2-4 programs per SM (python -m benchmarks.kernel_resources prints every kernel's use;
# the query-grad kernel spills a few bytes at head_dim 64 and both token-grad kernels at 128). Not yet tuned on a GPU.
_LAUNCH = {
    "state": {16: (32, 4), 32: (16, 8), 64: (16, 8), 128: (16, 8)},
    "output": {16: (64, 8), 32: (32, 8), 64: (16, 8), 128: (16, 8)},
    "state_grad": {16: (64, 8), 32: (32, 8), 64: (16, 8), 128: (16, 8)},
    "query_grad": {16: (32, 8), 32: (16, 8), 64: (16, 8), 128: (16, 8)},
    "key_value_grad": {16: (16, 8), 32: (16, 8), 64: (16, 8), 128: (16, 8)},
}


def launch_config(kernel: str, head_pad: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) of a kernel ("state", "output", "state_grad", "query_grad", "key_value_grad") for a
    padded head dim."""
    return _LAUNCH[kernel][head_pad]


def _sizes(qkv: Tensor, num_heads: int) -> dict:
    channels = qkv.shape[-1] // 3
    return kernel_sizes(channels, channels // num_heads, qkv.dtype in (torch.float16, torch.bfloat16))


def _kept(key_mask: Tensor | None, qkv: Tensor) -> Tensor:
    """(B, 1, 1): the number of kept keys of each batch element (the mean form's N)."""
    if key_mask is None:
        return torch.full((qkv.shape[0], 1, 1), float(qkv.shape[1]), device=qkv.device)
    return key_mask.sum(dim=1).clamp_min(1).to(torch.float32).view(-1, 1, 1)


def _optional(tensor: Tensor | None, fallback: Tensor) -> Tensor:
    """A tensor argument for a kernel parameter its flags leave unread."""
    return fallback if tensor is None else tensor


@_custom_op("linvit::linear_attention_qkv_forward", _forward_shapes)
def _forward(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    dwc_bias: Tensor | None,
    key_mask: Tensor | None,
    grid_h: int,
    grid_w: int,
    num_heads: int,
    feature_map: int,
    focusing_factor: float,
    num_prefix_tokens: int,
    eps: float,
    feature_eps: float,
    prescaled: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    batch, tokens, _ = qkv.shape
    sizes = _sizes(qkv, num_heads)
    channels, head_dim = sizes["C"], sizes["D"]
    mask = None if key_mask is None else key_mask.contiguous().view(torch.uint8)
    block, warps = launch_config("state", sizes["D_PAD"])
    chunk, num_chunks = _chunking(qkv, tokens, block, batch * num_heads)
    partial_s = torch.empty(batch, num_chunks, num_heads, head_dim, head_dim, device=qkv.device)
    partial_z = torch.empty(batch, num_chunks, num_heads, head_dim, device=qkv.device)
    position_stride = 0 if key_position is None or key_position.shape[0] == 1 else key_position[0].numel()
    _launch(triton_forward.state_kernel)[(batch, num_chunks, num_heads)](
        qkv, _optional(key_position, qkv), _optional(inverse_temperature, qkv), _optional(mask, qkv),
        partial_s, partial_z,
        tokens, qkv.stride(0), qkv.stride(1), position_stride, tokens, num_prefix_tokens, chunk, feature_eps,
        BLOCK_N=block, MAP=feature_map, POWER=focusing_factor, PRESCALED=prescaled,
        HAS_POS=key_position is not None, HAS_MASK=mask is not None, **compile_time_sizes(sizes), num_warps=warps,
    )  # fmt: skip
    kept = _kept(key_mask, qkv)
    state = partial_s.sum(dim=1) / kept.unsqueeze(-1)  # a fixed order: the same sums on every run
    normaliser = partial_z.sum(dim=1) / kept
    out = torch.empty(batch, tokens, channels, device=qkv.device, dtype=qkv.dtype)
    kernel_size = 1 if dwc_weight is None else dwc_weight.shape[-1]
    block, warps = launch_config("output", sizes["D_PAD"])
    _launch(triton_forward.output_kernel)[(batch, triton.cdiv(tokens, block))](
        qkv, _optional(inverse_temperature, qkv), _optional(mask, qkv), state, normaliser,
        _optional(dwc_weight, qkv), _optional(dwc_bias, qkv), out,
        tokens, qkv.stride(0), qkv.stride(1), out.stride(0), out.stride(1), tokens, num_prefix_tokens, grid_h,
        grid_w, eps, feature_eps,
        H=num_heads, BLOCK_N=block, K=kernel_size, MAP=feature_map, POWER=focusing_factor, PRESCALED=prescaled,
        HAS_MASK=mask is not None, HAS_DWC=dwc_weight is not None, HAS_BIAS=dwc_bias is not None,
        **compile_time_sizes(sizes), num_warps=warps,
    )  # fmt: skip
    return out, state, normaliser


@_custom_op("linvit::linear_attention_qkv_backward", _backward_shapes)
def _backward(
    grad_out: Tensor,
    qkv: Tensor,
    state: Tensor,
    normaliser: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    key_mask: Tensor | None,
    grid_h: int,
    grid_w: int,
    num_heads: int,
    feature_map: int,
    focusing_factor: float,
    num_prefix_tokens: int,
    eps: float,
    feature_eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    batch, tokens, _ = qkv.shape
    sizes = _sizes(qkv, num_heads)
    channels, head_dim = sizes["C"], sizes["D"]
    mask = None if key_mask is None else key_mask.contiguous().view(torch.uint8)
    dims = compile_time_sizes(sizes)
    block, warps = launch_config("state_grad", sizes["D_PAD"])
    chunk, num_chunks = _chunking(qkv, tokens, block, batch * num_heads)
    partial_ds = torch.empty(batch, num_chunks, num_heads, head_dim, head_dim, device=qkv.device)
    partial_dz = torch.empty(batch, num_chunks, num_heads, head_dim, device=qkv.device)
    _launch(triton_backward.state_grad_kernel)[(batch, num_chunks, num_heads)](
        qkv, _optional(inverse_temperature, qkv), state, normaliser, grad_out, partial_ds, partial_dz,
        tokens, qkv.stride(0), qkv.stride(1), grad_out.stride(0), grad_out.stride(1), num_prefix_tokens, chunk,
        eps, feature_eps, BLOCK_N=block, MAP=feature_map, POWER=focusing_factor, **dims, num_warps=warps,
    )  # fmt: skip
    kept = _kept(key_mask, qkv)
    state_grad = partial_ds.sum(dim=1) / kept.unsqueeze(-1)
    normaliser_grad = partial_dz.sum(dim=1) / kept

    kernel_size = 1 if dwc_weight is None else dwc_weight.shape[-1]
    grad_qkv = torch.empty(batch, tokens, 3 * channels, device=qkv.device, dtype=qkv.dtype)
    head_pad = triton.next_power_of_2(num_heads)
    block, warps = launch_config("query_grad", sizes["D_PAD"])
    chunk, num_chunks = _chunking(qkv, tokens, block, batch)
    query_dinv = torch.zeros(batch, num_chunks, channels, device=qkv.device)
    _launch(triton_backward.query_grad_kernel)[(batch, num_chunks)](
        qkv, _optional(inverse_temperature, qkv), state, normaliser, grad_out, grad_qkv, query_dinv,
        tokens, qkv.stride(0), qkv.stride(1), grad_out.stride(0), grad_out.stride(1), grad_qkv.stride(0),
        grad_qkv.stride(1), num_prefix_tokens, chunk, eps, feature_eps,
        H=num_heads, H_PAD=head_pad, BLOCK_N=block, MAP=feature_map, POWER=focusing_factor, **dims, num_warps=warps,
    )  # fmt: skip
    block, warps = launch_config("key_value_grad", sizes["D_PAD"])
    chunk, num_chunks = _chunking(qkv, tokens, block, batch)
    key_dinv = torch.zeros(batch, num_chunks, channels, device=qkv.device)
    partial_dw = torch.zeros(batch, num_chunks, head_dim, kernel_size * kernel_size, device=qkv.device)
    partial_db = torch.zeros(batch, num_chunks, head_dim, device=qkv.device)
    position_stride = 0 if key_position is None or key_position.shape[0] == 1 else key_position[0].numel()
    _launch(triton_backward.key_value_grad_kernel)[(batch, num_chunks)](
        qkv, _optional(key_position, qkv), _optional(inverse_temperature, qkv), _optional(mask, qkv), state_grad,
        normaliser_grad, _optional(dwc_weight, qkv), grad_out, grad_qkv, key_dinv, partial_dw, partial_db,
        tokens, qkv.stride(0), qkv.stride(1), grad_out.stride(0), grad_out.stride(1), grad_qkv.stride(0),
        grad_qkv.stride(1), position_stride, tokens, num_prefix_tokens, chunk, grid_h, grid_w, feature_eps,
        H=num_heads, H_PAD=head_pad, BLOCK_N=block, K=kernel_size,
        KK_PAD=triton.next_power_of_2(kernel_size * kernel_size), MAP=feature_map, POWER=focusing_factor,
        HAS_POS=key_position is not None, HAS_MASK=mask is not None, HAS_DWC=dwc_weight is not None, **dims,
        num_warps=warps,
    )  # fmt: skip
    grad_inverse = query_dinv.sum(dim=(0, 1)) + key_dinv.sum(dim=(0, 1))
    grad_weight = partial_dw.sum(dim=(0, 1)).view(head_dim, 1, kernel_size, kernel_size)
    grad_bias = partial_db.sum(dim=(0, 1))
    return grad_qkv, grad_inverse, grad_weight, grad_bias


def _setup_context(ctx, inputs, output) -> None:
    qkv, inverse_temperature, key_position, dwc_weight, dwc_bias, key_mask = inputs[:6]
    _, state, normaliser = output
    ctx.save_for_backward(qkv, state, normaliser, inverse_temperature, key_position, dwc_weight, key_mask)
    ctx.options = inputs[6:]
    ctx.mark_non_differentiable(state, normaliser)


def _backward_from_autograd(ctx, grad_out: Tensor, grad_state: Tensor, grad_normaliser: Tensor):
    qkv, state, normaliser, inverse_temperature, key_position, dwc_weight, key_mask = ctx.saved_tensors
    grid_h, grid_w, num_heads, feature_map, focusing_factor, prefix, eps, feature_eps, prescaled = ctx.options
    if prescaled:
        raise RuntimeError(
            "linear_attention_qkv(prescaled=True) is an inference path (the temperature folded into the projection): "
            "call it with prescaled=False when gradients are needed."
        )
    grad_qkv, grad_inverse, grad_weight, grad_bias = _backward(
        grad_out.contiguous(), qkv, state, normaliser, inverse_temperature, key_position, dwc_weight, key_mask,
        grid_h, grid_w, num_heads, feature_map, focusing_factor, prefix, eps, feature_eps,
    )  # fmt: skip
    grad_position = None
    if key_position is not None and ctx.needs_input_grad[2]:
        channels = qkv.shape[-1] // 3
        grad_keys = grad_qkv[:, prefix:, channels : 2 * channels].float()  # dL/d(k + P) is dL/dk
        if key_position.shape[0] == 1:
            grad_keys = grad_keys.sum(dim=0, keepdim=True)
        grad_position = grad_keys.to(key_position.dtype)
    return (
        grad_qkv,
        grad_inverse.to(inverse_temperature.dtype) if inverse_temperature is not None else None,
        grad_position,
        grad_weight.to(dwc_weight.dtype) if dwc_weight is not None else None,
        grad_bias.to(dwc_weight.dtype) if ctx.needs_input_grad[4] and dwc_weight is not None else None,
    ) + (None,) * 10


_forward.register_autograd(_backward_from_autograd, setup_context=_setup_context)


def linear_attention_qkv(
    qkv: Tensor,
    *,
    hw: tuple[int, int],
    num_heads: int,
    feature_map: str = "focused",
    inverse_temperature: Tensor | None = None,
    focusing_factor: float = 3.0,
    key_position: Tensor | None = None,
    dwc_weight: Tensor | None = None,
    dwc_bias: Tensor | None = None,
    key_mask: Tensor | None = None,
    num_prefix_tokens: int = 0,
    eps: float = 1e-6,
    feature_eps: float = 1e-6,
    prescaled: bool = False,
) -> Tensor:
    """See :func:`linvit.ops.linear_attention_qkv`; returns (B, N, C) in qkv's dtype."""
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    if key_position is not None:
        key_position = key_position.reshape(-1, qkv.shape[1] - num_prefix_tokens, qkv.shape[-1] // 3).contiguous()
    if inverse_temperature is not None:
        inverse_temperature = inverse_temperature.contiguous()
    if dwc_weight is not None:
        dwc_weight = dwc_weight.contiguous()
    out, _, _ = _forward(
        qkv, inverse_temperature, key_position, dwc_weight, dwc_bias, key_mask, hw[0], hw[1], num_heads,
        _MAP_CODES[feature_map], float(focusing_factor), num_prefix_tokens, float(eps), float(feature_eps), prescaled,
    )  # fmt: skip
    return out
