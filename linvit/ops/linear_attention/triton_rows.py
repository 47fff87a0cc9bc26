"""The forward's output kernel for a whole map (no windows, no class tokens): the depthwise conv (DWC) of v streamed
down strips of the map, so that each value is read K times (once per horizontal tap) instead of K² times.

`triton_forward.output_kernel` gathers each of the K² taps of a tile of tokens from global memory: 25 reads of every
value at 5×5, 6.4 KB per token at C = 128, most of the forward's bytes (by the cost figure 8.8 KB per token and
0.96 ms of the forward's 1.08 at the benchmark shape). Here a program owns a strip of STRIP columns and a band of
rows of one image and walks the band row by row. Each input row is loaded K times, shifted by each horizontal tap,
and each load is multiplied into the K output rows it touches: a ring of K fp32 accumulators, one per output row in
flight (rows j - K//2 … j + K//2 while input row j is read). After row j the oldest is complete and is written out
with the attention of its tokens, φ(q)·S / (φ(q)·z + eps). The band's first K - 1 rows only fill the ring (their
outputs belong to the band above), so a band of r rows reads r + K - 1.

The taps multiply on the tensor cores, as `triton_tiles.depthwise_conv`'s do for 16-bit inputs of head dims up to
32 (`triton_taps.tap_products`; the plan takes this kernel only then): the conv's tile (every head's STRIP tokens as
the rows of one matrix, `triton_geometry.row_strip`) times the taps' diagonal weight matrices in TAP_DTYPE (the
weights rounded as autocast rounds them), fp32 accumulation; the matrices are built once per program and stay in
shared memory for the whole band.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention import triton_feature_maps as maps
from linvit.ops.linear_attention import triton_tiles as tiles

__all__ = ["output_rows_kernel"]


@triton.jit
def output_rows_kernel(
    qkv_ptr, inv_ptr, mask_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, w_ptr, bias_ptr, out_ptr,
    stride_b, stride_n, out_stride_b, out_stride_n, mask_stride_b, norms_stride_b, chunks, strips, band_rows, map_h,
    map_w, eps, feature_eps,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, STRIP: tl.constexpr,
    K: tl.constexpr, MAP: tl.constexpr, POWER: tl.constexpr, PRESCALED: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, TOKEN_NORMS: tl.constexpr, TAP_DTYPE: tl.constexpr,
    SOFTPLUS: tl.constexpr = False,
):  # fmt: skip
    """out = φ(q) S / (φ(q)·z + eps) + DWC(v) (+ bias) for the tokens of strip ``program_id(1) % strips`` (STRIP
    columns) of band ``program_id(1) // strips`` (band_rows rows) of image ``program_id(0)`` (its group's heads).
    ``chunks``: the state kernel's chunks per image, whose partial states are added here."""
    b = tl.program_id(0)
    strip = tl.program_id(1) % strips
    top = (tl.program_id(1) // strips) * band_rows
    bottom = tl.minimum(top + band_rows, map_h)
    head0 = tiles.first_head(H, H_PAD)
    channels, channel_ok, inv = tiles.channels_and_inverse(inv_ptr, head0, H, D, H_PAD, D_PAD, SOFTPLUS)
    s, z = tiles.reduced_state(s_ptr, z_ptr, count_ptr, b, chunks, head0, H, D, H_PAD, D_PAD)
    q_base = qkv_ptr + b.to(tl.int64) * stride_b
    v_base = q_base + 2 * H * D
    out_base = out_ptr + b.to(tl.int64) * out_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    norms_base = norms_ptr + b.to(tl.int64) * norms_stride_b + 3  # the queries' (m, ‖â‖², ‖â^p‖²)
    dims = tl.arange(0, D_PAD)[None, None, :]
    # the taps' diagonal matrices, built once and kept in shared memory for the band: for each dx the pairs of taps
    # (K-1-k, K-2-k) of even k, interleaved (column 2d + i: tap K-1-k-i), then tap (0, dx) alone. A product per pair
    # halves the products and the shared-memory operands (25 distinct ones spilled: each holds a descriptor)
    lanes = tl.arange(0, D_PAD)[None, :]
    diagonal = tl.arange(0, D_PAD)[:, None] == lanes
    pairs = ()
    taps = ()
    for dx in tl.static_range(K):
        for k in tl.static_range(0, K - 1, 2):
            upper = tl.load(w_ptr + lanes * (K * K) + (K - 1 - k) * K + dx, mask=lanes < D, other=0.0)
            lower = tl.load(w_ptr + lanes * (K * K) + (K - 2 - k) * K + dx, mask=lanes < D, other=0.0)
            pair = tl.join(tl.where(diagonal, upper, 0.0), tl.where(diagonal, lower, 0.0))
            pairs = pairs + (tl.reshape(pair, (D_PAD, 2 * D_PAD)).to(TAP_DTYPE),)
        top_tap = tl.load(w_ptr + lanes * (K * K) + dx, mask=lanes < D, other=0.0)
        taps = taps + (tl.where(diagonal, top_tap, 0.0).to(TAP_DTYPE),)
    bias = tl.zeros([1, 1, D_PAD], tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + dims, mask=dims < D, other=0.0).to(tl.float32)
    columns = strip * STRIP + tl.arange(0, STRIP)
    column_ok = columns < map_w
    R: tl.constexpr = K // 2
    FLAT: tl.constexpr = H_PAD * STRIP  # the conv's tiles: every head's STRIP tokens as the rows of one matrix
    zero = tl.zeros([FLAT, D_PAD], tl.float32)
    ring = ()  # the convs of output rows j - R … j + R - 1 so far, while input row j is read
    for _ in tl.static_range(K - 1):
        ring = ring + (zero,)
    for j in tl.range(top - R, bottom + R):
        # input row j, read once per horizontal tap dx, into each output row j - R + k it touches (tap dy = K-1-k)
        sums = ring + (zero,)
        inside = (j >= 0) & (j < map_h)
        row_values = v_base + (j * map_w + columns)[None, :, None] * stride_n + channels
        for dx in tl.static_range(K):
            # a scalar offset from the row's own addresses: per-tap address tiles would each hold registers
            x_columns = columns + (dx - R)
            x_ok = inside & (x_columns.to(tl.uint32) < map_w.to(tl.uint32))  # below 0 wraps above the width
            x_ok = tiles.unmasked(x_ok, mask_base, j * map_w + x_columns, HAS_MASK)
            values = tl.load(row_values + (dx - R) * stride_n, mask=x_ok[None, :, None] & channel_ok, other=0.0)
            values = tl.reshape(values, (FLAT, D_PAD))
            added = ()
            for k in tl.static_range(0, K - 1, 2):  # two output rows per product: a pair of taps' diagonals
                both = tl.reshape(tl.join(sums[k], sums[k + 1]), (FLAT, 2 * D_PAD))
                both = tl.dot(values.to(TAP_DTYPE), pairs[dx * (K // 2) + k // 2], both)
                earlier, later = tl.split(tl.reshape(both, (FLAT, D_PAD, 2)))
                added = added + (earlier, later)
            added = added + (tl.dot(values.to(TAP_DTYPE), taps[dx], sums[K - 1]),)
            sums = added
        # output row j - R is complete: its attention, plus its conv
        row = j - R
        places = row * map_w + columns
        row_ok = column_ok & (row >= top)
        ok = row_ok[None, :, None] & channel_ok
        x = tiles.load_tile(q_base, places, ok, stride_n, channels)
        m, sq_a, sq_y = maps.load_norms(norms_base, places, row_ok, TOKEN_NORMS)
        phi = maps.features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, PRESCALED, TOKEN_NORMS)
        phi = tl.where(ok, phi, 0.0)
        num = tiles.head_product(phi, s, H_PAD, DOT_PRECISION)
        den = tl.sum(phi * z[:, None, :], axis=2) + eps
        out = num * (1.0 / den)[:, :, None] + bias + tl.reshape(sums[0], (H_PAD, STRIP, D_PAD))
        tl.store(out_base + places[None, :, None] * out_stride_n + channels, out, mask=ok)
        ring = ()
        for k in tl.static_range(1, K):
            ring = ring + (sums[k],)
