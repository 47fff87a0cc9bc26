"""linear_attention_qkv: every backend against the package's naive reference, in value and in every gradient.

The Triton kernels run compiled on a CUDA machine and through Triton's interpreter on the CPU (tests/conftest.py sets
TRITON_INTERPRET=1 there), so their correctness never depends on having a GPU; shapes stay small for the interpreter.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from linvit.ops import BACKENDS, get_backend, linear_attention_qkv, resolve_backend, set_backend, use_backend

TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed (PyTorch's CUDA wheels bring it)"
)
TRITON = pytest.param("triton", marks=needs_triton)


def _case(feature_map: str, hw: tuple[int, int], heads: int, head_dim: int, **options) -> dict:
    """One configuration: options kernel (DWC size, 0 for none), power, mask, position ("shared", "batched", None),
    prefix (class tokens), window (attention in windows)."""
    return {"feature_map": feature_map, "hw": hw, "heads": heads, "head_dim": head_dim, **options}


CASES = {
    "focused": _case("focused", (5, 7), 2, 16, kernel=5, power=3.0, mask=True),
    "focused_odd_head_dim": _case("focused", (6, 4), 3, 24, kernel=3, power=2.0),
    "focused_batched_position": _case("focused", (4, 9), 2, 16, position="batched"),
    "focused_class_token": _case("focused", (3, 5), 1, 32, prefix=1, power=4.5),
    "focused_no_dwc_one_row": _case("focused", (1, 11), 2, 16, kernel=0, mask=True),
    "focused_head_dim_64": _case("focused", (5, 4), 2, 64, kernel=5, mask=True),
    "focused_head_dim_128": _case("focused", (3, 3), 1, 128, kernel=3),
    # head groups (one program per group of heads; the focused map's norms and cross-head term in passes of their
    # own): two 64-wide heads in windows with class-free padding; six 24-wide heads in a full and a ragged group of 4
    "focused_head_groups_windows": _case("focused", (5, 6), 2, 64, kernel=3, window=(4, 4), mask=False),
    "focused_head_groups_ragged": _case(
        "focused", (4, 5), 6, 24, kernel=3, mask=True, prefix=1, power=2.5, position="batched"
    ),
    "relu_head_groups": _case("relu", (3, 4), 2, 64, kernel=3, mask=True),
    "focused_windows_padded": _case("focused", (7, 9), 2, 16, kernel=3, window=(4, 4), position="batched"),
    "relu": _case("relu", (7, 3), 2, 16, kernel=5, mask=True),
    "relu_windows": _case("relu", (8, 4), 3, 16, kernel=5, window=(4, 2)),
    "elu": _case("elu", (4, 4), 2, 16, kernel=0, position=None),
}


def _inputs(case: dict, dtype=torch.float64, device="cpu", batch=2, seed=0) -> tuple[torch.Tensor, dict]:
    """qkv and the keyword arguments of one case, as leaf tensors (the parameters require grad)."""
    generator = torch.Generator().manual_seed(seed)
    heads, head_dim, prefix = case["heads"], case["head_dim"], case.get("prefix", 0)
    channels, tokens = heads * head_dim, prefix + case["hw"][0] * case["hw"][1]

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(device, dtype)

    kwargs = {"hw": case["hw"], "num_heads": heads, "feature_map": case["feature_map"], "num_prefix_tokens": prefix}
    positions, position_batch = tokens - prefix, batch
    if "window" in case:  # one position per window token; batched: per window of each image
        kwargs["window"] = window = case["window"]
        positions = window[0] * window[1]
        position_batch = batch * (-(-case["hw"][0] // window[0])) * (-(-case["hw"][1] // window[1]))
    leaves = {"qkv": randn(batch, tokens, 3 * channels)}
    if case["feature_map"] == "focused":
        leaves["inverse_temperature"] = 1.0 / torch.nn.functional.softplus(randn(channels, scale=0.5))
        kwargs["focusing_factor"] = case.get("power", 3.0)
    position = case.get("position", "shared")
    if position is not None:
        leaves["key_position"] = randn(position_batch if position == "batched" else 1, positions, channels, scale=0.5)
    kernel = case.get("kernel", 5)
    if kernel:
        leaves["dwc_weight"] = randn(head_dim, 1, kernel, kernel, scale=0.3)
        leaves["dwc_bias"] = randn(head_dim, scale=0.3)
    if case.get("mask"):
        kwargs["key_mask"] = (torch.rand(batch, tokens, generator=generator) > 0.3).to(device)
    for value in leaves.values():
        value.requires_grad_(True)
    qkv = leaves.pop("qkv")
    return qkv, {**kwargs, **leaves}


def _run(backend: str, qkv: torch.Tensor, kwargs: dict, grad_out: torch.Tensor):
    """Output and the gradients of (qkv, every tensor argument that requires grad), for one backend."""
    leaves = [qkv] + [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    out = linear_attention_qkv(qkv, backend=backend, **kwargs)
    return out, torch.autograd.grad(out, leaves, grad_out)


def _cast(qkv, kwargs, dtype, device):
    """The same leaves in another dtype / on another device (the mask stays bool)."""
    moved = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().to(device, dtype if value.is_floating_point() else value.dtype)
            moved[key] = value.requires_grad_(value.is_floating_point())
        else:
            moved[key] = value
    return qkv.detach().to(device, dtype).requires_grad_(True), moved


def _relative_error(got, expected) -> float:
    """Max-norm relative error (per tensor), the measure that suits values of very different sizes."""
    got, expected = got.detach().double(), expected.detach().double()
    return float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def _assert_close(got, expected, rtol):
    error = _relative_error(got, expected)
    assert error <= rtol, f"relative error {error:.2e} > {rtol:.0e}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_backend_equals_naive_in_value_and_gradients(name):
    qkv, kwargs = _inputs(CASES[name])
    grad_out = torch.randn(qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3, dtype=torch.float64)
    expected, expected_grads = _run("naive", qkv, kwargs, grad_out)
    out, grads = _run("torch", qkv, kwargs, grad_out)
    _assert_close(out, expected, 1e-12)
    for got, want in zip(grads, expected_grads):
        _assert_close(got, want, 1e-10)


def _assert_triton_equals_naive(name: str) -> None:
    """The Triton op in float32 equals the naive reference in float64 on one case, in value (2e-5) and every gradient
    (5e-5), on the Triton device in float32."""
    qkv, kwargs = _inputs(CASES[name])
    grad_out = torch.randn(qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3, dtype=torch.float64)
    expected, expected_grads = _run("naive", qkv, kwargs, grad_out)
    qkv32, kwargs32 = _cast(qkv, kwargs, torch.float32, TRITON_DEVICE)
    out, grads = _run("triton", qkv32, kwargs32, grad_out.float().to(TRITON_DEVICE))
    assert out.dtype == torch.float32 and out.device.type == TRITON_DEVICE.type
    _assert_close(out.cpu(), expected, 2e-5)
    for got, want in zip(grads, expected_grads):
        assert got.shape == want.shape
        _assert_close(got.cpu(), want, 5e-5)


@needs_triton
@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_backend_equals_naive_in_value_and_gradients(name):
    _assert_triton_equals_naive(name)


@needs_triton
@pytest.mark.parametrize("kernel", [3, 5, 7])
def test_the_rows_kernels_cover_ragged_strips_and_several_bands(kernel):
    """On a whole map with 16-bit inputs the forward's output comes from `triton_rows.output_rows_kernel`, the DWC
    weight's gradient from `triton_rows_backward.dwc_weight_rows_kernel` and dL/dv's transposed conv from its
    `value_conv_rows_kernel` (and the shared positional table's gradient from the last kernel's sum over the images,
    several blocks of tokens, the last ragged): strips of columns (the last one ragged) in
    bands of rows, each band reading the K//2 rows above and below it. On maps of two strips of the output kernel's
    (in two bands or more; 32 columns, of two warpgroups from four heads a program on, whose φ(q)·S products then take
    each row in two pieces; two head groups with their norms pass; heads of 24 channels padded to 32, whose output
    takes the conv in two halves of 16 channels up to DWC 5), with a key mask, they equal the naive reference on the
    same rounded inputs for DWC sizes 3, 5 and 7 (7 reaches past a band of 5 rows), in value and every gradient; fp32
    inputs take the tiled kernels."""
    from linvit.ops.linear_attention import triton_launch, triton_launch_backward
    from linvit.ops.linear_attention.triton_geometry import (
        geometry,
        head_splits,
        heads_per_program,
        output_row_warps,
        row_bands,
        row_strip,
    )
    from linvit.ops.linear_attention.triton_taps import tap_products

    for heads, head_dim in ((4, 8), (2, 16), (8, 32), (3, 24)):
        heads_pad = heads_per_program(heads, head_dim)
        warps = output_row_warps(heads_pad)
        strip = row_strip(heads_pad, warps)
        hw = (9, strip + 1)
        if TRITON_DEVICE.type == "cpu" and heads == 4:  # the interpreter's 4 multiprocessors: 4 programs of 8 warps
            assert (warps, strip, head_splits(heads_pad, warps)) == (8, 32, 2)
            assert row_bands(1, *hw, 1, strip, TRITON_DEVICE, warps=warps) == (2, 5, 2)
        qkv, kwargs = _inputs(_case("focused", hw, heads, head_dim, kernel=kernel, mask=True), batch=1)
        options = triton_launch.KernelOptions(*hw, heads, 0, 3.0, 0, 1e-6, 1e-6)
        walked = geometry(1, qkv.shape[1], options)
        for dtype, rows in ((torch.bfloat16, True), (torch.float32, False)):
            padded = max(16, head_dim)
            assert triton_launch.streams_rows(kwargs["dwc_weight"], walked, 0, tap_products(dtype, padded)) == rows
            streamed = triton_launch_backward._weight_strips(qkv.to(dtype), kwargs["dwc_weight"], options, None)
            assert (streamed is not None) == rows
        qkv16, kwargs16 = _cast(qkv, kwargs, torch.bfloat16, TRITON_DEVICE)
        forward, *_ = triton_launch.forward_plan(
            qkv16.detach(), kwargs16["inverse_temperature"].detach(), kwargs16["key_position"].detach(),
            kwargs16["dwc_weight"].detach(), kwargs16["dwc_bias"].detach(), None, options, False,
        )  # fmt: skip
        assert forward[-1].constants["HALVES"] == ((heads, head_dim) == (3, 24) and kernel <= 5)
        assert (forward[-1].num_warps, forward[-1].constants["STRIP"]) == (warps, strip)
        _assert_bf16_triton_matches_naive(qkv16, kwargs16, seed=kernel)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half_inputs_keep_float32_state(dtype):
    """Half-precision q|k|v in, the same dtype out; inside, the maps and S, z are float32, so the error is the
    rounding of the inputs and of the output, not of the cubed features."""
    qkv, kwargs = _inputs(CASES["focused"])
    qkv_half, kwargs_half = _cast(qkv, kwargs, dtype, TRITON_DEVICE)
    out = linear_attention_qkv(qkv_half, backend="triton", **kwargs_half)
    assert out.dtype == dtype and torch.isfinite(out).all()
    kwargs_float = {k: _float(v) for k, v in kwargs_half.items()}
    reference = linear_attention_qkv(qkv_half.float().cpu(), backend="naive", **kwargs_float)
    _assert_close(out.float().cpu(), reference, 1e-2)


def _float(value):
    return value.float().cpu() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


HALF_CASES = ["focused", "focused_odd_head_dim", "focused_class_token", "focused_head_groups_ragged", "relu_windows"]


@needs_triton
@pytest.mark.parametrize("name", HALF_CASES)
def test_triton_half_inputs_take_the_tensor_core_taps_in_value_and_gradients(name):
    """16-bit inputs take the DWC path of tensor-core products with diagonal weights, in the forward and (except with
    two heads to a program) in the backward's transposed conv, starting from dL/dv: padded heads (3 → 4) and head dims
    (24 → 32), class tokens, masked keys, head groups (the second one ragged), windows, against the naive reference on
    the same rounded inputs in float32, value and every gradient."""
    from linvit.ops.linear_attention.triton_taps import tap_products, transposed_tap_products

    assert tap_products(torch.bfloat16, 32)["TENSOR_TAPS"] and not tap_products(torch.float32, 32)["TENSOR_TAPS"]
    assert not tap_products(torch.bfloat16, 64)["TENSOR_TAPS"]  # multiply-adds issue less from head_dim 64 on
    backward = {heads: transposed_tap_products(torch.float16, heads, 32)["TENSOR_TAPS"] for heads in (1, 2, 4)}
    assert backward == {1: True, 2: False, 4: True}
    assert not transposed_tap_products(torch.float32, 4, 32)["TENSOR_TAPS"]
    qkv, kwargs = _inputs(CASES[name])
    _assert_bf16_triton_matches_naive(*_cast(qkv, kwargs, torch.bfloat16, TRITON_DEVICE), seed=2)


def off_a_word(qkv: torch.Tensor) -> torch.Tensor:
    """The same 16-bit values one element into a storage of their own, a leaf that requires grad: rows no longer
    start at whole 32-bit words, so the DWC reads them by values, not in pairs (`triton_taps.bf16_pairs`)."""
    storage = torch.zeros(qkv.numel() + 1, dtype=qkv.dtype, device=qkv.device)
    shifted = storage[1:].view(qkv.shape)
    shifted.copy_(qkv.detach())
    return shifted.requires_grad_(True)


def _assert_bf16_triton_matches_naive(qkv_half, kwargs_half, seed):
    """The Triton op on bf16 leaves equals the naive reference on the same rounded values in float32, in value
    (1e-2) and every gradient (3e-2)."""
    generator = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(qkv_half.shape[0], qkv_half.shape[1], qkv_half.shape[2] // 3, generator=generator)
    out, grads = _run("triton", qkv_half, kwargs_half, grad_out.to(TRITON_DEVICE, torch.bfloat16))
    qkv_float, kwargs_float = _cast(qkv_half, kwargs_half, torch.float32, torch.device("cpu"))
    expected, expected_grads = _run("naive", qkv_float, kwargs_float, grad_out)
    _assert_close(out.float().cpu(), expected, 1e-2)
    for got, want in zip(grads, expected_grads):
        _assert_close(got.float().cpu(), want, 3e-2)


def test_bf16_pairs_only_where_the_values_lie_in_whole_words_on_a_whole_map():
    """The DWC's multiply-adds read bf16 values as 32-bit pairs of channels only for an even head_dim, rows and images
    at whole words, no window, and multiply-adds (not tensor-core taps)."""
    from linvit.ops.linear_attention.triton_taps import MULTIPLY_ADD_TAPS, bf16_pairs, tap_products

    values = torch.zeros(2, 6, 3 * 128, dtype=torch.bfloat16)
    assert bf16_pairs(values, 64, MULTIPLY_ADD_TAPS, windowed=False) == {"BF16_PAIRS": True}
    refused = [
        (values.float(), 64, MULTIPLY_ADD_TAPS, False),
        (values.half(), 64, MULTIPLY_ADD_TAPS, False),
        (values, 63, MULTIPLY_ADD_TAPS, False),
        (off_a_word(values), 64, MULTIPLY_ADD_TAPS, False),
        (torch.zeros(2, 6, 385, dtype=torch.bfloat16)[..., :384], 64, MULTIPLY_ADD_TAPS, False),
        (values, 64, MULTIPLY_ADD_TAPS, True),
        (values, 32, tap_products(torch.bfloat16, 32), False),
    ]
    for tensor, head_dim, products, windowed in refused:
        assert bf16_pairs(tensor, head_dim, products, windowed) == {"BF16_PAIRS": False}


def test_bf16_pairs_of_fake_tensors_read_no_address():
    """As torch.compile traces the Triton op its tensors are fake, without an address (reading one warns and gives
    0): the pairs are decided from the storage offset and the strides alone."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from linvit.ops.linear_attention.triton_taps import MULTIPLY_ADD_TAPS, bf16_pairs

    with FakeTensorMode(), warnings.catch_warnings():
        warnings.simplefilter("error")
        values = torch.empty(2, 6, 384, dtype=torch.bfloat16)
        assert bf16_pairs(values, 64, MULTIPLY_ADD_TAPS, windowed=False) == {"BF16_PAIRS": True}
        shifted = torch.empty(2 * 6 * 384 + 1, dtype=torch.bfloat16)[1:].view(2, 6, 384)
        assert bf16_pairs(shifted, 64, MULTIPLY_ADD_TAPS, windowed=False) == {"BF16_PAIRS": False}


