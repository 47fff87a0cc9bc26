"""Backward Triton kernels of linear attention on a qkv projection (design: `triton_forward.py`).

Four launches, five for the focused map with head groups (``cross_head_grad_kernel``); on a whole map with 16-bit
inputs the DWC's two take `triton_rows_backward.py`'s streamed kernels (the weight's, and the transposed conv's
before ``key_value_grad_kernel``, which then reads it):

- ``query_grad_kernel`` (grid batch × chunk × head group): sums the forward's partial states, then per tile of
  queries dL/dq and the chunk's partial dL/dS = Σ φ(q)ᵀ dL/dnum, dL/dz = Σ dL/dden · φ(q) and temperature gradient. A
  program holds every head of its tokens, so the focused map's cross-head term is a sum within the tile: one pass.
  With head groups it holds some heads: it writes dq without the cross-head term to a buffer of its own (with dk),
  and its share of each token's cross-head sum; ``cross_head_grad_kernel`` writes dq and dk with that term once both
  gradient kernels are done.
- ``key_value_grad_kernel`` (grid batch × chunk × head group; two batch elements a program where they share the
  positional table, up to head dim 32): sums the partial dL/dS, dL/dz (or reads their sums, added once an image by
  the transposed conv's rows kernel), then per tile of keys dL/dk and dL/dv (through S, and through the depthwise
  conv: its transpose, each tap of dL/dout gathered once for all channels, or that rows kernel's), and the chunk's
  partial temperature and DWC bias gradients, accumulated in registers and reduced once per program.
- ``dwc_weight_grad_kernel`` (grid items × taps): the DWC weight's gradient Σ v · dL/dout(shifted), one to three taps
  per program sharing each tile of v, each from a tensor-core product of the raw tiles accumulated over the program's
  items, whose diagonal is taken once (a reduction per tap and tile inside the key kernel cost more than the rest of
  the backward together).
- ``cross_head_grad_kernel`` (head groups, focused map; grid batch × chunk × group): dq and dk, their values without
  the cross-head term plus the term, and the queries' temperature gradient plus the term's share, each read from one
  buffer and written to another.
- ``sum_rows_kernel``: the per-program partials of those small gradients added up in a fixed order, and with a
  positional table shared by the batch on a whole map its gradient, dk summed over the images (else a torch launch
  after the op).

Every launch is idempotent: no kernel reads what it writes (no ``tl.store(p, tl.load(p) + x)``, no atomics), so a
launch run again with the same arguments leaves the same outputs. `triton.autotune` runs each launch of a new shape
many times while it times the configurations (CUDA-graph replays run them again too); an in-place sum would add its
term once per run (tests/ops/test_launch_idempotence.py runs every launch twice).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention import triton_feature_maps as maps
from linvit.ops.linear_attention import triton_tiles as tiles


@triton.jit
def _store_row(row_ptr, values, head0, H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr,
               D_PAD: tl.constexpr):  # fmt: skip
    """Store an (H_PAD, D_PAD) accumulator of the heads head0 … into their columns of a row of C = H·D values."""
    heads = head0 + tl.arange(0, H_PAD)[:, None]
    dims = tl.arange(0, D_PAD)[None, :]
    tl.store(row_ptr + heads * D + dims, values, mask=(heads < H) & (dims < D))


@triton.jit
def query_grad_kernel(
    qkv_ptr, inv_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, do_ptr, dqk_ptr, ds_ptr, dz_ptr, grads_ptr, cross_ptr,
    w_ptr, taps_ptr,
    N, stride_b, stride_n, do_stride_b, do_stride_n, dqk_stride_b, dqk_stride_n, norms_stride_b, cross_stride_b,
    chunk, eps, feature_eps, grid_h, grid_w, map_h, map_w, windows, windows_w, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    MAP: tl.constexpr, POWER: tl.constexpr, HALF_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr, TOKEN_NORMS: tl.constexpr,
    HAS_DWC: tl.constexpr, K: tl.constexpr, TENSOR_TAPS: tl.constexpr, TAP_DTYPE: tl.constexpr,
    SOFTPLUS: tl.constexpr = False,
):  # fmt: skip
    """dq of the queries of chunk t of batch element b, into columns 0 … C of dqk_ptr (dL/dqkv itself, or with
    ``TOKEN_NORMS`` the buffer of dq and dk without the cross-head term, whose per-token share goes to cross_ptr), and
    the chunk's partial dS, dz and temperature gradient (its group's heads); the first program also copies the DWC
    weight tap-major for the key kernel."""
    b, t, grid_h, grid_w, image, top, left = tiles.program_element(grid_h, grid_w, windows, windows_w, WINDOW_H,
                                                                    WINDOW_W)  # fmt: skip
    WINDOWED: tl.constexpr = WINDOW_H > 0
    q_base = qkv_ptr + image.to(tl.int64) * stride_b
    do_base = do_ptr + image.to(tl.int64) * do_stride_b
    dq_base = dqk_ptr + image.to(tl.int64) * dqk_stride_b
    norms_base = norms_ptr + image.to(tl.int64) * norms_stride_b + 3  # the queries' (m, ‖â‖², ‖â^p‖²)
    GROUPS: tl.constexpr = (H + H_PAD - 1) // H_PAD
    cross_base = cross_ptr + image.to(tl.int64) * cross_stride_b + tl.program_id(2)  # the queries' share, per group
    if HAS_DWC:
        tiles.copy_taps_major(w_ptr, taps_ptr, D, D_PAD, K, TENSOR_TAPS, TAP_DTYPE)
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    s, z = tiles.reduced_state(s_ptr, z_ptr, count_ptr, b, tl.num_programs(1), head0, H, D, H_PAD, D_PAD)
    s = tiles.state_operand(s, HALF_DOT)
    s_t = tl.permute(s, (0, 2, 1))
    acc_ds = tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32)
    # dz tile-shaped, summed over the tokens once per program (a sum across threads per tile costs 13
    # warp-instructions per token); the temperature's reduced per tile: a second such accumulator spills (Triton 3.6).
    # In windows dz is reduced per tile too: there (the per-window origin holds registers) the tile-shaped one spilled
    # at 4 warps under Triton 3.6 (FLatten-Swin-T's stage 1: 340 per token at 4 warps against 500 at 8)
    acc_dz = tl.zeros([H_PAD, 1 if WINDOWED else BLOCK_N, D_PAD], tl.float32)
    acc_dinv = tl.zeros([H_PAD, D_PAD], tl.float32)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    for row0 in tl.range(start, stop, BLOCK_N):
        rows, places, row_ok, ok = tiles.tile_tokens(row0, stop, top, left, grid_w, map_h, map_w, channel_ok, BLOCK_N,
                                                     WINDOWED)  # fmt: skip
        x = tiles.load_tile(q_base, places, ok, stride_n, channels)
        g = tiles.load_tile(do_base, places, ok, do_stride_n, channels)
        m, sq_a, sq_y = maps.load_norms(norms_base, places, row_ok, TOKEN_NORMS)
        phi = tl.where(ok, maps.features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, False,
                                          TOKEN_NORMS), 0.0)  # fmt: skip
        num = tiles.head_product(phi.to(s.dtype), s, H_PAD, DOT_PRECISION)
        inv_den = 1.0 / (tl.sum(phi * z[:, None, :], axis=2) + eps)  # as in the forward; a division per token
        dnum = g * inv_den[:, :, None]
        dden = -tl.sum(dnum * num, axis=2) * inv_den
        dphi = tiles.head_product(dnum.to(s.dtype), s_t, H_PAD, DOT_PRECISION) + dden[:, :, None] * z[:, None, :]
        # dL/dout is 0 where not ok, and so are dphi, dx and dinv (S and z are 0 in padded channels)
        _, dx, dinv, cross = maps.feature_grad(x, inv, channel_ok, dphi, feature_eps, m, sq_a, sq_y, MAP, POWER,
                                                TOKEN_NORMS)  # fmt: skip
        tl.store(dq_base + places[None, :, None] * dqk_stride_n + channels, dx, mask=ok)
        if TOKEN_NORMS:
            tl.store(cross_base + places * (2 * GROUPS), cross, mask=row_ok)
        if HALF_DOT:
            acc_ds = tiles.head_dot(
                tl.permute(phi.to(tl.bfloat16), (0, 2, 1)), dnum.to(tl.bfloat16), acc_ds, H_PAD, DOT_PRECISION
            )
        else:
            acc_ds = tiles.head_dot(tl.permute(phi, (0, 2, 1)), dnum, acc_ds, H_PAD, DOT_PRECISION)
        if WINDOWED:
            acc_dz += tl.sum(dden[:, :, None] * phi, axis=1, keep_dims=True)
        else:
            acc_dz += dden[:, :, None] * phi
        acc_dinv += tl.sum(dinv, axis=1)
    slot = (b * tl.num_programs(1) + t).to(tl.int64)
    tiles.store_state(ds_ptr, dz_ptr, slot, acc_ds, tl.sum(acc_dz, axis=1), head0, H, D, H_PAD, D_PAD)
    _store_row(grads_ptr + slot * (H * D), acc_dinv, head0, H, D, H_PAD, D_PAD)


@triton.jit
def key_value_grad_kernel(
    qkv_ptr, pos_ptr, inv_ptr, mask_ptr, norms_ptr, ds_ptr, dz_ptr, count_ptr, taps_ptr, do_ptr, dqk_ptr, dqkv_ptr,
    grads_ptr, cross_ptr, conv_ptr,
    N, stride_b, stride_n, do_stride_b, do_stride_n, dqk_stride_b, dqk_stride_n, dqkv_stride_b, dqkv_stride_n,
    conv_stride_b, state_chunks,
    pos_stride_b, mask_stride_b, norms_stride_b, cross_stride_b, prefix, chunk, grads_width, grid_h, grid_w,
    feature_eps, map_h, map_w, windows, windows_w, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    K: tl.constexpr, MAP: tl.constexpr, POWER: tl.constexpr, HAS_POS: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_DWC: tl.constexpr, HALF_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr, TOKEN_NORMS: tl.constexpr, TENSOR_TAPS: tl.constexpr,
    TAP_DTYPE: tl.constexpr, BF16_PAIRS: tl.constexpr,
    SOFTPLUS: tl.constexpr = False, CONV_GIVEN: tl.constexpr = False, IMAGES: tl.constexpr = 1,
):  # fmt: skip
    """dk, dv of the tokens of chunk t of batch element b, and the chunk's partial temperature (keys' share), DWC
    weight and bias gradients (its group's heads; with ``TOKEN_NORMS`` dk as dq in ``query_grad_kernel``). dk goes to
    columns C … 2C of dL/dqkv, or with ``TOKEN_NORMS`` of dqk_ptr (dq and dk without the cross-head term), dv to
    columns 2C … 3C of dqkv_ptr.

    gs, gz: dL/dS and dL/dz over the number of kept keys (S and z are means), so that for a kept key
    dL/dφ(k) = v gsᵀ + gz and dL/dv = φ(k) gs (+ the transposed conv of dL/dout), from ``state_chunks`` partial sums
    an image at ds_ptr, dz_ptr, count_ptr: query_grad's chunks, or one slot of their sums
    (`triton_rows_backward.value_conv_rows_kernel` adds them once an image where it runs).
    ``CONV_GIVEN``: that conv is read from conv_ptr ((images, N, C), `triton_rows_backward.value_conv_rows_kernel`'s),
    not gathered here tap by tap, and that kernel writes the bias's partial gradient.
    ``IMAGES`` 2 (whole maps, a positional table shared by the batch, `triton_launch.paired_images`): the program takes
    batch elements 2b and 2b + 1 and reads each tile of the table once for both; its partial gradients (summed over
    both) go to 2b's row, zeros to 2b + 1's.
    """
    b0, t, grid_h, grid_w, image0, top, left = tiles.program_element(grid_h, grid_w, windows, windows_w, WINDOW_H,
                                                                      WINDOW_W)  # fmt: skip
    WINDOWED: tl.constexpr = WINDOW_H > 0
    b0 = b0 * IMAGES
    image0 = image0 * IMAGES  # with IMAGES > 1 whole maps: the image is the batch element
    pos_base = pos_ptr + b0.to(tl.int64) * pos_stride_b  # shared by the program's images when IMAGES > 1
    GROUPS: tl.constexpr = (H + H_PAD - 1) // H_PAD
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    states_t = ()
    state_z = ()
    for i in tl.static_range(IMAGES):
        gs, gz = tiles.reduced_state(ds_ptr, dz_ptr, count_ptr, b0 + i, state_chunks, head0, H, D, H_PAD, D_PAD)
        states_t = states_t + (tl.permute(tiles.state_operand(gs, HALF_DOT), (0, 2, 1)),)
        state_z = state_z + (gz,)
    acc_dinv = tl.zeros([H_PAD, D_PAD], tl.float32)  # reduced per tile: a second tile-shaped accumulator spills
    acc_b = tl.zeros([H_PAD, BLOCK_N, D_PAD], tl.float32)  # summed over the tokens once per program (34 per token less)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    # not pipelined with tensor-core taps, as in the forward's output kernel (336-561 KB of shared memory at 2 stages)
    STAGES: tl.constexpr = 1 if TENSOR_TAPS and not CONV_GIVEN else None
    for row0 in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        rows, places, row_ok, ok = tiles.tile_tokens(row0, stop, top, left, grid_w, map_h, map_w, channel_ok, BLOCK_N,
                                                     WINDOWED)  # fmt: skip
        position = tiles.key_position(pos_base, rows, ok, prefix, channels, inv, H * D, HAS_POS, False)
        for i in tl.static_range(IMAGES):
            image = (image0 + i).to(tl.int64)
            k_base = qkv_ptr + image * stride_b + H * D
            v_base = k_base + H * D
            dv_base = dqkv_ptr + image * dqkv_stride_b + 2 * H * D
            # without token norms dk goes to dL/dqkv through its own strides (dqk_ptr is dqkv_ptr there): the row
            # addresses are then shared with dv's (a second stride cost 2.5 warp-instructions per token at 4×32 by the
            # cost figure)
            if TOKEN_NORMS:
                dk_base = dqk_ptr + image * dqk_stride_b + H * D
                dk_stride_n = dqk_stride_n
            else:
                dk_base = dv_base - H * D
                dk_stride_n = dqkv_stride_n
            mask_base = mask_ptr + (b0 + i).to(tl.int64) * mask_stride_b
            keep = tiles.unmasked(row_ok, mask_base, rows, HAS_MASK)
            keep_ok = keep[None, :, None] & channel_ok
            x = tiles.load_tile(k_base, places, ok, stride_n, channels) + position
            v = tiles.load_tile(v_base, places, keep_ok, stride_n, channels)
            gs_t = states_t[i]
            dphi = tiles.head_product(v.to(gs_t.dtype), gs_t, H_PAD, DOT_PRECISION) + state_z[i][:, None, :]
            m, sq_a, sq_y = maps.load_norms(norms_ptr + image * norms_stride_b, places, row_ok, TOKEN_NORMS)
            phi, dx, dinv, cross = maps.feature_grad(x, inv, channel_ok, tl.where(keep_ok, dphi, 0.0), feature_eps, m,
                                                      sq_a, sq_y, MAP, POWER, TOKEN_NORMS)  # fmt: skip
            tl.store(dk_base + places[None, :, None] * dk_stride_n + channels, tl.where(keep_ok, dx, 0.0), mask=ok)
            if TOKEN_NORMS:  # the keys' share of cross
                cross_base = cross_ptr + image * cross_stride_b + GROUPS + tl.program_id(2)
                tl.store(cross_base + places * (2 * GROUPS), cross, mask=row_ok)
            acc_dinv += tl.sum(tl.where(keep_ok, dinv, 0.0), axis=1)
            phi = tl.where(keep_ok, phi, 0.0)
            # φ gs as (gsᵀ φᵀ)ᵀ: only gsᵀ stays in registers (both layouts of gs spill)
            dv = tl.permute(tiles.head_product(gs_t, tl.permute(phi.to(gs_t.dtype), (0, 2, 1)), H_PAD, DOT_PRECISION),
                            (0, 2, 1))  # fmt: skip
            if HAS_DWC and CONV_GIVEN:  # the transposed conv of dL/dout, its share of dL/dv (with the bias's gradient)
                dv += tiles.load_tile(conv_ptr + image * conv_stride_b, places, ok, H * D, channels)
            elif HAS_DWC:  # the transposed conv of dL/dout, its share of dL/dv, into dv
                dv, own = tiles.depthwise_conv(
                    dv, do_ptr + image * do_stride_b, mask_base, taps_ptr, row0, stop, do_stride_n, prefix, grid_h,
                    grid_w, top, left, map_h, map_w, head0, H, D, H_PAD, D_PAD, BLOCK_N, K, False, TENSOR_TAPS,
                    TAP_DTYPE, BF16_PAIRS, True, WINDOWED,
                )  # fmt: skip
                acc_b += own.to(tl.float32)
            tl.store(dv_base + places[None, :, None] * dqkv_stride_n + channels, tl.where(keep_ok, dv, 0.0), mask=ok)
    for i in tl.static_range(IMAGES):
        row = grads_ptr + ((b0 + i) * tl.num_programs(1) + t).to(tl.int64) * grads_width
        if i > 0:  # the first image's row holds the program's sums
            acc_dinv = tl.zeros_like(acc_dinv)
            acc_b = tl.zeros_like(acc_b)
        _store_row(row, acc_dinv, head0, H, D, H_PAD, D_PAD)
        if HAS_DWC and not CONV_GIVEN:  # the bias (D,) gradient, after the temperature's C values and the weight's
            # D·K·K, one share per group
            bias_row = row + H * D + D * K * K + tl.program_id(2) * D
            bias = tl.sum(tl.sum(acc_b, axis=1), axis=0)
            tl.store(bias_row + tl.arange(0, D_PAD), bias, mask=tl.arange(0, D_PAD) < D)


@triton.jit
def _shifted_grad(do_tile, rows, keep, prefix, grid_h, grid_w, top, left, map_h, map_w, do_stride_n, channel_ok, tap,
                  K: tl.constexpr, WINDOWED: tl.constexpr, ROWS_FIRST: tl.constexpr):  # fmt: skip
    """dL/dout at the tokens that tap ``tap`` of each token of a tile feeds ((H_PAD, BLOCK_N, D_PAD), zero where
    that is no token of the map, where the token itself is not kept, and everywhere for a tap beyond K·K: the last
    program's spare ones), at a scalar offset from ``do_tile``, the tile's own places
    (`triton_tiles.neighbour_offset`)."""
    dy = K // 2 - tap // K
    dx = K // 2 - tap % K
    # A spare tap (beyond K·K) reads nothing. Its product is never stored (_store_tap) and the bounds alone keep its
    # loads in the image, but the test counts fewest kept: on whole maps as a grid of no rows (a scalar the bounds
    # compare anyway), in windows (whose grid is a constant) per element. Triton 3.6 at 4×32: 288 warp-instructions
    # per token, 304 with no test, 328 per element; in windows 348 per element, 361 with none, 365 as a scalar.
    if not WINDOWED:
        grid_h = tl.where(tap < K * K, grid_h, 0)
    _, source_ok = tiles.neighbour_rows(rows, keep, prefix, grid_h, grid_w, dy, dx, top, left, map_h, map_w,
                                        WINDOWED)  # fmt: skip
    if WINDOWED:
        source_ok = source_ok & (tap < K * K)
    ok = source_ok[None, :, None] & channel_ok
    return tiles.load_rows(do_tile + tiles.neighbour_offset(dy, dx, grid_w, map_w, WINDOWED) * do_stride_n, ok, 0.0,
                           ROWS_FIRST)  # fmt: skip


@triton.jit
def _tap_product(v_t, g, acc, HALF_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + Σ_n v[n, i] g[n, j] for every pair of a head's channels, whose diagonal (i = j) is the gradient: a
    tensor-core product of the raw tiles (products of two half values are exact in fp32) issues far fewer
    instructions than converting both tiles and multiplying elementwise."""
    if HALF_DOT:
        acc = tl.dot(v_t, g.to(v_t.dtype), acc)
    else:
        acc = tl.dot(v_t.to(tl.float32), g.to(tl.float32), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _store_tap(grads_row, acc, tap, D: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr):
    """The diagonal of a tap's product, summed over the heads, into its D columns (strided by K·K) of a row; nothing
    for a tap beyond K·K."""
    dims = tl.arange(0, D_PAD)
    diagonal = tl.sum(tl.sum(tl.where(dims[None, :, None] == dims[None, None, :], acc, 0.0), axis=2), axis=0)
    tl.store(grads_row + dims * (K * K) + tap, diagonal, mask=(dims < D) & (tap < K * K))


@triton.jit
def dwc_weight_grad_kernel(
    qkv_ptr, mask_ptr, do_ptr, grads_ptr,
    N, stride_b, stride_n, do_stride_b, do_stride_n, mask_stride_b, prefix, chunk, grads_width, grid_h, grid_w,
    map_h, map_w, windows, windows_w, items, items_per_program, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    K: tl.constexpr, TAPS: tl.constexpr, HAS_MASK: tl.constexpr, HALF_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr, ROWS_FIRST: tl.constexpr,
):  # fmt: skip
    """The DWC weight's gradient for the TAPS (1 to 3) taps TAPS·j … of j = ``program_id(1)`` (fewer in the last
    program where K·K is no multiple), over the items (chunk t of batch element b, item b·chunks + t)
    p·items_per_program … of program p = ``program_id(0)``: Σ_n v[n] · dL/dout[n - offset(tap)] per channel of a
    head, summed over the heads (v zero at masked and class tokens). The taps share each tile of v and its rows'
    coordinates (loaded and divided once per tap, one tap a program issued 291 warp-instructions per token at 4×32;
    three, 202). Walking several items (the many small windows of a windowed map) keeps the per-program work (the
    diagonals and their stores) off the tokens."""
    p = tl.program_id(0)
    first = TAPS * tl.program_id(1)
    chunks = tl.cdiv(N, chunk)
    grid_h, grid_w = tiles.window_grid(grid_h, grid_w, WINDOW_H, WINDOW_W)
    WINDOWED: tl.constexpr = WINDOW_H > 0
    channels, channel_ok = tiles.tile_channels(0, H, D, H_PAD, D_PAD)
    # v is loaded as (H_PAD, D_PAD, BLOCK_N), the product's left operand as it is: a tile permuted in registers went
    # through shared memory in 16-byte pieces with two barriers each under Triton 3.6 (623 -> 513 warp-instructions
    # per token; ROWS_FIRST's swap is of a load the pipeline puts in shared memory as it is)
    column_heads = tl.arange(0, H_PAD)[:, None, None]
    column_dims = tl.arange(0, D_PAD)[None, :, None]
    columns, column_ok = column_heads * D + column_dims, (column_heads < H) & (column_dims < D)
    acc_first = tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32)
    acc_second = tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32)
    acc_third = tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32)
    for item in tl.range(p * items_per_program, tl.minimum((p + 1) * items_per_program, items)):
        b = item // chunks
        image, top, left = tiles.window_origin(b, windows, windows_w, WINDOW_H, WINDOW_W)
        v_base = qkv_ptr + image.to(tl.int64) * stride_b + 2 * H * D
        do_base = do_ptr + image.to(tl.int64) * do_stride_b
        mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
        start, stop = tiles.chunk_bounds(item - b * chunks, chunk, N)
        for row0 in tl.range(start, stop, BLOCK_N):
            rows = row0 + tl.arange(0, BLOCK_N)
            places, real = tiles.token_places(rows, top, left, grid_w, map_h, map_w, WINDOWED)
            keep = tiles.unmasked((rows < stop) & (rows >= prefix) & real, mask_base, rows, HAS_MASK)
            v_t = tiles.load_rows(v_base + places[None, None, :] * stride_n + columns, keep[None, None, :] & column_ok,
                                  0.0, ROWS_FIRST, ROW_AXIS=2)  # fmt: skip
            do_tile = do_base + places[None, :, None] * do_stride_n + channels
            g = _shifted_grad(do_tile, rows, keep, prefix, grid_h, grid_w, top, left, map_h, map_w, do_stride_n,
                              channel_ok, first, K, WINDOWED, ROWS_FIRST)  # fmt: skip
            acc_first = _tap_product(v_t, g, acc_first, HALF_DOT, DOT_PRECISION)
            if TAPS > 1:
                g = _shifted_grad(do_tile, rows, keep, prefix, grid_h, grid_w, top, left, map_h, map_w, do_stride_n,
                                  channel_ok, first + 1, K, WINDOWED, ROWS_FIRST)  # fmt: skip
                acc_second = _tap_product(v_t, g, acc_second, HALF_DOT, DOT_PRECISION)
            if TAPS > 2:
                g = _shifted_grad(do_tile, rows, keep, prefix, grid_h, grid_w, top, left, map_h, map_w, do_stride_n,
                                  channel_ok, first + 2, K, WINDOWED, ROWS_FIRST)  # fmt: skip
                acc_third = _tap_product(v_t, g, acc_third, HALF_DOT, DOT_PRECISION)
    row = grads_ptr + p.to(tl.int64) * grads_width + H * D
    _store_tap(row, acc_first, first, D, D_PAD, K)
    if TAPS > 1:
        _store_tap(row, acc_second, first + 1, D, D_PAD, K)
    if TAPS > 2:
        _store_tap(row, acc_third, first + 2, D, D_PAD, K)


@triton.jit
def cross_head_grad_kernel(
    qkv_ptr, pos_ptr, inv_ptr, norms_ptr, cross_ptr, dqk_ptr, dqkv_ptr, grads_ptr, cross_grads_ptr,
    N, stride_b, stride_n, dqk_stride_b, dqk_stride_n, dqkv_stride_b, dqkv_stride_n, pos_stride_b, norms_stride_b,
    cross_stride_b, prefix, chunk, feature_eps, grid_h, grid_w, map_h, map_w, windows, windows_w, N_BUCKET,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    POWER: tl.constexpr, HAS_POS: tl.constexpr, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr,
    SOFTPLUS: tl.constexpr = False,
):  # fmt: skip
    """dq and dk with the focused map's cross-head term (head groups) for the tokens of chunk t of batch element b and
    the heads of group ``program_id(2)``: their values without it (dqk_ptr, columns 0 … 2C) plus each token's cross
    summed over the groups' shares times a factor of its own channels (`triton_feature_maps.cross_head_grad`),
    written to dqkv_ptr; and the chunk's row of the queries' temperature partials (grads_ptr) plus the term's share,
    written to its row of cross_grads_ptr. It reads no buffer it writes, so that a launch run again (autotuning) gives
    the same result."""
    b, t, grid_h, grid_w, image, top, left = tiles.program_element(grid_h, grid_w, windows, windows_w, WINDOW_H,
                                                                    WINDOW_W)  # fmt: skip
    WINDOWED: tl.constexpr = WINDOW_H > 0
    q_base = qkv_ptr + image.to(tl.int64) * stride_b
    partial_base = dqk_ptr + image.to(tl.int64) * dqk_stride_b
    dq_base = dqkv_ptr + image.to(tl.int64) * dqkv_stride_b
    pos_base = pos_ptr + b.to(tl.int64) * pos_stride_b
    norms_base = norms_ptr + image.to(tl.int64) * norms_stride_b
    cross_base = cross_ptr + image.to(tl.int64) * cross_stride_b
    GROUPS: tl.constexpr = (H + H_PAD - 1) // H_PAD
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    acc_dinv = tl.zeros([H_PAD, D_PAD], tl.float32)
    start, stop = tiles.chunk_bounds(t, chunk, N)
    for row0 in tl.range(start, stop, BLOCK_N):
        rows, places, row_ok, ok = tiles.tile_tokens(row0, stop, top, left, grid_w, map_h, map_w, channel_ok, BLOCK_N,
                                                     WINDOWED)  # fmt: skip
        for which in tl.static_range(2):  # the queries, then the keys (the columns C … 2C, norms 3 floats earlier)
            if which == 0:
                x = tiles.load_tile(q_base, places, ok, stride_n, channels)
            else:
                x = tiles.load_keys(q_base + H * D, places, rows, ok, stride_n, pos_base, prefix, channels, inv, H * D,
                                    HAS_POS, False)  # fmt: skip
            cross = tl.zeros([BLOCK_N], tl.float32)
            for group in tl.static_range(GROUPS):
                cross += tl.load(cross_base + places * (2 * GROUPS) + which * GROUPS + group, mask=row_ok,
                                 other=0.0)  # fmt: skip
            m, sq_a, sq_y = maps.load_norms(norms_base + 3 * (1 - which), places, row_ok, True)
            dx, dinv = maps.cross_head_grad(x, inv, channel_ok, cross, feature_eps, m, sq_a, sq_y, POWER)
            partial = tl.load(partial_base + which * (H * D) + places[None, :, None] * dqk_stride_n + channels, mask=ok,
                              other=0.0)  # fmt: skip
            grad = dq_base + which * (H * D) + places[None, :, None] * dqkv_stride_n + channels
            tl.store(grad, partial.to(tl.float32) + dx, mask=ok)
            acc_dinv += tl.sum(tl.where(ok, dinv, 0.0), axis=1)
    row = (b * tl.num_programs(1) + t).to(tl.int64) * (H * D)
    heads = head0 + tl.arange(0, H_PAD)[:, None]
    dims = tl.arange(0, D_PAD)[None, :]
    columns_ok = (heads < H) & (dims < D)
    columns = row + heads * D + dims
    tl.store(cross_grads_ptr + columns, tl.load(grads_ptr + columns, mask=columns_ok, other=0.0) + acc_dinv,
             mask=columns_ok)  # fmt: skip


@triton.jit
def sum_rows_kernel(keys_ptr, queries_ptr, scale_ptr, out_ptr, rows, width, key_width, query_width, weight_end,
                    weight_rows, bias_rows, bias_width, dqkv_ptr, position_ptr, images, positions, dqkv_stride_b,
                    dqkv_stride_n, prefix, BLOCK: tl.constexpr, ROWS: tl.constexpr, BIAS_GROUPS: tl.constexpr,
                    SOFTPLUS: tl.constexpr = False, C: tl.constexpr = 0, C_PAD: tl.constexpr = 0,
                    POSITION_TOKENS: tl.constexpr = 0):  # fmt: skip
    """The backward's last launch: its first cdiv(width, BLOCK) programs add up the small gradients' partials
    (:func:`_sum_small_grads`); with ``POSITION_TOKENS`` the others the positional table's gradient
    (:func:`_sum_positions`), which would be a torch launch of its own after the op."""
    small = tl.cdiv(width, BLOCK)
    # the constant's test alone: without positions (POSITION_TOKENS 0) their branch must not be compiled at all
    if POSITION_TOKENS == 0:  # noqa: SIM114
        _sum_small_grads(keys_ptr, queries_ptr, scale_ptr, out_ptr, rows, width, key_width, query_width, weight_end,
                         weight_rows, bias_rows, bias_width, BLOCK, ROWS, BIAS_GROUPS, SOFTPLUS)  # fmt: skip
    elif tl.program_id(0) < small:
        _sum_small_grads(keys_ptr, queries_ptr, scale_ptr, out_ptr, rows, width, key_width, query_width, weight_end,
                         weight_rows, bias_rows, bias_width, BLOCK, ROWS, BIAS_GROUPS, SOFTPLUS)  # fmt: skip
    else:
        _sum_positions(dqkv_ptr, position_ptr, tl.program_id(0) - small, images, positions, dqkv_stride_b,
                       dqkv_stride_n, prefix, C, C_PAD, POSITION_TOKENS)  # fmt: skip


@triton.jit
def _sum_positions(dqkv_ptr, position_ptr, block, images, positions, dqkv_stride_b, dqkv_stride_n, prefix,
                   C: tl.constexpr, C_PAD: tl.constexpr, POSITION_TOKENS: tl.constexpr):  # fmt: skip
    """position[n, c] = Σ_b dk[b, prefix + n, c] for POSITION_TOKENS tokens n from block · POSITION_TOKENS (of
    ``positions``), in fp32 over the images in order, stored in the table's dtype: the gradient of a positional table
    shared by the batch (dL/d(k + P) is dL/dk), dk read from columns C … 2C of dL/dqkv."""
    tokens = (block * POSITION_TOKENS + tl.arange(0, POSITION_TOKENS))[:, None]
    channels = tl.arange(0, C_PAD)[None, :]
    ok = (tokens < positions) & (channels < C)
    grads = dqkv_ptr + (prefix + tokens).to(tl.int64) * dqkv_stride_n + C + channels
    acc = tl.zeros([POSITION_TOKENS, C_PAD], tl.float32)
    for _ in tl.range(0, images):
        acc += tl.load(grads, mask=ok, other=0.0).to(tl.float32)
        grads += dqkv_stride_b  # a pointer carried from image to image: no 64-bit product
    tl.store(position_ptr + tokens * C + channels, acc, mask=ok)


@triton.jit
def _sum_small_grads(keys_ptr, queries_ptr, scale_ptr, out_ptr, rows, width, key_width, query_width, weight_end,
                     weight_rows, bias_rows, bias_width, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                     BIAS_GROUPS: tl.constexpr, SOFTPLUS: tl.constexpr):  # fmt: skip
    """out[j] = Σ_i keys[i, j] + Σ_i queries[i, j] (j < query_width), ROWS rows at a time in a fixed order; keys:
    (max(rows, weight_rows, bias_rows), key_width), of whose columns query_width … weight_end (the DWC weight's) the
    first weight_rows rows are written, of the last BIAS_GROUPS · bias_width (the DWC bias's, one share per head
    group, added into the bias_width columns of out from weight_end on) the first bias_rows, of the others the first
    rows; queries: (rows, query_width), fp32, contiguous.
    ``SOFTPLUS``: the first query_width columns are the gradient of 1 / softplus(s) for the parameter s at
    scale_ptr, and are written as the gradient of s (the chain rule here, not in torch launches after it)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < width
    query_ok = cols < query_width
    weight_column = (cols >= query_width) & (cols < weight_end)
    bias_column = (cols >= weight_end) & col_ok
    acc = tl.zeros([ROWS, BLOCK], tl.float32)
    # the rows each column has: the weight's and the bias's may come from kernels of other grids than the chunks'
    last_row = tl.where(weight_column, weight_rows, tl.where(bias_column, bias_rows, rows))[None, :]
    for row0 in tl.range(0, tl.maximum(tl.maximum(rows, weight_rows), bias_rows), ROWS):
        block_rows = (row0 + tl.arange(0, ROWS))[:, None]
        row_ok = block_rows < rows
        key_ok = col_ok[None, :] & (block_rows < last_row)
        acc += tl.load(keys_ptr + block_rows * key_width + cols[None, :], mask=key_ok, other=0.0)
        for group in tl.static_range(1, BIAS_GROUPS):
            acc += tl.load(keys_ptr + block_rows * key_width + cols[None, :] + group * bias_width,
                           mask=(block_rows < bias_rows) & bias_column[None, :], other=0.0)  # fmt: skip
        acc += tl.load(
            queries_ptr + block_rows * query_width + cols[None, :], mask=row_ok & query_ok[None, :], other=0.0
        )
    total = tl.sum(acc, axis=0)
    if SOFTPLUS:  # d(1/softplus(s))/ds = -sigmoid(s) / softplus(s)²
        scale = tl.load(scale_ptr + cols, mask=query_ok, other=0.0).to(tl.float32)
        inverse = 1.0 / tiles.softplus(scale)
        total = tl.where(query_ok, total * -(inverse * inverse) * tl.sigmoid(scale), total)
    tl.store(out_ptr + cols, total, mask=col_ok)
