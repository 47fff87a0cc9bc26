"""Tile helpers of the linear-attention kernels: loads, the feature maps and their gradients, the depthwise conv.

Shared by `triton_forward.py` and `triton_backward.py` (see `triton_forward.py` for the kernels' design). Feature
maps (``MAP``): 0 focused, 1 relu, 2 elu + 1. The focused map is a = (relu(x) + feature_eps)·inv
(max(x, feature_eps·inv) when ``PRESCALED``: x already holds (x + feature_eps)·inv) and φ = ‖a‖ / ‖a^p‖ · a^p with
the norms over all C channels of a token, evaluated scale-free: with m = max_c a and â = a / m,
φ = m · ‖â‖ / ‖â^p‖ · â^p, which equals the definition but neither overflows for large a nor underflows to denormals
(and 0/0) for tiny a, where a^(2p) leaves float32's range. Rows are tokens; the first ``prefix`` tokens (class
tokens) have no position: no positional term, no DWC.
"""

from __future__ import annotations

import triton
import triton.language as tl

FOCUSED = 0
RELU = 1
ELU = 2


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