@needs_triton
@pytest.mark.parametrize("layout", ["whole_words", "off_a_word"])
def test_triton_bf16_head_dim_64_multiply_adds_in_pairs_or_not(layout):
    """bf16 at head_dim 64: the forward's DWC multiply-adds too (tensor-core taps stop at 32), reading v in 32-bit
    pairs where q|k|v starts at a whole word and by bf16 values where it does not (a view one element into its
    storage), and the backward's transposed conv in pairs; value and every gradient against the naive reference."""
    qkv, kwargs = _inputs(CASES["focused_head_dim_64"])
    qkv_half, kwargs_half = _cast(qkv, kwargs, torch.bfloat16, TRITON_DEVICE)
    if layout == "off_a_word":
        qkv_half = off_a_word(qkv_half)
        assert qkv_half.data_ptr() % 4 != 0
    _assert_bf16_triton_matches_naive(qkv_half, kwargs_half, seed=3)


def test_the_weight_gradient_shares_each_tile_of_v_between_taps_while_their_products_fit():
    """The DWC weight's gradient: three taps a program while their (H_PAD, D_PAD, D_PAD) fp32 products fit the
    budget, fewer beyond (the interpreter cases run 3, 2 and 1, and the last program's spare taps: 25 = 8·3 + 1)."""
    pytest.importorskip("triton")
    from linvit.ops.linear_attention.triton_geometry import weight_taps_per_program

    cases = {(4, 32): 3, (2, 16): 3, (1, 64): 3, (2, 64): 2, (8, 32): 2, (4, 64): 1, (1, 128): 1, (8, 64): 1}
    for (heads_pad, head_dim_pad), expected in cases.items():
        assert weight_taps_per_program(heads_pad, head_dim_pad) == expected, (heads_pad, head_dim_pad)


