"""How the linear-attention kernels are launched: grids, chunking, buffers and the autotune space, as plans.

A plan is a list of :class:`Launch` (kernel, grid, arguments, compile-time constants, the trip counts of its
runtime loops). The custom ops in `triton.py` run the plans; ``python -m benchmarks.kernel_resources --cost`` compiles
the same plans for sm_90 without a GPU and counts what they issue. One source for both keeps the count honest.

Chunking: every tiled kernel has the grid (batch, chunk, head group). A chunk is a run of token tiles that one
program walks, and the number of chunks is chosen so that B · chunks · groups fills the GPU's resident programs once
(an exact wave, no tail): the partial states a chunk writes (4·C·d bytes) are then few, and the kernels that consume
them add them up themselves. A program holds every head of its tokens unless their d × d states outgrow its
registers (:func:`heads_per_program`); then the heads are split into groups, one per program.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch._guards import detect_fake_mode

from linvit.ops._backend import interpreting
from linvit.ops.linear_attention import triton_backward, triton_forward
from linvit.ops.linear_attention.triton_tiles import FOCUSED, NORMS_PER_TOKEN

__all__ = ["KernelOptions", "Launch", "backward_plan", "forward_plan", "kernel_sizes", "num_chunks", "TILE_CONFIGS"]

# The autotune space of the tiled kernels: (tokens per tile, warps, pipeline stages). Under Triton's interpreter the
# first one runs (fixed, deterministic).
# Counted on sm_90 (python -m benchmarks.kernel_resources --cost): 4 warps issue fewer instructions than 8 (fewer
# replicated row values), the backward kernels spill from 32 tokens on at C = 128, and 8 warps of 16 tokens are the
# least-spilling choice above it; 2 stages for latency where registers allow.
TILE_CONFIGS: tuple[tuple[int, int, int], ...] = (
    (16, 4, 1),
    (32, 4, 1),
    (64, 4, 1),
    (16, 4, 2),
    (32, 4, 2),
    (16, 8, 1),
    (32, 8, 1),
)
# with the N bucket (:func:`n_bucket`) and the tensors' dtypes, what `triton.autotune` keys the tiled kernels on
AUTOTUNE_SIZES = ("H", "D", "MAP")
_INTERPRETER_BLOCK = 16  # small tiles, so that the tests' small maps still span several tiles and chunks
PROGRAMS_PER_SM = 2  # the tiled kernels are sized for two resident programs of 4-8 warps per SM
WEIGHT_PROGRAMS_PER_SM = 32  # the DWC weight's gradient: programs per SM above which a program walks several items
WEIGHT_PRODUCTS_BUDGET = 16384  # fp32 elements of the DWC weight gradient's per-tap products a program holds
# fp32 elements of the per-program d × d states (heads × d²) that the backward kernels hold without spilling: 4 × 32²
# at C = 128 is spill-free by the cost figure; 2 × 64² and more spill (query_grad's states and dS accumulators)
STATE_BUDGET = 4 * 32 * 32
SUM_BLOCK = 128  # columns per program of the final sum of the small gradients
SUM_ROWS = 8  # rows it adds per step


@dataclasses.dataclass
class Launch:
    """One kernel launch of a plan."""

    name: str
    kernel: object  # the @triton.jit function
    grid: tuple[int, ...]
    args: dict[str, object]  # run-time arguments by parameter name (tensors, ints, floats)
    constants: dict[str, object]  # compile-time constants, without the tuned ones
    loops: Callable[[int], tuple[float, ...]]  # mean trip counts of its run-time loops, in program order, per BLOCK_N
    tuned: bool = True  # BLOCK_N, num_warps and num_stages come from TILE_CONFIGS
    num_warps: int = 4  # untuned kernels


def n_bucket(launch: Launch) -> int:
    """The N_BUCKET a tuned launch is autotuned for: its N rounded up to a power of two."""
    return triton.next_power_of_2(int(launch.args["N"]))


class KernelOptions(NamedTuple):
    """The scalar arguments of both custom ops (`triton.py`), in their order: the grid of the spatial tokens, the
    heads, the feature map's code and power, the prefix tokens, the two epsilons and the window (0 × 0: global)."""

    grid_h: int
    grid_w: int
    num_heads: int
    feature_map: int
    focusing_factor: float
    num_prefix_tokens: int
    eps: float
    feature_eps: float
    window_h: int = 0
    window_w: int = 0


