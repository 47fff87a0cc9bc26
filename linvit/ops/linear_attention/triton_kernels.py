"""Triton kernels of non-causal linear attention on a qkv projection (forward and backward), IO-aware.

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

Feature maps (``MAP``): 0 focused, 1 relu, 2 elu + 1. The focused map is a = (relu(x) + feature_eps)·inv
(max(x, feature_eps·inv) when ``PRESCALED``: x already holds (x + feature_eps)·inv) and φ = ‖a‖ / ‖a^p‖ · a^p with
the norms over all C channels of a token. That couples the heads, so a program first runs over all C channels of
its tokens (``_focus_stats``), and the token-grad kernels make two passes over the heads (the first sums the
cross-head term of the norms' gradient). The map is evaluated scale-free, with m = max_c a and â = a / m:
φ = m · ‖â‖ / ‖â^p‖ · â^p, which equals the definition but neither overflows for large a nor underflows to
denormals (and 0/0) for tiny a, where a^(2p) leaves float32's range.

Rows are tokens; the first ``prefix`` tokens (class tokens) have no position: no positional term, no DWC.
"""

from __future__ import annotations

import triton
import triton.language as tl

FOCUSED = 0
RELU = 1
ELU = 2


# ------------------------------------------------------------------------------------------------------ helpers
@triton.jit
def _power(a, POWER: tl.constexpr):
    """a^p for a > 0; exact products for p = 1, 2, 3."""
    if POWER == 1.0:
        out = a
    elif POWER == 2.0:
        out = a * a
    elif POWER == 3.0:
        out = a * a * a
    else:
        out = tl.exp2(POWER * tl.log2(a))
    return out


@triton.jit
def _power_grad(a, POWER: tl.constexpr):
    """d(a^p)/da = p a^(p-1) for a > 0."""
    if POWER == 1.0:
        out = a * 0.0 + 1.0
    elif POWER == 2.0:
        out = 2.0 * a
    elif POWER == 3.0:
        out = 3.0 * a * a
    else:
        out = POWER * tl.exp2((POWER - 1.0) * tl.log2(a))
    return out