def test_heads_share_a_program_while_their_states_fit():
    """The tiled kernels' head groups: every head in one program up to 4 × 32² fp32 of d × d states, else groups of
    the largest power of two of heads that fits (the last one ragged); the forward hands the backward per-token norms
    only for the focused map in groups."""
    pytest.importorskip("triton")
    from linvit.ops.linear_attention.triton_geometry import KernelOptions, head_groups, heads_per_program
    from linvit.ops.linear_attention.triton_launch import token_norms_shape

    cases = {(4, 32): (4, 1), (3, 32): (4, 1), (16, 16): (16, 1), (1, 64): (1, 1), (1, 128): (1, 1), (2, 64): (1, 2),
             (5, 64): (1, 5), (6, 24): (4, 2), (12, 32): (4, 3)}  # fmt: skip
    for (heads, head_dim), expected in cases.items():
        assert (heads_per_program(heads, head_dim), head_groups(heads, head_dim)) == expected, (heads, head_dim)
    focused = KernelOptions(4, 4, 2, 0, 3.0, 0, 1e-6, 1e-6)
    assert token_norms_shape(2, 16, 128, focused) == (2, 16, 6)
    assert token_norms_shape(2, 16, 64, focused) == (0,)  # 2 × 32: one program holds both heads
    assert token_norms_shape(2, 16, 128, focused._replace(feature_map=1)) == (0,)  # relu: no norms across heads


