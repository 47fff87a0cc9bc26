"""WindowAttention, GlobalAttention and HybridAttention against naive, loop-based softmax attention."""

import math

import pytest
import torch

from linvit.attention import FocusedLinearAttention, GlobalAttention, HybridAttention, WindowAttention


def _randomise(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)
    return module


def _tokens(batch, hw, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, hw[0] * hw[1], channels, generator=generator, dtype=torch.float64)


def swin_region_labels(padded_hw, window, shift):
    """Swin's construction of the shift mask: label the slices of the rolled map, one id per region."""
    labels = torch.zeros(padded_hw, dtype=torch.long)
    h_slices = [slice(0, padded_hw[0] - window[0]), slice(padded_hw[0] - window[0], padded_hw[0] - shift[0])]
    w_slices = [slice(0, padded_hw[1] - window[1]), slice(padded_hw[1] - window[1], padded_hw[1] - shift[1])]
    if shift[0]:
        h_slices.append(slice(padded_hw[0] - shift[0], padded_hw[0]))
    if shift[1]:
        w_slices.append(slice(padded_hw[1] - shift[1], padded_hw[1]))
    count = 0
    for hs in h_slices:
        for ws in w_slices:
            labels[hs, ws] = count
            count += 1
    return labels


def reference_window_attention(module, x, hw):
    """Per window, per query token, an explicit softmax over the keys it may see (same window, same shift region,
    real token), with Swin's relative position bias looked up from the offsets."""
    height, width = hw
    batch, _, channels = x.shape
    heads, head_dim = module.num_heads, channels // module.num_heads
    full_h, full_w = module.window_size
    wh, ww = min(full_h, height), min(full_w, width)
    sh = module.shift_size[0] if height > full_h else 0
    sw = module.shift_size[1] if width > full_w else 0
    padded = (math.ceil(height / wh) * wh, math.ceil(width / ww) * ww)
    qkv = module.qkv(x).reshape(batch, height, width, 3, heads, head_dim)
    # Positions of the rolled, padded map: rolled (r, c) shows original ((r + sh) % Hp, (c + sw) % Wp).
    labels = swin_region_labels(padded, (wh, ww), (sh, sw))
    out = torch.zeros(batch, height, width, heads, head_dim, dtype=x.dtype)
    for top in range(0, padded[0], wh):
        for left in range(0, padded[1], ww):
            cells = [(top + i, left + j) for i in range(wh) for j in range(ww)]
            real = [
                (r, c, (r + sh) % padded[0], (c + sw) % padded[1])
                for r, c in cells
                if (r + sh) % padded[0] < height and (c + sw) % padded[1] < width
            ]
            for qr, qc, oqr, oqc in real:
                keys = [(kr, kc, okr, okc) for kr, kc, okr, okc in real if labels[kr, kc] == labels[qr, qc]]
                q = qkv[:, oqr, oqc, 0]  # (B, heads, d)
                k = torch.stack([qkv[:, okr, okc, 1] for _, _, okr, okc in keys], dim=2)  # (B, heads, n, d)
                v = torch.stack([qkv[:, okr, okc, 2] for _, _, okr, okc in keys], dim=2)
                bias_index = [
                    (qr - kr + full_h - 1) * (2 * full_w - 1) + (qc - kc + full_w - 1) for kr, kc, _, _ in keys
                ]
                bias = module.relative_position_bias_table[bias_index].t()  # (heads, n)
                scores = (q.unsqueeze(2) * k).sum(-1) / math.sqrt(head_dim) + bias
                out[:, oqr, oqc] = (torch.softmax(scores, dim=-1).unsqueeze(-1) * v).sum(2)
    return module.proj(out.reshape(batch, height * width, channels))


@pytest.mark.parametrize(
    "hw,window,shift",
    [
        ((8, 8), 4, 0),
        ((8, 8), 4, 2),
        ((9, 7), 4, 2),  # padded, shifted
        ((10, 5), (4, 3), (2, 1)),  # non-square window
        ((3, 9), 4, 2),  # clamped in H (no shift there), shifted and padded in W
        ((3, 3), 7, 3),  # map smaller than the window: one window, no shift
    ],
)
def test_window_attention_equals_naive_reference(hw, window, shift):
    module = _randomise(WindowAttention(16, 2, window_size=window, shift_size=shift, dtype=torch.float64)).eval()
    x = _tokens(2, hw, 16)
    torch.testing.assert_close(module(x, hw), reference_window_attention(module, x, hw), rtol=1e-10, atol=1e-10)