@triton.jit
def _map(x, inv, feature_eps, MAP: tl.constexpr, PRESCALED: tl.constexpr):
    """The elementwise part of the feature map: a (focused, before the power), relu(x) or elu(x) + 1."""
    if MAP == 0:
        if PRESCALED:
            out = tl.maximum(x, feature_eps * inv)
        else:
            out = (tl.maximum(x, 0.0) + feature_eps) * inv
    elif MAP == 1:
        out = tl.maximum(x, 0.0)
    else:
        out = tl.where(x > 0.0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    return out


@triton.jit
def _load_raw(
    base,
    rows,
    row_ok,
    cols,
    col_ok,
    stride_n,
    pos_base,
    prefix,
    inv,
    C: tl.constexpr,
    HAS_POS: tl.constexpr,
    PRESCALED: tl.constexpr,
):
    """x of a (rows × cols) tile in fp32 (zero outside it), plus the positional term on spatial tokens (rows of C
    values; scaled by inv when the temperature was folded into the projection)."""
    ok = row_ok[:, None] & col_ok[None, :]
    x = tl.load(base + rows[:, None] * stride_n + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_POS:
        spatial = rows - prefix
        pos_ok = ok & (spatial >= 0)[:, None]
        position = tl.load(pos_base + spatial[:, None] * C + cols[None, :], mask=pos_ok, other=0.0).to(tl.float32)
        if PRESCALED:
            position = position * inv[None, :]
        x = x + position
    return x


@triton.jit
def _focus_stats(
    base,
    rows,
    row_ok,
    stride_n,
    pos_base,
    prefix,
    inv_ptr,
    feature_eps,
    C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    HAS_POS: tl.constexpr,
    PRESCALED: tl.constexpr,
):
    """Per token over all C channels: m = max a, ‖â‖² and ‖â^p‖² with â = a / m (online rescaling, one pass).

    Only the focused map has them: for the others this returns zeros without reading anything."""
    m = tl.zeros([BLOCK_N], tl.float32)
    sq_a = tl.zeros([BLOCK_N], tl.float32)
    sq_y = tl.zeros([BLOCK_N], tl.float32)
    if MAP == 0:
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            col_ok = cols < C
            inv = tl.load(inv_ptr + cols, mask=col_ok, other=1.0).to(tl.float32)
            x = _load_raw(base, rows, row_ok, cols, col_ok, stride_n, pos_base, prefix, inv, C, HAS_POS, PRESCALED)
            a = _map(x, inv[None, :], feature_eps, 0, PRESCALED)  # > 0 everywhere (feature_eps · inv, inv = 1 off C)
            m_new = tl.maximum(m, tl.max(tl.where(col_ok[None, :], a, 0.0), axis=1))
            shrink = m / m_new
            a_hat = a / m_new[:, None]
            y = tl.where(col_ok[None, :], _power(a_hat, POWER), 0.0)
            a_hat = tl.where(col_ok[None, :], a_hat, 0.0)
            shrink_p = _power(tl.maximum(shrink, 1e-30), POWER)  # 0 on the first block, without log2(0)
            sq_a = sq_a * shrink * shrink + tl.sum(a_hat * a_hat, axis=1)
            sq_y = sq_y * shrink_p * shrink_p + tl.sum(y * y, axis=1)
            m = m_new
    return m, sq_a, sq_y


@triton.jit
def _head_state(s_ptr, z_ptr, state, cols, col_ok, D: tl.constexpr):
    """The (D×D, D) fp32 state of one (batch element, head) slot, zero-padded to D_PAD."""
    square_ok = col_ok[:, None] & col_ok[None, :]
    s = tl.load(s_ptr + state * (D * D) + cols[:, None] * D + cols[None, :], mask=square_ok, other=0.0)
    return s, tl.load(z_ptr + state * D + cols, mask=col_ok, other=0.0)


@triton.jit
def _features(
    x,
    inv,
    m,
    sq_a,
    sq_y,
    feature_eps,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
    PRESCALED: tl.constexpr,
):
    """φ(x) of a head tile; for the focused map from the token statistics of `_focus_stats`."""
    a = _map(x, inv[None, :], feature_eps, MAP, PRESCALED)
    if MAP == 0:
        y = _power(a / m[:, None], POWER)
        phi = y * (m * tl.sqrt(sq_a / sq_y))[:, None]
    else:
        phi = a
    return phi


@triton.jit
def _feature_grad(
    x,
    inv,
    dphi,
    m,
    sq_a,
    sq_y,
    cross,
    feature_eps,
    MAP: tl.constexpr,
    POWER: tl.constexpr,
):
    """dL/dx of a head tile from dL/dφ. Focused: ``cross`` = Σ_c dφ_c â_c^p over all C channels of the token, and
    dL/da = α̂ (p â^(p-1) (dφ - cross · â^p / ‖â^p‖²) + cross · â / ‖â‖²), α̂ = ‖â‖ / ‖â^p‖ (the scale-free form
    of the definition's gradient). Returns (dx, dL/da · (relu(x) + eps), the temperature's share; 0 if not
    focused)."""
    if MAP == 0:
        shifted = tl.maximum(x, 0.0) + feature_eps
        a_hat = shifted * inv[None, :] / m[:, None]
        y = _power(a_hat, POWER)
        alpha = tl.sqrt(sq_a / sq_y)
        direct = _power_grad(a_hat, POWER) * (dphi - (cross / sq_y)[:, None] * y)
        da = alpha[:, None] * (direct + (cross / sq_a)[:, None] * a_hat)
        dx = tl.where(x > 0.0, da * inv[None, :], 0.0)
        dinv = da * shifted
    elif MAP == 1:
        dx = tl.where(x > 0.0, dphi, 0.0)
        dinv = dx * 0.0
    else:
        dx = tl.where(x > 0.0, dphi, dphi * tl.exp(tl.minimum(x, 0.0)))
        dinv = dx * 0.0
    return dx, dinv


@triton.jit
def _neighbour(
    src_base,
    head_cols,
    col_ok,
    yy,
    xx,
    is_spatial,
    dy,
    dx,
    stride_n,
    prefix,
    grid_h,
    grid_w,
    mask_base,
    HAS_MASK: tl.constexpr,
):
    """src at (y + dy, x + dx) of each token of a head tile in fp32; zero off the map (and at masked tokens)."""
    ny = yy + dy
    nx = xx + dx
    ok = is_spatial & (ny >= 0) & (ny < grid_h) & (nx >= 0) & (nx < grid_w)
    neighbour = prefix + ny * grid_w + nx
    if HAS_MASK:
        ok = ok & (tl.load(mask_base + neighbour, mask=ok, other=0) != 0)
    return tl.load(
        src_base + neighbour[:, None] * stride_n + head_cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0.0
    ).to(tl.float32)


@triton.jit
def _shifted_sum(
    src_base,
    cols,
    col_ok,
    head_cols,
    yy,
    xx,
    is_spatial,
    stride_n,
    prefix,
    grid_h,
    grid_w,
    mask_base,
    w_ptr,
    BLOCK_N: tl.constexpr,
    D_PAD: tl.constexpr,
    K: tl.constexpr,
    SIGN: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """Σ_(ky,kx) w[:, ky, kx] · src[y + SIGN (ky - K//2), x + SIGN (kx - K//2)] over a head tile: the depthwise conv
    (SIGN = 1, masked sources zero) or its transpose (SIGN = -1)."""
    acc = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    for ky in range(K):
        for kx in range(K):
            value = _neighbour(
                src_base, head_cols, col_ok, yy, xx, is_spatial, SIGN * (ky - K // 2), SIGN * (kx - K // 2),
                stride_n, prefix, grid_h, grid_w, mask_base, HAS_MASK,
            )  # fmt: skip
            weight = tl.load(w_ptr + cols * (K * K) + (ky * K + kx), mask=col_ok, other=0.0).to(tl.float32)
            acc += value * weight[None, :]
    return acc


# ------------------------------------------------------------------------------------------------------ forward
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


# ----------------------------------------------------------------------------------------------------- backward
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