class Geometry(NamedTuple):
    """What the kernels walk: ``batch`` elements of ``tokens`` tokens on a ``grid`` (the DWC's). In windows, the
    elements are the windows of every image (image-major) and the kernels read them in place from the (B, N, ·)
    tokens of the map padded to whole windows, the padding holding no token; else the images themselves."""

    batch: int
    tokens: int
    grid: tuple[int, int]
    windowed: bool
    args: dict  # the kernels' window arguments: map_h, map_w, windows (per image), windows_w (per row of windows)

    @property
    def window_constants(self) -> dict:
        """The window's sizes as the kernels' compile-time WINDOW_H, WINDOW_W (0 × 0: global)."""
        return {"WINDOW_H": self.grid[0], "WINDOW_W": self.grid[1]} if self.windowed else {"WINDOW_H": 0, "WINDOW_W": 0}


def geometry(batch: int, tokens: int, options: KernelOptions) -> Geometry:
    """The :class:`Geometry` of B images of N tokens under these options."""
    map_args = {"map_h": options.grid_h, "map_w": options.grid_w}
    if not options.window_h:
        return Geometry(
            batch, tokens, (options.grid_h, options.grid_w), False, {**map_args, "windows": 1, "windows_w": 1}
        )
    window = (options.window_h, options.window_w)
    windows_w = triton.cdiv(options.grid_w, window[1])
    windows = triton.cdiv(options.grid_h, window[0]) * windows_w
    return Geometry(batch * windows, window[0] * window[1], window, True, {**map_args, "windows": windows,
                    "windows_w": windows_w})  # fmt: skip


def heads_per_program(num_heads: int, head_dim: int) -> int:
    """The heads one program of the tiled kernels holds (a tile's H_PAD): all of them (padded to a power of two)
    where their d × d states fit STATE_BUDGET, else the largest power of two that fits (at least one)."""
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    every = triton.next_power_of_2(num_heads)
    if every * head_dim_pad**2 <= STATE_BUDGET:
        return every
    fit = STATE_BUDGET // head_dim_pad**2
    return 1 << (fit.bit_length() - 1) if fit else 1


def head_groups(num_heads: int, head_dim: int) -> int:
    """The groups of :func:`heads_per_program` heads (the last may be ragged): the grid's third axis."""
    return triton.cdiv(num_heads, heads_per_program(num_heads, head_dim))


def kernel_sizes(channels: int, num_heads: int, dtype: torch.dtype) -> dict:
    """The compile-time sizes of one shape: heads, head dim, the heads of a program's tiles (fewer than all: head
    groups) and the head dim, both padded to powers of two, and the dot precisions."""
    head_dim = channels // num_heads
    half = dtype in (torch.float16, torch.bfloat16)
    return {
        "H": num_heads,
        "D": head_dim,
        "H_PAD": heads_per_program(num_heads, head_dim),
        "D_PAD": max(16, triton.next_power_of_2(head_dim)),
        # bf16 token tiles stay bf16 in the products that sum over tokens (fp32 accumulation), and the backward's
        # products with a d × d state take it in bf16 too (`triton_tiles.state_operand`); fp16 tiles could overflow
        # there, so they and the forward's state products use tf32; fp32 inputs keep fp32 products
        "HALF_DOT": dtype == torch.bfloat16 and not interpreting(),
        "DOT_PRECISION": "tf32" if half and not interpreting() else "ieee",
    }


