"""The backward's kernels on a whole map (no windows, no class tokens), streamed down strips of the map as the
forward's output is (`triton_rows.py`): each row of v and of dL/dout read about once (its strip and a halo of K - 1
columns), not once per tap.

``dwc_weight_rows_kernel``: dL/dw[dy, dx] = Σ over tokens o of v[o + (dy, dx) - K//2] · dL/dout[o], per channel and
summed over the heads (the DWC's weight is shared by them). `triton_backward.dwc_weight_grad_kernel` reads v once per
group of up to three taps and dL/dout once per tap (9.2 KB per token at the benchmark shape). Here a program owns a
strip of columns, a band of rows, a block of 16 channels and a group of up to four heads, and walks the band row by
row: v's row j is read once with its halo, its K horizontal shifts (gathers within the program) stacked side by side
(padded to 4 or 8) as one (tokens, shifts·16) tile, and multiplied with the K rows of dL/dout it meets (j - K//2 … j +
K//2, a ring: the newest loaded each row, the oldest dropped), one tensor-core product per vertical tap, (shifts·16,
H_PAD·STRIP) @ (H_PAD·STRIP, 16) over the group's tokens at once. The diagonal of each shift's 16 × 16 block is a
tap's gradient, taken once per program. Stacked, a product has the 64 rows or more that a warpgroup's takes (16 rows
alone were padded to 64, 4× the work), and a block of 16 channels wastes 16× the conv's multiply-adds on the
off-diagonal products, where a program of all 32 channels per tap (the kernel before, one program per horizontal tap)
wasted 32× and read v and dL/dout K times: 2,646 → 606 B and 0.289 → 0.091 ms at the benchmark shape by the cost
figure. The band's first K - 1 rows only fill the ring. A program writes its K² taps' partial sums to its row of the
plan's partials, as the tiled kernel does.

``value_conv_rows_kernel``: dL/dv's share through the conv, the transposed DWC of dL/dout, which
`triton_backward.key_value_grad_kernel` otherwise gathers tap by tap (6.4 KB of its 11.4 KB per token at the
benchmark shape): the forward's streamed conv with the taps flipped (each row read once with its halo), written to a
buffer that the key kernel adds.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention import triton_rows
from linvit.ops.linear_attention import triton_tiles as tiles

__all__ = ["dwc_weight_rows_kernel", "value_conv_rows_kernel"]


@triton.jit
def dwc_weight_rows_kernel(
    qkv_ptr, mask_ptr, do_ptr, grads_ptr,
    stride_b, stride_n, do_stride_b, do_stride_n, mask_stride_b, grads_width, strips, bands, band_rows, map_h, map_w,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, BLOCK_D: tl.constexpr, STRIP: tl.constexpr,
    K: tl.constexpr, HALO: tl.constexpr, WORDS: tl.constexpr, HAS_MASK: tl.constexpr, HALF_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The partial dL/dw of channels c·BLOCK_D … c·BLOCK_D + BLOCK_D - 1 (c = ``program_id(1)``) of the heads of group
    g = ``program_id(2)`` (H_PAD heads from g·H_PAD) in strip ``p % strips`` of band ``p // strips % bands`` of image
    ``p // (strips · bands)`` (p = ``program_id(0)``), into row p · groups + g of grads_ptr (after its H·D temperature
    columns, weight column d·K·K + dy·K + dx)."""
    p = tl.program_id(0)
    block = tl.program_id(1)
    group = tl.program_id(2)
    image = p // (strips * bands)
    strip = p % strips
    top = (p // strips % bands) * band_rows
    bottom = tl.minimum(top + band_rows, map_h)
    v_base = qkv_ptr + image.to(tl.int64) * stride_b + 2 * H * D
    do_base = do_ptr + image.to(tl.int64) * do_stride_b
    mask_base = mask_ptr + image.to(tl.int64) * mask_stride_b
    heads = group * H_PAD + tl.arange(0, H_PAD)[:, None, None]
    dims = block * BLOCK_D + tl.arange(0, BLOCK_D)[None, None, :]
    channels, channel_ok = heads * D + dims, (heads < H) & (dims < D)
    columns = strip * STRIP + tl.arange(0, STRIP)
    R: tl.constexpr = K // 2
    FLAT: tl.constexpr = H_PAD * STRIP
    SHIFTS: tl.constexpr = 4 if K <= 4 else 8  # the K horizontal shifts stacked, padded to a power of two
    acc = ()  # per vertical tap dy: (SHIFTS·BLOCK_D, BLOCK_D) fp32, the diagonal of each shift's block its gradient
    ring = ()  # dL/dout's rows j - R … j + R - 1 (then j + R joins), (FLAT, BLOCK_D)
    for _ in tl.static_range(K):
        acc = acc + (tl.zeros([SHIFTS * BLOCK_D, BLOCK_D], tl.float32),)
    for _ in tl.static_range(K - 1):
        ring = ring + (tl.zeros([FLAT, BLOCK_D], do_ptr.dtype.element_ty),)
    for j in tl.range(top - 2 * R, bottom):
        newest = j + R  # dL/dout's row that joins the ring
        places = newest * map_w + columns
        ok = (columns < map_w) & (newest >= 0) & (newest < map_h)
        g = tl.load(do_base + places[None, :, None] * do_stride_n + channels, mask=ok[None, :, None] & channel_ok,
                    other=0.0)  # fmt: skip
        ring = ring + (tl.reshape(g, (FLAT, BLOCK_D)),)
        # v's row j (the band's own rows only) with K//2 columns on each side, read once, its K shifts stacked
        v_row = tl.where(j >= top, j, -1)  # row -1 reads as zeros
        strip_values, halo = triton_rows.row_and_halo(v_base, mask_base, v_row, strip * STRIP, channels, channel_ok,
                                                      stride_n, map_h, map_w, STRIP, K, HALO, HAS_MASK,
                                                      WORDS)  # fmt: skip
        shifts = ()
        for dx in tl.static_range(SHIFTS):
            if dx < K:
                shifted = triton_rows.shifted_row(strip_values, halo, dx - R, STRIP, HALO, K, WORDS,
                                                  v_base.dtype.element_ty)  # fmt: skip
                shifts = shifts + (tl.reshape(shifted, (FLAT, BLOCK_D)),)
            else:
                shifts = shifts + (tl.zeros([FLAT, BLOCK_D], v_base.dtype.element_ty),)
        v_t = tl.trans(_stacked(shifts, FLAT, BLOCK_D, SHIFTS))
        summed = ()
        for dy in tl.static_range(K):  # v's row j meets dL/dout's row j - dy + R: ring entry K - 1 - dy
            if HALF_DOT:
                summed = summed + (tl.dot(v_t, ring[K - 1 - dy], acc[dy]),)
            else:
                summed = summed + (tl.dot(v_t.to(tl.float32), ring[K - 1 - dy].to(tl.float32), acc[dy],
                                          input_precision=DOT_PRECISION),)  # fmt: skip
        acc = summed
        ring = ring[1:]
    row = grads_ptr + (p * tl.num_programs(2) + group).to(tl.int64) * grads_width + H * D
    lanes = tl.arange(0, BLOCK_D)
    stacked_rows = tl.arange(0, SHIFTS * BLOCK_D)[:, None]
    weight_dims = block * BLOCK_D + lanes
    for dy in tl.static_range(K):
        for dx in tl.static_range(K):
            own = stacked_rows == lanes[None, :] * SHIFTS + dx  # channel c's row of shift dx: c·SHIFTS + dx
            diagonal = tl.sum(tl.where(own, acc[dy], 0.0), axis=0)
            tl.store(row + weight_dims * (K * K) + dy * K + dx, diagonal, mask=weight_dims < D)


@triton.jit
def _stacked(tiles, FLAT: tl.constexpr, BLOCK_D: tl.constexpr, SHIFTS: tl.constexpr):
    """The SHIFTS tiles (FLAT, BLOCK_D) side by side as one (FLAT, SHIFTS·BLOCK_D), tile m's channel c at column
    c·SHIFTS + m (`tl.join` makes the new axis the innermost, so the leaves go in bit-reversed order)."""
    if SHIFTS == 4:
        both = tl.join(tl.join(tiles[0], tiles[2]), tl.join(tiles[1], tiles[3]))
    else:
        both = tl.join(tl.join(tl.join(tiles[0], tiles[4]), tl.join(tiles[2], tiles[6])),
                       tl.join(tl.join(tiles[1], tiles[5]), tl.join(tiles[3], tiles[7])))  # fmt: skip
    return tl.reshape(both, (FLAT, SHIFTS * BLOCK_D))


@triton.jit
def value_conv_rows_kernel(
    do_ptr, w_ptr, conv_ptr, grads_ptr, ds_ptr, dz_ptr, count_ptr, sum_ds_ptr, sum_dz_ptr, sum_count_ptr,
    do_stride_b, do_stride_n, grads_width, strips, band_rows, map_h, map_w, chunks,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
    STRIP: tl.constexpr, K: tl.constexpr, HALO: tl.constexpr, WORDS: tl.constexpr, TAP_DTYPE: tl.constexpr,
    GROUPED: tl.constexpr = False,
):  # fmt: skip
    """dL/dout's transposed DWC, dL/dv's share through the conv: Σ_tap w[tap] · dL/dout[token - offset(tap)], for
    the tokens of strip ``program_id(1) % strips`` of band ``program_id(1) // strips`` of image ``program_id(0)``
    and channels c·BLOCK_D … c·BLOCK_D + BLOCK_D - 1 of each head of group g (``program_id(2)`` = g · D_PAD /
    BLOCK_D + c: the taps' diagonal products of a block of 16 do 16× the conv's multiply-adds, of a whole head of 32
    32×; ``GROUPED``: a block of 16 read as words, up to DWC 5, multiplies its older output rows in flight in one
    product, `triton_rows.conv_row_block`: 147 -> 135 warp-instructions a token at the benchmark shape), into
    conv_ptr ((images, H·W, C), contiguous, qkv's dtype), which key_value_grad adds to dL/dv and zeroes at masked
    keys. The forward's streamed conv (`triton_rows.conv_row`) with the taps flipped:
    each row of dL/dout read once with its halo, where the tiled key kernel gathers it once per tap (6.4 KB per token
    at the benchmark shape, most of that kernel's bytes). And the DWC bias's partial gradient, Σ dL/dout over the
    program's tokens (each row of its band is read there anyway), into row ``program_id(0) · num_programs(1) +
    program_id(1)`` of grads_ptr, its group's share of the bias columns (after the H·D temperature and D·K·K weight
    columns), as key_value_grad writes them on the tiled path. And the first program of each image and head group adds
    up query_grad's ``chunks`` partial dS, dz and kept-key counts of the image once, into its slot of sum_ds_ptr,
    sum_dz_ptr, sum_count_ptr, which key_value_grad then reads instead of every partial in each of its programs (256 B
    a token at the benchmark shape); a kernel between the two, so no atomics order them."""
    b = tl.program_id(0)
    strip = tl.program_id(1) % strips
    top = (tl.program_id(1) // strips) * band_rows
    bottom = tl.minimum(top + band_rows, map_h)
    BLOCKS: tl.constexpr = D_PAD // BLOCK_D
    group = tl.program_id(2) // BLOCKS
    first = (tl.program_id(2) % BLOCKS) * BLOCK_D  # the block's first channel of a head
    heads = group * H_PAD + tl.arange(0, H_PAD)[:, None, None]
    dims = first + tl.arange(0, BLOCK_D)[None, None, :]
    channels, channel_ok = heads * D + dims, (heads < H) & (dims < D)
    do_base = do_ptr + b.to(tl.int64) * do_stride_b
    conv_base = conv_ptr + b.to(tl.int64) * map_h * map_w * (H * D)  # 64-bit before the product: large maps
    if GROUPED:
        grouped = triton_rows.block_tap_matrices(w_ptr, D, BLOCK_D, K, TAP_DTYPE, tl.program_id(2) % BLOCKS, True)
    else:
        pairs, taps = triton_rows.tap_matrices(w_ptr + first * (K * K), D - first, BLOCK_D, K, TAP_DTYPE, True)
    columns = strip * STRIP + tl.arange(0, STRIP)
    R: tl.constexpr = K // 2
    ring = triton_rows.empty_ring(H_PAD, STRIP, BLOCK_D, K)
    bias = tl.zeros([H_PAD * STRIP, BLOCK_D], tl.float32)  # summed over the tokens once, at the end
    for j in tl.range(top - R, bottom + R):
        if GROUPED:
            sums, row_values = triton_rows.conv_row_block(ring, grouped, do_base, do_base, j, strip * STRIP,
                                                          channels, channel_ok, do_stride_n, map_h, map_w, H_PAD,
                                                          STRIP, BLOCK_D, K, HALO, False, TAP_DTYPE)  # fmt: skip
        else:
            sums, row_values = triton_rows.conv_row(ring, pairs, taps, do_base, do_base, j, strip * STRIP, channels,
                                                    channel_ok, do_stride_n, map_h, map_w, H_PAD, STRIP, BLOCK_D, K,
                                                    HALO, False, TAP_DTYPE, WORDS)  # fmt: skip
        bias += tl.where((j >= top) & (j < bottom), row_values.to(tl.float32), 0.0)  # the band's own rows
        row = j - R  # complete
        ok = ((columns < map_w) & (row >= top))[None, :, None] & channel_ok
        conv = tl.reshape(sums[0], (H_PAD, STRIP, BLOCK_D))
        tl.store(conv_base + (row * map_w + columns)[None, :, None] * (H * D) + channels, conv, mask=ok)
        ring = sums[1:]
    grads_row = grads_ptr + (b * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * grads_width
    lanes = first + tl.arange(0, BLOCK_D)
    tl.store(grads_row + H * D + D * K * K + group * D + lanes, tl.sum(bias, axis=0), mask=lanes < D)
    if (tl.program_id(1) == 0) & (first == 0):
        head0 = group * H_PAD
        s, z, kept = tiles.summed_state(ds_ptr, dz_ptr, count_ptr, b, chunks, head0, H, D, H_PAD, D_PAD)
        tiles.store_state(sum_ds_ptr, sum_dz_ptr, b.to(tl.int64), s, z, head0, H, D, H_PAD, D_PAD)
        if head0 == 0:  # every group counts the same keys
            tl.store(sum_count_ptr + b, kept)
