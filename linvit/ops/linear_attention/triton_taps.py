"""How the kernels' depthwise convolution (DWC) multiplies its taps: on the tensor cores as products with diagonal
matrices, or as multiply-adds (fp32, or bf16 read two channels at a time), and the buffer of the taps' copy that a
plan's first kernel writes; and how the tiles lay their tokens (``ROWS_FIRST``, by Triton version)."""

from __future__ import annotations

import re

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch._guards import detect_fake_mode

from linvit.ops._backend import interpreting

__all__ = ["MULTIPLY_ADD_TAPS", "ROWS_FIRST", "bf16_pairs", "dwc_constants", "tap_buffer", "tap_products",
           "transposed_tap_products"]  # fmt: skip

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


def row_words(values: Tensor, head_dim: int) -> bool:
    """WORDS of a rows kernel (`triton_rows.row_and_halo`) reading ``values``: 16-bit values of an even head_dim whose
    rows and images start at whole 32-bit words, which it reads and shifts two channels at a time."""
    return values.element_size() == 2 and head_dim % 2 == 0 and _whole_words(values)


def _whole_words(values: Tensor) -> bool:
    """Whether the rows and images of 16-bit ``values`` start at whole 32-bit words: even strides and an even offset
    into their storage, and for a real tensor an address that is a multiple of 4 (a fake tensor, as torch.compile
    traces the op, has no address: its storage starts where an allocation does, aligned)."""
    strides = values.stride(0) % 2 == 0 and values.stride(1) % 2 == 0
    address = detect_fake_mode((values,)) is not None or values.data_ptr() % 4 == 0
    return strides and values.storage_offset() % 2 == 0 and address


def tap_buffer(dwc_weight: Tensor | None, qkv: Tensor, products: dict, head_dim_pad: int) -> Tensor:
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


def dwc_constants(dwc_weight: Tensor | None) -> dict:
    """HAS_DWC and K (the DWC's size; 1 without one) of the kernels that copy or multiply the taps."""
    return {"HAS_DWC": dwc_weight is not None, "K": 1 if dwc_weight is None else dwc_weight.shape[-1]}
