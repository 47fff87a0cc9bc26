"""Fused Triton linear attention on a qkv projection, registered as torch custom ops.

The forward op (``torch.ops.linvit.linear_attention_qkv_forward``) returns the output and the fp32 partial states of
its token chunks (S, z and the kept-key counts; the kernels that consume them add them up), and with head groups the
focused map's per-token norms (else an empty tensor); the backward op
(``torch.ops.linvit.linear_attention_qkv_backward``) recomputes the feature maps from q|k|v and returns dL/dqkv and
the small gradients (inverse temperature, DWC weight and bias) as one fp32 vector. They are Triton ops
(``torch.library.triton_op``), so ``torch.compile`` sees the kernels, and autograd is registered on the forward op.
The launches are planned in `triton_launch.py` and `triton_launch_backward.py` (grids, chunking and the autotune
space in `triton_geometry.py`, the DWC's taps in `triton_taps.py`), a new shape's tile configurations compiled in
parallel before autotuning by `triton_precompile.py`; the kernels are described in `triton_forward.py`,
`triton_rows.py` and `triton_backward.py`, their tile helpers in `triton_tiles.py` and their feature maps in
`triton_feature_maps.py`.

Traffic per token (bf16, C channels): forward reads k|v (4C B), then q and the DWC taps of v (on a whole map each
value K times, one per horizontal tap: `triton_rows.py`), and writes the output (2C B); backward reads q and dL/dout
(4C B), k|v and dL/dout with its DWC taps (6C B), v and dL/dout again for the DWC weight (4C B), and writes dq|dk|dv
(6C B).
"""

import contextlib
import typing

import torch
import triton
from torch import Tensor
from torch._guards import detect_fake_mode

from linvit.ops._backend import interpreting
from linvit.ops.linear_attention import triton_geometry, triton_launch, triton_launch_backward, triton_precompile
from linvit.ops.linear_attention.arguments import LinearAttentionArguments
from linvit.ops.linear_attention.triton_feature_maps import ELU, FOCUSED, RELU
from linvit.ops.linear_attention.triton_geometry import KernelOptions
from linvit.ops.windows import window_keys

try:  # torch >= 2.6: Triton ops, whose kernels torch.compile sees
    from torch.library import triton_op, wrap_triton
except ImportError:  # pragma: no cover - older torch: opaque custom ops
    triton_op = wrap_triton = None


__all__ = ["linear_attention_qkv", "pinned_tiles"]

_MAP_CODES = {"focused": FOCUSED, "relu": RELU, "elu": ELU}


def _launch(kernel):
    return kernel if wrap_triton is None or interpreting() else wrap_triton(kernel)


