"""Forward Triton kernels of non-causal linear attention on a qkv projection (the backward ones are in
`triton_backward.py`, the tile helpers in `triton_tiles.py`).

Only bytes moved should count (head_dim 32 gives ~13 FLOP per byte), so the kernels read q|k|v straight from the
(B, N, 3C) projection output through its strides, recompute the feature maps instead of storing them, and keep only
fp32 partial states between the passes. The grid of every kernel is (batch, token chunk): a chunk is a run of tiles
that one program walks, and the number of chunks is chosen so that the programs fill the GPU once (see
`triton_launch.py`); with head groups (see `triton_tiles.py`) it has a third axis, over the groups. Two launches,
three for the focused map with head groups:

- ``token_norms_kernel`` (head groups, focused map only): each token's m, ‖â‖², ‖â^p‖² over all C channels of its
  key (with the positional term) and its query, which the head-group programs cannot see;
- ``state_kernel``: the partial S = Σ φ(k) vᵀ (H × D × D, one batched tensor-core product per tile with fp32
  accumulation), z = Σ φ(k) and the number of kept keys of one chunk (of two batch elements where they share the
  positional table: `triton_launch.paired_images`);
- ``output_kernel``: sums the partials of its batch element in a fixed order (deterministic) and scales them by the
  number of kept keys, then for each tile φ(q)·S / (φ(q)·z + eps) (the numerator a tensor-core product, the
  normaliser an fp32 sum) plus the depthwise conv of v (`triton_tiles.depthwise_conv`: each tap gathered once for
  all C channels, and for 16-bit inputs multiplied on the tensor cores), written as (B, N, C). On a whole map with
  a DWC and no class tokens the output comes instead from `triton_rows.output_rows_kernel`, which streams the DWC
  down strips of the map and reads each value K times instead of K² (`triton_launch.streams_rows`).

Every kernel (here and in `triton_backward.py`) lists its parameters by kind, a line or two each: tensors, run-time
scalars, compile-time constants.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention import triton_feature_maps as maps
from linvit.ops.linear_attention import triton_tiles as tiles


@triton.jit
def state_kernel(
    qkv_ptr, pos_ptr, inv_ptr, mask_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, w_ptr, taps_ptr,
    N, stride_b, stride_n, pos_stride_b, mask_stride_b, norms_stride_b, prefix, chunk, feature_eps, grid_h, grid_w,
    map_h, map_w, windows, windows_w, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    MAP: tl.constexpr, POWER: tl.constexpr, PRESCALED: tl.constexpr, HAS_POS: tl.constexpr,
    HAS_MASK: tl.constexpr, HALF_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr, TOKEN_NORMS: tl.constexpr,
    HAS_DWC: tl.constexpr, K: tl.constexpr, TENSOR_TAPS: tl.constexpr, TAP_DTYPE: tl.constexpr,
    ROWS_FIRST: tl.constexpr,
    SOFTPLUS: tl.constexpr = False, IMAGES: tl.constexpr = 1,
):  # fmt: skip
    """Partial S, z and kept-key count of the keys of chunk t of batch element b (its group's heads); the first
    program also copies the DWC weight in the form the output kernel's taps multiply. ROWS_FIRST: the tiles' layout
    (`triton_tiles.load_rows`). ``IMAGES`` 2 (whole maps, a positional table shared by the batch): the program takes
    batch elements 2b and 2b + 1, and reads each tile of the table once for both (in fp32 it is as many bytes as the
    keys and values together: 1,033 → 777 B a token at the benchmark shape)."""
    if IMAGES > 1:
        _paired_state(qkv_ptr, pos_ptr, inv_ptr, mask_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, w_ptr, taps_ptr, N,
                      stride_b, stride_n, mask_stride_b, norms_stride_b, chunk, feature_eps, H, D, H_PAD, D_PAD,
                      BLOCK_N, MAP, POWER, PRESCALED, HAS_MASK, HALF_DOT, DOT_PRECISION, TOKEN_NORMS, HAS_DWC, K,
                      TENSOR_TAPS, TAP_DTYPE, ROWS_FIRST, SOFTPLUS, IMAGES)  # fmt: skip
        return
    b, t, grid_h, grid_w, image, top, left = tiles.program_element(grid_h, grid_w, windows, windows_w, WINDOW_H,
                                                                    WINDOW_W)  # fmt: skip
    WINDOWED: tl.constexpr = WINDOW_H > 0
    k_base = qkv_ptr + image.to(tl.int64) * stride_b + H * D
    v_base = k_base + H * D
    pos_base = pos_ptr + b.to(tl.int64) * pos_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    norms_base = norms_ptr + image.to(tl.int64) * norms_stride_b  # the keys' (m, ‖â‖², ‖â^p‖²)
    if HAS_DWC:
        tiles.copy_taps_major(w_ptr, taps_ptr, D, D_PAD, K, TENSOR_TAPS, TAP_DTYPE)
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    acc_s = tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32)
    acc_z = tl.zeros([H_PAD, BLOCK_N, D_PAD], tl.float32)
    kept = tl.zeros([BLOCK_N], tl.float32)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    for row0 in tl.range(start, stop, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        places, real = tiles.token_places(rows, top, left, grid_w, map_h, map_w, WINDOWED)
        keep = tiles.unmasked((rows < stop) & real, mask_base, rows, HAS_MASK)
        ok = keep[None, :, None] & channel_ok
        x = tiles.load_keys(k_base, places, rows, ok, stride_n, pos_base, prefix, channels, inv, H * D, HAS_POS,
                            PRESCALED, ROWS_FIRST)  # fmt: skip
        m, sq_a, sq_y = maps.load_norms(norms_base, places, keep, TOKEN_NORMS)
        phi = maps.features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, PRESCALED, TOKEN_NORMS)
        phi = tl.where(ok, phi, 0.0)
        v = tiles.load_rows(v_base + places[None, :, None] * stride_n + channels, ok, 0.0, ROWS_FIRST)
        if HALF_DOT:  # bf16 operands, fp32 accumulation
            acc_s = tiles.head_dot(tl.permute(phi.to(v.dtype), (0, 2, 1)), v, acc_s, H_PAD, DOT_PRECISION)
        else:
            acc_s = tiles.head_dot(tl.permute(phi, (0, 2, 1)), v.to(tl.float32), acc_s, H_PAD, DOT_PRECISION)
        acc_z += phi
        kept += keep.to(tl.float32)
    slot = (b * tl.num_programs(1) + t).to(tl.int64)
    tiles.store_state(s_ptr, z_ptr, slot, acc_s, tl.sum(acc_z, axis=1), head0, H, D, H_PAD, D_PAD)
    if head0 == 0:  # every group counts the same keys
        tl.store(count_ptr + slot, tl.sum(kept, axis=0))


@triton.jit
def _paired_state(
    qkv_ptr, pos_ptr, inv_ptr, mask_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, w_ptr, taps_ptr,
    N, stride_b, stride_n, mask_stride_b, norms_stride_b, chunk, feature_eps,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    MAP: tl.constexpr, POWER: tl.constexpr, PRESCALED: tl.constexpr, HAS_MASK: tl.constexpr, HALF_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TOKEN_NORMS: tl.constexpr, HAS_DWC: tl.constexpr, K: tl.constexpr,
    TENSOR_TAPS: tl.constexpr, TAP_DTYPE: tl.constexpr, ROWS_FIRST: tl.constexpr, SOFTPLUS: tl.constexpr,
    IMAGES: tl.constexpr,
):  # fmt: skip
    """`state_kernel` for IMAGES batch elements from IMAGES · ``program_id(0)`` on a whole map with a positional table
    shared by the batch, each tile of the table read once for all of them."""
    first = tl.program_id(0) * IMAGES
    t = tl.program_id(1)
    if HAS_DWC:
        tiles.copy_taps_major(w_ptr, taps_ptr, D, D_PAD, K, TENSOR_TAPS, TAP_DTYPE)
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    acc_s = ()
    acc_z = ()
    kept = ()
    for _ in tl.static_range(IMAGES):
        acc_s = acc_s + (tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32),)
        acc_z = acc_z + (tl.zeros([H_PAD, BLOCK_N, D_PAD], tl.float32),)
        kept = kept + (tl.zeros([BLOCK_N], tl.float32),)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    for row0 in tl.range(start, stop, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        in_chunk = (rows < stop)[None, :, None] & channel_ok
        position = tiles.key_position(pos_ptr, rows, in_chunk, 0, channels, inv, H * D, True, PRESCALED, ROWS_FIRST)
        summed_s = ()
        summed_z = ()
        counted = ()
        for i in tl.static_range(IMAGES):
            image = (first + i).to(tl.int64)
            keep = tiles.unmasked(rows < stop, mask_ptr + image * mask_stride_b, rows, HAS_MASK)
            ok = keep[None, :, None] & channel_ok
            x = tiles.load_tile(qkv_ptr + image * stride_b + H * D, rows, ok, stride_n, channels, ROWS_FIRST)
            x = x + position
            m, sq_a, sq_y = maps.load_norms(norms_ptr + image * norms_stride_b, rows, keep, TOKEN_NORMS)
            phi = maps.features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, PRESCALED, TOKEN_NORMS)
            phi = tl.where(ok, phi, 0.0)
            v = tiles.load_rows(qkv_ptr + image * stride_b + 2 * H * D + rows[None, :, None] * stride_n + channels, ok,
                                0.0, ROWS_FIRST)  # fmt: skip
            if HALF_DOT:  # bf16 operands, fp32 accumulation
                product = tiles.head_dot(tl.permute(phi.to(v.dtype), (0, 2, 1)), v, acc_s[i], H_PAD, DOT_PRECISION)
            else:
                product = tiles.head_dot(tl.permute(phi, (0, 2, 1)), v.to(tl.float32), acc_s[i], H_PAD,
                                         DOT_PRECISION)  # fmt: skip
            summed_s = summed_s + (product,)
            summed_z = summed_z + (acc_z[i] + phi,)
            counted = counted + (kept[i] + keep.to(tl.float32),)
        acc_s = summed_s
        acc_z = summed_z
        kept = counted
    for i in tl.static_range(IMAGES):
        slot = ((first + i) * tl.num_programs(1) + t).to(tl.int64)
        tiles.store_state(s_ptr, z_ptr, slot, acc_s[i], tl.sum(acc_z[i], axis=1), head0, H, D, H_PAD, D_PAD)
        if head0 == 0:  # every group counts the same keys
            tl.store(count_ptr + slot, tl.sum(kept[i], axis=0))


@triton.jit
def output_kernel(
    qkv_ptr, inv_ptr, mask_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, taps_ptr, bias_ptr, out_ptr,
    N, stride_b, stride_n, out_stride_b, out_stride_n, mask_stride_b, norms_stride_b, prefix, chunk, grid_h, grid_w,
    eps, feature_eps, map_h, map_w, windows, windows_w, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    K: tl.constexpr, MAP: tl.constexpr, POWER: tl.constexpr, PRESCALED: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_DWC: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, TENSOR_TAPS: tl.constexpr,
    TAP_DTYPE: tl.constexpr, BF16_PAIRS: tl.constexpr, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr,
    TOKEN_NORMS: tl.constexpr, ROWS_FIRST: tl.constexpr,
    SOFTPLUS: tl.constexpr = False, HALF_DOT: tl.constexpr = False,
):  # fmt: skip
    """out = φ(q) S / (φ(q)·z + eps) (+ DWC(v) on spatial tokens) for the tokens of chunk t of batch element b (its
    group's heads). ROWS_FIRST: the tiles' layout (`triton_tiles.load_rows`)."""
    b, t, grid_h, grid_w, image, top, left = tiles.program_element(grid_h, grid_w, windows, windows_w, WINDOW_H,
                                                                    WINDOW_W)  # fmt: skip
    WINDOWED: tl.constexpr = WINDOW_H > 0
    q_base = qkv_ptr + image.to(tl.int64) * stride_b
    v_base = q_base + 2 * H * D
    out_base = out_ptr + image.to(tl.int64) * out_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    norms_base = norms_ptr + image.to(tl.int64) * norms_stride_b + 3  # the queries' (m, ‖â‖², ‖â^p‖²)
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    dims = tl.arange(0, D_PAD)[None, None, :]
    s, z = tiles.reduced_state(s_ptr, z_ptr, count_ptr, b, tl.num_programs(1), head0, H, D, H_PAD, D_PAD)
    s = tiles.state_operand(s, HALF_DOT)
    bias = tl.zeros([1, 1, D_PAD], tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + dims, mask=dims < D, other=0.0).to(tl.float32)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    # not pipelined with tensor-core taps: the pipeliner would multi-buffer every tap's gathered rows and diagonal
    # weights in shared memory (328-540 KB at 2 stages, beyond the SM's 227 KB: such a launch fails)
    STAGES: tl.constexpr = 1 if TENSOR_TAPS else None
    for row0 in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        rows, places, row_ok, ok = tiles.tile_tokens(row0, stop, top, left, grid_w, map_h, map_w, channel_ok, BLOCK_N,
                                                     WINDOWED)  # fmt: skip
        x = tiles.load_tile(q_base, places, ok, stride_n, channels, ROWS_FIRST)
        m, sq_a, sq_y = maps.load_norms(norms_base, places, row_ok, TOKEN_NORMS)
        y, scale = maps.scaled_features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, PRESCALED,
                                        TOKEN_NORMS)  # fmt: skip
        y = tl.where(ok, y, 0.0)  # φ = y · scale: the per-token scale goes to the products' results
        num = tiles.head_product(y.to(s.dtype), s, H_PAD, DOT_PRECISION)
        # the normaliser in exact fp32, and 32 registers fewer than a z-column product
        den = tl.sum(y * z[:, None, :], axis=2) * scale[None, :] + eps
        out = num * (scale[None, :] / den)[:, :, None]
        if HAS_DWC:
            out, _ = tiles.depthwise_conv(
                out, v_base, mask_base, taps_ptr, row0, stop, stride_n, prefix, grid_h, grid_w, top, left, map_h, map_w,
                head0, H, D, H_PAD, D_PAD, BLOCK_N, K, HAS_MASK, TENSOR_TAPS, TAP_DTYPE, BF16_PAIRS, False,
                WINDOWED, ROWS_FIRST,
            )  # fmt: skip
            if HAS_BIAS:
                out += tl.where((rows >= prefix)[None, :, None], bias, 0.0)
        tiles.store_rows(out_base + places[None, :, None] * out_stride_n + channels, out, ok, ROWS_FIRST)


@triton.jit
def token_norms_kernel(
    qkv_ptr, pos_ptr, inv_ptr, norms_ptr,
    N, stride_b, stride_n, pos_stride_b, norms_stride_b, prefix, chunk, feature_eps, grid_h, grid_w, map_h, map_w,
    windows, windows_w, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    POWER: tl.constexpr, PRESCALED: tl.constexpr, HAS_POS: tl.constexpr, WINDOW_H: tl.constexpr,
    WINDOW_W: tl.constexpr, ROWS_FIRST: tl.constexpr,
    SOFTPLUS: tl.constexpr = False,
):  # fmt: skip
    """The focused map's (m, ‖â‖², ‖â^p‖²) of the key (with its positional term) and the query of each token of chunk t
    of batch element b, over all C channels (the tile holds every head), as 6 fp32 per token of the image's tokens:
    the keys' three, then the queries'. ROWS_FIRST: the tiles' layout (`triton_tiles.load_rows`)."""
    b, t, grid_h, grid_w, image, top, left = tiles.program_element(grid_h, grid_w, windows, windows_w, WINDOW_H,
                                                                    WINDOW_W)  # fmt: skip
    WINDOWED: tl.constexpr = WINDOW_H > 0
    q_base = qkv_ptr + image.to(tl.int64) * stride_b
    pos_base = pos_ptr + b.to(tl.int64) * pos_stride_b
    norms_base = norms_ptr + image.to(tl.int64) * norms_stride_b
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, 0, H, D, H_PAD, D_PAD, SOFTPLUS)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    for row0 in tl.range(start, stop, BLOCK_N):
        rows, places, row_ok, ok = tiles.tile_tokens(row0, stop, top, left, grid_w, map_h, map_w, channel_ok, BLOCK_N,
                                                     WINDOWED)  # fmt: skip
        keys = tiles.load_keys(q_base + H * D, places, rows, ok, stride_n, pos_base, prefix, channels, inv, H * D,
                               HAS_POS, PRESCALED, ROWS_FIRST)  # fmt: skip
        m, sq_a, sq_y = maps.token_norms(maps.focus_input(keys, inv, channel_ok, feature_eps, PRESCALED), POWER)
        maps.store_norms(norms_base, places, row_ok, m, sq_a, sq_y)
        queries = tiles.load_tile(q_base, places, ok, stride_n, channels, ROWS_FIRST)
        m, sq_a, sq_y = maps.token_norms(maps.focus_input(queries, inv, channel_ok, feature_eps, PRESCALED), POWER)
        maps.store_norms(norms_base + 3, places, row_ok, m, sq_a, sq_y)
