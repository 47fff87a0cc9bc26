"""The geometry of the linear-attention kernels' launches: the autotune space, the shapes of one launch (what the
kernels walk, their compile-time sizes, head groups) and how the token axis is chunked over the GPU's programs.

Chunking: every tiled kernel has the grid (batch, chunk, head group). A chunk is a run of token tiles that one
program walks, and the number of chunks is chosen so that B · chunks · groups fills the GPU's resident programs once
(an exact wave, no tail): the partial states a chunk writes (4·C·d bytes) are then few, and the kernels that consume
them add them up themselves. A program holds every head of its tokens unless their d × d states outgrow its
registers (:func:`heads_per_program`); then the heads are split into groups, one per program.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton

from linvit.ops._backend import interpreting

__all__ = [
    "AUTOTUNE_SIZES",
    "TILE_CONFIGS",
    "Geometry",
    "KernelOptions",
    "Launch",
    "ROW_TILE",
    "RowWalk",
    "ROW_WARPS",
    "geometry",
    "head_groups",
    "head_splits",
    "kernel_sizes",
    "num_chunks",
    "output_row_warps",
    "row_bands",
    "row_halo",
    "row_strip",
    "row_walk",
]

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
ROW_TILE = 64  # tokens × heads of a rows kernel's tile per warpgroup: its tensor-core product rows on sm_90
ROW_WARPS = 4  # the rows kernels' warps: one warpgroup (the forward's output: two from four heads a program on)
PROGRAMS_PER_SM = 2  # the tiled kernels are sized for two resident programs of 4-8 warps per SM
WEIGHT_PROGRAMS_PER_SM = 32  # the DWC weight's gradient: programs per SM above which a program walks several items
WEIGHT_PRODUCTS_BUDGET = 16384  # fp32 elements of the DWC weight gradient's per-tap products a program holds
# fp32 elements of the per-program d × d states (heads × d²) that the backward kernels hold without spilling: 4 × 32²
# at C = 128 is spill-free by the cost figure; 2 × 64² and more spill (query_grad's states and dS accumulators)
STATE_BUDGET = 4 * 32 * 32


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
    heads, the feature map's code and power, the prefix tokens, the two epsilons, the window (0 × 0: global) and
    whether the temperature is given as its parameter."""

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
    temperature_scale: int = 0  # 1: the temperature tensor is the parameter s, the kernels take 1 / softplus(s)


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
        # bf16 token tiles stay bf16 in the products that sum over tokens (fp32 accumulation), and the products with
        # a d × d state (its chunks summed in fp32) take it in bf16 too (`triton_tiles.state_operand`), as the torch
        # backend's products under autocast do; fp16 tiles could overflow there, so they use tf32; fp32 inputs keep
        # fp32 products
        "HALF_DOT": dtype == torch.bfloat16 and not interpreting(),
        "DOT_PRECISION": "tf32" if half and not interpreting() else "ieee",
    }


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def chunk_granularity() -> int:
    """Chunks are whole numbers of the largest tile, so that every config walks the same chunks."""
    return _INTERPRETER_BLOCK if interpreting() else max(block for block, _, _ in TILE_CONFIGS)