@needs_triton
@pytest.mark.parametrize(
    "name",
    [
        "focused",
        pytest.param("relu_windows", marks=pytest.mark.slow),
        pytest.param("focused_head_groups_ragged", marks=pytest.mark.slow),
    ],
)
def test_tiles_load_with_their_tokens_first_or_not_with_the_same_result(name, monkeypatch):
    """The forward kernels and dwc_weight_grad load and store their tiles through pointers with the tokens on the
    first axis before Triton 3.7 and in place from 3.7 (`triton_taps.ROWS_FIRST`, so that each version's
    coalescing pass gives a thread one token): the layout this Triton does not take gives the same output and
    gradients (whole map with a mask, windows, class token with head groups)."""
    from linvit.ops.linear_attention import triton_taps

    monkeypatch.setattr(triton_taps, "ROWS_FIRST", not triton_taps.ROWS_FIRST)
    _assert_triton_equals_naive(name)


@needs_triton
@pytest.mark.slow
def test_bf16_pairs_load_with_their_tokens_first_or_not_with_the_same_result(monkeypatch):
    """The DWC's bf16 pairs (head_dim 64) gathered through pointers with the tokens first and in place: the layout
    this Triton does not take gives the same output and gradients (see the test above)."""
    from linvit.ops.linear_attention import triton_taps

    monkeypatch.setattr(triton_taps, "ROWS_FIRST", not triton_taps.ROWS_FIRST)
    qkv, kwargs = _inputs(CASES["focused_head_dim_64"])
    _assert_bf16_triton_matches_naive(*_cast(qkv, kwargs, torch.bfloat16, TRITON_DEVICE), seed=3)


