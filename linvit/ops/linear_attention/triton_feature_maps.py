"""The feature maps of the linear-attention kernels on a tile, and their gradients (``MAP``: 0 focused, 1 relu,
2 elu + 1). Shared by `triton_forward.py` and `triton_backward.py`; the tile layout is `triton_tiles.py`'s.

The focused map is a = (relu(x) + feature_eps)·inv (max(x, feature_eps·inv) when ``PRESCALED``: x already holds
(x + feature_eps)·inv) and φ = ‖a‖ / ‖a^p‖ · a^p with the norms over all C channels of a token, evaluated
scale-free: with m = max_c a and â = a / m, φ = m · ‖â‖ / ‖â^p‖ · â^p, which equals the definition but neither
overflows for large a nor underflows to denormals (and 0/0) for tiny a, where a^(2p) leaves float32's range. With
head groups a tile holds only some heads of its tokens: the norms then come from a pass of their own
(``TOKEN_NORMS``, :func:`load_norms`) and the part of dL/dx that couples the heads from :func:`cross_head_grad`.
"""

from __future__ import annotations

import triton
import triton.language as tl

FOCUSED = 0
RELU = 1
ELU = 2
# fp32 values per token of the focused map's norms in head groups: the key's (m, ‖â‖², ‖â^p‖²), then the query's
NORMS_PER_TOKEN = tl.constexpr(6)


@triton.jit
def power(a, POWER: tl.constexpr):
    """a^p for a >= 0; exact products for p = 0, 1, 2, 3, 4."""
    if POWER == 0.0:
        out = a * 0.0 + 1.0
    elif POWER == 1.0:
        out = a
    elif POWER == 2.0:
        out = a * a
    elif POWER == 3.0:
        out = a * a * a
    elif POWER == 4.0:
        out = a * a
        out = out * out
    else:
        out = tl.exp2(POWER * tl.log2(a))
    return out


@triton.jit
def row_sum(x):
    """Σ over the heads and channels of each token of a tile: (BLOCK_N,)."""
    return tl.sum(tl.sum(x, axis=2), axis=0)


@triton.jit
def focus_input(x, inv, channel_ok, feature_eps, PRESCALED: tl.constexpr):
    """a = (relu(x) + feature_eps)·inv of a tile (> 0 in range), 0 out of range."""
    if PRESCALED:
        a = tl.maximum(x, feature_eps * inv)
    else:
        a = (tl.maximum(x, 0.0) + feature_eps) * inv
    return tl.where(channel_ok, a, 0.0)


@triton.jit
def token_norms(a, POWER: tl.constexpr):
    """The focused map's per-token (m, ‖â‖², ‖â^p‖²) of a tile of a = :func:`focus_input` holding every channel."""
    m = tl.max(tl.max(a, axis=2), axis=0)
    a_hat = a * (1.0 / m)[None, :, None]
    y = power(a_hat, POWER)
    return m, row_sum(a_hat * a_hat), row_sum(y * y)


@triton.jit
def store_norms(base, places, ok, m, sq_a, sq_y):
    """Write the (m, ‖â‖², ‖â^p‖²) of the tokens at ``places`` where ``ok``: 3 fp32 at base + NORMS_PER_TOKEN·place."""
    tl.store(base + places * NORMS_PER_TOKEN, m, mask=ok)
    tl.store(base + places * NORMS_PER_TOKEN + 1, sq_a, mask=ok)
    tl.store(base + places * NORMS_PER_TOKEN + 2, sq_y, mask=ok)


@triton.jit
def load_norms(base, places, ok, TOKEN_NORMS: tl.constexpr):
    """With ``TOKEN_NORMS``, the (m, ‖â‖², ‖â^p‖²) of the tokens at ``places`` from the norms pass (as
    :func:`store_norms` wrote them; 1 where not ``ok``); else placeholders that :func:`focus` ignores."""
    if TOKEN_NORMS:
        m = tl.load(base + places * NORMS_PER_TOKEN, mask=ok, other=1.0)
        sq_a = tl.load(base + places * NORMS_PER_TOKEN + 1, mask=ok, other=1.0)
        sq_y = tl.load(base + places * NORMS_PER_TOKEN + 2, mask=ok, other=1.0)
    else:
        m = 1.0
        sq_a = 1.0
        sq_y = 1.0
    return m, sq_a, sq_y


@triton.jit
def focus(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, POWER: tl.constexpr, PRESCALED: tl.constexpr,
          TOKEN_NORMS: tl.constexpr):  # fmt: skip
    """The focused map's pieces of a tile: (â^p, â, scale = m·‖â‖/‖â^p‖, ‖â‖², ‖â^p‖²); φ = â^p · scale. The
    norms run over all C channels of a token: from the tile, or with ``TOKEN_NORMS`` the given m, sq_a, sq_y."""
    a = focus_input(x, inv, channel_ok, feature_eps, PRESCALED)
    if not TOKEN_NORMS:
        m, sq_a, sq_y = token_norms(a, POWER)
    a_hat = a * (1.0 / m)[None, :, None]
    return power(a_hat, POWER), a_hat, m * tl.sqrt(sq_a / sq_y), sq_a, sq_y