# Whether the tiles' loads lay their tokens on the first axis (`triton_tiles.load_rows`): Triton's coalescing pass then
# gives each thread one token before 3.7, where it breaks a tie of contiguity in favour of the first axis. The forward
# kernels and dwc_weight_grad take it (Triton 3.6 at 4×32, warp-instructions per token: forward 352 -> 330,
# dwc_weight_grad 288 -> 184); query_grad and key_value_grad do not (they spilled with it).
ROWS_FIRST = tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2]) < (3, 7)


MULTIPLY_ADD_TAPS = {"TENSOR_TAPS": False, "TAP_DTYPE": tl.float32}  # the DWC's taps as fp32 multiply-adds


def tap_products(dtype: torch.dtype, head_dim_pad: int) -> dict:
    """How the forward's DWC multiplies (the backward's: :func:`transposed_tap_products`): 16-bit inputs with
    padded head dims up to 32 on the tensor cores (each tap a product with a diagonal weight matrix in the input's
    dtype, the weights rounded to it as autocast rounds them, fp32 accumulation; the matrices built once per call by
    the state kernel's first program); fp32 inputs and head dims of 64 and
    more with fp32 multiply-adds (a diagonal product does head_dim× the work the tap needs: on sm_90 at head_dim 64
    the multiply-adds issue no more instructions, 276 against 281 per token at 1×64, by the cost figure). The
    interpreter takes the tensor-core path in fp32 (numpy has no bf16 product): the same addressing and sums, the
    weights unrounded."""
    if dtype not in (torch.float16, torch.bfloat16) or head_dim_pad > 32:
        return MULTIPLY_ADD_TAPS
    return {
        "TENSOR_TAPS": True,
        "TAP_DTYPE": tl.float32 if interpreting() else tl.float16 if dtype == torch.float16 else tl.bfloat16,
    }


def transposed_tap_products(dtype: torch.dtype, heads_pad: int, head_dim_pad: int) -> dict:
    """How the backward's transposed conv (in key_value_grad) multiplies: as the forward (:func:`tap_products`),
    its tensor-core products starting from the tile's dL/dv, except with two heads to a program (multiply-adds).
    By the cost figure on Triton 3.8 (3.6), key_value_grad's warp-instructions per token with tensor-core taps
    against multiply-adds: 437 against 576 (459 against 777) at 4×32, 460 against 645 (490 against 866) in
    FLatten-Swin-T's windows, 126 against 159 (124 against 207) at 1×32; but 424 against 405 (425 against 387) at 2×32,
    where the largest tiles that do not spill hold 16 tokens: products of 32 rows, whose per-tile work (each tap's
    weight matrix loaded and staged in shared memory) is spread over half the tokens of the others. (Counted before the
    neighbour bounds became unsigned comparisons, which take 5-10 from each: 428 at 4×32 now.)"""
    if heads_pad == 2:
        return MULTIPLY_ADD_TAPS
    return tap_products(dtype, head_dim_pad)


def bf16_pairs(values: Tensor, head_dim: int, products: dict, windowed: bool) -> dict:
    """BF16_PAIRS of a kernel whose DWC multiplies ``values`` (`triton_tiles.depthwise_conv`): whether its
    multiply-adds read them two channels at a time as 32-bit words, each half widened by one shift or mask (Triton's
    bf16 conversion takes 1.5 instructions an element under 3.6). By the cost figure key_value_grad went from 624 to
    576 warp-instructions per token at 4×32 on Triton 3.8 (825 to 777 on 3.6), and the output kernel at 2×64 on a
    128² map from 495 to 445. For bf16 values of an even head_dim whose rows and images start at whole words, on whole
    maps: in windows the per-window origin (divisions of the program index) holds vector registers, and there the
    pairs spilled under Triton 3.6 (16 B or more in every configuration of key_value_grad at FLatten-Swin-T's stage 1).
    """
    paired = values.dtype == torch.bfloat16 and head_dim % 2 == 0 and _whole_words(values)
    return {"BF16_PAIRS": paired and not products["TENSOR_TAPS"] and not windowed}