@needs_triton
def test_pinned_tiles_take_one_configuration_with_the_same_result():
    """pinned_tiles launches every tiled kernel with one configuration instead of autotuning (the GPU test tier):
    64-token tiles across the interpreter's 16-token chunks (clipped to each chunk) give the same values and
    gradients; a configuration outside the autotune space is refused."""
    from linvit.ops.linear_attention.triton import pinned_tiles

    with pinned_tiles((64, 4, 1)):
        _assert_triton_equals_naive("focused_head_groups_ragged")
    with pytest.raises(ValueError, match="is not one of TILE_CONFIGS"), pinned_tiles((128, 4, 1)):
        pass


@needs_triton
def test_triton_is_deterministic():
    qkv, kwargs = _inputs(CASES["focused"])
    qkv32, kwargs32 = _cast(qkv, kwargs, torch.float32, TRITON_DEVICE)
    grad_out = torch.randn(qkv32.shape[0], qkv32.shape[1], qkv32.shape[2] // 3, device=TRITON_DEVICE)
    first, second = (_run("triton", qkv32, kwargs32, grad_out) for _ in range(2))
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1]))


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_gradcheck_float64(backend):
    qkv, kwargs = _inputs(_case("focused", (2, 3), 2, 4, kernel=3, mask=True), batch=1)
    leaves = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.requires_grad}
    others = {k: v for k, v in kwargs.items() if k not in leaves}

    def function(qkv, *values):
        return linear_attention_qkv(qkv, backend=backend, **others, **dict(zip(leaves, values)))

    assert torch.autograd.gradcheck(function, (qkv, *leaves.values()), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    "backend, name",
    [
        ("naive", "focused"),
        ("torch", "focused"),
        pytest.param("triton", "focused", marks=needs_triton),
        pytest.param("triton", "focused_head_groups_ragged", marks=needs_triton),
    ],
)
def test_prescaled_queries_keys_equal_raw_ones(backend, name):
    """prescaled=True takes q|k as (x + eps) / s (the temperature folded into the projection): same result (in
    head groups too, whose per-token norms then come from the prescaled q|k)."""
    qkv, kwargs = _inputs(CASES[name])
    device, dtype = (TRITON_DEVICE, torch.float32) if backend == "triton" else ("cpu", torch.float64)
    qkv, kwargs = _cast(qkv, kwargs, dtype, device)
    inverse = kwargs["inverse_temperature"]
    channels = qkv.shape[-1] // 3
    qk = (qkv[..., : 2 * channels] + 1e-6) * inverse.repeat(2)
    prescaled_qkv = torch.cat([qk, qkv[..., 2 * channels :]], dim=-1)
    expected = linear_attention_qkv(qkv, backend=backend, **kwargs)
    with torch.no_grad():  # the torch backend then maps the caller's buffer in place
        got = linear_attention_qkv(prescaled_qkv.detach().clone(), backend=backend, prescaled=True, **kwargs)
    _assert_close(got, expected.detach(), 1e-5 if backend == "triton" else 1e-12)
    if backend != "triton":  # the eager and reference forms are differentiable in both forms
        grad = torch.autograd.grad(
            linear_attention_qkv(prescaled_qkv, backend=backend, prescaled=True, **kwargs),
            inverse,
            torch.ones_like(expected),
        )[0]
        want = torch.autograd.grad(expected, inverse, torch.ones_like(expected))[0]
        _assert_close(grad, want, 1e-10)
    else:
        out = linear_attention_qkv(prescaled_qkv, backend=backend, prescaled=True, **kwargs)
        with pytest.raises(RuntimeError, match="prescaled=False when gradients are needed"):
            out.sum().backward()