@triton.jit
def features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP: tl.constexpr, POWER: tl.constexpr,
             PRESCALED: tl.constexpr, TOKEN_NORMS: tl.constexpr):  # fmt: skip
    """φ(x) of a tile (m, sq_a, sq_y: :func:`load_norms`)."""
    if MAP == 0:
        y, _, scale, _, _ = focus(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, POWER, PRESCALED, TOKEN_NORMS)
        phi = y * scale[None, :, None]
    elif MAP == 1:
        phi = tl.maximum(x, 0.0)
    else:
        phi = tl.where(x > 0.0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    return phi


@triton.jit
def scaled_features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP: tl.constexpr, POWER: tl.constexpr,
                    PRESCALED: tl.constexpr, TOKEN_NORMS: tl.constexpr):  # fmt: skip
    """φ(x) of a tile as (y, scale): φ = y · scale with a per-token scale (the focused map's â^p and
    m·‖â‖/‖â^p‖; 1 for the others), for products whose per-token factor can be applied to their results instead of
    to every element of φ (a multiply an element less)."""
    if MAP == 0:
        y, _, scale, _, _ = focus(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, POWER, PRESCALED, TOKEN_NORMS)
    else:
        y = features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, PRESCALED, TOKEN_NORMS)
        scale = tl.full([x.shape[1]], 1.0, tl.float32)
    return y, scale


@triton.jit
def feature_grad(x, inv, channel_ok, dphi, feature_eps, m, sq_a, sq_y, MAP: tl.constexpr, POWER: tl.constexpr,
                 TOKEN_NORMS: tl.constexpr):  # fmt: skip
    """(φ(x), dL/dx, the temperature's share dL/da · (relu(x) + eps), cross) of a tile from dL/dφ.

    Focused: with cross = Σ_c dφ_c â_c^p over all C channels of the token and α̂ = ‖â‖ / ‖â^p‖,
    dL/da = α̂ p â^(p-1) dφ + cross · α̂ (â / ‖â‖² - p â^(p-1) â^p / ‖â^p‖²) (the scale-free form of the
    definition's gradient). With ``TOKEN_NORMS`` the tile holds only some heads: cross is this tile's share (returned,
    per token) and dL/dx, the temperature's share leave its term out (:func:`cross_head_grad` adds it). The
    temperature's share and cross are 0 for the other maps."""
    if MAP == 0:
        y, a_hat, scale, sq_a, sq_y = focus(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, POWER, False,
                                            TOKEN_NORMS)  # fmt: skip
        phi = y * scale[None, :, None]
        cross = row_sum(dphi * y)
        alpha = tl.sqrt(sq_a / sq_y)
        # p â^(p-1) as â^(p-1) (the product â^p starts with) times a per-token p·α̂: two multiplies an element less
        lower = power(a_hat, POWER - 1.0)
        if TOKEN_NORMS:
            da = (lower * dphi) * (alpha * POWER)[None, :, None]
        else:
            direct = lower * (dphi - (cross / sq_y)[None, :, None] * y)
            da = direct * (alpha * POWER)[None, :, None] + a_hat * (alpha * cross / sq_a)[None, :, None]
        da = tl.where(channel_ok, da, 0.0)
        dx = tl.where(x > 0.0, da * inv, 0.0)
        dinv = da * (tl.maximum(x, 0.0) + feature_eps)
    elif MAP == 1:
        phi = tl.maximum(x, 0.0)
        dx = tl.where(x > 0.0, dphi, 0.0)
        dinv = dx * 0.0
        cross = row_sum(dinv)
    else:
        phi = tl.where(x > 0.0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
        dx = tl.where(x > 0.0, dphi, dphi * tl.exp(tl.minimum(x, 0.0)))
        dinv = dx * 0.0
        cross = row_sum(dinv)
    return phi, dx, dinv, cross


@triton.jit
def cross_head_grad(x, inv, channel_ok, cross, feature_eps, m, sq_a, sq_y, POWER: tl.constexpr):
    """The focused map's cross-head part of (dL/dx, the temperature's share) of a tile, given each token's cross
    summed over all heads: dL/da = cross · α̂ (â / ‖â‖² - p â^(p-1) â^p / ‖â^p‖²) (see :func:`feature_grad`), as
    â · (c₁ - c₂ · â^(2p-2)) with the per-token c₁ = cross · α̂ / ‖â‖², c₂ = cross · α̂ · p / ‖â^p‖²."""
    shifted = tl.maximum(x, 0.0) + feature_eps
    a_hat = tl.where(channel_ok, shifted * inv, 0.0) * (1.0 / m)[None, :, None]
    scaled = cross * tl.sqrt(sq_a / sq_y)
    first = (scaled / sq_a)[None, :, None]
    second = (scaled * POWER / sq_y)[None, :, None]
    da = a_hat * (first - second * power(a_hat, 2.0 * POWER - 2.0))
    return tl.where(x > 0.0, da * inv, 0.0), da * shifted