# The ops' schemas; their scalar arguments are KernelOptions, in its order (ints as SymInt, for dynamic shapes).
_OPTIONS = ", ".join(
    f"{'SymInt' if kind is int else 'float'} {name}" for name, kind in typing.get_type_hints(KernelOptions).items()
)
_FORWARD_SCHEMA = (
    "(Tensor qkv, Tensor? inverse_temperature, Tensor? key_position, Tensor? dwc_weight, Tensor? dwc_bias, "
    f"Tensor? key_mask, {_OPTIONS}, bool prescaled) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    "(Tensor grad_out, Tensor qkv, Tensor partial_s, Tensor partial_z, Tensor partial_count, Tensor token_norms, "
    f"Tensor? inverse_temperature, Tensor? key_position, Tensor? dwc_weight, Tensor? key_mask, {_OPTIONS}, "
    "bool position_grad) -> (Tensor, Tensor, Tensor)"
)


def _custom_op(name: str, schema: str, fake):
    """Register ``fn`` as the op ``name`` with ``schema``: a Triton op where torch has them and takes the schema, else
    (torch 2.11, and under Triton's interpreter, whose kernels fake tensors cannot trace) a custom op with ``fake``
    as its shape function, which torch.compile calls without looking inside."""

    def register(fn):
        if triton_op is not None and not interpreting():
            try:
                return triton_op(name, mutates_args=(), schema=schema)(fn)
            except ValueError:  # torch 2.11's triton_op infers the schema and cannot read ``*scalars``: opaque op
                pass
        op = torch.library.custom_op(name, mutates_args=(), schema=schema)(fn)
        op.register_fake(fake)
        return op

    return register


def _forward_shapes(qkv: Tensor, *args) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward op's outputs without running it: (B, N, C) in qkv's dtype, the float32 partial states
    S (B, chunks, h, d, d), z (B, chunks, h, d) and kept-key counts (B, chunks), and the per-token norms."""
    channels = qkv.shape[2] // 3
    options = KernelOptions(*args[5:-1])
    walked = triton_geometry.geometry(qkv.shape[0], qkv.shape[1], options)
    batch, num_heads = walked.batch, options.num_heads
    head_dim = channels // num_heads
    groups = triton_geometry.head_groups(num_heads, head_dim)
    _, chunks = triton_geometry.num_chunks(batch, walked.tokens, qkv.device, groups=groups)
    floats = {"dtype": torch.float32}
    return (
        qkv.new_empty(qkv.shape[0], qkv.shape[1], channels),
        qkv.new_empty(batch, chunks, num_heads, head_dim, head_dim, **floats),
        qkv.new_empty(batch, chunks, num_heads, head_dim, **floats),
        qkv.new_empty(batch, chunks, **floats),
        qkv.new_empty(triton_launch.token_norms_shape(qkv.shape[0], qkv.shape[1], channels, options), **floats),
    )


def _backward_shapes(grad_out: Tensor, qkv: Tensor, partial_s: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
    """The backward op's outputs without running it: dqkv, the small gradients as one fp32 vector (the inverse
    temperature's C values, then the DWC weight's d·k·k and bias's d), and the positional table's gradient where
    the op sums it (`triton_launch_backward.sums_positions`; else empty)."""
    key_position, dwc_weight = args[4:6]  # after partial_z, partial_count, token_norms, inverse_temperature
    *options, position_grad = args[7:]
    channels, head_dim = qkv.shape[2] // 3, partial_s.shape[-1]
    width = channels + (0 if dwc_weight is None else head_dim * dwc_weight.shape[-1] ** 2 + head_dim)
    summed = position_grad and triton_launch_backward.sums_positions(key_position, KernelOptions(*options))
    return (
        torch.empty_like(qkv),
        qkv.new_empty(width, dtype=torch.float32),
        torch.empty_like(key_position, memory_format=torch.contiguous_format) if summed else qkv.new_empty(0),
    )


_tuned_kernels: dict[tuple, object] = {}  # by autotune key (`triton_precompile.autotune_key`)
_pinned: list[tuple[int, int, int]] = []  # the innermost pinned_tiles configuration, if any


@contextlib.contextmanager
def pinned_tiles(config: tuple[int, int, int]):
    """Launch the tiled kernels with one (tokens per tile, warps, pipeline stages) configuration instead of
    autotuning over ``triton_geometry.TILE_CONFIGS``: one compile per kernel and shape instead of one per configuration
    (the GPU test tier, which checks many small shapes). Any configuration gives the same result up to the order of
    fp32 sums: chunks are whole numbers of the largest tile."""
    if tuple(config) not in triton_geometry.TILE_CONFIGS:
        raise ValueError(f"pinned_tiles: {config} is not one of TILE_CONFIGS {triton_geometry.TILE_CONFIGS}")
    _pinned.append(tuple(config))
    try:
        yield
    finally:
        _pinned.pop()


def _tuned(launch: triton_geometry.Launch):
    """The launch's kernel wrapped in `triton.autotune` over the TILE_CONFIGS that do not spill registers at its
    shape (`triton_precompile.spill_free`), keyed on the shape's compile-time sizes, the tensors' dtypes and a bucket
    of N; one wrapper per autotune key, made on first use.

    The space is pruned here rather than by the autotuner's ``prune_configs_by``: torch's ``wrap_triton`` runs such
    a pruning itself and builds a new autotuner, with an empty cache, from its result on every call, so each call
    would autotune again (measured on an H200: 1.5 s per forward call). While torch.compile traces the op on fake
    tensors every configuration stays (inductor tunes the whole space), under a key of its own."""
    key = triton_precompile.autotune_key(launch)
    tensors = tuple(value for value in launch.args.values() if isinstance(value, Tensor))
    key += (detect_fake_mode(tensors) is not None,)
    if key not in _tuned_kernels:
        configs = [
            triton.Config({"BLOCK_N": block}, num_warps=warps, num_stages=stages)
            for block, warps, stages in triton_geometry.TILE_CONFIGS
        ]
        arguments = {**launch.args, **launch.constants, "N_BUCKET": triton_geometry.n_bucket(launch)}
        kept = triton_precompile.spill_free(launch.kernel)(configs, {}, **arguments)
        autotune_on = ["N_BUCKET", *triton_geometry.AUTOTUNE_SIZES]
        _tuned_kernels[key] = triton.autotune(configs=kept, key=autotune_on)(launch.kernel)
    return _tuned_kernels[key]


def _run(launches: list[triton_geometry.Launch]) -> None:
    if not _pinned and not interpreting():
        triton_precompile.precompile(launches)
    for launch in launches:
        if not launch.tuned:
            _launch(launch.kernel)[launch.grid](**launch.args, **launch.constants, num_warps=launch.num_warps)
        elif _pinned:
            block, warps, stages = _pinned[-1]
            _launch(launch.kernel)[launch.grid](
                **launch.args, **launch.constants, N_BUCKET=0, BLOCK_N=block, num_warps=warps, num_stages=stages
            )
        elif interpreting():
            block = triton_geometry.chunk_granularity()
            launch.kernel[launch.grid](**launch.args, **launch.constants, N_BUCKET=0, BLOCK_N=block)
        else:
            _launch(_tuned(launch))[launch.grid](
                **launch.args, **launch.constants, N_BUCKET=triton_geometry.n_bucket(launch)
            )


def _mask_bytes(key_mask: Tensor | None) -> Tensor | None:
    return None if key_mask is None else key_mask.contiguous().view(torch.uint8)


@_custom_op("linvit::linear_attention_qkv_forward", _FORWARD_SCHEMA, _forward_shapes)
def _forward(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    dwc_bias: Tensor | None,
    key_mask: Tensor | None,
    *scalars: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The output, the partial states and the per-token norms; ``scalars``: the KernelOptions, then prescaled."""
    *options, prescaled = scalars
    launches, out, partials = triton_launch.forward_plan(
        qkv, inverse_temperature, key_position, dwc_weight, dwc_bias, _mask_bytes(key_mask), KernelOptions(*options),
        prescaled,
    )  # fmt: skip
    _run(launches)
    return (out, *partials)


@_custom_op("linvit::linear_attention_qkv_backward", _BACKWARD_SCHEMA, _backward_shapes)
def _backward(
    grad_out: Tensor,
    qkv: Tensor,
    partial_s: Tensor,
    partial_z: Tensor,
    partial_count: Tensor,
    token_norms: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    key_mask: Tensor | None,
    *scalars: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dqkv, the small gradients and the positional table's (empty where not summed here); ``scalars``: the
    KernelOptions, then position_grad."""
    *options, position_grad = scalars
    launches, grad_qkv, small_grads, grad_position = triton_launch_backward.backward_plan(
        grad_out, qkv, (partial_s, partial_z, partial_count, token_norms), inverse_temperature, key_position,
        dwc_weight, _mask_bytes(key_mask), KernelOptions(*options), position_grad=position_grad,
    )  # fmt: skip
    _run(launches)
    return grad_qkv, small_grads, qkv.new_empty(0) if grad_position is None else grad_position


def _setup_context(ctx, inputs, output) -> None:
    qkv, inverse_temperature, key_position, dwc_weight, dwc_bias, key_mask = inputs[:6]
    _, *partials = output
    ctx.save_for_backward(qkv, *partials, inverse_temperature, key_position, dwc_weight, key_mask)
    *options, ctx.prescaled = inputs[6:]
    ctx.options = KernelOptions(*options)
    ctx.mark_non_differentiable(*partials)
    # the partials never get a gradient: without this autograd would launch a zero fill for each of them
    ctx.set_materialize_grads(False)


def _backward_from_autograd(ctx, grad_out: Tensor, *_):
    qkv, partial_s, partial_z, partial_count, token_norms, inverse_temperature, key_position, dwc_weight, key_mask = (
        ctx.saved_tensors
    )
    if grad_out is None:  # only the partials were used, which carry no gradient
        return (None,) * (6 + len(KernelOptions._fields) + 1)
    if ctx.prescaled:
        raise RuntimeError(
            "linear_attention_qkv(prescaled=True) is an inference path (the temperature folded into the projection): "
            "call it with prescaled=False when gradients are needed."
        )
    position_grad = key_position is not None and ctx.needs_input_grad[2]
    grad_qkv, small_grads, summed_position = _backward(
        grad_out.contiguous(), qkv, partial_s, partial_z, partial_count, token_norms, inverse_temperature,
        key_position, dwc_weight, key_mask, *ctx.options, position_grad,
    )  # fmt: skip
    channels, prefix = qkv.shape[-1] // 3, ctx.options.num_prefix_tokens
    grad_position = grad_weight = grad_bias = None
    if position_grad and triton_launch_backward.sums_positions(key_position, ctx.options):
        grad_position = summed_position  # summed over the batch by the backward's last kernel
    elif position_grad:
        grad_keys = grad_qkv[:, prefix:, channels : 2 * channels]  # dL/d(k + P) is dL/dk
        if ctx.options.window_h:  # per window token: the keys' gradient in windows, zero on the padding
            grad_keys = _window_keys(grad_keys, ctx.options)
        if key_position.shape[0] == 1:  # summed over the batch in fp32, without an fp32 copy of the keys' gradient
            grad_keys = grad_keys.sum(dim=0, keepdim=True, dtype=torch.float32)
        grad_position = grad_keys.to(key_position.dtype)
    if dwc_weight is not None:
        head_dim, size = dwc_weight.shape[0], dwc_weight.shape[-1]
        grad_weight = small_grads[channels : channels + head_dim * size * size].view(dwc_weight.shape)
        grad_weight = grad_weight.to(dwc_weight.dtype)
        grad_bias = small_grads[channels + head_dim * size * size :].to(dwc_weight.dtype)
    return (
        grad_qkv,
        small_grads[:channels].to(inverse_temperature.dtype) if inverse_temperature is not None else None,
        grad_position,
        grad_weight,
        grad_bias if ctx.needs_input_grad[4] else None,
    ) + (None,) * (len(KernelOptions._fields) + 2)  # the key mask, the options and prescaled


_forward.register_autograd(_backward_from_autograd, setup_context=_setup_context)


def _window_keys(keys: Tensor, options: KernelOptions) -> Tensor:
    """(B, N, C) tokens → (B · windows, window tokens, C), zero on the padding of the map to whole windows."""
    windows, valid = window_keys(keys, (options.grid_h, options.grid_w), (options.window_h, options.window_w))
    return windows if valid is None else windows * valid.unsqueeze(-1).to(windows.dtype)


def linear_attention_qkv(
    qkv: Tensor, arguments: LinearAttentionArguments, window: tuple[int, int] | None = None
) -> Tensor:
    """:func:`linvit.ops.linear_attention_qkv` on CUDA tensors, with its checked arguments; (B, N, C) in qkv's dtype.
    The kernels read the windows in place from the tokens (no partition copies)."""
    (
        hw, num_heads, feature_map, inverse_temperature, focusing_factor, key_position, dwc_weight, dwc_bias,
        key_mask, num_prefix_tokens, eps, feature_eps, prescaled, temperature_scale,
    ) = arguments  # fmt: skip
    if temperature_scale is not None:  # the op's temperature slot takes s; its kernels take 1 / softplus(s)
        inverse_temperature = temperature_scale
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    if key_position is not None:
        spatial = qkv.shape[1] - num_prefix_tokens if window is None else window[0] * window[1]
        key_position = key_position.reshape(-1, spatial, qkv.shape[-1] // 3).contiguous()
    if inverse_temperature is not None:
        inverse_temperature = inverse_temperature.contiguous()
    if dwc_weight is not None:
        dwc_weight = dwc_weight.contiguous()
    options = KernelOptions(
        hw[0], hw[1], num_heads, _MAP_CODES[feature_map], float(focusing_factor), num_prefix_tokens, float(eps),
        float(feature_eps), *(window or (0, 0)), int(temperature_scale is not None),
    )  # fmt: skip
    out, *_ = _forward(qkv, inverse_temperature, key_position, dwc_weight, dwc_bias, key_mask, *options, prescaled)
    return out
