"""The DWC weight's gradient on a whole map (no windows, no class tokens), streamed down strips of the map: each value
of v and of dL/dout read once per program, one program per horizontal tap, instead of once per tap.

dL/dw[dy, dx] = Σ over tokens o of v[o + (dy, dx) - K//2] · dL/dout[o], per channel and summed over the heads (the
DWC's weight is shared by them). `triton_backward.dwc_weight_grad_kernel` reads v once per group of up to three taps
and dL/dout once per tap (9.2 KB per token at the benchmark shape). Here a program owns a strip of columns, a band of
rows, one horizontal tap dx and a group of up to four heads (more spilled), and walks the band row by row: v's row j
shifted by dx is read once and multiplied with the K rows of dL/dout it meets (j - K//2 … j + K//2, a ring of K
tiles: the newest loaded each row, the oldest dropped), one tensor-core product per vertical tap,
(D, H_PAD·STRIP) @ (H_PAD·STRIP, D) over the group's tokens at once, whose diagonal is the tap's gradient and is
taken once per program. The band's first K - 1 rows only fill the ring. A program writes its K taps' partial sums
to its row of the plan's partials, as the tiled kernel does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention import triton_tiles as tiles

__all__ = ["dwc_weight_rows_kernel"]


@triton.jit
def dwc_weight_rows_kernel(
    qkv_ptr, mask_ptr, do_ptr, grads_ptr,
    stride_b, stride_n, do_stride_b, do_stride_n, mask_stride_b, grads_width, strips, bands, band_rows, map_h, map_w,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, STRIP: tl.constexpr,
    K: tl.constexpr, HAS_MASK: tl.constexpr, HALF_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The partial dL/dw[·, dx] (dx = ``program_id(1)``) of the heads of group g = ``program_id(2)`` (H_PAD heads
    from g·H_PAD) in strip ``p % strips`` of band ``p // strips % bands`` of image ``p // (strips · bands)``
    (p = ``program_id(0)``), into row p · groups + g of grads_ptr (after its H·D temperature columns, weight column
    d·K·K + dy·K + dx)."""
    p = tl.program_id(0)
    dx = tl.program_id(1)
    group = tl.program_id(2)
    image = p // (strips * bands)
    strip = p % strips
    top = (p // strips % bands) * band_rows
    bottom = tl.minimum(top + band_rows, map_h)
    v_base = qkv_ptr + image.to(tl.int64) * stride_b + 2 * H * D
    do_base = do_ptr + image.to(tl.int64) * do_stride_b
    mask_base = mask_ptr + image.to(tl.int64) * mask_stride_b
    channels, channel_ok = tiles.tile_channels(group * H_PAD, H, D, H_PAD, D_PAD)
    columns = strip * STRIP + tl.arange(0, STRIP)
    R: tl.constexpr = K // 2
    FLAT: tl.constexpr = H_PAD * STRIP
    v_columns = columns + dx - R
    v_column_ok = v_columns.to(tl.uint32) < map_w.to(tl.uint32)  # below 0 wraps above the width
    acc = ()  # per vertical tap dy: Σ vᵀ dL/dout, (D_PAD, D_PAD) fp32, whose diagonal is the gradient
    ring = ()  # dL/dout's rows j - R … j + R - 1 (then j + R joins), (FLAT, D_PAD)
    for _ in tl.static_range(K):
        acc = acc + (tl.zeros([D_PAD, D_PAD], tl.float32),)
    for _ in tl.static_range(K - 1):
        ring = ring + (tl.zeros([FLAT, D_PAD], do_ptr.dtype.element_ty),)
    for j in tl.range(top - 2 * R, bottom):
        newest = j + R  # dL/dout's row that joins the ring
        places = newest * map_w + columns
        ok = (columns < map_w) & (newest >= 0) & (newest < map_h)
        g = tl.load(do_base + places[None, :, None] * do_stride_n + channels, mask=ok[None, :, None] & channel_ok,
                    other=0.0)  # fmt: skip
        ring = ring + (tl.reshape(g, (FLAT, D_PAD)),)
        v_places = j * map_w + v_columns
        v_ok = tiles.unmasked(v_column_ok & (j >= top) & (j >= 0), mask_base, v_places, HAS_MASK)
        v = tl.load(v_base + v_places[None, :, None] * stride_n + channels, mask=v_ok[None, :, None] & channel_ok,
                    other=0.0)  # fmt: skip
        v_t = tl.trans(tl.reshape(v, (FLAT, D_PAD)))
        summed = ()
        for dy in tl.static_range(K):  # v's row j meets dL/dout's row j - dy + R: ring entry K - 1 - dy
            if HALF_DOT:
                summed = summed + (tl.dot(v_t, ring[K - 1 - dy], acc[dy]),)
            else:
                summed = summed + (tl.dot(v_t.to(tl.float32), ring[K - 1 - dy].to(tl.float32), acc[dy],
                                          input_precision=DOT_PRECISION),)  # fmt: skip
        acc = summed
        dropped = ()
        for m in tl.static_range(1, K):
            dropped = dropped + (ring[m],)
        ring = dropped
    row = grads_ptr + (p * tl.num_programs(2) + group).to(tl.int64) * grads_width + H * D
    dims = tl.arange(0, D_PAD)
    for dy in tl.static_range(K):
        diagonal = tl.sum(tl.where(dims[:, None] == dims[None, :], acc[dy], 0.0), axis=1)
        tl.store(row + dims * (K * K) + dy * K + dx, diagonal, mask=dims < D)
