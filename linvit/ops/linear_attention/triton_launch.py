"""How the linear-attention kernels are launched: the forward's and the backward's plans.

A plan is a list of :class:`~linvit.ops.linear_attention.triton_geometry.Launch` (kernel, grid, arguments,
compile-time constants, the trip counts of its runtime loops). The custom ops in `triton.py` run the plans;
``python -m benchmarks.kernel_resources --cost`` compiles the same plans for sm_90 without a GPU and counts what they
issue. One source for both keeps the count honest. The shapes and the chunking are `triton_geometry.py`'s, the DWC's
taps `triton_taps.py`'s.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from linvit.ops._backend import interpreting
from linvit.ops.linear_attention import triton_backward, triton_forward, triton_geometry, triton_rows, triton_taps
from linvit.ops.linear_attention.triton_feature_maps import FOCUSED, NORMS_PER_TOKEN
from linvit.ops.linear_attention.triton_geometry import (
    ROW_WARPS,
    Geometry,
    KernelOptions,
    Launch,
    geometry,
    head_groups,
    kernel_sizes,
    num_chunks,
    row_bands,
    row_strip,
    tile_trips,
    weight_items_per_program,
    weight_taps_per_program,
)
from linvit.ops.linear_attention.triton_taps import (
    bf16_pairs,
    dwc_constants,
    tap_buffer,
    tap_products,
    transposed_tap_products,
)

__all__ = ["backward_plan", "forward_plan", "token_norms_shape"]

SUM_BLOCK = 128  # columns per program of the final sum of the small gradients
SUM_ROWS = 8  # rows it adds per step


def _optional(tensor: Tensor | None, fallback: Tensor) -> Tensor:
    """A tensor argument for a kernel parameter its flags leave unread."""
    return fallback if tensor is None else tensor


def _walk(qkv: Tensor, chunk: int, walked: Geometry) -> dict:
    """The arguments every tiled kernel takes to walk its chunk of the projection output's tokens (in windows, of a
    window's tokens)."""
    return {
        "qkv_ptr": qkv,
        "N": walked.tokens,
        "stride_b": qkv.stride(0),
        "stride_n": qkv.stride(1),
        "chunk": chunk,
        "grid_h": walked.grid[0],
        "grid_w": walked.grid[1],
        **walked.args,
    }


def _position_stride(key_position: Tensor | None) -> int:
    return 0 if key_position is None or key_position.shape[0] == 1 else key_position[0].numel()


