"""Tile helpers of the linear-attention kernels: addressing, loads and stores, the state reduction and the
depthwise-conv taps. Shared by `triton_forward.py` and `triton_backward.py`.

A tile is (H_PAD, BLOCK_N, D_PAD): every head of BLOCK_N tokens, all C = H·D channels of each token, read from the
(B, N, ·) token layout through strides (channel h·D + d of a token sits at column h·D + d). Holding all heads of a
token in one program is what the focused map needs (its norms run over all C channels) and what lets each DWC tap
be gathered once for all channels; the per-head products S = φ(k)ᵀv and φ(q)·S are one batched (3-D) ``tl.dot``
(:func:`head_dot`; a 2-D one for a single head).

Head groups: where every head's d × d state does not fit a program's registers (head_dim 64 from two heads on), the
grid has a third axis over groups of H_PAD heads (``program_id(2)``; the last group may be ragged), and a tile holds
the heads head0 … head0 + H_PAD of its tokens. The focused map's norms over all C channels of a token then come from
a pass of their own (``TOKEN_NORMS``: per token m, ‖â‖², ‖â^p‖², `triton_feature_maps.load_norms`), and the part of
dL/dx that couples the heads (cross · factor, `triton_feature_maps.cross_head_grad`) is added by a pass after the
gradient kernels.

The feature maps (``MAP``) and their gradients on a tile are `triton_feature_maps.py`'s.

``ROWS_FIRST`` (Triton before 3.7, `triton_taps.ROWS_FIRST`): the kernels that gain by it load and store their tiles
through pointers laid out with the tokens on the first axis (:func:`load_rows`), so that each thread holds one token
of a tile under either version's coalescing pass.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def first_head(H: tl.constexpr, H_PAD: tl.constexpr):
    """The first head of the program's tiles: with head groups (a program's H_PAD heads fewer than all H) its group's
    (``program_id(2)``), else 0 (a constant)."""
    if H_PAD < H:
        head0 = tl.program_id(2) * H_PAD
    else:
        head0 = 0
    return head0


@triton.jit
def tile_channels(head0, H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """(channel index, channel in range) of a tile of the heads head0 … head0 + H_PAD, both (H_PAD, 1, D_PAD)."""
    heads = head0 + tl.arange(0, H_PAD)[:, None, None]
    dims = tl.arange(0, D_PAD)[None, None, :]
    return heads * D + dims, (heads < H) & (dims < D)


@triton.jit
def softplus(x):
    """log(1 + eˣ) in fp32 as torch's softplus gives it (x itself above 20), without losing the small values of a very
    negative x: log1p(u) = u · log(1 + u) / ((1 + u) - 1), exact where 1 + u rounds to 1."""
    u = tl.exp(-tl.abs(x))
    w = 1.0 + u
    rounded = w == 1.0
    log1p = tl.where(rounded, u, tl.log(w) * (u / tl.where(rounded, 1.0, w - 1.0)))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def channels_and_inverse(inv_ptr, head0, H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr,
                         D_PAD: tl.constexpr, SOFTPLUS: tl.constexpr = False):  # fmt: skip
    """:func:`tile_channels` and the inverse temperature of each channel, (H_PAD, 1, D_PAD) in fp32 (1 out of
    range): how every kernel that maps q or k begins. ``SOFTPLUS``: inv_ptr holds the temperature's parameter s
    itself, and the inverse is 1 / softplus(s), computed here (no torch launch before the kernels)."""
    channels, channel_ok = tile_channels(head0, H, D, H_PAD, D_PAD)
    loaded = tl.load(inv_ptr + channels, mask=channel_ok, other=1.0).to(tl.float32)
    if SOFTPLUS:
        loaded = tl.where(channel_ok, 1.0 / softplus(loaded), 1.0)
    return channels, channel_ok, loaded


@triton.jit
def chunk_bounds(t, chunk, N):
    """[start, stop) of the tokens of chunk t: the run of tiles that one program walks."""
    start = t * chunk
    return start, tl.minimum(start + chunk, N)


@triton.jit
def unmasked(keep, mask_base, rows, HAS_MASK: tl.constexpr):
    """``keep`` and, with a key mask (one byte per token, non-zero keeps), the mask of each of ``rows``."""
    if HAS_MASK:
        keep = keep & (tl.load(mask_base + rows, mask=keep, other=0) != 0)
    return keep


@triton.jit
def window_grid(grid_h, grid_w, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr):
    """The grid a batch element's tokens lie on: the WINDOW_H × WINDOW_W window (compile-time sizes: the index
    arithmetic divides by constants), or without one (``WINDOW_H`` = 0) the grid_h × grid_w map."""
    if WINDOW_H > 0:
        height = WINDOW_H
        width = WINDOW_W
    else:
        height = grid_h
        width = grid_w
    return height, width


@triton.jit
def window_origin(b, windows, windows_w, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr):
    """(image, first map row, first map column) of batch element b: with a window the batch elements are the windows
    of the images (``windows`` per image, ``windows_w`` per row of windows, image-major), read in place from the
    image's tokens; else b is the image."""
    if WINDOW_H > 0:
        image = b // windows
        window = b - image * windows
        top = (window // windows_w) * WINDOW_H
        left = (window % windows_w) * WINDOW_W
    else:
        image = b
        top = 0
        left = 0
    return image, top, left


@triton.jit
def program_element(grid_h, grid_w, windows, windows_w, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr):
    """What a tiled kernel's program walks: (batch element b = ``program_id(0)``, chunk t = ``program_id(1)``, the
    grid of b's tokens (:func:`window_grid`), and b's image and first map row and column (:func:`window_origin`))."""
    b = tl.program_id(0)
    height, width = window_grid(grid_h, grid_w, WINDOW_H, WINDOW_W)
    image, top, left = window_origin(b, windows, windows_w, WINDOW_H, WINDOW_W)
    return b, tl.program_id(1), height, width, image, top, left


@triton.jit
def token_places(tokens, top, left, grid_w, map_h, map_w, WINDOWED: tl.constexpr):
    """(row in the image's token layout, is a token of the map) of a window's token indices: the window of the map
    padded to whole windows, whose padding holds no token. Without windows the indices themselves, all real."""
    if WINDOWED:
        y = top + tokens // grid_w
        x = left + tokens % grid_w
        places = y * map_w + x
        real = (y < map_h) & (x < map_w)
    else:
        places = tokens
        real = True  # a constant: the masks it joins fold it away
    return places, real


@triton.jit
def tile_tokens(row0, stop, top, left, grid_w, map_h, map_w, channel_ok, BLOCK_N: tl.constexpr,
                WINDOWED: tl.constexpr):  # fmt: skip
    """The tile of BLOCK_N tokens from row0 in a chunk that ends at ``stop``: (its token indices, their rows in the
    image's token layout (:func:`token_places`), which are tokens of the chunk and the map, and that as a
    (H_PAD, BLOCK_N, D_PAD) mask with ``channel_ok``)."""
    rows = row0 + tl.arange(0, BLOCK_N)
    places, real = token_places(rows, top, left, grid_w, map_h, map_w, WINDOWED)
    row_ok = (rows < stop) & real
    return rows, places, row_ok, row_ok[None, :, None] & channel_ok


@triton.jit
def _swap_with_first(x, AXIS: tl.constexpr):
    """x with its axes 0 and AXIS (1 or 2) swapped: a relabelling of the layout, its own inverse."""
    if AXIS == 1:
        swapped = tl.permute(x, (1, 0, 2))
    else:  # no early return: Triton 3.6 compares the types of both returns
        swapped = tl.permute(x, (2, 1, 0))
    return swapped


@triton.jit
def load_rows(pointers, mask, other, ROWS_FIRST: tl.constexpr, ROW_AXIS: tl.constexpr = 1):
    """``tl.load`` of a 3-D tile whose tokens lie along ROW_AXIS. Triton's coalescing pass spreads a load's threads
    over its axes in the order of their contiguity and breaks the tie between the tokens and the heads by position:
    before 3.7 the first axis goes first, from 3.7 the last. With ROWS_FIRST the load is laid out with the tokens
    first and swapped back, so that a thread holds one token of the tile (its coordinates, neighbours and norms
    computed once) instead of four."""
    if ROWS_FIRST:
        tile = tl.load(_swap_with_first(pointers, ROW_AXIS), mask=_swap_with_first(mask, ROW_AXIS), other=other)
        return _swap_with_first(tile, ROW_AXIS)
    return tl.load(pointers, mask=mask, other=other)


@triton.jit
def store_rows(pointers, values, mask, ROWS_FIRST: tl.constexpr):
    """``tl.store`` of a (H_PAD, BLOCK_N, D_PAD) tile, laid out as :func:`load_rows` lays out its loads."""
    if ROWS_FIRST:
        tl.store(_swap_with_first(pointers, 1), _swap_with_first(values, 1), mask=_swap_with_first(mask, 1))
    else:
        tl.store(pointers, values, mask=mask)


@triton.jit
def load_tile(base, rows, ok, stride_n, channels, ROWS_FIRST: tl.constexpr = False):
    """x[rows, channels] of a (H_PAD, BLOCK_N, D_PAD) tile in fp32, zero where not ``ok``."""
    return load_rows(base + rows[None, :, None] * stride_n + channels, ok, 0.0, ROWS_FIRST).to(tl.float32)


@triton.jit
def load_keys(base, places, rows, ok, stride_n, pos_base, prefix, channels, inv, C: tl.constexpr,
              HAS_POS: tl.constexpr, PRESCALED: tl.constexpr, ROWS_FIRST: tl.constexpr = False):  # fmt: skip
    """Raw keys of a tile (tokens ``rows``, stored at ``places``) plus the positional term on spatial tokens (scaled
    by inv when the temperature was folded into the projection)."""
    x = load_tile(base, places, ok, stride_n, channels, ROWS_FIRST)
    return x + key_position(pos_base, rows, ok, prefix, channels, inv, C, HAS_POS, PRESCALED, ROWS_FIRST)


@triton.jit
def key_position(pos_base, rows, ok, prefix, channels, inv, C: tl.constexpr, HAS_POS: tl.constexpr,
                 PRESCALED: tl.constexpr, ROWS_FIRST: tl.constexpr = False):  # fmt: skip
    """The positional term of a tile's keys (tokens ``rows``; zero on class tokens and where not ``ok``) in fp32, scaled
    by inv when the temperature was folded into the projection; 0 without a positional table."""
    if HAS_POS:
        spatial = rows - prefix
        pos_ok = ok & (spatial >= 0)[None, :, None]
        position = load_rows(pos_base + spatial[None, :, None] * C + channels, pos_ok, 0.0, ROWS_FIRST).to(tl.float32)
        if PRESCALED:
            position = position * inv
    else:
        position = 0.0
    return position


@triton.jit
def head_dot(a, b, acc, H_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ b for every head, (H_PAD, M, K) @ (H_PAD, K, N) → (H_PAD, M, N) in fp32. One head is a 2-D
    product, whose loop-invariant operand (a state) the compiler keeps in shared memory; a batched (3-D) product holds
    it in registers in the operand layout, which spills at head_dim 64."""
    if H_PAD == 1:
        out = tl.dot(tl.reshape(a, (a.shape[1], a.shape[2])), tl.reshape(b, (b.shape[1], b.shape[2])),
                     tl.reshape(acc, (acc.shape[1], acc.shape[2])), input_precision=DOT_PRECISION)  # fmt: skip
        out = tl.reshape(out, (1, out.shape[0], out.shape[1]))
    else:
        out = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return out


@triton.jit
def head_product(a, b, H_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a @ b for every head in fp32 (:func:`head_dot` from zero)."""
    return head_dot(a, b, tl.zeros((a.shape[0], a.shape[1], b.shape[2]), tl.float32), H_PAD, DOT_PRECISION)


@triton.jit
def state_operand(s, HALF_DOT: tl.constexpr):
    """A d × d state (S, or dL/dS; its chunks summed in fp32) as the operand of a kernel's products with the token
    tiles: bf16 with bf16 inputs (fp32 accumulation), as the torch backend's products under autocast and fla's chunk
    kernels take them; fp32 otherwise (tf32 with fp16 inputs, which could overflow in half). fp32 operands hold
    twice the registers (query_grad and key_value_grad spill at 4 warps under Triton 3.6 with them) and take twice
    the products (tf32 takes 8 of a product's sum a step, bf16 16): the forward's output kernel at the benchmark shape
    issued 243 warp-instructions a token with fp32 S, 216 with bf16."""
    if HALF_DOT:
        s = s.to(tl.bfloat16)
    return s


@triton.jit
def reduced_state(s_ptr, z_ptr, count_ptr, b, num_chunks, head0, H: tl.constexpr, D: tl.constexpr,
                  H_PAD: tl.constexpr, D_PAD: tl.constexpr):  # fmt: skip
    """S (H_PAD, D_PAD, D_PAD) and z (H_PAD, D_PAD) of the heads head0 … of batch element b: the partial sums of its
    chunks added in a fixed order (deterministic), over the number of kept keys (the mean form)."""
    s, z, kept = summed_state(s_ptr, z_ptr, count_ptr, b, num_chunks, head0, H, D, H_PAD, D_PAD)
    scale = 1.0 / tl.maximum(kept, 1.0)
    return s * scale, z * scale


@triton.jit
def summed_state(s_ptr, z_ptr, count_ptr, b, num_chunks, head0, H: tl.constexpr, D: tl.constexpr,
                 H_PAD: tl.constexpr, D_PAD: tl.constexpr):  # fmt: skip
    """The sums of batch element b's partial S, z and kept-key counts over its chunks, in a fixed order (one chunk
    of such sums gives :func:`reduced_state` the same values)."""
    heads = head0 + tl.arange(0, H_PAD)[:, None, None]
    rows = tl.arange(0, D_PAD)[None, :, None]
    cols = tl.arange(0, D_PAD)[None, None, :]
    square_ok = (heads < H) & (rows < D) & (cols < D)
    square = heads * (D * D) + rows * D + cols
    vector_heads = head0 + tl.arange(0, H_PAD)[:, None]
    vector = vector_heads * D + tl.arange(0, D_PAD)[None, :]
    vector_ok = (vector_heads < H) & (tl.arange(0, D_PAD)[None, :] < D)
    s = tl.zeros([H_PAD, D_PAD, D_PAD], tl.float32)
    z = tl.zeros([H_PAD, D_PAD], tl.float32)
    kept = 0.0
    for chunk in tl.range(0, num_chunks):
        slot = (b * num_chunks + chunk).to(tl.int64)
        s += tl.load(s_ptr + slot * (H * D * D) + square, mask=square_ok, other=0.0)
        z += tl.load(z_ptr + slot * (H * D) + vector, mask=vector_ok, other=0.0)
        kept += tl.load(count_ptr + slot)
    return s, z, kept


@triton.jit
def store_state(s_ptr, z_ptr, slot, s, z, head0, H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr,
                 D_PAD: tl.constexpr):  # fmt: skip
    """Write the heads head0 … of one (H, D, D) state and (H, D) vector into the partial slot ``slot``."""
    heads = head0 + tl.arange(0, H_PAD)[:, None, None]
    rows = tl.arange(0, D_PAD)[None, :, None]
    cols = tl.arange(0, D_PAD)[None, None, :]
    tl.store(s_ptr + slot * (H * D * D) + heads * (D * D) + rows * D + cols, s,
             mask=(heads < H) & (rows < D) & (cols < D))  # fmt: skip
    vector_heads = head0 + tl.arange(0, H_PAD)[:, None]
    vector_cols = tl.arange(0, D_PAD)[None, :]
    tl.store(z_ptr + slot * (H * D) + vector_heads * D + vector_cols, z, mask=(vector_heads < H) & (vector_cols < D))


@triton.jit
def neighbour_rows(rows, row_ok, prefix, grid_h, grid_w, dy, dx, top, left, map_h, map_w, WINDOWED: tl.constexpr):
    """Rows of the tokens at (y + dy, x + dx) of each token of a tile (on its grid: the map, or with ``WINDOWED`` the
    window at (top, left)), and whether that is a token of the map: on the grid and, for a window at the map's edge,
    on the map (its padding holds none; scalar bounds, where a test of each place cost Triton 3.6 a select per
    element). Each bound is one unsigned comparison, a coordinate below zero wrapping above it (fewer instructions in
    every kernel with a DWC: key_value_grad 437 → 428 per token, dwc_weight_grad 205 → 194, under Triton 3.6
    339 → 328, and in FLatten-Swin-T's windows 376 → 348)."""
    spatial = rows - prefix
    yy = spatial // grid_w
    xx = spatial - yy * grid_w
    ny = yy + dy
    nx = xx + dx
    height = grid_h
    width = grid_w
    if WINDOWED:
        height = tl.minimum(height, map_h - top)
        width = tl.minimum(width, map_w - left)
    ok = row_ok & (spatial >= 0) & (ny.to(tl.uint32) < height.to(tl.uint32)) & (nx.to(tl.uint32) < width.to(tl.uint32))
    return prefix + ny * grid_w + nx, ok


@triton.jit
def neighbour_offset(dy, dx, grid_w, map_w, WINDOWED: tl.constexpr):
    """How many places on from a token of the grid its neighbour at (dy, dx) lies in the image's token layout (a row
    is the map's width, for a window too): one scalar per tap, so that a tap's loads are the tile's own addresses plus
    it (per-element neighbour addresses per tap were hoisted out of the tile loop and spilled)."""
    pitch = map_w if WINDOWED else grid_w
    return dy * pitch + dx


@triton.jit
def copy_taps_major(w_ptr, taps_ptr, D: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr,
                    TENSOR_TAPS: tl.constexpr, TAP_DTYPE: tl.constexpr):  # fmt: skip
    """Copy the DWC weight (D, 1, K, K) to ``taps_ptr`` in the form :func:`depthwise_conv` multiplies, done by the
    first program of a kernel that runs before the ones that multiply the taps. Multiply-adds: (K·K, D), a tap's D
    weights contiguous, so that each thread loads its channels' weights as vectors (strided by K·K they take a
    scalar load each, for every tap of every tile: about 50 of key_value_grad's 66 global loads per token at
    C = 128). ``TENSOR_TAPS``: (K·K, D_PAD, D_PAD) in ``TAP_DTYPE``, each tap's diagonal matrix of its weights, which
    the tiles then load as the product's operand (built from the weights in every tile, its selects and shared-memory
    stores cost 90 warp-instructions per token of the forward's 339 at the benchmark shape)."""
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
        dims = tl.arange(0, D_PAD)
        for tap in tl.static_range(K * K):
            weight = tl.load(w_ptr + dims * (K * K) + tap, mask=dims < D, other=0.0)
            if TENSOR_TAPS:
                diagonal = tl.where(dims[:, None] == dims[None, :], weight[None, :], 0.0).to(TAP_DTYPE)
                tl.store(taps_ptr + tap * (D_PAD * D_PAD) + dims[:, None] * D_PAD + dims[None, :], diagonal)
            else:
                tl.store(taps_ptr + tap * D + dims, weight, mask=dims < D)


@triton.jit
def widen_pairs(words):
    """(even, odd) channels in fp32 of bf16 values read in pairs as 32-bit words (the even one in the low half): a
    bf16 is the upper half of the fp32 of the same value, so each widens with one shift or mask, where Triton's
    conversion of a bf16 tile moves the upper half down before shifting it (1.5 instructions per element)."""
    return (words << 16).to(tl.float32, bitcast=True), (words & -65536).to(tl.float32, bitcast=True)


@triton.jit
def depthwise_conv(acc, base, mask_base, taps_ptr, row0, stop, stride_n, prefix, grid_h, grid_w, top, left, map_h,
                   map_w, head0, H: tl.constexpr, D: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
                   BLOCK_N: tl.constexpr, K: tl.constexpr, HAS_MASK: tl.constexpr, TENSOR_TAPS: tl.constexpr,
                   TAP_DTYPE: tl.constexpr, BF16_PAIRS: tl.constexpr, TRANSPOSED: tl.constexpr,
                   WINDOWED: tl.constexpr, ROWS_FIRST: tl.constexpr = False):  # fmt: skip
    """(``acc`` plus the depthwise k×k conv (the kernel of D channels shared by the heads, at ``taps_ptr`` in the form
    :func:`copy_taps_major` writes for ``TENSOR_TAPS``) of the (B, N, ·) values at
    ``base`` for the tokens row0 … row0 + BLOCK_N of a tile (heads head0 …), (H_PAD, BLOCK_N, D_PAD) in fp32, and the
    centre tap's gathered values: the tile's own, zero where a tap counts as zero); with
    ``TRANSPOSED`` its transpose (the taps mirrored: the gradient of its input). Taps on padding, class tokens and
    (``HAS_MASK``) masked tokens count as zeros. Each tap is gathered once for all C channels, at a scalar offset from
    the tile's own places (:func:`neighbour_offset`). With ``WINDOWED`` the grid is the window at (top, left) of the
    map (see :func:`token_places`), whose padding holds zeros too. ROWS_FIRST: the multiply-adds' 3-D gathers
    through :func:`load_rows` (the tensor-core taps' 2-D ones need no such layout).

    ``TENSOR_TAPS`` (16-bit inputs, head_dim ≤ 32): each tap is one tensor-core product, the gathered rows of every head
    as one (H_PAD·BLOCK_N, D_PAD) matrix times the diagonal matrix of the tap's weights, operands in ``TAP_DTYPE`` and
    fp32 accumulation. The products are D_PAD× what the conv needs (32× at head_dim 32), but the tensor cores take them
    at a few instructions per tap and token, where multiply-adds on the CUDA cores take a conversion and an FMA per
    element (about 200 warp-instructions per token at C = 128, most of the forward's cost). Otherwise fp32
    multiply-adds, with ``BF16_PAIRS`` (bf16 values of an even head_dim whose rows start at whole 32-bit words) on
    the values read two channels at a time (:func:`widen_pairs`), even and odd channels accumulated apart."""
    if TENSOR_TAPS:
        flat = tl.arange(0, H_PAD * BLOCK_N)
        rows = (row0 + flat % BLOCK_N)[:, None]  # flat row h·BLOCK_N + i: token i of the tile in head h
        heads = head0 + (flat // BLOCK_N)[:, None]
        dims = tl.arange(0, D_PAD)[None, :]
        channels = heads * D + dims
        channel_ok = (heads < H) & (dims < D)
        # the backward's products start from acc (a second tile-sized accumulator spilled there); the forward's from
        # zero, acc added after them (starting from acc issued 4-11 more per token there)
        conv = (
            tl.reshape(acc, (H_PAD * BLOCK_N, D_PAD)) if TRANSPOSED else tl.zeros([H_PAD * BLOCK_N, D_PAD], tl.float32)
        )
    else:  # multiply-adds straight into acc (a second tile-sized accumulator spills in the backward)
        rows = row0 + tl.arange(0, BLOCK_N)[None, :, None]
        channels, channel_ok = tile_channels(head0, H, D, H_PAD, D_PAD)
        dims = tl.arange(0, D_PAD)[None, None, :]
        conv = acc
    own, _ = token_places(rows, top, left, grid_w, map_h, map_w, WINDOWED)
    if BF16_PAIRS:  # a tile of words: channels 2j and 2j + 1 of each head
        pair_heads = head0 + tl.arange(0, H_PAD)[:, None, None]
        pairs = tl.arange(0, D_PAD // 2)[None, None, :]
        step = stride_n // 2
        tile = base.to(tl.pointer_type(tl.int32)) + own * step + pair_heads * (D // 2) + pairs
        tile_ok = (pair_heads < H) & (pairs < D // 2)
        even, odd = tl.split(tl.reshape(conv, (H_PAD, BLOCK_N, D_PAD // 2, 2)))
    else:
        step = stride_n
        tile = base + own * step + channels
        tile_ok = channel_ok
    for tap in tl.static_range(K * K):
        dy = tap // K - K // 2
        dx = tap % K - K // 2
        if TRANSPOSED:
            dy, dx = -dy, -dx
        neighbours, neighbour_ok = neighbour_rows(rows, rows < stop, prefix, grid_h, grid_w, dy, dx, top, left, map_h,
                                                  map_w, WINDOWED)  # fmt: skip
        neighbour_ok = unmasked(neighbour_ok, mask_base, neighbours, HAS_MASK)
        value = load_rows(tile + neighbour_offset(dy, dx, grid_w, map_w, WINDOWED) * step, neighbour_ok & tile_ok, 0,
                          ROWS_FIRST and not TENSOR_TAPS)  # fmt: skip
        if tap == (K * K) // 2:
            center = value
        if TENSOR_TAPS:
            square = tl.arange(0, D_PAD)[:, None] * D_PAD + dims
            conv = tl.dot(value.to(TAP_DTYPE), tl.load(taps_ptr + tap * (D_PAD * D_PAD) + square), conv)
        else:
            weight = tl.load(taps_ptr + tap * D + dims, mask=dims < D, other=0.0).to(tl.float32)
            if BF16_PAIRS:
                weight_even, weight_odd = tl.split(tl.reshape(weight, (1, 1, D_PAD // 2, 2)))
                low, high = widen_pairs(value)
                even = tl.fma(low, weight_even, even)
                odd = tl.fma(high, weight_odd, odd)
            else:
                conv = tl.fma(value.to(tl.float32), weight, conv)
    if BF16_PAIRS:
        conv = tl.reshape(tl.join(even, odd), (H_PAD, BLOCK_N, D_PAD))
        low, high = widen_pairs(center)
        center = tl.reshape(tl.join(low, high), (H_PAD, BLOCK_N, D_PAD))
    if TENSOR_TAPS:
        conv = tl.reshape(conv, (H_PAD, BLOCK_N, D_PAD))
        if not TRANSPOSED:
            conv += acc
        center = tl.reshape(center, (H_PAD, BLOCK_N, D_PAD))
    return conv, center