def test_window_attention_float32():
    module = _randomise(WindowAttention(16, 2, window_size=4, shift_size=2)).eval()
    x = _tokens(1, (9, 7), 16).float()
    torch.testing.assert_close(module(x, (9, 7)), reference_window_attention(module, x, (9, 7)), rtol=1e-5, atol=1e-5)


def test_window_attention_gradients_and_cached_masks_follow_the_table():
    """Shifted, padded windows in training: gradients reach the bias table (and x) as in the reference; the cached
    size-derived masks do not freeze the bias, which changes with the table."""
    from linvit.ops.window_masks import shifted_window_mask

    module = _randomise(WindowAttention(16, 2, window_size=4, shift_size=2, dtype=torch.float64)).train()
    hw = (9, 7)
    x = _tokens(2, hw, 16).requires_grad_(True)
    grads = []
    for forward in (module, lambda t, size: reference_window_attention(module, t, size)):
        module.zero_grad()
        x.grad = None
        forward(x, hw).square().sum().backward()
        grads.append((module.relative_position_bias_table.grad.clone(), x.grad.clone()))
    for fast, slow in zip(*grads):
        torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        module.relative_position_bias_table.mul_(-2.0)
        torch.testing.assert_close(module(x, hw), reference_window_attention(module, x, hw), rtol=1e-10, atol=1e-10)
    cached = shifted_window_mask(hw, (12, 8), (4, 4), (2, 2), x.device)
    assert cached is shifted_window_mask(hw, (12, 8), (4, 4), (2, 2), x.device)
    torch.testing.assert_close(cached, shifted_window_mask(hw, (12, 8), (4, 4), (2, 2), x.device, cached=False))
    assert shifted_window_mask((8, 8), (8, 8), (4, 4), (0, 0), x.device) is None


def test_window_attention_state_dict():
    module = WindowAttention(96, 3, window_size=7)
    state = module.state_dict()
    assert set(state) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "relative_position_bias_table"}
    assert state["relative_position_bias_table"].shape == (169, 3)
    assert module.relative_position_index.shape == (49, 49)


def test_window_attention_errors():
    with pytest.raises(ValueError, match="shift"):
        WindowAttention(16, 2, window_size=4, shift_size=4)
    with pytest.raises(ValueError, match="divisible"):
        WindowAttention(18, 4)
    with pytest.raises(ValueError, match="H \\* W"):
        WindowAttention(16, 2)(torch.randn(1, 10, 16), (3, 4))


def test_global_attention_equals_naive_softmax():
    module = _randomise(GlobalAttention(16, 4, dtype=torch.float64)).eval()
    x = _tokens(2, (3, 5), 16)
    q, k, v = module.qkv(x).reshape(2, 15, 3, 4, 4).permute(2, 0, 3, 1, 4)
    attn = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    expected = module.proj((attn @ v).transpose(1, 2).reshape(2, 15, 16))
    torch.testing.assert_close(module(x, (3, 5)), expected, rtol=1e-10, atol=1e-10)