@pytest.mark.parametrize(
    "backend, name",
    [
        ("naive", "focused"),
        ("torch", "focused"),
        pytest.param("triton", "focused", marks=needs_triton),
        pytest.param("triton", "focused_head_groups_windows", marks=needs_triton),  # head groups, in windows
    ],
)
def test_an_empty_batch_returns_an_empty_output(backend, name):
    qkv, kwargs = _inputs(CASES[name], batch=1)
    qkv, kwargs = _cast(qkv, kwargs, torch.float32, TRITON_DEVICE if backend == "triton" else "cpu")
    kwargs.pop("key_mask", None)
    out = linear_attention_qkv(qkv[:0], backend=backend, **kwargs)
    assert out.shape == (0, qkv.shape[1], qkv.shape[2] // 3)


def test_backend_choice_per_call_and_per_process(monkeypatch):
    cpu = torch.device("cpu")
    assert get_backend() == "auto" and resolve_backend("auto", cpu) == "torch"
    assert resolve_backend("naive", cpu) == "naive"
    with use_backend("naive"):
        assert resolve_backend("auto", cpu) == "naive"
        assert resolve_backend("torch", cpu) == "torch"  # a module's own choice wins
    assert get_backend() == "auto"
    set_backend("torch")
    try:
        assert resolve_backend("auto", cpu) == "torch"
    finally:
        set_backend("auto")
    with pytest.raises(ValueError, match="valid backends are auto, torch, triton, naive"):
        set_backend("cuda")
    assert BACKENDS == ("auto", "torch", "triton", "naive")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        resolve_backend("triton", cpu)


def test_environment_variable_sets_the_process_default():
    import subprocess
    import sys

    from linvit.ops._backend import _checked

    code = "import linvit.ops as o; print(o.get_backend())"
    env = {"LINVIT_BACKEND": "naive", "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "naive"
    with pytest.raises(ValueError, match="Unknown LINVIT_BACKEND 'fast'; valid backends are"):
        _checked("fast", "LINVIT_BACKEND")


@pytest.mark.parametrize("backend", ["naive", "torch", TRITON])
@pytest.mark.parametrize("name", ["focused", "focused_head_groups_ragged", "focused_windows_padded"])
def test_the_temperature_parameter_equals_its_inverse_given(backend, name):
    """temperature_scale=s (what FocusedLinearAttention passes: the fused kernels take 1 / softplus(s) as they load it
    and chain its gradient in their last sum) equals inverse_temperature=1 / softplus(s) on the naive reference, in
    value and every gradient, the gradient of s included; s spans -8 … 22 (past torch's threshold 20, where
    softplus(s) = s; far below 0 the features overflow fp32 in every backend: test_the_kernels_softplus_... covers
    that range)."""
    qkv, kwargs = _inputs(CASES[name])
    channels = qkv.shape[-1] // 3
    scale = torch.linspace(-8.0, 22.0, channels, dtype=torch.float64).requires_grad_(True)
    reference = {**kwargs, "inverse_temperature": 1.0 / torch.nn.functional.softplus(scale)}
    leaves = [value for value in kwargs.values() if isinstance(value, torch.Tensor) and value.requires_grad]
    leaves = [leaf for leaf in leaves if leaf is not kwargs["inverse_temperature"]]
    expected = linear_attention_qkv(qkv, backend="naive", **reference)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, [qkv, scale, *leaves], grad_out)
    device = TRITON_DEVICE if backend == "triton" else torch.device("cpu")
    given = {key: value for key, value in kwargs.items() if key != "inverse_temperature"}
    qkv32, given32 = _cast(qkv, {**given, "temperature_scale": scale}, torch.float32, device)
    out = linear_attention_qkv(qkv32, backend=backend, **given32)
    scale32 = given32["temperature_scale"]
    leaves32 = [given32[key] for key, value in kwargs.items() if any(value is leaf for leaf in leaves)]
    grads = torch.autograd.grad(out, [qkv32, scale32, *leaves32], grad_out.float().to(device))
    _assert_close(out.cpu(), expected, 2e-5)
    for got, want in zip(grads, expected_grads):
        _assert_close(got.cpu(), want, 5e-5)


if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl

    from linvit.ops.linear_attention.triton_tiles import softplus as kernel_softplus

    @triton.jit
    def _softplus_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, kernel_softplus(tl.load(x_ptr + offsets)))


@needs_triton
def test_the_kernels_softplus_is_torch_s_over_its_whole_range():
    """The kernels' softplus (`triton_tiles.softplus`) equals softplus in float64 within 4e-7 in fp32 from -80 to 100
    (below -87 eˣ is subnormal in fp32): log1p where log(1 + eˣ) would round to 0, and x itself above 20."""
    x = torch.linspace(-80.0, 100.0, 1024, device=TRITON_DEVICE)
    out = torch.empty_like(x)
    _softplus_kernel[(1,)](x, out, BLOCK=1024)
    expected = torch.nn.functional.softplus(x.double()).cpu()
    assert torch.all((out.double().cpu() - expected).abs() <= 4e-7 * expected)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"feature_map": "softmax"}, "Unknown feature_map"),
        ({"num_heads": 5}, "divisible by num_heads=5"),
        ({"hw": (5, 6)}, "N must be num_prefix_tokens"),
        ({"inverse_temperature": None}, "inverse_temperature"),
        ({"temperature_scale": torch.zeros(32)}, "not both"),
        ({"inverse_temperature": None, "temperature_scale": torch.zeros(1, 1, 32)}, r"temperature_scale must .* 32"),
        ({"key_position": torch.zeros(3, 32)}, "key_position must be"),
        ({"dwc_weight": torch.zeros(32, 1, 5, 5)}, "dwc_weight must be"),
        ({"key_mask": torch.ones(2, 7, dtype=torch.bool)}, "key_mask must be"),
        ({"window": (6, 7)}, "must fit the"),  # the map is 5 × 7
        ({"window": (2, 2)}, "no prefix tokens and no key_mask"),  # the case masks keys
        ({"window": (5, 1), "key_mask": None}, r"key_position must be \(5, 32\)"),  # one row per window token
    ],
)
def test_wrong_arguments_say_what_is_expected(change, match):
    qkv, kwargs = _inputs(CASES["focused"])
    with pytest.raises(ValueError, match=match):
        linear_attention_qkv(qkv, **{**kwargs, **change})


