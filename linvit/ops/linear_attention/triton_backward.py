"""Backward Triton kernels of linear attention on a qkv projection (design: `triton_forward.py`).

dL/dS and dL/dz come from the queries (``state_grad_kernel``, per head and token chunk, partial sums reduced in a
fixed order); dq from the queries again (``query_grad_kernel``); dk, dv and the temperature and DWC weight/bias
gradients from the keys and values (``key_value_grad_kernel``). The focused map couples a token's heads through its
norms, so the token kernels make two passes over the heads: the first sums the cross-head term of the norms'
gradient. (One kernel for dq and dk/dv would read dL/dout once instead of twice, but it holds too many tiles at once
and spills registers.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention.triton_tiles import (
    _feature_grad,
    _features,
    _focus_stats,
    _head_state,
    _load_raw,
    _map,
    _neighbour,
    _power,
    _shifted_sum,
)


@triton.jit
def _query_grad(
    q_base,
    do_base,
    rows,
    row_ok,
    cols,
    col_ok,
    head_cols,
    inv,
    s,
    z,
    m,
    sq_a,
    sq_y,
    stride_n,
    do_stride_n,
    prefix,
    eps,
    feature_eps,
    C: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """For a query head tile: (x, φ, dL/dnum, dL/dden, dL/dφ) of out = φ S / (φ·z + eps)."""
    ok = row_ok[:, None] & col_ok[None, :]
    x = _load_raw(q_base, rows, row_ok, head_cols, col_ok, stride_n, q_base, prefix, inv, C, False, False)
    phi = tl.where(ok, _features(x, inv, m, sq_a, sq_y, feature_eps, MAP, POWER, False), 0.0)
    g = tl.load(do_base + rows[:, None] * do_stride_n + head_cols[None, :], mask=ok, other=0.0).to(tl.float32)
    num = tl.dot(phi, s, input_precision=DOT_PRECISION)
    den = tl.sum(phi * z[None, :], axis=1) + eps
    dnum = g / den[:, None]
    dden = -tl.sum(g * num, axis=1) / (den * den)
    dphi = tl.dot(dnum, tl.trans(s), input_precision=DOT_PRECISION) + dden[:, None] * z[None, :]
    return x, phi, dnum, dden, dphi


@triton.jit
def state_grad_kernel(
    qkv_ptr,
    inv_ptr,
    s_ptr,
    z_ptr,
    do_ptr,
    ds_ptr,
    dz_ptr,
    N,
    stride_b,
    stride_n,
    do_stride_b,
    do_stride_n,
    prefix,
    chunk,
    eps,
    feature_eps,
    C: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Partial dL/dS = Σ φ(q)ᵀ dL/dnum and dL/dz = Σ dL/dden · φ(q) of head h over the queries of chunk t."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    h = tl.program_id(2)
    num_chunks = tl.num_programs(1)
    num_heads = tl.num_programs(2)
    q_base = qkv_ptr + b.to(tl.int64) * stride_b
    do_base = do_ptr + b.to(tl.int64) * do_stride_b
    cols = tl.arange(0, D_PAD)
    col_ok = cols < D
    head_cols = h * D + cols
    inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
    state = (b * num_heads + h).to(tl.int64)
    square = cols[:, None] * D + cols[None, :]
    square_ok = col_ok[:, None] & col_ok[None, :]
    s, z = _head_state(s_ptr, z_ptr, state, cols, col_ok, D)
    acc_s = tl.zeros([D_PAD, D_PAD], tl.float32)
    acc_z = tl.zeros([D_PAD], tl.float32)
    start = t * chunk
    stop = tl.minimum(start + chunk, N)
    for row0 in range(start, stop, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        row_ok = rows < stop
        m, sq_a, sq_y = _focus_stats(
            q_base, rows, row_ok, stride_n, q_base, prefix, inv_ptr, feature_eps,
            C, BLOCK_N, BLOCK_C, MAP, POWER, False, False,
        )  # fmt: skip
        _, phi, dnum, dden, _ = _query_grad(
            q_base, do_base, rows, row_ok, cols, col_ok, head_cols, inv, s, z, m, sq_a, sq_y, stride_n,
            do_stride_n, prefix, eps, feature_eps, C, MAP, POWER, DOT_PRECISION,
        )  # fmt: skip
        acc_s += tl.dot(tl.trans(phi), dnum, input_precision=DOT_PRECISION)
        acc_z += tl.sum(dden[:, None] * phi, axis=0)
    slot = ((b * num_chunks + t) * num_heads + h).to(tl.int64)
    tl.store(ds_ptr + slot * (D * D) + square, acc_s, mask=square_ok)
    tl.store(dz_ptr + slot * D + cols, acc_z, mask=col_ok)


@triton.jit
def query_grad_kernel(
    qkv_ptr,
    inv_ptr,
    s_ptr,
    z_ptr,
    do_ptr,
    dqkv_ptr,
    dinv_ptr,
    N,
    stride_b,
    stride_n,
    do_stride_b,
    do_stride_n,
    dqkv_stride_b,
    dqkv_stride_n,
    prefix,
    chunk,
    eps,
    feature_eps,
    H,
    C: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    H_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dq of the queries of chunk t (all heads), and the chunk's share of the temperature gradient."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    num_chunks = tl.num_programs(1)
    q_base = qkv_ptr + b.to(tl.int64) * stride_b
    do_base = do_ptr + b.to(tl.int64) * do_stride_b
    dq_base = dqkv_ptr + b.to(tl.int64) * dqkv_stride_b
    cols = tl.arange(0, D_PAD)
    col_ok = cols < D
    head_rows = tl.arange(0, H_PAD)
    acc_dinv = tl.zeros([H_PAD, D_PAD], tl.float32)
    start = t * chunk
    stop = tl.minimum(start + chunk, N)
    for row0 in range(start, stop, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        row_ok = rows < stop
        ok = row_ok[:, None] & col_ok[None, :]
        m, sq_a, sq_y = _focus_stats(
            q_base, rows, row_ok, stride_n, q_base, prefix, inv_ptr, feature_eps, C, BLOCK_N, BLOCK_C, MAP, POWER,
            False, False,
        )  # fmt: skip
        cross = tl.zeros([BLOCK_N], tl.float32)
        if MAP == 0:
            # first pass over the heads: the cross-head sum Σ_c dL/dφ_c · â_c^p of the norms' gradient
            for h in range(H):
                head_cols = h * D + cols
                inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
                state = (b * H + h).to(tl.int64)
                s, z = _head_state(s_ptr, z_ptr, state, cols, col_ok, D)
                x, _, _, _, dphi = _query_grad(
                    q_base, do_base, rows, row_ok, cols, col_ok, head_cols, inv, s, z, m, sq_a, sq_y, stride_n,
                    do_stride_n, prefix, eps, feature_eps, C, MAP, POWER, DOT_PRECISION,
                )  # fmt: skip
                y = tl.where(ok, _power(_map(x, inv[None, :], feature_eps, 0, False) / m[:, None], POWER), 0.0)
                cross += tl.sum(dphi * y, axis=1)
        for h in range(H):
            head_cols = h * D + cols
            inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
            state = (b * H + h).to(tl.int64)
            s, z = _head_state(s_ptr, z_ptr, state, cols, col_ok, D)
            x, _, _, _, dphi = _query_grad(
                q_base, do_base, rows, row_ok, cols, col_ok, head_cols, inv, s, z, m, sq_a, sq_y, stride_n,
                do_stride_n, prefix, eps, feature_eps, C, MAP, POWER, DOT_PRECISION,
            )  # fmt: skip
            dx, dinv = _feature_grad(x, inv, dphi, m, sq_a, sq_y, cross, feature_eps, MAP, POWER)
            tl.store(dq_base + rows[:, None] * dqkv_stride_n + head_cols[None, :], dx, mask=ok)
            if MAP == 0:
                dinv = tl.sum(tl.where(ok, dinv, 0.0), axis=0)
                acc_dinv += tl.where(head_rows[:, None] == h, dinv[None, :], 0.0)
    if MAP == 0:
        slot = (b * num_chunks + t).to(tl.int64)
        channels = head_rows[:, None] * D + cols[None, :]
        tl.store(dinv_ptr + slot * C + channels, acc_dinv, mask=(head_rows[:, None] < H) & col_ok[None, :])


@triton.jit
def key_value_grad_kernel(
    qkv_ptr,
    pos_ptr,
    inv_ptr,
    mask_ptr,
    gs_ptr,
    gz_ptr,
    w_ptr,
    do_ptr,
    dqkv_ptr,
    dinv_ptr,
    dw_ptr,
    db_ptr,
    N,
    stride_b,
    stride_n,
    do_stride_b,
    do_stride_n,
    dqkv_stride_b,
    dqkv_stride_n,
    pos_stride_b,
    mask_stride_b,
    prefix,
    chunk,
    grid_h,
    grid_w,
    feature_eps,
    H,
    C: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    H_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    K: tl.constexpr,
    KK_PAD: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    HAS_POS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_DWC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dk, dv of the tokens of chunk t (all heads), and the chunk's partial temperature (keys' share), DWC weight and
    bias gradients.

    gs, gz: dL/dS and dL/dz over the number of kept keys (S and z are means), so that for a key
    dL/dφ(k) = v gsᵀ + gz and dL/dv = φ(k) gs (+ the transposed conv of dL/dout).
    """
    b = tl.program_id(0)
    t = tl.program_id(1)
    num_chunks = tl.num_programs(1)
    k_base = qkv_ptr + b.to(tl.int64) * stride_b + C
    v_base = k_base + C
    do_base = do_ptr + b.to(tl.int64) * do_stride_b
    dk_base = dqkv_ptr + b.to(tl.int64) * dqkv_stride_b + C
    dv_base = dk_base + C
    pos_base = pos_ptr + b.to(tl.int64) * pos_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    cols = tl.arange(0, D_PAD)
    col_ok = cols < D
    head_rows = tl.arange(0, H_PAD)
    kk = tl.arange(0, KK_PAD)
    acc_dinv = tl.zeros([H_PAD, D_PAD], tl.float32)
    acc_w = tl.zeros([D_PAD, KK_PAD], tl.float32)
    acc_b = tl.zeros([D_PAD], tl.float32)
    start = t * chunk
    stop = tl.minimum(start + chunk, N)
    for row0 in range(start, stop, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        row_ok = rows < stop
        keep = row_ok
        if HAS_MASK:
            keep = keep & (tl.load(mask_base + rows, mask=row_ok, other=0) != 0)
        ok = row_ok[:, None] & col_ok[None, :]
        keep_ok = keep[:, None] & col_ok[None, :]
        spatial = rows - prefix
        is_spatial = row_ok & (spatial >= 0)
        yy = spatial // grid_w
        xx = spatial % grid_w
        m, sq_a, sq_y = _focus_stats(
            k_base, rows, row_ok, stride_n, pos_base, prefix, inv_ptr, feature_eps, C, BLOCK_N, BLOCK_C, MAP,
            POWER, HAS_POS, False,
        )  # fmt: skip
        cross = tl.zeros([BLOCK_N], tl.float32)
        if MAP == 0:
            for h in range(H):  # first pass: the cross-head sum of the norms' gradient
                head_cols = h * D + cols
                inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
                state = (b * H + h).to(tl.int64)
                gs, gz = _head_state(gs_ptr, gz_ptr, state, cols, col_ok, D)
                x = _load_raw(
                    k_base, rows, row_ok, head_cols, col_ok, stride_n, pos_base, prefix, inv, C, HAS_POS, False
                )
                v = tl.load(v_base + rows[:, None] * stride_n + head_cols[None, :], mask=keep_ok, other=0.0)
                dphi = tl.dot(v.to(tl.float32), tl.trans(gs), input_precision=DOT_PRECISION) + gz[None, :]
                dphi = tl.where(keep_ok, dphi, 0.0)
                y = tl.where(ok, _power(_map(x, inv[None, :], feature_eps, 0, False) / m[:, None], POWER), 0.0)
                cross += tl.sum(dphi * y, axis=1)
        for h in range(H):
            head_cols = h * D + cols
            inv = tl.load(inv_ptr + head_cols, mask=col_ok, other=1.0).to(tl.float32)
            state = (b * H + h).to(tl.int64)
            gs, gz = _head_state(gs_ptr, gz_ptr, state, cols, col_ok, D)
            x = _load_raw(k_base, rows, row_ok, head_cols, col_ok, stride_n, pos_base, prefix, inv, C, HAS_POS, False)
            phi = tl.where(keep_ok, _features(x, inv, m, sq_a, sq_y, feature_eps, MAP, POWER, False), 0.0)
            v = tl.load(v_base + rows[:, None] * stride_n + head_cols[None, :], mask=keep_ok, other=0.0)
            dphi = tl.dot(v.to(tl.float32), tl.trans(gs), input_precision=DOT_PRECISION) + gz[None, :]
            dphi = tl.where(keep_ok, dphi, 0.0)
            dx, dinv = _feature_grad(x, inv, dphi, m, sq_a, sq_y, cross, feature_eps, MAP, POWER)
            dx = tl.where(keep_ok, dx, 0.0)
            tl.store(dk_base + rows[:, None] * dqkv_stride_n + head_cols[None, :], dx, mask=ok)
            if MAP == 0:
                dinv = tl.sum(tl.where(keep_ok, dinv, 0.0), axis=0)
                acc_dinv += tl.where(head_rows[:, None] == h, dinv[None, :], 0.0)
            # values: through S, and through the depthwise conv
            dv = tl.dot(phi, gs, input_precision=DOT_PRECISION)
            if HAS_DWC:
                dv += _shifted_sum(
                    do_base, cols, col_ok, head_cols, yy, xx, is_spatial, do_stride_n, prefix, grid_h, grid_w,
                    mask_base, w_ptr, BLOCK_N, D_PAD, K, -1, False,
                )  # fmt: skip
                g = tl.load(
                    do_base + rows[:, None] * do_stride_n + head_cols[None, :],
                    mask=ok & is_spatial[:, None],
                    other=0.0,
                ).to(tl.float32)
                for ky in range(K):
                    for kx in range(K):
                        value = _neighbour(
                            v_base, head_cols, col_ok, yy, xx, is_spatial, ky - K // 2, kx - K // 2, stride_n,
                            prefix, grid_h, grid_w, mask_base, HAS_MASK,
                        )  # fmt: skip
                        contribution = tl.sum(g * value, axis=0)
                        acc_w += tl.where(kk[None, :] == ky * K + kx, contribution[:, None], 0.0)
                acc_b += tl.sum(g, axis=0)
            dv = tl.where(keep_ok, dv, 0.0)
            tl.store(dv_base + rows[:, None] * dqkv_stride_n + head_cols[None, :], dv, mask=ok)
    slot = (b * num_chunks + t).to(tl.int64)
    if MAP == 0:
        channels = head_rows[:, None] * D + cols[None, :]
        tl.store(dinv_ptr + slot * C + channels, acc_dinv, mask=(head_rows[:, None] < H) & col_ok[None, :])
    if HAS_DWC:
        weight_ok = col_ok[:, None] & (kk[None, :] < K * K)
        tl.store(dw_ptr + slot * (D * K * K) + cols[:, None] * (K * K) + kk[None, :], acc_w, mask=weight_ok)
        tl.store(db_ptr + slot * D + cols, acc_b, mask=col_ok)