def test_hybrid_is_window_softmax_plus_global_linear():
    hybrid = _randomise(HybridAttention(16, 2, window_size=4, shift_size=2, dtype=torch.float64)).eval()
    window = WindowAttention(16, 2, window_size=4, shift_size=2, dtype=torch.float64)
    linear = FocusedLinearAttention(16, 2, pos_encoding="none", dtype=torch.float64)
    with torch.no_grad():
        for branch in (window, linear):
            branch.qkv.weight.copy_(hybrid.qkv.weight)
            branch.qkv.bias.copy_(hybrid.qkv.bias)
            branch.proj.weight.copy_(torch.eye(16, dtype=torch.float64))
            branch.proj.bias.zero_()
        window.relative_position_bias_table.copy_(hybrid.local_attn.relative_position_bias_table)
        linear.scale.copy_(hybrid.global_attn.scale)
        linear.dwc.load_state_dict(hybrid.global_attn.dwc.state_dict())
    hw = (9, 6)
    x = _tokens(2, hw, 16)
    expected = hybrid.proj(window(x, hw) + linear(x, hw))
    torch.testing.assert_close(hybrid(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_hybrid_inference_leaves_shared_qkv_intact():
    hybrid = _randomise(HybridAttention(16, 2, window_size=4, dtype=torch.float64)).eval()
    x = _tokens(1, (6, 5), 16)
    with torch.no_grad():
        inference = hybrid(x, (6, 5))
    torch.testing.assert_close(inference, hybrid(x, (6, 5)), rtol=1e-12, atol=1e-12)


# --- the gathers, the SDPA mask layout and the caches behind the fast path ---

LAYOUTS = [((8, 8), (4, 4), (0, 0)), ((9, 7), (4, 4), (2, 2)), ((10, 5), (4, 3), (2, 1)), ((3, 9), (3, 4), (0, 2))]


@pytest.mark.parametrize("hw,window,shift", LAYOUTS)
def test_window_gathers_equal_pad_roll_partition_and_back(hw, window, shift):
    """One gather in equals pad + roll + partition on every real position; the gather back is its exact inverse."""
    from linvit.ops.windows import (
        pad_grid,
        padded_grid_size,
        window_partition,
        window_position_index,
        window_token_index,
    )

    x = torch.randn(2, hw[0] * hw[1], 5)
    padded = padded_grid_size(hw, window)
    grid = pad_grid(x.view(2, *hw, 5), padded[0] - hw[0], padded[1] - hw[1])
    expected = window_partition(torch.roll(grid, (-shift[0], -shift[1]), (1, 2)), window)  # (B * nW, n, 5)
    real = pad_grid(torch.ones(1, *hw, 1), padded[0] - hw[0], padded[1] - hw[1])
    real = window_partition(torch.roll(real, (-shift[0], -shift[1]), (1, 2)), window).reshape(-1).bool()

    windows = x.index_select(1, window_token_index(hw, window, shift, x.device))
    assert windows.shape == (2, expected.shape[0] // 2 * expected.shape[1], 5)
    assert torch.equal(windows.reshape(2, -1, 5)[:, real], expected.reshape(2, -1, 5)[:, real])
    back = windows.index_select(1, window_position_index(hw, window, shift, x.device))
    assert torch.equal(back, x)


def test_window_sdpa_mask_has_the_layout_fused_kernels_read():
    """The mask reaches SDPA in q's dtype with rows aligned to 8 elements and a unit last stride (the
    memory-efficient CUDA kernel copies anything else; cuDNN reads it as declared), and equals bias + mask."""
    from linvit.attention.window import relative_position_bias
    from linvit.ops.window_masks import shifted_window_mask, window_attention_mask, window_mask_layout

    module = _randomise(WindowAttention(16, 2, window_size=7, shift_size=3))
    table, index = module.relative_position_bias_table, module.relative_position_index
    bias = relative_position_bias(table, index, (7, 7), (7, 7))  # (heads, 49, 49)
    for hw, shift, dtype in (((14, 14), (0, 0), torch.bfloat16), ((16, 13), (3, 3), torch.float32)):
        bias_index, mask = window_mask_layout(hw, (7, 7), shift, (7, 7), index, 2, dtype)
        attn_mask = window_attention_mask(table, bias_index, mask, 3, dtype)
        assert attn_mask.dtype == dtype and attn_mask.stride(-1) == 1
        assert all(stride % 8 == 0 for stride in attn_mask.stride()[:-1]), attn_mask.stride()
        if mask is None:
            assert attn_mask.shape == (1, 2, 49, 49)
            torch.testing.assert_close(attn_mask[0], bias.to(dtype))
        else:
            windows = shifted_window_mask(hw, (21, 14), (7, 7), shift, table.device)  # (nW, 1, 49, 49)
            expected = (bias + windows).repeat(3, 1, 1, 1)  # batch-major windows
            assert attn_mask.shape == expected.shape == (3 * 6, 2, 49, 49)
            torch.testing.assert_close(attn_mask, expected)


def test_window_layouts_are_cached_per_size_device_and_dtype():
    from linvit.ops.window_masks import window_mask_layout
    from linvit.ops.windows import window_layout

    cpu = torch.device("cpu")
    first = window_layout((9, 7), (4, 4), (2, 2), cpu)
    assert all(a is b for a, b in zip(first, window_layout((9, 7), (4, 4), (2, 2), cpu)))
    assert window_layout((9, 8), (4, 4), (2, 2), cpu)[0] is not first[0]
    index = WindowAttention(16, 2, window_size=4).relative_position_index
    fp32 = window_mask_layout((9, 7), (4, 4), (2, 2), (4, 4), index, 2, torch.float32)
    assert fp32[1] is window_mask_layout((9, 7), (4, 4), (2, 2), (4, 4), index, 2, torch.float32)[1]
    bf16 = window_mask_layout((9, 7), (4, 4), (2, 2), (4, 4), index, 2, torch.bfloat16)
    assert fp32[1].dtype == torch.float32 and bf16[1].dtype == torch.bfloat16


def test_window_attention_under_bf16_autocast_follows_fp32():
    module = _randomise(WindowAttention(32, 2, window_size=4, shift_size=2)).eval()
    x = _tokens(2, (9, 7), 32).float()
    with torch.no_grad():
        expected = module(x, (9, 7))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x, (9, 7))
    assert out.dtype == torch.bfloat16
    # bf16 rounding of q, k, v and the bias (outputs reach ~9 here): about 0.6% of the norm, as before the gathers
    assert (out.float() - expected).norm() / expected.norm() < 0.02


def test_window_attention_gradients_repeat_exactly():
    """Same input, same gradients bit for bit: padded positions (copies of edge tokens) add exact zeros."""
    module = _randomise(WindowAttention(16, 2, window_size=4, shift_size=2)).train()
    x = _tokens(2, (9, 7), 16).float().requires_grad_(True)
    grads = []
    for _ in range(2):
        x.grad = None
        module.zero_grad()
        module(x, (9, 7)).square().sum().backward()
        grads.append((x.grad.clone(), module.relative_position_bias_table.grad.clone(), module.qkv.weight.grad.clone()))
    for first, second in zip(*grads):
        assert torch.equal(first, second)


def test_window_attention_compiles_without_graph_breaks_and_keeps_gradients():
    import torch._dynamo

    module = _randomise(WindowAttention(16, 2, window_size=4, shift_size=2)).train()
    x = _tokens(2, (9, 7), 16).float().requires_grad_(True)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(module)(x, (9, 7))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="aot_eager")
    results = []
    for forward in (compiled, module):
        x.grad = None
        module.zero_grad()
        out = forward(x, (9, 7))
        out.square().sum().backward()
        results.append((out.detach(), x.grad.clone(), module.relative_position_bias_table.grad.clone()))
    for fast, slow in zip(*results):
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # inductor's C++ code generation: about 15 s on 2 cores
@pytest.mark.parametrize("hw", [(16, 16), (20, 12)], ids=["whole_windows", "padded"])
def test_shifted_windows_compile_with_inductor(hw):
    """The shifted windows' gather indices are built in the graph and compiled by inductor (its C++ code on the
    CPU): with ``torch.remainder`` in the merge's index inductor misread its value range and failed
    (``AssertionError: (VR[-int_oo, oo], VR[-int_oo, -1])``, linvit_tiny at 512² under `torch.compile`)."""
    import torch._dynamo

    module = _randomise(WindowAttention(32, 2, window_size=8, shift_size=4)).eval()
    x = _tokens(1, hw, 32).float()
    torch._dynamo.reset()
    compiled = torch.compile(module)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, hw), module(x, hw), rtol=1e-5, atol=1e-6)


def test_layouts_first_built_in_inference_mode_serve_training():
    """The size caches outlive the call that filled them: built under torch.inference_mode(), they must still be
    usable (and saved for backward) by a later training call."""
    module = _randomise(WindowAttention(16, 2, window_size=3, shift_size=1)).train()
    hw = (7, 5)  # sizes no other test uses, so this test fills the caches
    with torch.inference_mode():
        module(_tokens(1, hw, 16).float(), hw)
    x = _tokens(2, hw, 16).float().requires_grad_(True)
    module(x, hw).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_fake_tensor_runs_leave_no_fake_entries_in_the_size_caches():
    """A dry run on fake tensors (`linvit models`, memory estimates) must not turn later real outputs fake."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    module = WindowAttention(16, 2, window_size=4, shift_size=2).eval()
    hw = (6, 11)  # shifted and padded (sizes no other test uses): every cached index and mask is built here
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = module(torch.empty(1, 66, 16), hw)
    assert isinstance(fake, FakeTensor)
    with torch.no_grad():
        real = module(torch.randn(1, 66, 16), hw)
    assert not isinstance(real, FakeTensor) and torch.isfinite(real).all()