@needs_triton
@pytest.mark.slow
def test_custom_ops_pass_torch_opcheck():
    """Schema, fake-tensor shapes, autograd registration and AOT dispatch of the two Triton ops (~22 s through the
    interpreter: the slow tier, which CI runs; the ops' values and gradients are default-tier tests)."""
    import linvit.ops.linear_attention.triton  # noqa: F401  (registers the ops)

    qkv, kwargs = _inputs(CASES["focused"])
    qkv, kwargs = _cast(qkv, kwargs, torch.float32, TRITON_DEVICE)
    hw, heads = kwargs["hw"], kwargs["num_heads"]
    tensors = [kwargs[k] for k in ("inverse_temperature", "key_position", "dwc_weight", "dwc_bias", "key_mask")]
    options = [hw[0], hw[1], heads, 0, 3.0, 0, 1e-6, 1e-6, 0, 0, 0]  # the last: the temperature is its inverse
    forward = torch.ops.linvit.linear_attention_qkv_forward.default
    torch.library.opcheck(forward, (qkv, *tensors, *options, False))
    torch.library.opcheck(forward, (qkv.detach(), None, None, None, None, None, *options, False))
    scale = (1.0 / tensors[0].detach()).expm1().log().requires_grad_(True)  # softplus⁻¹(1 / inverse)
    torch.library.opcheck(forward, (qkv, scale, *tensors[1:], *options[:-1], 1, False))  # given as its parameter
    out, *partials = forward(qkv.detach(), *[t.detach() for t in tensors], *options, False)
    grad_out = torch.randn_like(out)
    backward = torch.ops.linvit.linear_attention_qkv_backward.default
    saved = [kwargs[k].detach() for k in ("inverse_temperature", "key_position", "dwc_weight", "key_mask")]
    for position_grad in (True, False):  # the table's gradient summed by the op, or left to the caller (windows)
        torch.library.opcheck(backward, (grad_out, qkv.detach(), *partials, *saved, *options, position_grad))


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [16, 64])
def test_custom_ops_pass_torch_opcheck_in_windows(head_dim):
    """The forward op in windows, read in place: the output keeps the map's layout, the fake partial states are per
    window, and at 2 × 64 (head groups) the fake per-token norms have the kernels' shape (~7 s each through the
    interpreter; the windows' values and gradients are default-tier tests)."""
    import linvit.ops.linear_attention.triton  # noqa: F401  (registers the ops)

    small_windows = _case("focused", (5, 6), 2, head_dim, kernel=3, window=(4, 4))  # 2 × 2 windows, padded
    qkv, kwargs = _cast(*_inputs(small_windows, batch=1), torch.float32, TRITON_DEVICE)
    hw, window = kwargs["hw"], kwargs["window"]
    tensors = [kwargs.get(k) for k in ("inverse_temperature", "key_position", "dwc_weight", "dwc_bias", "key_mask")]
    options = [hw[0], hw[1], kwargs["num_heads"], 0, 3.0, 0, 1e-6, 1e-6, *window, 0]
    torch.library.opcheck(torch.ops.linvit.linear_attention_qkv_forward.default, (qkv, *tensors, *options, False))


@needs_triton
def test_torch_export_keeps_the_fused_op():
    from linvit.attention import FocusedLinearAttention

    class Grid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = FocusedLinearAttention(32, 2, pos_size=(3, 4), backend="triton")

        def forward(self, x):
            return self.attention(x, (3, 4))

    module = Grid().to(TRITON_DEVICE)
    x = torch.randn(2, 12, 32, device=TRITON_DEVICE)
    program = torch.export.export(module, (x,))
    targets = [str(node.target) for node in program.graph.nodes]
    assert "linvit.linear_attention_qkv_forward.default" in targets
    torch.testing.assert_close(program.module()(x), module(x))


# the Triton case in the slow tier (14 s of the interpreter under Dynamo); the torch case stays in the default tier
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[needs_triton, pytest.mark.slow])])
def test_module_compiles_without_graph_breaks(backend):
    """Dynamo traces the module, the backend choice and the op in one graph (the Triton op is one node)."""
    from linvit.attention import FocusedLinearAttention

    device = TRITON_DEVICE if backend == "triton" else torch.device("cpu")
    module = FocusedLinearAttention(32, 2, window_size=4, backend=backend).to(device)
    x = torch.randn(2, 30, 32, device=device, requires_grad=True)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, (5, 6)), module(x, (5, 6)))
    compiled(x, (5, 6)).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("backend", ["naive", "torch", TRITON])