def _whole_words(values: Tensor) -> bool:
    """Whether the rows and images of 16-bit ``values`` start at whole 32-bit words: even strides and an even offset
    into their storage, and for a real tensor an address that is a multiple of 4 (a fake tensor, as torch.compile
    traces the op, has no address: its storage starts where an allocation does, aligned)."""
    strides = values.stride(0) % 2 == 0 and values.stride(1) % 2 == 0
    address = detect_fake_mode((values,)) is not None or values.data_ptr() % 4 == 0
    return strides and values.storage_offset() % 2 == 0 and address


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def chunk_granularity() -> int:
    """Chunks are whole numbers of the largest tile, so that every config walks the same chunks."""
    return _INTERPRETER_BLOCK if interpreting() else max(block for block, _, _ in TILE_CONFIGS)


def _device_multiprocessors(device: torch.device) -> int:
    """The SMs of a CUDA device; 4 elsewhere (the interpreter)."""
    return _multiprocessors(device.index or 0) if device.type == "cuda" else 4


def weight_items_per_program(items: int, tap_programs: int, multiprocessors: int) -> int:
    """Items (a chunk of a batch element: a run of tiles, or a window) per program of the DWC weight's gradient:
    one, unless one per program makes more than ~32 programs per SM (the many 49-token windows of a windowed map),
    where each program walks a run of items so that its fixed work (the diagonal and its store) is spread over them.
    Under the interpreter two (fixed; the tests' small maps then cover runs and a ragged last run)."""
    if interpreting():
        return 2
    return max(1, items * tap_programs // (WEIGHT_PROGRAMS_PER_SM * multiprocessors))


def weight_taps_per_program(heads_pad: int, head_dim_pad: int) -> int:
    """Taps per program of the DWC weight's gradient (1 to 3): each holds an (H_PAD, D_PAD, D_PAD) fp32 product,
    and they share the tiles of v; as many as fit WEIGHT_PRODUCTS_BUDGET fp32 elements (3 at 4×32, 2 at 2×64, 1 at
    4×64: more spill)."""
    return max(1, min(3, WEIGHT_PRODUCTS_BUDGET // (heads_pad * head_dim_pad * head_dim_pad)))


def num_chunks(
    batch: int, tokens: int, device: torch.device, multiprocessors: int | None = None, groups: int = 1
) -> tuple[int, int]:
    """(chunk length, number of chunks) of the token axis: B · chunks · head groups ≤ the resident programs, as close
    as it gets."""
    if multiprocessors is None:
        multiprocessors = _device_multiprocessors(device)
    target = PROGRAMS_PER_SM * multiprocessors
    granule = chunk_granularity()
    tiles = triton.cdiv(tokens, granule)
    chunks = max(1, min(tiles, target // max(batch * groups, 1)))
    chunk = triton.cdiv(tiles, chunks) * granule
    return chunk, triton.cdiv(tokens, chunk)


def _tile_trips(tokens: int, chunk: int, chunks: int) -> Callable[[int], float]:
    """Mean number of tiles a program walks, for a tile size."""

    def trips(block: int) -> float:
        lengths = [min(chunk, tokens - i * chunk) for i in range(chunks)]
        return sum(triton.cdiv(length, block) for length in lengths) / chunks

    return trips


def _optional(tensor: Tensor | None, fallback: Tensor) -> Tensor:
    """A tensor argument for a kernel parameter its flags leave unread."""
    return fallback if tensor is None else tensor


def _walk(qkv: Tensor, chunk: int, walked: Geometry) -> dict:
    """The arguments every tiled kernel takes to walk its chunk of the projection output's tokens (in windows, of a
    window's tokens)."""
    return {
        "qkv_ptr": qkv,
        "N": walked.tokens,
        "stride_b": qkv.stride(0),
        "stride_n": qkv.stride(1),
        "chunk": chunk,
        "grid_h": walked.grid[0],
        "grid_w": walked.grid[1],
        **walked.args,
    }


def _position_stride(key_position: Tensor | None) -> int:
    return 0 if key_position is None or key_position.shape[0] == 1 else key_position[0].numel()


def token_norms_shape(images: int, map_tokens: int, channels: int, options: KernelOptions) -> tuple[int, ...]:
    """The shape of the focused map's per-token norms the forward hands the backward: (images, N, 6) fp32 (the keys'
    m, ‖â‖², ‖â^p‖², then the queries') where the heads are split into groups, else (0,) (nothing to hand)."""
    grouped = head_groups(options.num_heads, channels // options.num_heads) > 1
    return (images, map_tokens, NORMS_PER_TOKEN.value) if grouped and options.feature_map == FOCUSED else (0,)


def _tap_buffer(dwc_weight: Tensor | None, qkv: Tensor, products: dict, head_dim_pad: int) -> Tensor:
    """The buffer of the DWC weight's copy that a plan's first kernel writes (`triton_tiles.copy_taps_major`) in the
    form its taps multiply (``products``: :func:`tap_products` or :func:`transposed_tap_products`): for multiply-adds
    tap-major (K·K, D) in the weight's dtype, for tensor-core taps each tap's (D_PAD, D_PAD) diagonal matrix in the
    taps' dtype; without a DWC a placeholder."""
    if dwc_weight is None:
        return qkv
    if not products["TENSOR_TAPS"]:
        return torch.empty(dwc_weight.numel(), device=qkv.device, dtype=dwc_weight.dtype)
    dtype = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16}[products["TAP_DTYPE"]]
    return torch.empty(dwc_weight.shape[-1] ** 2 * head_dim_pad**2, device=qkv.device, dtype=dtype)


def _dwc_constants(dwc_weight: Tensor | None) -> dict:
    """HAS_DWC and K (the DWC's size; 1 without one) of the kernels that copy or multiply the taps."""
    return {"HAS_DWC": dwc_weight is not None, "K": 1 if dwc_weight is None else dwc_weight.shape[-1]}


def forward_plan(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    dwc_bias: Tensor | None,
    mask: Tensor | None,
    options: KernelOptions,
    prescaled: bool,
    multiprocessors: int | None = None,
) -> tuple[list[Launch], Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The forward's launches, its output (B, N, C) and what the backward needs: the partial states (S, z, kept) and
    the focused map's per-token norms (:func:`token_norms_shape`).

    ``mask`` is the key mask as uint8 (or None)."""
    _, _, num_heads, feature_map, focusing_factor, num_prefix_tokens, eps, feature_eps, _, _ = options
    images, map_tokens, _ = qkv.shape
    walked = geometry(images, map_tokens, options)
    batch, tokens = walked.batch, walked.tokens
    channels = qkv.shape[-1] // 3
    sizes = kernel_sizes(channels, num_heads, qkv.dtype)
    head_dim, groups = sizes["D"], head_groups(num_heads, sizes["D"])
    chunk, chunks = num_chunks(batch, tokens, qkv.device, multiprocessors, groups)
    floats = {"device": qkv.device, "dtype": torch.float32}
    partial_s = torch.empty(batch, chunks, num_heads, head_dim, head_dim, **floats)
    partial_z = torch.empty(batch, chunks, num_heads, head_dim, **floats)
    partial_count = torch.empty(batch, chunks, **floats)
    norms = torch.empty(token_norms_shape(images, map_tokens, channels, options), **floats)
    token_norms = norms.numel() > 0
    dwc = {**_dwc_constants(dwc_weight), **tap_products(qkv.dtype, sizes["D_PAD"])}
    taps = _tap_buffer(dwc_weight, qkv, dwc, sizes["D_PAD"])
    out = torch.empty(images, map_tokens, channels, device=qkv.device, dtype=qkv.dtype)
    flags = {"MAP": feature_map, "POWER": focusing_factor, "PRESCALED": prescaled, "HAS_MASK": mask is not None,
             **walked.window_constants, "TOKEN_NORMS": token_norms}  # fmt: skip
    trips = _tile_trips(tokens, chunk, chunks)
    norms_args = {"norms_ptr": norms if token_norms else qkv, "norms_stride_b": map_tokens * NORMS_PER_TOKEN.value}
    state = Launch(
        "state",
        triton_forward.state_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **norms_args,
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": _optional(inverse_temperature, qkv),
            "mask_ptr": _optional(mask, qkv),
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "w_ptr": _optional(dwc_weight, qkv),
            "taps_ptr": taps,
            "pos_stride_b": _position_stride(key_position),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "feature_eps": feature_eps,
        },
        {**sizes, **flags, "HAS_POS": key_position is not None, **dwc, "ROWS_FIRST": ROWS_FIRST},
        lambda block: (trips(block),),
    )
    output_sizes = {key: value for key, value in sizes.items() if key != "HALF_DOT"}
    output = Launch(
        "output",
        triton_forward.output_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **norms_args,
            "inv_ptr": _optional(inverse_temperature, qkv),
            "mask_ptr": _optional(mask, qkv),
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "taps_ptr": taps,
            "bias_ptr": _optional(dwc_bias, qkv),
            "out_ptr": out,
            "out_stride_b": out.stride(0),
            "out_stride_n": out.stride(1),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "eps": eps,
            "feature_eps": feature_eps,
        },
        {
            **output_sizes,
            **flags,
            **dwc,
            **bf16_pairs(qkv, head_dim, dwc, walked.windowed),
            "HAS_BIAS": dwc_bias is not None,
            "ROWS_FIRST": ROWS_FIRST,
        },
        lambda block: (chunks, trips(block)),
    )
    launches = [state, output]
    if token_norms:
        norms_pass = _token_norms(qkv, inverse_temperature, key_position, norms, options, prescaled, multiprocessors)
        launches.insert(0, norms_pass)
    return launches, out, (partial_s, partial_z, partial_count, norms)


def _token_norms(
    qkv: Tensor,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    norms: Tensor,
    options: KernelOptions,
    prescaled: bool,
    multiprocessors: int | None,
) -> Launch:
    """The launch that fills ``norms``: every head of a token in one program, so chunked as a kernel without head
    groups."""
    walked = geometry(qkv.shape[0], qkv.shape[1], options)
    sizes = kernel_sizes(qkv.shape[-1] // 3, options.num_heads, qkv.dtype)
    chunk, chunks = num_chunks(walked.batch, walked.tokens, qkv.device, multiprocessors)
    trips = _tile_trips(walked.tokens, chunk, chunks)
    return Launch(
        "token_norms",
        triton_forward.token_norms_kernel,
        (walked.batch, chunks),
        {
            **_walk(qkv, chunk, walked),
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": _optional(inverse_temperature, qkv),
            "norms_ptr": norms,
            "pos_stride_b": _position_stride(key_position),
            "norms_stride_b": norms[0].numel(),
            "prefix": options.num_prefix_tokens,
            "feature_eps": options.feature_eps,
        },
        {
            "H": sizes["H"],
            "D": sizes["D"],
            "H_PAD": triton.next_power_of_2(options.num_heads),
            "D_PAD": sizes["D_PAD"],
            "POWER": options.focusing_factor,
            "PRESCALED": prescaled,
            "HAS_POS": key_position is not None,
            **walked.window_constants,
            "ROWS_FIRST": ROWS_FIRST,
        },
        lambda block: (trips(block),),
    )


def backward_plan(
    grad_out: Tensor,
    qkv: Tensor,
    partials: tuple[Tensor, Tensor, Tensor, Tensor],
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    mask: Tensor | None,
    options: KernelOptions,
    multiprocessors: int | None = None,
) -> tuple[list[Launch], Tensor, Tensor]:
    """The backward's launches, dL/dqkv, and the small gradients as one fp32 vector: the inverse temperature (C),
    then the DWC weight (d·k·k) and bias (d) when there is a DWC."""
    _, _, num_heads, feature_map, focusing_factor, num_prefix_tokens, eps, feature_eps, _, _ = options
    partial_s, partial_z, partial_count, norms = partials
    _, chunks = partial_count.shape
    images, map_tokens, _ = qkv.shape
    walked = geometry(images, map_tokens, options)
    batch, tokens = walked.batch, walked.tokens
    channels = qkv.shape[-1] // 3
    sizes = kernel_sizes(channels, num_heads, qkv.dtype)
    head_dim, groups = sizes["D"], head_groups(num_heads, sizes["D"])
    chunk, planned = num_chunks(batch, tokens, qkv.device, multiprocessors, groups)
    if planned != chunks:
        raise ValueError(f"the forward's partial states hold {chunks} chunks, this device plans {planned}")
    trips = _tile_trips(tokens, chunk, chunks)
    floats = {"device": qkv.device, "dtype": torch.float32}
    grad_qkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
    partial_ds = torch.empty_like(partial_s)
    partial_dz = torch.empty_like(partial_z)
    token_norms = norms.numel() > 0
    # each token's share of the focused map's cross-head sum per head group: the queries', then the keys'
    cross = torch.empty(images, map_tokens, 2, groups, **floats) if token_norms else qkv
    # dq | dk without the cross-head term, which cross_head_grad reads to write them into dL/dqkv with it: a buffer of
    # their own, so that no launch reads what it writes (an in-place sum under autotune adds its term once per run)
    dqk = torch.empty(images, map_tokens, 2 * channels, dtype=qkv.dtype, device=qkv.device) if token_norms else grad_qkv
    kernel_size = 1 if dwc_weight is None else dwc_weight.shape[-1]
    weight_end = channels + (head_dim * kernel_size * kernel_size if dwc_weight is not None else 0)
    width = weight_end + (head_dim if dwc_weight is not None else 0)
    key_width = width + (groups - 1) * head_dim if dwc_weight is not None else width  # a bias share per group
    query_grads = torch.empty(batch * chunks, channels, **floats)
    # the queries' temperature partials with the cross-head term's share (cross_head_grad's rows; sum_rows adds them)
    cross_grads = torch.empty_like(query_grads) if token_norms else query_grads
    key_grads = torch.empty(batch * chunks, key_width, **floats)
    small_grads = torch.empty(width, **floats)
    inv = _optional(inverse_temperature, qkv)
    dwc = {**_dwc_constants(dwc_weight), **transposed_tap_products(qkv.dtype, sizes["H_PAD"], sizes["D_PAD"])}
    taps = _tap_buffer(dwc_weight, qkv, dwc, sizes["D_PAD"])
    common = {"MAP": feature_map, "POWER": focusing_factor, **walked.window_constants, "TOKEN_NORMS": token_norms}
    group_args = {
        "norms_ptr": norms if token_norms else qkv,
        "cross_ptr": cross,
        "norms_stride_b": map_tokens * NORMS_PER_TOKEN.value,
        "cross_stride_b": map_tokens * 2 * groups,
    }
    out_grad_args = {"do_ptr": grad_out, "do_stride_b": grad_out.stride(0), "do_stride_n": grad_out.stride(1)}
    grad_args = {"dqkv_ptr": grad_qkv, "dqkv_stride_b": grad_qkv.stride(0), "dqkv_stride_n": grad_qkv.stride(1)}
    dqk_args = {"dqk_ptr": dqk, "dqk_stride_b": dqk.stride(0), "dqk_stride_n": dqk.stride(1)}
    query = Launch(
        "query_grad",
        triton_backward.query_grad_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **group_args,
            **out_grad_args,
            **dqk_args,
            "inv_ptr": inv,
            "s_ptr": partial_s,
            "z_ptr": partial_z,
            "count_ptr": partial_count,
            "ds_ptr": partial_ds,
            "dz_ptr": partial_dz,
            "grads_ptr": query_grads,
            "w_ptr": _optional(dwc_weight, qkv),
            "taps_ptr": taps,
            "eps": eps,
            "feature_eps": feature_eps,
        },
        {**sizes, **common, **dwc},
        lambda block: (chunks, trips(block)),
    )
    key_value = Launch(
        "key_value_grad",
        triton_backward.key_value_grad_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **group_args,
            **out_grad_args,
            **grad_args,
            **dqk_args,
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": inv,
            "mask_ptr": _optional(mask, qkv),
            "ds_ptr": partial_ds,
            "dz_ptr": partial_dz,
            "count_ptr": partial_count,
            "taps_ptr": taps,
            "grads_ptr": key_grads,
            "pos_stride_b": _position_stride(key_position),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "grads_width": key_width,
            "feature_eps": feature_eps,
        },
        {
            **sizes,
            **common,
            **dwc,
            **bf16_pairs(grad_out, head_dim, dwc, walked.windowed),
            "HAS_POS": key_position is not None,
            "HAS_MASK": mask is not None,
        },
        lambda block: (chunks, trips(block)),
    )
    cross_head = Launch(
        "cross_head_grad",
        triton_backward.cross_head_grad_kernel,
        (batch, chunks, groups),
        {
            **_walk(qkv, chunk, walked),
            **group_args,
            "pos_ptr": _optional(key_position, qkv),
            "inv_ptr": inv,
            **dqk_args,
            **grad_args,
            "grads_ptr": query_grads,
            "cross_grads_ptr": cross_grads,
            "pos_stride_b": _position_stride(key_position),
            "prefix": num_prefix_tokens,
            "feature_eps": feature_eps,
        },
        {
            **{key: sizes[key] for key in ("H", "D", "H_PAD", "D_PAD")},
            "POWER": focusing_factor,
            "HAS_POS": key_position is not None,
            **walked.window_constants,
        },
        lambda block: (trips(block),),
    )
    items = batch * chunks
    heads_pad = triton.next_power_of_2(num_heads)
    taps = weight_taps_per_program(heads_pad, sizes["D_PAD"])
    tap_programs = triton.cdiv(kernel_size * kernel_size, taps)
    per_program = weight_items_per_program(items, tap_programs, multiprocessors or _device_multiprocessors(qkv.device))
    weight_programs = triton.cdiv(items, per_program)
    weight = Launch(
        "dwc_weight_grad",
        triton_backward.dwc_weight_grad_kernel,
        (weight_programs, tap_programs),
        {
            **_walk(qkv, chunk, walked),
            "mask_ptr": _optional(mask, qkv),
            "do_ptr": grad_out,
            "grads_ptr": key_grads,
            "do_stride_b": grad_out.stride(0),
            "do_stride_n": grad_out.stride(1),
            "mask_stride_b": tokens,
            "prefix": num_prefix_tokens,
            "grads_width": key_width,
            "items": items,
            "items_per_program": per_program,
        },
        {
            "H": num_heads,
            "D": head_dim,
            "H_PAD": heads_pad,
            **{key: sizes[key] for key in ("D_PAD", "DOT_PRECISION")},
            "K": kernel_size,
            "TAPS": taps,
            "HAS_MASK": mask is not None,
            **walked.window_constants,
            "HALF_DOT": qkv.dtype != torch.float32 and not interpreting(),
            "ROWS_FIRST": ROWS_FIRST,
        },
        # one item per program: the launcher makes items_per_program the constant 1, and the item loop is gone
        lambda block: (trips(block),) if per_program == 1 else (items / weight_programs, trips(block)),
    )
    total = Launch(
        "sum_grads",
        triton_backward.sum_rows_kernel,
        (triton.cdiv(width, SUM_BLOCK),),
        {
            "keys_ptr": key_grads,
            "queries_ptr": cross_grads,
            "out_ptr": small_grads,
            "rows": batch * chunks,
            "width": width,
            "key_width": key_width,
            "query_width": channels,
            "weight_end": weight_end,
            "weight_rows": weight_programs,
            "bias_width": head_dim,
        },
        {"BLOCK": SUM_BLOCK, "ROWS": SUM_ROWS, "BIAS_GROUPS": groups if dwc_weight is not None else 1},
        lambda block: (triton.cdiv(batch * chunks, SUM_ROWS),),
        tuned=False,
        num_warps=4,
    )
    launches = [query, key_value] + ([cross_head] if token_norms else []) + ([weight] if dwc_weight is not None else [])
    return launches + [total], grad_qkv, small_grads