def device_multiprocessors(device: torch.device) -> int:
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
        multiprocessors = device_multiprocessors(device)
    target = PROGRAMS_PER_SM * multiprocessors
    granule = chunk_granularity()
    tiles = triton.cdiv(tokens, granule)
    chunks = max(1, min(tiles, target // max(batch * groups, 1)))
    chunk = triton.cdiv(tiles, chunks) * granule
    return chunk, triton.cdiv(tokens, chunk)


def row_strip(heads_pad: int, warps: int = ROW_WARPS) -> int:
    """Columns of a strip of a rows kernel of ``warps`` warps: its tiles (one row of a strip, every head of the
    program) hold ROW_TILE token-heads a warpgroup, the rows of its tensor-core products (at least 16: a product's
    least)."""
    return max(16, ROW_TILE * (warps // ROW_WARPS) // heads_pad)


def output_row_warps(heads_pad: int) -> int:
    """Warps of `triton_rows.output_rows_kernel`: two warpgroups from four heads a program on, one below. Two take
    strips twice as wide in one program a multiprocessor (the same warps as two of one): at the benchmark shape
    (4×32) strips of 32 columns read 36 for 32 instead of 20 for 16, and each program adds up the state's chunks for
    twice the tokens (1,145 → 988 B a token, 0.125 → 0.108 ms by the cost figure). At two heads Triton 3.8 fails to
    compile them (a pass's error, at strips of 32 and 64)."""
    return 2 * ROW_WARPS if heads_pad >= 4 else ROW_WARPS


def head_splits(heads_pad: int, warps: int) -> int:
    """Pieces of a strip's row the output kernel's φ(q)·S products take as batches of their own (16 tokens each), so
    that each warp has a batch: a batched product puts its warps on the batch axis, and with fewer heads than warps
    two warps did the same work (at the benchmark shape in two warpgroups: 227 → 213 warp-instructions a token)."""
    return warps // heads_pad if 1 < heads_pad < warps else 1


def row_halo(kernel_size: int, heads_pad: int, channels: int, words: bool, warps: int = ROW_WARPS) -> dict:
    """HALO and WORDS of the rows kernels (`triton_rows.row_and_halo`): the K//2 columns on each side of a strip
    that its taps reach, 2·(K//2) rounded up to a power of two (a tile's size), and at least as many that the halo's
    tile (heads_pad × HALO × channels, or half as many 32-bit ``words``) holds an element per thread: Triton 3.8's
    gather from a smaller tile fails to compile (a pass's assertion, a RuntimeError at the first launch: one head of
    16 or 32 channels at DWC 3, one of 16 at DWC 5)."""
    elements = heads_pad * (channels // 2 if words else channels)
    halo = max(triton.next_power_of_2(max(1, kernel_size - 1)), triton.cdiv(warps * 32, elements))
    return {"HALO": halo, "WORDS": words}


def row_bands(
    images: int, map_h: int, map_w: int, groups: int, strip: int, device: torch.device,
    multiprocessors: int | None = None, warps: int = ROW_WARPS,
) -> tuple[int, int, int]:  # fmt: skip
    """(strips, rows per band, bands) of a rows kernel's grid: strips of ``strip`` columns, each cut into bands of
    rows so that images · strips · bands · groups fills the resident programs once (PROGRAMS_PER_SM of ROW_WARPS
    warps, or as many warps in fewer programs), as close as it gets (each band reads K - 1 rows more than it writes:
    its halo)."""
    if multiprocessors is None:
        multiprocessors = device_multiprocessors(device)
    strips = triton.cdiv(map_w, strip)
    resident = max(1, PROGRAMS_PER_SM * ROW_WARPS // warps) * multiprocessors
    bands = max(1, min(map_h, resident // max(images * strips * groups, 1)))
    band_rows = triton.cdiv(map_h, bands)
    return strips, band_rows, triton.cdiv(map_h, band_rows)


class RowWalk(NamedTuple):
    """How a rows kernel (`triton_rows.py`, `triton_rows_backward.py`) walks the maps: per image and group of heads_pad
    heads, strips of ``strip`` columns, each cut into ``bands`` bands of ``band_rows`` rows."""

    images: int
    strip: int
    strips: int
    band_rows: int
    bands: int
    heads_pad: int
    groups: int  # of heads

    @property
    def strip_bands(self) -> int:
        """Its (strip, band) pieces over the images: the programs of one head group (and one block of channels, for
        the weight's gradient)."""
        return self.images * self.strips * self.bands


def row_walk(
    images: int, map_h: int, map_w: int, num_heads: int, heads_pad: int, device: torch.device,
    multiprocessors: int | None = None, filling_groups: int | None = None, warps: int = ROW_WARPS,
) -> RowWalk:  # fmt: skip
    """The walk of a rows kernel of ``warps`` warps holding ``heads_pad`` heads a program: :func:`row_strip` and
    :func:`row_bands`, the bands sized for its head groups' programs to fill the resident ones (``filling_groups``:
    count that many instead; the weight gradient's kernel counts 1)."""
    strip, groups = row_strip(heads_pad, warps), triton.cdiv(num_heads, heads_pad)
    filling = groups if filling_groups is None else filling_groups
    strips, band_rows, bands = row_bands(images, map_h, map_w, filling, strip, device, multiprocessors, warps)
    return RowWalk(images, strip, strips, band_rows, bands, heads_pad, groups)


def tile_trips(tokens: int, chunk: int, chunks: int) -> Callable[[int], float]:
    """Mean number of tiles a program walks, for a tile size."""

    def trips(block: int) -> float:
        lengths = [min(chunk, tokens - i * chunk) for i in range(chunks)]
        return sum(triton.cdiv(length, block) for length in lengths) / chunks

    return trips