def test_key_masks_of_other_dtypes_give_the_same_result_or_a_clear_error(backend):
    """0/1 integer masks equal the bool mask on every backend (the fused kernels read mask bytes: an int32 mask was
    silently misread there before); a float mask is refused with the fix named."""
    qkv, kwargs = _inputs(CASES["focused"], dtype=torch.float32)
    device = TRITON_DEVICE if backend == "triton" else torch.device("cpu")
    qkv, kwargs = _cast(qkv, kwargs, torch.float32, device)
    mask = kwargs.pop("key_mask")
    with torch.no_grad():
        expected = linear_attention_qkv(qkv, key_mask=mask, backend=backend, **kwargs)
        for dtype in (torch.int32, torch.int64, torch.uint8):
            got = linear_attention_qkv(qkv, key_mask=mask.to(dtype), backend=backend, **kwargs)
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        with pytest.raises(TypeError, match="mask > 0.5"):
            linear_attention_qkv(qkv, key_mask=mask.float(), backend=backend, **kwargs)


@needs_triton
def test_two_batch_elements_share_a_program_only_where_they_share_a_positional_table():
    """The state and key-gradient kernels take two batch elements a program, reading each tile of the positional
    table once for both, exactly where that is the same table: one shared by the batch, an even batch, a whole map
    without class tokens; the key kernel only up to head dim 32 (its two states spill from 64). The paired kernels
    equal the naive reference in the cases above (`focused`, `relu`; `focused_head_dim_64` with its norms pass, the
    state kernel paired), the unpaired ones in the batched-position, class-token and window cases."""
    from linvit.ops.linear_attention.triton_geometry import KernelOptions, geometry
    from linvit.ops.linear_attention.triton_launch import forward_plan, paired_images
    from linvit.ops.linear_attention.triton_launch_backward import backward_plan

    whole = KernelOptions(8, 8, 2, 0, 3.0, 0, 1e-6, 1e-6)
    windows = KernelOptions(8, 8, 2, 0, 3.0, 0, 1e-6, 1e-6, 4, 4)
    shared, batched = torch.zeros(1, 64, 32), torch.zeros(4, 64, 32)
    assert paired_images(4, shared, geometry(4, 64, whole), 0) == 2
    assert paired_images(3, shared, geometry(3, 64, whole), 0) == 1  # odd batch
    assert paired_images(4, batched, geometry(4, 64, whole), 0) == 1  # a table per image
    assert paired_images(4, None, geometry(4, 64, whole), 0) == 1  # no table to share
    assert paired_images(4, shared, geometry(4, 65, whole), 1) == 1  # class tokens
    assert paired_images(4, torch.zeros(1, 16, 32), geometry(4, 64, windows), 0) == 1  # windows
    # the plans (meta tensors: 8 images of 4 heads on a 64² map sharing a table) launch them so: half the batch on
    # the grid's first axis
    for head_dim, key_images in ((32, 2), (64, 1)):
        meta = {"device": "meta"}
        qkv = torch.empty(8, 64 * 64, 3 * 4 * head_dim, dtype=torch.bfloat16, **meta)
        table, weight = torch.empty(1, 64 * 64, 4 * head_dim, **meta), torch.empty(head_dim, 1, 5, 5, **meta)
        options = KernelOptions(64, 64, 4, 0, 3.0, 0, 1e-6, 1e-6)
        forward, out, partials = forward_plan(qkv, None, table, weight, None, None, options, False, 132)
        backward, *_ = backward_plan(out, qkv, partials, None, table, weight, None, options, 132, position_grad=True)
        launched = {launch.name: launch for launch in forward + backward}
        assert launched["state"].constants["IMAGES"] == 2 and launched["state"].grid[0] == 4
        assert launched["key_value_grad"].constants["IMAGES"] == key_images
        assert launched["key_value_grad"].grid[0] == 8 // key_images


def test_the_exported_key_sum_reduces_the_keys_contiguous_axis():
    """ONNX Runtime's ReduceSum over the token axis of (B, N, h, m) took 9 ms a block at 1024² (26 ms in linvit_tiny);
    over the last axis of the product's own transposed keys (B, h, m, N), 0.4 ms."""
    pytest.importorskip("onnx", reason="the onnx extra (pip install 'linvit[onnx]')")
    from onnx import numpy_helper

    from linvit.ops.linear_attention.torch import linear_attention_tokens

    class Core(torch.nn.Module):
        def forward(self, q, k, v):
            return linear_attention_tokens(q, k, v)

    q, k, v = (torch.rand(1, 64, 2, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = torch.onnx.export(Core(), (q, k, v), dynamo=True, verbose=False).model_proto.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    sums = [node for node in graph.node if node.op_type == "ReduceSum"]
    assert sums, [node.op_type for node in graph.node]
    for node in sums:
        assert [int(a) for a in constants[node.input[1]].reshape(-1)] in ([-1], [3]), node
