"""The forward's output kernel for a whole map (no windows, no class tokens): the depthwise conv (DWC) of v streamed
down strips of the map, so that each value is read about once (its strip's row and a halo of K - 1 columns) instead
of K² times.

`triton_forward.output_kernel` gathers each of the K² taps of a tile of tokens from global memory: 25 reads of every
value at 5×5, 6.4 KB per token at C = 128, most of the forward's bytes (by the cost figure 8.8 KB per token and
0.96 ms of the forward's 1.08 at the benchmark shape). Here a program owns a strip of STRIP columns and a band of
rows of one image and walks the band row by row. Each input row is loaded once with K//2 columns on each side and
shifted within the program for each horizontal tap (gathers; read again per tap it cost 5× its bytes, 1,280 of the
kernel's 2,128 B a token at the benchmark shape, 1,138 now; with the focused map's head groups, where the gathers
spill, it is still read per tap), and each shift is multiplied into the K output rows it touches: a ring of K fp32
accumulators, one per output row in flight (rows j - K//2 … j + K//2 while input row j is read). After row j the
oldest is complete and is written out with the attention of its tokens, φ(q)·S / (φ(q)·z + eps). The band's first
K - 1 rows only fill the ring (their outputs belong to the band above), so a band of r rows reads r + K - 1.

The taps multiply on the tensor cores, as `triton_tiles.depthwise_conv`'s do for 16-bit inputs of head dims up to
32 (`triton_taps.tap_products`; the plan takes this kernel only then): the conv's tile (every head's STRIP tokens as
the rows of one matrix, `triton_geometry.row_strip`) times the taps' diagonal weight matrices in TAP_DTYPE (the
weights rounded as autocast rounds them), fp32 accumulation; the matrices are built once per program and stay in
shared memory for the whole band. Heads of 32 channels read as words take the conv in two halves of 16
(`conv_row_halves`): a half's diagonal products do 16× the conv's multiply-adds where a whole head's did 32×, and
a half's older output rows in flight take one product, their taps side by side (at the benchmark shape the kernel
went from 0.121 ms of tensor-core work to 0.065, from 267 warp-instructions a token to 243: fewer products, and a
half's words go to the products as they are read).

From four heads a program on the kernel runs two warpgroups (`triton_geometry.output_row_warps`): strips twice as
wide, one program a multiprocessor, so that a row's halo and the state's chunks, which every program adds up, are
read for twice the tokens (at the benchmark shape 1,145 → 988 B a token). The attention's products take S in bf16
with bf16 inputs (`triton_tiles.state_operand`), φ(q) as â^p with its per-token scale applied to their results
(`triton_feature_maps.scaled_features`), and a row in pieces of 16 tokens where a program has fewer heads than
warps (`triton_geometry.head_splits`): 243 → 213 warp-instructions a token, 0.125 → 0.108 ms.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linvit.ops.linear_attention import triton_feature_maps as maps
from linvit.ops.linear_attention import triton_tiles as tiles

__all__ = ["block_tap_matrices", "conv_row", "conv_row_block", "conv_row_halves", "empty_ring", "output_rows_kernel",
           "row_and_halo", "shifted_row", "tap_matrices"]  # fmt: skip


@triton.jit
def tap_matrices(w_ptr, D: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr, TAP_DTYPE: tl.constexpr,
                 FLIPPED: tl.constexpr):  # fmt: skip
    """The taps' diagonal weight matrices as :func:`conv_row` multiplies them, built once a program (they stay in
    shared memory for the band): for each dx the pairs of taps (K-1-k, K-2-k) of even k, side by side (column
    i·D_PAD + d: tap K-1-k-i), then tap (0, dx) alone. A product per pair halves the products and the shared-memory
    operands (25 distinct ones spilled: each holds a descriptor). Side by side, each half of a pair's accumulator
    holds its registers as a lone tap's does, so the ring's rows pass between the pair and lone products without
    moving (interleaved, column 2d + i, they were shuffled: the output kernel issued 300 warp-instructions a token at
    the benchmark shape, 271 so). ``FLIPPED``: tap (dy, dx) is the weight's (K-1-dy, K-1-dx), the transposed conv's."""
    lanes = tl.arange(0, D_PAD)[None, :]
    diagonal = tl.arange(0, D_PAD)[:, None] == lanes
    pairs = ()
    taps = ()
    for dx in tl.static_range(K):
        for k in tl.static_range(0, K - 1, 2):
            upper = tl.load(w_ptr + lanes * (K * K) + _tap(K - 1 - k, dx, K, FLIPPED), mask=lanes < D, other=0.0)
            lower = tl.load(w_ptr + lanes * (K * K) + _tap(K - 2 - k, dx, K, FLIPPED), mask=lanes < D, other=0.0)
            pair = tl.permute(tl.join(tl.where(diagonal, upper, 0.0), tl.where(diagonal, lower, 0.0)), (0, 2, 1))
            pairs = pairs + (tl.reshape(pair, (D_PAD, 2 * D_PAD)).to(TAP_DTYPE),)
        top_tap = tl.load(w_ptr + lanes * (K * K) + _tap(0, dx, K, FLIPPED), mask=lanes < D, other=0.0)
        taps = taps + (tl.where(diagonal, top_tap, 0.0).to(TAP_DTYPE),)
    return pairs, taps


@triton.jit
def _tap(dy: tl.constexpr, dx: tl.constexpr, K: tl.constexpr, FLIPPED: tl.constexpr):
    """The weight's index of tap (dy, dx): its own, or the one opposite (the transposed conv's)."""
    if FLIPPED:
        return (K - 1 - dy) * K + (K - 1 - dx)
    return dy * K + dx


@triton.jit
def empty_ring(H_PAD: tl.constexpr, STRIP: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr):
    """The K - 1 output rows in flight before a band's first input row: zero convs, (H_PAD·STRIP, D_PAD) each."""
    zero = tl.zeros([H_PAD * STRIP, D_PAD], tl.float32)
    ring = ()
    for _ in tl.static_range(K - 1):
        ring = ring + (zero,)
    return ring