def token_norms_shape(images: int, map_tokens: int, channels: int, options: KernelOptions) -> tuple[int, ...]:
    """The shape of the focused map's per-token norms the forward hands the backward: (images, N, 6) fp32 (the keys'
    m, ‖â‖², ‖â^p‖², then the queries') where the heads are split into groups, else (0,) (nothing to hand)."""
    grouped = head_groups(options.num_heads, channels // options.num_heads) > 1
    return (images, map_tokens, NORMS_PER_TOKEN.value) if grouped and options.feature_map == FOCUSED else (0,)


def forward_plan(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    dwc_bias: Tensor | None,
    mask: Tensor | None,
    options: KernelOptions,
    prescaled: bool,
    multiprocessors: int | None = None,
) -> tuple[list[Launch], Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The forward's launches, its output (B, N, C) and what the backward needs: the partial states (S, z, kept) and
    the focused map's per-token norms (:func:`token_norms_shape`).

    ``mask`` is the key mask as uint8 (or None)."""
    num_heads, feature_map, focusing_factor = options.num_heads, options.feature_map, options.focusing_factor
    num_prefix_tokens, eps, feature_eps = options.num_prefix_tokens, options.eps, options.feature_eps
    images, map_tokens, _ = qkv.shape
    walked = geometry(images, map_tokens, options)
    batch, tokens = walked.batch, walked.tokens
    channels = qkv.shape[-1] // 3
    sizes = kernel_sizes(channels, num_heads, qkv.dtype)
    head_dim, groups = sizes["D"], head_groups(num_heads, sizes["D"])
    chunk, chunks = num_chunks(batch, tokens, qkv.device, multiprocessors, groups)
    floats = {"device": qkv.device, "dtype": torch.float32}
    partial_s = torch.empty(batch, chunks, num_heads, head_dim, head_dim, **floats)
    partial_z = torch.empty(batch, chunks, num_heads, head_dim, **floats)
    partial_count = torch.empty(batch, chunks, **floats)
    norms = torch.empty(token_norms_shape(images, map_tokens, channels, options), **floats)
    token_norms = norms.numel() > 0
    dwc = {**dwc_constants(dwc_weight), **tap_products(qkv.dtype, sizes["D_PAD"])}
    taps = tap_buffer(dwc_weight, qkv, dwc, sizes["D_PAD"])
    out = torch.empty(images, map_tokens, channels, device=qkv.device, dtype=qkv.dtype)
    flags = {"MAP": feature_map, "POWER": focusing_factor, "PRESCALED": prescaled, "HAS_MASK": mask is not None,
             **walked.window_constants, "TOKEN_NORMS": token_norms,
             "SOFTPLUS": bool(options.temperature_scale)}  # fmt: skip
    trips = tile_trips(tokens, chunk, chunks)
    norms_args = {"norms_ptr": norms if token_norms else qkv, "norms_stride_b": map_tokens * NORMS_PER_TOKEN.value}
    state = Launch(
        "state",
        triton_forward.state_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **norms_args,
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": _optional(inverse_temperature, qkv),
            "mask_ptr": _optional(mask, qkv),
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "w_ptr": _optional(dwc_weight, qkv),
            "taps_ptr": taps,
            "pos_stride_b": _position_stride(key_position),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "feature_eps": feature_eps,
        },
        {**sizes, **flags, "HAS_POS": key_position is not None, **dwc, "ROWS_FIRST": triton_taps.ROWS_FIRST},
        lambda block: (trips(block),),
    )
    output_sizes = {key: value for key, value in sizes.items() if key != "HALF_DOT"}
    if streams_rows(dwc_weight, walked, num_prefix_tokens, dwc):
        state.constants["HAS_DWC"] = False  # the rows kernel reads the weight itself: no taps to copy
        partials = (partial_s, partial_z, partial_count)
        output = _output_rows(qkv, inverse_temperature, mask, partials, norms_args, dwc_weight, dwc_bias, out,
                              {**output_sizes, **flags}, chunks, multiprocessors, options)  # fmt: skip
    else:
        output = Launch(
            "output",
            triton_forward.output_kernel,
            (batch, chunks, groups),
            {
                **_walk(qkv, chunk, walked),
                **norms_args,
                "inv_ptr": _optional(inverse_temperature, qkv),
                "mask_ptr": _optional(mask, qkv),
                "s_ptr": partial_s,
                "z_ptr": partial_z,
                "count_ptr": partial_count,
                "taps_ptr": taps,
                "bias_ptr": _optional(dwc_bias, qkv),
                "out_ptr": out,
                "out_stride_b": out.stride(0),
                "out_stride_n": out.stride(1),
                "mask_stride_b": tokens,
                "prefix": num_prefix_tokens,
                "eps": eps,
                "feature_eps": feature_eps,
            },
            {
                **output_sizes,
                **flags,
                **dwc,
                **bf16_pairs(qkv, head_dim, dwc, walked.windowed),
                "HAS_BIAS": dwc_bias is not None,
                "ROWS_FIRST": triton_taps.ROWS_FIRST,
            },
            lambda block: (chunks, trips(block)),
        )
    launches = [state, output]
    if token_norms:
        norms_pass = _token_norms(qkv, inverse_temperature, key_position, norms, options, prescaled, multiprocessors)
        launches.insert(0, norms_pass)
    return launches, out, (partial_s, partial_z, partial_count, norms)


def streams_rows(dwc_weight: Tensor | None, walked: Geometry, num_prefix_tokens: int, products: dict) -> bool:
    """Whether the forward's output comes from `triton_rows.output_rows_kernel`: a DWC multiplied on the tensor
    cores (``products``: `triton_taps.tap_products`; 16-bit inputs of head dims up to 32) on a whole map of spatial
    tokens only. Else (windows, class tokens, no DWC, fp32 inputs or wider heads) `triton_forward.output_kernel`."""
    return dwc_weight is not None and not walked.windowed and num_prefix_tokens == 0 and bool(products["TENSOR_TAPS"])


def _output_rows(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    mask: Tensor | None,
    partials: tuple[Tensor, Tensor, Tensor],
    norms_args: dict,
    dwc_weight: Tensor,
    dwc_bias: Tensor | None,
    out: Tensor,
    constants: dict,
    chunks: int,
    multiprocessors: int | None,
    options: KernelOptions,
) -> Launch:
    """The launch of `triton_rows.output_rows_kernel`: strips (`triton_geometry.row_strip`) in bands of rows
    (`triton_geometry.row_bands`), the state kernel's ``chunks`` partial states per image."""
    images, map_h, map_w = qkv.shape[0], options.grid_h, options.grid_w
    groups = triton.cdiv(constants["H"], constants["H_PAD"])
    strip = row_strip(constants["H_PAD"])
    strips, band_rows, bands = row_bands(images, map_h, map_w, groups, strip, qkv.device, multiprocessors)
    partial_s, partial_z, partial_count = partials
    constants = {key: value for key, value in constants.items() if key not in ("WINDOW_H", "WINDOW_W")}
    kernel_size = dwc_weight.shape[-1]
    return Launch(
        "output_rows",
        triton_rows.output_rows_kernel,
        (images, strips * bands, groups),
        {
            "qkv_ptr": qkv,
            **norms_args,
            "inv_ptr": _optional(inverse_temperature, qkv),
            "mask_ptr": _optional(mask, qkv),
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "w_ptr": dwc_weight,
            "bias_ptr": _optional(dwc_bias, qkv),
            "out_ptr": out,
            "stride_b": qkv.stride(0),
            "stride_n": qkv.stride(1),
            "out_stride_b": out.stride(0),
            "out_stride_n": out.stride(1),
            "mask_stride_b": qkv.shape[1],
            "chunks": chunks,
            "strips": strips,
            "band_rows": band_rows,
            "map_h": map_h,
            "map_w": map_w,
            "eps": options.eps,
            "feature_eps": options.feature_eps,
        },
        {
            **constants,
            "STRIP": strip,
            "K": kernel_size,
            "HAS_BIAS": dwc_bias is not None,
            "TAP_DTYPE": tap_products(qkv.dtype, constants["D_PAD"])["TAP_DTYPE"],
        },  # fmt: skip
        lambda block: (chunks, band_rows + kernel_size - 1),
        tuned=False,
        num_warps=ROW_WARPS,
    )


def _token_norms(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    norms: Tensor,
    options: KernelOptions,
    prescaled: bool,
    multiprocessors: int | None,
) -> Launch:
    """The launch that fills ``norms``: every head of a token in one program, so chunked as a kernel without head
    groups."""
    walked = geometry(qkv.shape[0], qkv.shape[1], options)
    sizes = kernel_sizes(qkv.shape[-1] // 3, options.num_heads, qkv.dtype)
    chunk, chunks = num_chunks(walked.batch, walked.tokens, qkv.device, multiprocessors)
    trips = tile_trips(walked.tokens, chunk, chunks)
    return Launch(
        "token_norms",
        triton_forward.token_norms_kernel,
        (walked.batch, chunks),
        {
            **_walk(qkv, chunk, walked),
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": _optional(inverse_temperature, qkv),
            "norms_ptr": norms,
            "pos_stride_b": _position_stride(key_position),
            "norms_stride_b": norms[0].numel(),
            "prefix": options.num_prefix_tokens,
            "feature_eps": options.feature_eps,
        },
        {
            "H": sizes["H"],
            "D": sizes["D"],
            "H_PAD": triton.next_power_of_2(options.num_heads),
            "D_PAD": sizes["D_PAD"],
            "POWER": options.focusing_factor,
            "PRESCALED": prescaled,
            "HAS_POS": key_position is not None,
            **walked.window_constants,
            "ROWS_FIRST": triton_taps.ROWS_FIRST,
            "SOFTPLUS": bool(options.temperature_scale),
        },
        lambda block: (trips(block),),
    )


def backward_plan(
    grad_out: Tensor,
    qkv: Tensor,
    partials: tuple[Tensor, Tensor, Tensor, Tensor],
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    mask: Tensor | None,
    options: KernelOptions,
    multiprocessors: int | None = None,
) -> tuple[list[Launch], Tensor, Tensor]:
    """The backward's launches, dL/dqkv, and the small gradients as one fp32 vector: the inverse temperature (C),
    then the DWC weight (d·k·k) and bias (d) when there is a DWC."""
    num_heads, feature_map, focusing_factor = options.num_heads, options.feature_map, options.focusing_factor
    num_prefix_tokens, eps, feature_eps = options.num_prefix_tokens, options.eps, options.feature_eps
    partial_s, partial_z, partial_count, norms = partials
    _, chunks = partial_count.shape
    images, map_tokens, _ = qkv.shape
    walked = geometry(images, map_tokens, options)
    batch, tokens = walked.batch, walked.tokens
    channels = qkv.shape[-1] // 3
    sizes = kernel_sizes(channels, num_heads, qkv.dtype)
    head_dim, groups = sizes["D"], head_groups(num_heads, sizes["D"])
    chunk, planned = num_chunks(batch, tokens, qkv.device, multiprocessors, groups)
    if planned != chunks:
        raise ValueError(f"the forward's partial states hold {chunks} chunks, this device plans {planned}")
    trips = tile_trips(tokens, chunk, chunks)
    floats = {"device": qkv.device, "dtype": torch.float32}
    grad_qkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
    partial_ds = torch.empty_like(partial_s)
    partial_dz = torch.empty_like(partial_z)
    token_norms = norms.numel() > 0
    # each token's share of the focused map's cross-head sum per head group: the queries', then the keys'
    cross = torch.empty(images, map_tokens, 2, groups, **floats) if token_norms else qkv
    # dq | dk without the cross-head term, which cross_head_grad reads to write them into dL/dqkv with it: a buffer of
    # their own, so that no launch reads what it writes (an in-place sum under autotune adds its term once per run)
    dqk = torch.empty(images, map_tokens, 2 * channels, dtype=qkv.dtype, device=qkv.device) if token_norms else grad_qkv
    kernel_size = 1 if dwc_weight is None else dwc_weight.shape[-1]
    weight_end = channels + (head_dim * kernel_size * kernel_size if dwc_weight is not None else 0)
    width = weight_end + (head_dim if dwc_weight is not None else 0)
    key_width = width + (groups - 1) * head_dim if dwc_weight is not None else width  # a bias share per group
    query_grads = torch.empty(batch * chunks, channels, **floats)
    # the queries' temperature partials with the cross-head term's share (cross_head_grad's rows; sum_rows adds them)
    cross_grads = torch.empty_like(query_grads) if token_norms else query_grads
    key_grads = torch.empty(batch * chunks, key_width, **floats)
    small_grads = torch.empty(width, **floats)
    inv = _optional(inverse_temperature, qkv)
    dwc = {**dwc_constants(dwc_weight), **transposed_tap_products(qkv.dtype, sizes["H_PAD"], sizes["D_PAD"])}
    taps = tap_buffer(dwc_weight, qkv, dwc, sizes["D_PAD"])
    softplus = {"SOFTPLUS": bool(options.temperature_scale)}  # inv holds the parameter s: kernels take 1/softplus(s)
    common = {"MAP": feature_map, "POWER": focusing_factor, **walked.window_constants, "TOKEN_NORMS": token_norms,
              **softplus}  # fmt: skip
    group_args = {
        "norms_ptr": norms if token_norms else qkv,
        "cross_ptr": cross,
        "norms_stride_b": map_tokens * NORMS_PER_TOKEN.value,
        "cross_stride_b": map_tokens * 2 * groups,
    }
    out_grad_args = {"do_ptr": grad_out, "do_stride_b": grad_out.stride(0), "do_stride_n": grad_out.stride(1)}
    grad_args = {"dqkv_ptr": grad_qkv, "dqkv_stride_b": grad_qkv.stride(0), "dqkv_stride_n": grad_qkv.stride(1)}
    dqk_args = {"dqk_ptr": dqk, "dqk_stride_b": dqk.stride(0), "dqk_stride_n": dqk.stride(1)}
    query = Launch(
        "query_grad",
        triton_backward.query_grad_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **group_args,
            **out_grad_args,
            **dqk_args,
            "inv_ptr": inv,
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "ds_ptr": partial_ds,
            "dz_ptr": partial_dz,
            "grads_ptr": query_grads,
            "w_ptr": _optional(dwc_weight, qkv),
            "taps_ptr": taps,
            "eps": eps,
            "feature_eps": feature_eps,
        },
        {**sizes, **common, **dwc},
        lambda block: (chunks, trips(block)),
    )
    key_value = Launch(
        "key_value_grad",
        triton_backward.key_value_grad_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **group_args,
            **out_grad_args,
            **grad_args,
            **dqk_args,
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": inv,
            "mask_ptr": _optional(mask, qkv),
            "ds_ptr": partial_ds,
            "dz_ptr": partial_dz,
            "count_ptr": partial_count,
            "taps_ptr": taps,
            "grads_ptr": key_grads,
            "pos_stride_b": _position_stride(key_position),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "grads_width": key_width,
            "feature_eps": feature_eps,
        },
        {
            **sizes,
            **common,
            **dwc,
            **bf16_pairs(grad_out, head_dim, dwc, walked.windowed),
            "HAS_POS": key_position is not None,
            "HAS_MASK": mask is not None,
        },
        lambda block: (chunks, trips(block)),
    )
    cross_head = Launch(
        "cross_head_grad",
        triton_backward.cross_head_grad_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **group_args,
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": inv,
            **dqk_args,
            **grad_args,
            "grads_ptr": query_grads,
            "cross_grads_ptr": cross_grads,
            "pos_stride_b": _position_stride(key_position),
            "prefix": num_prefix_tokens,
            "feature_eps": feature_eps,
        },
        {
            **{key: sizes[key] for key in ("H", "D", "H_PAD", "D_PAD")},
            "POWER": focusing_factor,
            "HAS_POS": key_position is not None,
            **walked.window_constants,
            **softplus,
        },
        lambda block: (trips(block),),
    )
    items = batch * chunks
    heads_pad = triton.next_power_of_2(num_heads)
    taps = weight_taps_per_program(heads_pad, sizes["D_PAD"])
    tap_programs = triton.cdiv(kernel_size * kernel_size, taps)
    per_program = weight_items_per_program(
        items, tap_programs, multiprocessors or triton_geometry.device_multiprocessors(qkv.device)
    )
    weight_programs = triton.cdiv(items, per_program)
    weight = Launch(
        "dwc_weight_grad",
        triton_backward.dwc_weight_grad_kernel,
        (weight_programs, tap_programs),
        {
            **_walk(qkv, chunk, walked),
            "mask_ptr": _optional(mask, qkv),
            "do_ptr": grad_out,
            "grads_ptr": key_grads,
            "do_stride_b": grad_out.stride(0),
            "do_stride_n": grad_out.stride(1),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "grads_width": key_width,
            "items": items,
            "items_per_program": per_program,
        },
        {
            "H": num_heads,
            "D": head_dim,
            "H_PAD": heads_pad,
            **{key: sizes[key] for key in ("D_PAD", "DOT_PRECISION")},
            "K": kernel_size,
            "TAPS": taps,
            "HAS_MASK": mask is not None,
            **walked.window_constants,
            "HALF_DOT": qkv.dtype != torch.float32 and not interpreting(),
            "ROWS_FIRST": triton_taps.ROWS_FIRST,
        },
        # one item per program: the launcher makes items_per_program the constant 1, and the item loop is gone
        lambda block: (trips(block),) if per_program == 1 else (items / weight_programs, trips(block)),
    )
    total = Launch(
        "sum_grads",
        triton_backward.sum_rows_kernel,
        (triton.cdiv(width, SUM_BLOCK),),
        {
            "keys_ptr": key_grads,
            "queries_ptr": cross_grads,
            "scale_ptr": inv,
            "out_ptr": small_grads,
            "rows": batch * chunks,
            "width": width,
            "key_width": key_width,
            "query_width": channels,
            "weight_end": weight_end,
            "weight_rows": weight_programs,
            "bias_width": head_dim,
        },
        {"BLOCK": SUM_BLOCK, "ROWS": SUM_ROWS, "BIAS_GROUPS": groups if dwc_weight is not None else 1, **softplus},
        lambda block: (triton.cdiv(batch * chunks, SUM_ROWS),),
        tuned=False,
        num_warps=4,
    )
    launches = [query, key_value] + ([cross_head] if token_norms else []) + ([weight] if dwc_weight is not None else [])
    return launches + [total], grad_qkv, small_grads
