"""How the backward's linear-attention kernels are launched: its plan (the forward's and the shared arguments are
`triton_launch.py`'s)."""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from linvit.ops._backend import interpreting
from linvit.ops.linear_attention import triton_backward, triton_geometry, triton_rows_backward, triton_taps
from linvit.ops.linear_attention.triton_feature_maps import NORMS_PER_TOKEN
from linvit.ops.linear_attention.triton_geometry import (
    ROW_WARPS,
    KernelOptions,
    Launch,
    RowWalk,
    geometry,
    head_groups,
    kernel_sizes,
    num_chunks,
    row_halo,
    row_walk,
    tile_trips,
    weight_items_per_program,
    weight_taps_per_program,
)
from linvit.ops.linear_attention.triton_launch import (
    optional_tensor,
    paired_images,
    position_stride,
    streams_rows,
    walk_arguments,
)
from linvit.ops.linear_attention.triton_taps import (
    bf16_pairs,
    dwc_constants,
    tap_buffer,
    tap_products,
    transposed_tap_products,
)

__all__ = ["backward_plan", "sums_positions"]

SUM_BLOCK = 128  # columns per program of the final sum of the small gradients
SUM_ROWS = 8  # rows it adds per step
POSITION_ELEMENTS = 4096  # a program's tile of the positional table's gradient: 32 tokens at C = 128
WEIGHT_ROW_HEADS = 4  # heads a program of the streamed DWC weight gradient holds (8 spilled: 6×32 by the cost figure)
WEIGHT_ROW_CHANNELS = 16  # channels a program of it holds: its products' diagonals, 16 the tensor cores' least
# channels of a head a program of the streamed transposed conv (value_conv_rows) holds: its taps' diagonal products do
# 16× the conv's multiply-adds, where all 32 of a head did 32× (at the benchmark shape it was bound by them: 0.112 ms
# by the cost figure, 0.068 so, bound by its issue); head dims are padded to 16 at least, so a block is 16 channels
CONV_BLOCK = 16


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
    position_grad: bool = False,
) -> tuple[list[Launch], Tensor, Tensor, Tensor | None]:
    """The backward's launches, dL/dqkv, the small gradients as one fp32 vector (the inverse temperature (C), then
    the DWC weight (d·k·k) and bias (d) when there is a DWC) and, where ``position_grad`` asks for it and
    :func:`sums_positions`, the positional table's gradient (its shape and dtype; None elsewhere)."""
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
    # rows of partials: one per chunk (the key kernel's temperature and, on the tiled path, bias columns), and where
    # the map is streamed in rows the weight kernel's and the transposed conv's (bias), as many as their programs
    streamed = _weight_strips(qkv, dwc_weight, options, multiprocessors)
    weight_rows = 0 if streamed is None else streamed.strip_bands * streamed.groups
    conv_walk = None
    if streamed is not None:  # the transposed conv's walk: the forward output's
        conv_walk = row_walk(images, options.grid_h, options.grid_w, num_heads, sizes["H_PAD"], qkv.device,
                             multiprocessors, conv_programs(num_heads, sizes))  # fmt: skip
    bias_rows = batch * chunks if conv_walk is None else conv_walk.strip_bands
    key_grads = torch.empty(max(batch * chunks, weight_rows, bias_rows), key_width, **floats)
    small_grads = torch.empty(width, **floats)
    inv = optional_tensor(inverse_temperature, qkv)
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
    # where the map is streamed in rows, the transposed DWC of dL/dout comes from a rows kernel (key_value_grad adds
    # it); the dS, dz partials that key_value_grad reads are query_grad's chunks, or where that kernel runs between
    # the two, one slot an image of their sums, which it adds up once
    value_conv, conv = None, None
    key_states = (partial_ds, partial_dz, partial_count)
    if conv_walk is not None:
        summed = tuple(torch.empty_like(part[:, :1]) for part in (partial_ds, partial_dz, partial_count))
        value_conv, conv = _value_conv(grad_out, dwc_weight, key_grads, key_width, sizes, conv_walk, options,
                                       key_states, summed)  # fmt: skip
        key_states = summed
    out_grad_args = {"do_ptr": grad_out, "do_stride_b": grad_out.stride(0), "do_stride_n": grad_out.stride(1)}
    grad_args = {"dqkv_ptr": grad_qkv, "dqkv_stride_b": grad_qkv.stride(0), "dqkv_stride_n": grad_qkv.stride(1)}
    dqk_args = {"dqk_ptr": dqk, "dqk_stride_b": dqk.stride(0), "dqk_stride_n": dqk.stride(1)}
    query = Launch(
        "query_grad",
        triton_backward.query_grad_kernel,
        (batch, chunks, groups),
        {
            **walk_arguments(qkv, chunk, walked),
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
            "w_ptr": optional_tensor(dwc_weight, qkv),
            "taps_ptr": taps,
            "eps": eps,
            "feature_eps": feature_eps,
        },
        {**sizes, **common, **dwc},
        lambda block: (chunks, trips(block)),
    )
    # two batch elements a program up to head dim 32: from 64 their two d × d states spill (8 B at 3×64 in every
    # configuration) or leave only slow configurations (FLatten-PVTv2-b1's stage 2: 0.42 -> 0.61 ms by the figure)
    images_a_program = paired_images(batch, key_position, walked, num_prefix_tokens) if sizes["D_PAD"] <= 32 else 1
    state_chunks = key_states[2].shape[1]
    key_value = Launch(
        "key_value_grad",
        triton_backward.key_value_grad_kernel,
        (batch // images_a_program, chunks, groups),
        {
            **walk_arguments(qkv, chunk, walked),
            **group_args,
            **out_grad_args,
            **grad_args,
            **dqk_args,
            "pos_ptr": optional_tensor(key_position, qkv),
            "inv_ptr": inv,
            "mask_ptr": optional_tensor(mask, qkv),
            "conv_ptr": optional_tensor(conv, qkv),
            "conv_stride_b": 0 if conv is None else conv.stride(0),
            "ds_ptr": key_states[0],
            "dz_ptr": key_states[1],
            "count_ptr": key_states[2],
            "state_chunks": state_chunks,
            "taps_ptr": taps,
            "grads_ptr": key_grads,
            "pos_stride_b": position_stride(key_position),
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
            "CONV_GIVEN": conv is not None,
            "IMAGES": images_a_program,
        },
        lambda block: _summing_loops(state_chunks) * images_a_program + (trips(block),),  # a sum per image
    )
    cross_head = Launch(
        "cross_head_grad",
        triton_backward.cross_head_grad_kernel,
        (batch, chunks, groups),
        {
            **walk_arguments(qkv, chunk, walked),
            **group_args,
            "pos_ptr": optional_tensor(key_position, qkv),
            "inv_ptr": inv,
            **dqk_args,
            **grad_args,
            "grads_ptr": query_grads,
            "cross_grads_ptr": cross_grads,
            "pos_stride_b": position_stride(key_position),
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
    if streamed is not None:
        weight, weight_programs = _streamed_weight_grad(qkv, grad_out, mask, key_grads, key_width, options,
                                                        kernel_size, streamed)  # fmt: skip
    else:
        weight, weight_programs = _tiled_weight_grad(qkv, grad_out, mask, key_grads, key_width, options, chunk, walked,
                                                     sizes, trips, items, kernel_size, multiprocessors)  # fmt: skip
    grad_position = None
    if position_grad and sums_positions(key_position, options):  # contiguous: the kernel writes token-major rows
        grad_position = torch.empty_like(key_position, memory_format=torch.contiguous_format)
    small_programs, positions = triton.cdiv(width, SUM_BLOCK), 0 if grad_position is None else grad_position.shape[1]
    position_tokens = max(1, POSITION_ELEMENTS // triton.next_power_of_2(channels)) if positions else 0
    position_programs = triton.cdiv(positions, position_tokens) if positions else 0
    sum_programs = small_programs + position_programs
    sum_trips = triton.cdiv(max(batch * chunks, weight_programs, bias_rows), SUM_ROWS) * small_programs / sum_programs
    total = Launch(
        "sum_grads",
        triton_backward.sum_rows_kernel,
        (sum_programs,),
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
            "bias_rows": bias_rows,
            "bias_width": head_dim,
            "dqkv_ptr": grad_qkv,
            "position_ptr": small_grads if grad_position is None else grad_position,
            "images": images,
            "positions": positions,
            "dqkv_stride_b": grad_qkv.stride(0),
            "dqkv_stride_n": grad_qkv.stride(1),
            "prefix": num_prefix_tokens,
        },
        {
            "BLOCK": SUM_BLOCK,
            "ROWS": SUM_ROWS,
            "BIAS_GROUPS": groups if dwc_weight is not None else 1,
            **softplus,
            "C": channels,
            "C_PAD": triton.next_power_of_2(channels),
            "POSITION_TOKENS": position_tokens,
        },
        # mean trips a program: the small gradients' rows in their programs, the images in the positions'
        lambda block: (sum_trips, images * position_programs / sum_programs) if positions else (sum_trips,),
        tuned=False,
        num_warps=4,
    )
    launches = [query] + ([] if value_conv is None else [value_conv]) + [key_value]
    launches += ([cross_head] if token_norms else []) + ([weight] if dwc_weight is not None else [])
    return launches + [total], grad_qkv, small_grads, grad_position


def _summing_loops(chunks: int, programs_per_sum: int = 1) -> tuple[float, ...]:
    """The mean trips a program of a loop over ``chunks`` partial slots, one program in ``programs_per_sum`` running
    it (the cost figure's trip counts): none for one slot, which Triton compiles as a constant and the loop away."""
    return (chunks / programs_per_sum,) if chunks > 1 else ()


def sums_positions(key_position: Tensor | None, options: KernelOptions) -> bool:
    """Whether the backward's last kernel sums the positional table's gradient over the batch (`triton_backward.
    _sum_positions`): a table shared by the batch, on a whole map (in windows the keys' gradient is first laid out per
    window token, a torch computation)."""
    return key_position is not None and key_position.shape[0] == 1 and not options.window_h


def conv_programs(num_heads: int, sizes: dict) -> int:
    """value_conv_rows's programs a (strip, band) piece of an image: a head group's blocks of CONV_BLOCK channels."""
    return triton.cdiv(num_heads, sizes["H_PAD"]) * (sizes["D_PAD"] // CONV_BLOCK)


def _value_conv(
    grad_out: Tensor, dwc_weight: Tensor, key_grads: Tensor, key_width: int, sizes: dict, walk: RowWalk,
    options: KernelOptions, partials: tuple[Tensor, Tensor, Tensor], summed: tuple[Tensor, Tensor, Tensor],
) -> tuple[Launch, Tensor]:  # fmt: skip
    """`triton_rows_backward.value_conv_rows_kernel`'s launch (strips in bands, ``walk``) and the transposed conv it
    writes, (images, H·W, C) in dL/dout's dtype; the bias's partials go to its program's row of key_grads, and the
    sums of query_grad's ``partials`` (dS, dz, counts) over each image's chunks to ``summed``."""
    chunks = partials[2].shape[1]
    images, map_h, map_w = grad_out.shape[0], options.grid_h, options.grid_w
    conv = torch.empty(images, map_h * map_w, grad_out.shape[-1], dtype=grad_out.dtype, device=grad_out.device)
    kernel_size = dwc_weight.shape[-1]
    words = triton_taps.row_words(grad_out, sizes["D"])
    launch = Launch(
        "value_conv_rows",
        triton_rows_backward.value_conv_rows_kernel,
        (images, walk.strips * walk.bands, conv_programs(options.num_heads, sizes)),
        {
            "do_ptr": grad_out,
            "w_ptr": dwc_weight,
            "conv_ptr": conv,
            "grads_ptr": key_grads,
            "ds_ptr": partials[0],
            "dz_ptr": partials[1],
            "count_ptr": partials[2],
            "sum_ds_ptr": summed[0],
            "sum_dz_ptr": summed[1],
            "sum_count_ptr": summed[2],
            "do_stride_b": grad_out.stride(0),
            "do_stride_n": grad_out.stride(1),
            "grads_width": key_width,
            "strips": walk.strips,
            "band_rows": walk.band_rows,
            "map_h": map_h,
            "map_w": map_w,
            "chunks": chunks,
        },
        {
            **{key: sizes[key] for key in ("H", "D", "H_PAD", "D_PAD")},
            "BLOCK_D": CONV_BLOCK,
            "STRIP": walk.strip,
            "K": kernel_size,
            **row_halo(kernel_size, sizes["H_PAD"], CONV_BLOCK, words),
            "TAP_DTYPE": tap_products(grad_out.dtype, sizes["D_PAD"])["TAP_DTYPE"],
            "GROUPED": words and kernel_size <= 5,  # `triton_rows.conv_row_block`
        },
        # the band's rows, and the partials' sum in one program of each image's strips, bands and blocks: mean trips
        lambda block: (
            (walk.band_rows + kernel_size - 1,)
            + _summing_loops(chunks, walk.strips * walk.bands * sizes["D_PAD"] // CONV_BLOCK)
        ),
        tuned=False,
        num_warps=ROW_WARPS,
    )
    return launch, conv


def _tiled_weight_grad(
    qkv: Tensor, grad_out: Tensor, mask: Tensor | None, key_grads: Tensor, key_width: int, options: KernelOptions,
    chunk: int, walked, sizes: dict, trips, items: int, kernel_size: int, multiprocessors: int | None,
) -> tuple[Launch, int]:  # fmt: skip
    """`triton_backward.dwc_weight_grad_kernel`'s launch (over the chunks or windows, up to three taps a program) and
    the rows of partials it writes."""
    num_heads, num_prefix_tokens, tokens = options.num_heads, options.num_prefix_tokens, walked.tokens
    head_dim = sizes["D"]
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
            **walk_arguments(qkv, chunk, walked),
            "mask_ptr": optional_tensor(mask, qkv),
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
    return weight, weight_programs


def _weight_strips(
    qkv: Tensor, dwc_weight: Tensor | None, options: KernelOptions, multiprocessors: int | None
) -> RowWalk | None:
    """The walk of `triton_rows_backward.dwc_weight_rows_kernel` (up to WEIGHT_ROW_HEADS heads and
    WEIGHT_ROW_CHANNELS channels a program, its bands sized as if it had one head group and one block of channels)
    where the forward streams its rows too (`triton_launch.streams_rows`: a whole map without class tokens, 16-bit
    inputs of head dims up to 32); None elsewhere, for the tiled kernel (by the cost figure the streamed one spills
    304 B at 2×64, 872 B in fp32)."""
    head_dim_pad = kernel_sizes(qkv.shape[-1] // 3, options.num_heads, qkv.dtype)["D_PAD"]
    whole_map = geometry(qkv.shape[0], qkv.shape[1], options)
    if not streams_rows(dwc_weight, whole_map, options.num_prefix_tokens, tap_products(qkv.dtype, head_dim_pad)):
        return None
    heads_pad = min(WEIGHT_ROW_HEADS, triton.next_power_of_2(options.num_heads))
    return row_walk(qkv.shape[0], options.grid_h, options.grid_w, options.num_heads, heads_pad, qkv.device,
                    multiprocessors, filling_groups=1)  # fmt: skip


def _streamed_weight_grad(
    qkv: Tensor, grad_out: Tensor, mask: Tensor | None, key_grads: Tensor, key_width: int, options: KernelOptions,
    dwc_kernel_size: int, walk: RowWalk,
) -> tuple[Launch, int]:  # fmt: skip
    """`triton_rows_backward.dwc_weight_rows_kernel`'s launch (strips in bands, ``walk``: :func:`_weight_strips`, a
    program per block of WEIGHT_ROW_CHANNELS channels) and the rows of partials it writes, one per strip, band, image
    and head group (each block of channels its own columns)."""
    sizes = kernel_sizes(qkv.shape[-1] // 3, options.num_heads, qkv.dtype)
    kernel_size, block_d = dwc_kernel_size, min(WEIGHT_ROW_CHANNELS, sizes["D_PAD"])
    launch = Launch(
        "dwc_weight_rows",
        triton_rows_backward.dwc_weight_rows_kernel,
        (walk.strip_bands, triton.cdiv(sizes["D_PAD"], WEIGHT_ROW_CHANNELS), walk.groups),
        {
            "qkv_ptr": qkv,
            "mask_ptr": optional_tensor(mask, qkv),
            "do_ptr": grad_out,
            "grads_ptr": key_grads,
            "stride_b": qkv.stride(0),
            "stride_n": qkv.stride(1),
            "do_stride_b": grad_out.stride(0),
            "do_stride_n": grad_out.stride(1),
            "mask_stride_b": qkv.shape[1],
            "grads_width": key_width,
            "strips": walk.strips,
            "bands": walk.bands,
            "band_rows": walk.band_rows,
            "map_h": options.grid_h,
            "map_w": options.grid_w,
        },
        {
            "H": options.num_heads,
            "D": sizes["D"],
            "H_PAD": walk.heads_pad,
            "BLOCK_D": block_d,
            "STRIP": walk.strip,
            "K": kernel_size,
            **row_halo(kernel_size, walk.heads_pad, block_d, triton_taps.row_words(qkv, sizes["D"])),
            "HAS_MASK": mask is not None,
            "HALF_DOT": qkv.dtype != torch.float32 and not interpreting(),
            "DOT_PRECISION": sizes["DOT_PRECISION"],
        },
        lambda block: (walk.band_rows + kernel_size - 1,),
        tuned=False,
        num_warps=ROW_WARPS,
    )
    return launch, walk.strip_bands * walk.groups