@triton.jit
def conv_row(ring, pairs, taps, base, mask_base, j, first, channels, channel_ok, stride_n, map_h, map_w,
             H_PAD: tl.constexpr, STRIP: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr, HALO: tl.constexpr,
             HAS_MASK: tl.constexpr, TAP_DTYPE: tl.constexpr, WORDS: tl.constexpr):  # fmt: skip
    """Input row j of the strip of STRIP columns from ``first`` multiplied into the K output rows it touches:
    ``ring`` holds the convs of output rows j - K//2 … j + K//2 - 1 so far; returns those of rows
    j - K//2 … j + K//2, the first complete, and the row's own values (FLAT, D_PAD) (the centre tap's). Each horizontal
    tap dx takes the row shifted by dx - K//2 (zero outside the map and at masked tokens) and multiplies it with the
    pairs of vertical taps (:func:`tap_matrices`), every head's STRIP tokens as the rows of one matrix.

    With a ``HALO`` (2·(K//2) rounded up to a power of two) the row is read once, its strip and the K//2 columns on
    each side, and shifted within the program (gathers): reading it again per tap cost 5× the row's bytes, 1,280 of
    the output kernel's 2,128 B a token at the benchmark shape. ``HALO`` 0: read per tap (where the gathers'
    registers spill: the output kernel with the focused map's head groups, 16 B at 6×32)."""
    R: tl.constexpr = K // 2
    FLAT: tl.constexpr = H_PAD * STRIP
    sums = ring + (tl.zeros([FLAT, D_PAD], tl.float32),)
    inside = (j >= 0) & (j < map_h)
    columns = first + tl.arange(0, STRIP)
    row = base + (j * map_w + columns)[None, :, None] * stride_n + channels
    if HALO > 0:
        strip, halo = row_and_halo(base, mask_base, j, first, channels, channel_ok, stride_n, map_h, map_w, STRIP, K,
                                   HALO, HAS_MASK, WORDS)  # fmt: skip
    for dx in tl.static_range(K):
        if HALO == 0:  # a scalar offset from the row's own addresses: per-tap address tiles would hold registers
            shifted_columns = columns + (dx - R)
            shifted_ok = inside & (shifted_columns.to(tl.uint32) < map_w.to(tl.uint32))  # below 0 wraps
            shifted_ok = tiles.unmasked(shifted_ok, mask_base, j * map_w + shifted_columns, HAS_MASK)
            shifted = tl.load(row + (dx - R) * stride_n, mask=shifted_ok[None, :, None] & channel_ok, other=0.0)
        else:
            shifted = shifted_row(strip, halo, dx - R, STRIP, HALO, K, WORDS, base.dtype.element_ty)
        values = tl.reshape(shifted, (FLAT, D_PAD))
        if dx == R:
            centre = values
        added = ()
        for k in tl.static_range(0, K - 1, 2):  # two output rows per product: a pair of taps' diagonals
            both = tl.reshape(tl.permute(tl.join(sums[k], sums[k + 1]), (0, 2, 1)), (FLAT, 2 * D_PAD))
            both = tl.dot(values.to(TAP_DTYPE), pairs[dx * (K // 2) + k // 2], both)
            earlier, later = tl.split(tl.permute(tl.reshape(both, (FLAT, 2, D_PAD)), (0, 2, 1)))
            added = added + (earlier, later)
        added = added + (tl.dot(values.to(TAP_DTYPE), taps[dx], sums[K - 1]),)
        sums = added
    return sums, centre


@triton.jit
def block_tap_matrices(w_ptr, D: tl.constexpr, W: tl.constexpr, K: tl.constexpr, TAP_DTYPE: tl.constexpr,
                       BLOCK, FLIPPED: tl.constexpr):  # fmt: skip
    """The taps of channels BLOCK·W … BLOCK·W + W - 1 of a head (W = 16: half a head of 32) as
    :func:`conv_row_halves` and :func:`conv_row_block` multiply them, for each dx: the diagonal matrices of taps
    K-1 … 1 (one per output row in flight but the newest) side by side, (W, (K-1)·W) (K = 3 or 5), then tap (0, dx)
    alone."""
    lanes = tl.arange(0, W)[None, :]
    diagonal = tl.arange(0, W)[:, None] == lanes
    channels = BLOCK * W + lanes
    groups = ()
    taps = ()
    for dx in tl.static_range(K):
        rows = ()
        for dy in tl.static_range(K - 1, -1, -1):
            weight = tl.load(w_ptr + channels * (K * K) + _tap(dy, dx, K, FLIPPED), mask=channels < D, other=0.0)
            rows = rows + (tl.where(diagonal, weight, 0.0),)
        groups = groups + (_side_by_side(rows[: K - 1], W, W).to(TAP_DTYPE),)
        taps = taps + (rows[K - 1].to(TAP_DTYPE),)
    return groups, taps


@triton.jit
def _side_by_side(tiles, FLAT: tl.constexpr, W: tl.constexpr):
    """Two or four (FLAT, W) tiles side by side, (FLAT, n·W): tile i at columns i·W … (each holds its registers
    as a lone tile does in a product's accumulator)."""
    if len(tiles) == 2:
        both = tl.reshape(tl.permute(tl.join(tiles[0], tiles[1]), (0, 2, 1)), (FLAT, 2 * W))
    else:
        both = tl.join(tl.join(tiles[0], tiles[1]), tl.join(tiles[2], tiles[3]))  # (FLAT, W, j, i): tile 2i + j
        both = tl.reshape(tl.permute(both, (0, 3, 2, 1)), (FLAT, 4 * W))
    return both


@triton.jit
def _apart(both, FLAT: tl.constexpr, W: tl.constexpr, N: tl.constexpr):
    """The N tiles of :func:`_side_by_side`."""
    if N == 2:
        first, second = tl.split(tl.permute(tl.reshape(both, (FLAT, 2, W)), (0, 2, 1)))
        tiles = (first, second)
    else:
        pairs = tl.permute(tl.reshape(both, (FLAT, 2, 2, W)), (0, 3, 2, 1))  # (FLAT, W, j, i)
        first, second = tl.split(pairs)
        a, b = tl.split(first)
        c, d = tl.split(second)
        tiles = (a, b, c, d)
    return tiles


@triton.jit
def conv_row_halves(first_ring, second_ring, first_taps, second_taps, base, mask_base, j, first, channels,
                    channel_ok, stride_n, map_h, map_w, H_PAD: tl.constexpr, STRIP: tl.constexpr, D_PAD: tl.constexpr,
                    K: tl.constexpr, HALO: tl.constexpr, HAS_MASK: tl.constexpr, TAP_DTYPE: tl.constexpr):  # fmt: skip
    """:func:`conv_row` for 16-bit heads of 32 channels read as words, K = 3 or 5, in two halves of 16 channels:
    the taps' diagonal products of a half do 16× the conv's multiply-adds where a whole head's did 32×, and a
    half's K - 1 older output rows take one product (their taps side by side: :func:`block_tap_matrices`), the
    newest another. Returns the two halves' rings (rows j - K//2 … j + K//2, (H_PAD·STRIP, 16) each)."""
    R: tl.constexpr = K // 2
    W: tl.constexpr = D_PAD // 2
    FLAT: tl.constexpr = H_PAD * STRIP
    dtype: tl.constexpr = base.dtype.element_ty
    firsts = first_ring + (tl.zeros([FLAT, W], tl.float32),)
    seconds = second_ring + (tl.zeros([FLAT, W], tl.float32),)
    strip, halo = row_and_halo(base, mask_base, j, first, channels, channel_ok, stride_n, map_h, map_w, STRIP, K,
                               HALO, HAS_MASK, True)  # fmt: skip
    for dx in tl.static_range(K):
        words = shifted_row(strip, halo, dx - R, STRIP, HALO, K, False, dtype)
        # a half's words (its channels in pairs, a word each: the products' operand takes them as they are)
        lower, upper = tl.split(tl.permute(tl.reshape(words, (H_PAD, STRIP, 2, W // 2)), (0, 1, 3, 2)))
        lower = tl.reshape(_unpacked(lower, dtype), (FLAT, W)).to(TAP_DTYPE)
        upper = tl.reshape(_unpacked(upper, dtype), (FLAT, W)).to(TAP_DTYPE)
        firsts = _block_taps(lower, first_taps, firsts, dx, FLAT, W, K)
        seconds = _block_taps(upper, second_taps, seconds, dx, FLAT, W, K)
    return firsts, seconds


@triton.jit
def conv_row_block(ring, taps, base, mask_base, j, first, channels, channel_ok, stride_n, map_h, map_w,
                   H_PAD: tl.constexpr, STRIP: tl.constexpr, W: tl.constexpr, K: tl.constexpr, HALO: tl.constexpr,
                   HAS_MASK: tl.constexpr, TAP_DTYPE: tl.constexpr):  # fmt: skip
    """:func:`conv_row` for a block of W = 16 channels of 16-bit heads read as words, K = 3 or 5, its older output
    rows in flight in one product (:func:`block_tap_matrices`); returns the ring and the row's own values."""
    R: tl.constexpr = K // 2
    FLAT: tl.constexpr = H_PAD * STRIP
    dtype: tl.constexpr = base.dtype.element_ty
    sums = ring + (tl.zeros([FLAT, W], tl.float32),)
    strip, halo = row_and_halo(base, mask_base, j, first, channels, channel_ok, stride_n, map_h, map_w, STRIP, K,
                               HALO, HAS_MASK, True)  # fmt: skip
    for dx in tl.static_range(K):
        values = tl.reshape(shifted_row(strip, halo, dx - R, STRIP, HALO, K, True, dtype), (FLAT, W))
        if dx == R:
            centre = values
        sums = _block_taps(values.to(TAP_DTYPE), taps, sums, dx, FLAT, W, K)
    return sums, centre


@triton.jit
def _block_taps(values, taps, sums, dx: tl.constexpr, FLAT: tl.constexpr, W: tl.constexpr, K: tl.constexpr):
    """A block's shifted row ``values`` (FLAT, W) multiplied into its K rows in flight ``sums``."""
    older = tl.dot(values, taps[0][dx], _side_by_side(sums[: K - 1], FLAT, W))
    return _apart(older, FLAT, W, K - 1) + (tl.dot(values, taps[1][dx], sums[K - 1]),)


@triton.jit
def _unpacked(words, dtype: tl.constexpr):
    """A tile of words (H_PAD, STRIP, n), two 16-bit channels each, as (H_PAD, STRIP, 2n) values of ``dtype``, the
    even channel the low half."""
    low = (words & 0xFFFF).to(tl.int16).to(dtype, bitcast=True)
    high = (words >> 16).to(tl.int16).to(dtype, bitcast=True)
    return tl.reshape(tl.join(low, high), (words.shape[0], words.shape[1], 2 * words.shape[2]))


@triton.jit
def row_and_halo(base, mask_base, j, first, channels, channel_ok, stride_n, map_h, map_w, STRIP: tl.constexpr,
                 K: tl.constexpr, HALO: tl.constexpr, HAS_MASK: tl.constexpr, WORDS: tl.constexpr):  # fmt: skip
    """Row j's strip of STRIP columns from ``first`` (H_PAD, STRIP, channels) and its halo (H_PAD, HALO, channels):
    the K//2 columns before the strip, then the K//2 after it (zero outside the map, at masked tokens and past 2·K//2),
    for :func:`shifted_row`. ``WORDS``: 16-bit values read two channels at a time as 32-bit words (an even number of
    channels a head, rows starting at whole words): the gathers then move a word per pair (at the benchmark shape the
    output kernel issued 328 warp-instructions a token, 300 so, its byte permutes gone)."""
    R: tl.constexpr = K // 2
    if WORDS:  # channel 2i + 1 is the high half of word i: the even channels' indices, halved
        channels, _ = tl.split(tl.reshape(channels, (channels.shape[0], 1, channels.shape[2] // 2, 2)))
        channel_ok, _ = tl.split(tl.reshape(channel_ok, (channel_ok.shape[0], 1, channel_ok.shape[2] // 2, 2)))
        base = base.to(tl.pointer_type(tl.int32))
        channels = channels // 2
        stride_n = stride_n // 2
    inside = (j >= 0) & (j < map_h)
    columns = first + tl.arange(0, STRIP)
    strip_ok = tiles.unmasked(inside & (columns < map_w), mask_base, j * map_w + columns, HAS_MASK)
    strip = tl.load(base + (j * map_w + columns)[None, :, None] * stride_n + channels,
                    mask=strip_ok[None, :, None] & channel_ok, other=0.0)  # fmt: skip
    sides = tl.arange(0, HALO)
    halo_columns = tl.where(sides < R, first - R + sides, first + STRIP + sides - R)
    halo_ok = inside & (halo_columns.to(tl.uint32) < map_w.to(tl.uint32)) & (sides < 2 * R)  # below 0 wraps
    halo_ok = tiles.unmasked(halo_ok, mask_base, j * map_w + halo_columns, HAS_MASK)
    halo = tl.load(base + (j * map_w + halo_columns)[None, :, None] * stride_n + channels,
                   mask=halo_ok[None, :, None] & channel_ok, other=0.0)  # fmt: skip
    return strip, halo


@triton.jit
def shifted_row(strip, halo, shift: tl.constexpr, STRIP: tl.constexpr, HALO: tl.constexpr, K: tl.constexpr,
                WORDS: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """The row (:func:`row_and_halo`) shifted by ``shift`` columns: token c takes column c + shift, from the strip
    or, outside it, from the halo (gathers within the program), as (H_PAD, STRIP, channels) of ``dtype`` (with
    ``WORDS`` each word's halves, even channel low)."""
    R: tl.constexpr = K // 2
    if shift == 0:
        shifted = strip
    else:
        source = tl.broadcast_to(tl.arange(0, STRIP)[None, :, None] + shift, strip.shape)
        from_strip = tl.gather(strip, tl.minimum(tl.maximum(source, 0), STRIP - 1), 1)
        side = tl.where(source < 0, source + R, source - STRIP + R)
        from_halo = tl.gather(halo, tl.minimum(tl.maximum(side, 0), HALO - 1), 1)
        shifted = tl.where((source >= 0) & (source < STRIP), from_strip, from_halo)
    if WORDS:
        shifted = _unpacked(shifted, dtype)
    return shifted


@triton.jit
def output_rows_kernel(
    qkv_ptr, inv_ptr, mask_ptr, norms_ptr, s_ptr, z_ptr, count_ptr, w_ptr, bias_ptr, out_ptr,
    stride_b, stride_n, out_stride_b, out_stride_n, mask_stride_b, norms_stride_b, chunks, strips, band_rows, map_h,
    map_w, eps, feature_eps,
    H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, STRIP: tl.constexpr,
    K: tl.constexpr, HALO: tl.constexpr, WORDS: tl.constexpr, MAP: tl.constexpr, POWER: tl.constexpr,
    PRESCALED: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, TOKEN_NORMS: tl.constexpr, TAP_DTYPE: tl.constexpr,
    SOFTPLUS: tl.constexpr = False, HALVES: tl.constexpr = False, HALF_DOT: tl.constexpr = False,
    SPLITS: tl.constexpr = 1,
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
    s = _split_states(tiles.state_operand(s, HALF_DOT), SPLITS)
    q_base = qkv_ptr + b.to(tl.int64) * stride_b
    v_base = q_base + 2 * H * D
    out_base = out_ptr + b.to(tl.int64) * out_stride_b
    mask_base = mask_ptr + b.to(tl.int64) * mask_stride_b
    norms_base = norms_ptr + b.to(tl.int64) * norms_stride_b + 3  # the queries' (m, ‖â‖², ‖â^p‖²)
    dims = tl.arange(0, D_PAD)[None, None, :]
    bias = tl.zeros([1, 1, D_PAD], tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + dims, mask=dims < D, other=0.0).to(tl.float32)
    columns = strip * STRIP + tl.arange(0, STRIP)
    column_ok = columns < map_w
    R: tl.constexpr = K // 2
    if HALVES:
        first_taps = block_tap_matrices(w_ptr, D, D_PAD // 2, K, TAP_DTYPE, 0, False)
        second_taps = block_tap_matrices(w_ptr, D, D_PAD // 2, K, TAP_DTYPE, 1, False)
        firsts = empty_ring(H_PAD, STRIP, D_PAD // 2, K)
        seconds = empty_ring(H_PAD, STRIP, D_PAD // 2, K)
        for j in tl.range(top - R, bottom + R):
            firsts, seconds = conv_row_halves(firsts, seconds, first_taps, second_taps, v_base, mask_base, j,
                                              strip * STRIP, channels, channel_ok, stride_n, map_h, map_w, H_PAD,
                                              STRIP, D_PAD, K, HALO, HAS_MASK, TAP_DTYPE)  # fmt: skip
            conv = _side_by_side((firsts[0], seconds[0]), H_PAD * STRIP, D_PAD // 2)  # the halves' channels
            _output_row(conv, bias, j - R, top, columns, column_ok, q_base, out_base, norms_base, channels,
                        channel_ok, inv, s, z, stride_n, out_stride_n, map_w, eps, feature_eps, H_PAD, MAP, POWER,
                        PRESCALED, TOKEN_NORMS, DOT_PRECISION, SPLITS)  # fmt: skip
            firsts = firsts[1:]
            seconds = seconds[1:]
    else:
        pairs, taps = tap_matrices(w_ptr, D, D_PAD, K, TAP_DTYPE, False)
        ring = empty_ring(H_PAD, STRIP, D_PAD, K)
        for j in tl.range(top - R, bottom + R):
            sums, _ = conv_row(ring, pairs, taps, v_base, mask_base, j, strip * STRIP, channels, channel_ok,
                               stride_n, map_h, map_w, H_PAD, STRIP, D_PAD, K, HALO, HAS_MASK, TAP_DTYPE,
                               WORDS)  # fmt: skip
            _output_row(sums[0], bias, j - R, top, columns, column_ok, q_base, out_base, norms_base, channels,
                        channel_ok, inv, s, z, stride_n, out_stride_n, map_w, eps, feature_eps, H_PAD, MAP, POWER,
                        PRESCALED, TOKEN_NORMS, DOT_PRECISION, SPLITS)  # fmt: skip
            ring = sums[1:]


@triton.jit
def _output_row(conv, bias, row, top, columns, column_ok, q_base, out_base, norms_base, channels, channel_ok, inv,
                s, z, stride_n, out_stride_n, map_w, eps, feature_eps, H_PAD: tl.constexpr, MAP: tl.constexpr,
                POWER: tl.constexpr, PRESCALED: tl.constexpr, TOKEN_NORMS: tl.constexpr,
                DOT_PRECISION: tl.constexpr, SPLITS: tl.constexpr):  # fmt: skip
    """Output row ``row`` of the strip, its conv ``conv`` (H_PAD·STRIP, D_PAD) complete: its attention and the conv's
    bias added, and written; ``s``: the states as :func:`_split_states` gives them. φ(q) = y · scale
    (`triton_feature_maps.scaled_features`) goes to the products as y, its per-token scale applied to their results
    (a multiply an element less). (The conv is reshaped to the tile here, not before: beside the ring, the reshaped
    tile held registers that spilled 24 B at 2×31 with DWC 5.)"""
    places = row * map_w + columns
    row_ok = column_ok & (row >= top)
    ok = row_ok[None, :, None] & channel_ok
    x = tiles.load_tile(q_base, places, ok, stride_n, channels)
    m, sq_a, sq_y = maps.load_norms(norms_base, places, row_ok, TOKEN_NORMS)
    y, scale = maps.scaled_features(x, inv, channel_ok, feature_eps, m, sq_a, sq_y, MAP, POWER, PRESCALED,
                                    TOKEN_NORMS)  # fmt: skip
    # no zeros where not ok: S and z are 0 in padded channels, and rows past the band are not stored
    num = _split_product(y.to(s.dtype), s, H_PAD, DOT_PRECISION, SPLITS)
    den = tl.sum(y * z[:, None, :], axis=2) * scale[None, :] + eps
    conv = tl.reshape(conv, (H_PAD, columns.shape[0], conv.shape[1]))
    out = num * (scale[None, :] / den)[:, :, None] + bias + conv
    tl.store(out_base + places[None, :, None] * out_stride_n + channels, out, mask=ok)


@triton.jit
def _split_states(s, SPLITS: tl.constexpr):
    """The heads' states (H_PAD, d, d) for :func:`_split_product`: with SPLITS 2 each twice, (2·H_PAD, d, d), head
    h's at 2h and 2h + 1 (built once a program)."""
    tl.static_assert(SPLITS == 1 or SPLITS == 2)
    if SPLITS == 2:
        s = tl.reshape(tl.permute(tl.join(s, s), (0, 3, 1, 2)), (2 * s.shape[0], s.shape[1], s.shape[2]))
    return s


@triton.jit
def _split_product(y, states, H_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLITS: tl.constexpr):
    """y @ S for every head of a row's tile y (H_PAD, STRIP, d), its row cut into SPLITS pieces that multiply as
    batches of their own (`triton_geometry.head_splits`: a warp a batch)."""
    pieces = tl.reshape(y, (SPLITS * H_PAD, y.shape[1] // SPLITS, y.shape[2]))
    num = tiles.head_product(pieces, states, SPLITS * H_PAD, DOT_PRECISION)
    return tl.reshape(num, (H_PAD, y.shape[1], states.shape[2]))
