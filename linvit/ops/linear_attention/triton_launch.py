"""How the linear-attention kernels are launched: the forward's plan, and the arguments every plan's tiled kernels
take (the backward's plan is `triton_launch_backward.py`).

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

from linvit.ops.linear_attention import triton_forward, triton_rows, triton_taps
from linvit.ops.linear_attention.triton_feature_maps import FOCUSED, NORMS_PER_TOKEN
from linvit.ops.linear_attention.triton_geometry import (
    Geometry,
    KernelOptions,
    Launch,
    geometry,
    head_groups,
    head_splits,
    kernel_sizes,
    num_chunks,
    output_row_warps,
    row_halo,
    row_walk,
    tile_trips,
)
from linvit.ops.linear_attention.triton_taps import (
    bf16_pairs,
    dwc_constants,
    row_words,
    tap_buffer,
    tap_products,
)

__all__ = [
    "forward_plan",
    "optional_tensor",
    "position_stride",
    "streams_rows",
    "token_norms_shape",
    "walk_arguments",
]


def optional_tensor(tensor: Tensor | None, fallback: Tensor) -> Tensor:
    """A tensor argument for a kernel parameter its flags leave unread."""
    return fallback if tensor is None else tensor


def walk_arguments(qkv: Tensor, chunk: int, walked: Geometry) -> dict:
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


def position_stride(key_position: Tensor | None) -> int:
    return 0 if key_position is None or key_position.shape[0] == 1 else key_position[0].numel()


def paired_images(batch: int, key_position: Tensor | None, walked: Geometry, num_prefix_tokens: int) -> int:
    """Batch elements a program of the state and key-gradient kernels takes: 2 where they share a positional table
    (one for the whole batch, an even batch of whole maps without class tokens), which the program then reads once
    for both (in fp32 it is as many bytes as a token's keys and values together); else 1."""
    shared = key_position is not None and position_stride(key_position) == 0
    return 2 if shared and batch % 2 == 0 and not walked.windowed and num_prefix_tokens == 0 else 1


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
    rows = streams_rows(dwc_weight, walked, num_prefix_tokens, dwc)
    images_a_program = paired_images(batch, key_position, walked, num_prefix_tokens)
    state = Launch(
        "state",
        triton_forward.state_kernel,
        (batch // images_a_program, chunks, groups),
        {
            **walk_arguments(qkv, chunk, walked),
            **norms_args,
            "pos_ptr": optional_tensor(key_position, qkv),
            "inv_ptr": optional_tensor(inverse_temperature, qkv),
            "mask_ptr": optional_tensor(mask, qkv),
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "w_ptr": optional_tensor(dwc_weight, qkv),
            "taps_ptr": taps,
            "pos_stride_b": position_stride(key_position),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "feature_eps": feature_eps,
        },
        # the rows kernel reads the weight itself: no taps to copy
        {
            **sizes,
            **flags,
            "HAS_POS": key_position is not None,
            **dwc,
            "HAS_DWC": dwc["HAS_DWC"] and not rows,
            "ROWS_FIRST": triton_taps.ROWS_FIRST,
            "IMAGES": images_a_program,
        },  # fmt: skip
        lambda block: (trips(block),),
    )
    if rows:
        partials = (partial_s, partial_z, partial_count)
        output = _output_rows(qkv, inverse_temperature, mask, partials, norms_args, dwc_weight, dwc_bias, out,
                              {**sizes, **flags, "TAP_DTYPE": dwc["TAP_DTYPE"]}, chunks, multiprocessors,
                              options)  # fmt: skip
    else:
        output = Launch(
            "output",
            triton_forward.output_kernel,
            (batch, chunks, groups),
            {
                **walk_arguments(qkv, chunk, walked),
                **norms_args,
                "inv_ptr": optional_tensor(inverse_temperature, qkv),
                "mask_ptr": optional_tensor(mask, qkv),
                "s_ptr": partial_s,
                "z_ptr": partial_z,
                "count_ptr": partial_count,
                "taps_ptr": taps,
                "bias_ptr": optional_tensor(dwc_bias, qkv),
                "out_ptr": out,
                "out_stride_b": out.stride(0),
                "out_stride_n": out.stride(1),
                "mask_stride_b": tokens,
                "prefix": num_prefix_tokens,
                "eps": eps,
                "feature_eps": feature_eps,
            },
            {
                **sizes,
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
    """The launch of `triton_rows.output_rows_kernel`: strips in bands of rows (`triton_geometry.row_walk`), the state
    kernel's ``chunks`` partial states per image; ``constants``: the sizes and flags, with the taps' TAP_DTYPE."""
    images, map_h, map_w = qkv.shape[0], options.grid_h, options.grid_w
    warps = output_row_warps(constants["H_PAD"])
    walk = row_walk(images, map_h, map_w, constants["H"], constants["H_PAD"], qkv.device, multiprocessors,
                    warps=warps)  # fmt: skip
    words = row_words(qkv, constants["D"])
    # heads of 32 in two halves of 16 channels (`triton_rows.conv_row_halves`), read as words, up to DWC 5; other
    # rows in words except at two heads of 17-32 (linvit_tiny's first stage at DWC 7), where they spill 8 B
    halves = words and constants["D_PAD"] == 32 and dwc_weight.shape[-1] <= 5 and not constants["TOKEN_NORMS"]
    words = words and (halves or (constants["H_PAD"], constants["D_PAD"]) != (2, 32))
    partial_s, partial_z, partial_count = partials
    constants = {key: value for key, value in constants.items() if key not in ("WINDOW_H", "WINDOW_W")}
    kernel_size = dwc_weight.shape[-1]
    return Launch(
        "output_rows",
        triton_rows.output_rows_kernel,
        (images, walk.strips * walk.bands, walk.groups),
        {
            "qkv_ptr": qkv,
            **norms_args,
            "inv_ptr": optional_tensor(inverse_temperature, qkv),
            "mask_ptr": optional_tensor(mask, qkv),
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "w_ptr": dwc_weight,
            "bias_ptr": optional_tensor(dwc_bias, qkv),
            "out_ptr": out,
            "stride_b": qkv.stride(0),
            "stride_n": qkv.stride(1),
            "out_stride_b": out.stride(0),
            "out_stride_n": out.stride(1),
            "mask_stride_b": qkv.shape[1],
            "chunks": chunks,
            "strips": walk.strips,
            "band_rows": walk.band_rows,
            "map_h": map_h,
            "map_w": map_w,
            "eps": options.eps,
            "feature_eps": options.feature_eps,
        },
        {
            **constants,
            "STRIP": walk.strip,
            "K": kernel_size,
            # each row read once with its halo, except beside the head groups' norms (its gathers spill there)
            **(
                {"HALO": 0, "WORDS": False}
                if constants["TOKEN_NORMS"]
                else row_halo(kernel_size, constants["H_PAD"], constants["D_PAD"], words, warps)
            ),
            "HAS_BIAS": dwc_bias is not None,
            "HALVES": halves,
            "SPLITS": head_splits(constants["H_PAD"], warps),
        },  # fmt: skip
        lambda block: (chunks, walk.band_rows + kernel_size - 1),
        tuned=False,
        num_warps=warps,
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
            **walk_arguments(qkv, chunk, walked),
            "pos_ptr": optional_tensor(key_position, qkv),
            "inv_ptr": optional_tensor(inverse_temperature, qkv),
            "norms_ptr": norms,
            "pos_stride_b": position_stride(key_position),
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
