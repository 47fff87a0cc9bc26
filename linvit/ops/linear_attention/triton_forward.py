"""Triton kernels of non-causal linear attention on a qkv projection, IO-aware: the forward ones here, the backward
ones in `triton_backward.py`, the tile helpers they share in `triton_tiles.py`.

Only bytes moved count here (head_dim 32 gives ~13 FLOP per byte), so every kernel reads q|k|v straight from the
(B, N, 3C) projection output through its strides, recomputes the feature maps instead of storing them, and keeps
only the fp32 state S = Σ φ(k) vᵀ (d×d) and z = Σ φ(k) (d) per head between the passes. Five kernels:

- ``state_kernel`` (forward, grid batch × token chunks × heads): partial S, z of one head over a chunk of tokens;
  many chunks keep all SMs busy, and the caller sums the partials in a fixed order (deterministic);
- ``output_kernel`` (forward, grid batch × token tiles): φ(q)·S / (φ(q)·z + eps) for every head of a tile, plus
  the depthwise conv of v from shifted loads (the halo comes from cache), written as (B, N, C);
- ``state_grad_kernel`` (backward, grid batch × token chunks × heads): partial dS, dz from the queries;
- ``query_grad_kernel`` and ``key_value_grad_kernel`` (backward, grid batch × token chunks): dq; dk, dv; and
  per-chunk partials of the temperature and DWC weight/bias gradients. (One kernel for both would read dL/dout once
  instead of twice, but holds too many tiles at once: it spills registers.)

The focused map couples the heads (its norms run over all C channels of a token before the head split), so a
program first runs over all C channels of its tokens (``_focus_stats``); the feature maps, evaluated scale-free,
are described in `triton_tiles.py`.

Rows are tokens; the first ``prefix`` tokens (class tokens) have no position: no positional term, no DWC.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention.triton_tiles import _features, _focus_stats, _head_state, _load_raw, _shifted_sum


@triton.jit
def state_kernel(
    qkv_ptr,
    pos_ptr,
    inv_ptr,
    mask_ptr,
    s_ptr,
    z_ptr,
    N,
    stride_b,
    stride_n,
    pos_stride_b,
    mask_stride_b,
    prefix,
    chunk,
    feature_eps,
    C: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    PRESCALED: tl.constexpr,
    HAS_POS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Partial S = Σ φ(k) vᵀ (D×D) and z = Σ φ(k) of head h over the keys of chunk t of batch element b."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    h = tl.program_id(2)
    num_chunks = tl.num_programs(1)
    num_heads = tl.num_programs(2)
    k_base = qkv_ptr + b.to(tl.int64) * stride_b + C
    v_base = k_base + C
    pos_base = pos_ptr + b.to(tl.int64) * pos_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    cols = tl.arange(0, D_PAD)
    col_ok = cols < D
    head_cols = h * D + cols
    inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
    acc_s = tl.zeros([D_PAD, D_PAD], tl.float32)
    acc_z = tl.zeros([D_PAD], tl.float32)
    start = t * chunk
    stop = tl.minimum(start + chunk, N)
    for row0 in range(start, stop, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        row_ok = rows < stop
        if HAS_MASK:
            row_ok = row_ok & (tl.load(mask_base + rows, mask=row_ok, other=0) != 0)
        x = _load_raw(k_base, rows, row_ok, head_cols, col_ok, stride_n, pos_base, prefix, inv, C, HAS_POS, PRESCALED)
        m, sq_a, sq_y = _focus_stats(
            k_base, rows, row_ok, stride_n, pos_base, prefix, inv_ptr, feature_eps,
            C, BLOCK_N, BLOCK_C, MAP, POWER, HAS_POS, PRESCALED,
        )  # fmt: skip
        ok = row_ok[:, None] & col_ok[None, :]
        phi = tl.where(ok, _features(x, inv, m, sq_a, sq_y, feature_eps, MAP, POWER, PRESCALED), 0.0)
        v = tl.load(v_base + rows[:, None] * stride_n + head_cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc_s += tl.dot(tl.trans(phi), v, input_precision=DOT_PRECISION)
        acc_z += tl.sum(phi, axis=0)
    slot = (b * num_chunks + t) * num_heads + h
    square = cols[:, None] * D + cols[None, :]
    tl.store(s_ptr + slot.to(tl.int64) * (D * D) + square, acc_s, mask=col_ok[:, None] & col_ok[None, :])
    tl.store(z_ptr + slot.to(tl.int64) * D + cols, acc_z, mask=col_ok)


@triton.jit
def output_kernel(
    qkv_ptr,
    inv_ptr,
    mask_ptr,
    s_ptr,
    z_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    N,
    stride_b,
    stride_n,
    out_stride_b,
    out_stride_n,
    mask_stride_b,
    prefix,
    grid_h,
    grid_w,
    eps,
    feature_eps,
    H,
    C: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    K: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    PRESCALED: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_DWC: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """out = φ(q) S / (φ(q)·z + eps) (+ DWC(v) on spatial tokens) for all heads of one token tile."""
    b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    q_base = qkv_ptr + b.to(tl.int64) * stride_b
    v_base = q_base + 2 * C
    out_base = out_ptr + b.to(tl.int64) * out_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    cols = tl.arange(0, D_PAD)
    col_ok = cols < D
    ok = row_ok[:, None] & col_ok[None, :]
    m, sq_a, sq_y = _focus_stats(
        q_base, rows, row_ok, stride_n, q_base, prefix, inv_ptr, feature_eps,
        C, BLOCK_N, BLOCK_C, MAP, POWER, False, PRESCALED,
    )  # fmt: skip
    spatial = rows - prefix
    is_spatial = row_ok & (spatial >= 0)
    yy = spatial // grid_w
    xx = spatial % grid_w
    for h in range(H):
        head_cols = h * D + cols
        inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
        x = _load_raw(q_base, rows, row_ok, head_cols, col_ok, stride_n, q_base, prefix, inv, C, False, PRESCALED)
        phi = tl.where(ok, _features(x, inv, m, sq_a, sq_y, feature_eps, MAP, POWER, PRESCALED), 0.0)
        state = (b * H + h).to(tl.int64)
        s, z = _head_state(s_ptr, z_ptr, state, cols, col_ok, D)
        num = tl.dot(phi, s, input_precision=DOT_PRECISION)
        den = tl.sum(phi * z[None, :], axis=1) + eps
        out = num / den[:, None]
        if HAS_DWC:
            out += _shifted_sum(
                v_base, cols, col_ok, head_cols, yy, xx, is_spatial, stride_n, prefix, grid_h, grid_w,
                mask_base, w_ptr, BLOCK_N, D_PAD, K, 1, HAS_MASK,
            )  # fmt: skip
            if HAS_BIAS:
                bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                out += tl.where(is_spatial[:, None], bias[None, :], 0.0)
        tl.store(out_base + rows[:, None] * out_stride_n + head_cols[None, :], out, mask=ok)
