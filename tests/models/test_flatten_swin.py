"""FLatten-Swin: published sizes, the authors' checkpoints, any input size, timm API details.

Heavy checks use a tiny configuration built through the same registered names (keyword overrides), so the
code path is the one users take.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

import linvit.models  # noqa: F401  (registers the models)
from linvit.io import UntrustedCheckpointError
from linvit.models.flatten_swin import FlattenSwin
from linvit.utils import count_macs, count_params

# name: (params, MACs) of the paper's table (arXiv 2308.00442, Table 2 / the authors' README)
PUBLISHED = {
    "flatten_swin_tiny_patch4_224": (29.2e6, 4.48e9),
    "flatten_swin_small_patch4_224": (50.5e6, 8.73e9),
    "flatten_swin_base_patch4_224": (89.0e6, 15.4e9),
    "flatten_swin_base_patch4_384": (91.4e6, 46.4e9),
}

# A small FLatten-Swin: linear stages 1-2 (one global window each at 128), shifted 4x4 windows in stage 3, a
# clamped window in stage 4. Same structure as the published models, a thousandth of the compute.
TINY = {
    "img_size": 128,
    "embed_dim": 16,
    "depths": (2, 2, 2, 2),
    "num_heads": (2, 2, 4, 4),
    "linear_window_size": 32,
    "window_size": 4,
    "num_classes": 10,
}
NAME = "flatten_swin_tiny_patch4_224"


# ------------------------------------------------------------------------------------------------------------------
# published sizes
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_paper(name):
    model = timm.create_model(name, device="meta")
    assert count_params(model) == pytest.approx(PUBLISHED[name][0], rel=0.01)


def _explicit_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    attn = (q * (q.shape[-1] ** -0.5 if scale is None else scale)) @ k.transpose(-2, -1)
    if attn_mask is not None:
        attn = attn + attn_mask
    return attn.softmax(-1) @ v


def _mathematical_macs(name, monkeypatch):
    """MACs as the paper counts them: every product of the mathematical definition, through linvit's counter.

    `count_macs` (PyTorch's flop counter) counts linears, convolutions and matmuls; window softmax attention is run
    through explicit matmuls here so that the count does not depend on which fused attention kernel PyTorch picks.
    The linear attention's products are per-head batched matmuls, counted as they are.
    """
    monkeypatch.setattr(F, "scaled_dot_product_attention", _explicit_sdpa)
    model = timm.create_model(name)
    return count_macs(model, model.pretrained_cfg["input_size"])


@pytest.mark.parametrize(
    "name",
    [
        "flatten_swin_tiny_patch4_224",
        pytest.param("flatten_swin_small_patch4_224", marks=pytest.mark.slow),
        pytest.param("flatten_swin_base_patch4_224", marks=pytest.mark.slow),
        pytest.param("flatten_swin_base_patch4_384", marks=pytest.mark.slow),
    ],
)
def test_macs_match_paper(name, monkeypatch):
    assert _mathematical_macs(name, monkeypatch) == pytest.approx(PUBLISHED[name][1], rel=0.01)


# ------------------------------------------------------------------------------------------------------------------
# A line-by-line restatement of the authors' FLatten-Swin (their key names, their math, their layout with patch
# merging at the END of a stage, their fixed square resolution). Slow and obviously faithful: the reference.
# ------------------------------------------------------------------------------------------------------------------
def _ref_window_partition(x, w):
    B, H, W, C = x.shape
    return x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, w, w, C)


def _ref_window_reverse(windows, w, H, W):
    B = windows.shape[0] // ((H // w) * (W // w))
    x = windows.view(B, H // w, W // w, w, w, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, H, W, -1)


class RefMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class RefWindowAttention(nn.Module):
    def __init__(self, dim, window, heads):
        super().__init__()
        self.window, self.heads = window, heads
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("relative_position_index", rel[..., 0] * (2 * window - 1) + rel[..., 1])
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (C // self.heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = (attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)).view(
                -1, self.heads, N, N
            )
        attn = attn.softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


class RefFocusedLinearAttention(nn.Module):
    def __init__(self, dim, window, heads, focusing_factor=3, kernel_size=5):
        super().__init__()
        self.heads, self.focusing_factor = heads, focusing_factor
        head_dim = dim // heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, groups=head_dim, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, window * window, dim))

    def forward(self, x, mask=None):  # the shift mask is ignored, as in the authors' code
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, C).permute(2, 0, 1, 3).unbind(0)
        k = k + self.positional_encoding
        q, k = F.relu(q) + 1e-6, F.relu(k) + 1e-6
        scale = F.softplus(self.scale)
        q, k = q / scale, k / scale
        q_norm, k_norm = q.norm(dim=-1, keepdim=True), k.norm(dim=-1, keepdim=True)
        q, k = q**self.focusing_factor, k**self.focusing_factor
        q = (q / q.norm(dim=-1, keepdim=True)) * q_norm
        k = (k / k.norm(dim=-1, keepdim=True)) * k_norm
        q, k, v = (t.reshape(B, N, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (N**-0.5)) @ (v * (N**-0.5))
        x = q @ kv * z
        H = W = int(N**0.5)
        x = x.transpose(1, 2).reshape(B, N, C)
        v = v.reshape(B * self.heads, H, W, -1).permute(0, 3, 1, 2)
        x = x + self.dwc(v).reshape(B, C, N).permute(0, 2, 1)
        return self.proj(x)


class RefBlock(nn.Module):
    def __init__(self, dim, res, heads, window, shift, attn_type):
        super().__init__()
        self.res, self.window, self.shift = res, window, shift
        if res <= window:
            self.shift, self.window = 0, res
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if attn_type == "L":
            self.attn = RefFocusedLinearAttention(dim, self.window, heads)
        else:
            self.attn = RefWindowAttention(dim, self.window, heads)
        self.mlp = RefMlp(dim, 4 * dim)
        attn_mask = None
        if self.shift > 0:
            img = torch.zeros(1, res, res, 1)
            w, s = self.window, self.shift
            cnt = 0
            for h in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                for ww in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                    img[:, h, ww, :] = cnt
                    cnt += 1
            mw = _ref_window_partition(img, w).view(-1, w * w)
            attn_mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H = W = self.res
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift > 0:
            x = torch.roll(x, (-self.shift, -self.shift), (1, 2))
        windows = _ref_window_partition(x, self.window).view(-1, self.window * self.window, C)
        windows = self.attn(windows, mask=self.attn_mask)
        x = _ref_window_reverse(windows.view(-1, self.window, self.window, C), self.window, H, W)
        if self.shift > 0:
            x = torch.roll(x, (self.shift, self.shift), (1, 2))
        x = shortcut + x.reshape(B, L, C)
        return x + self.mlp(self.norm2(x))


class RefPatchMerging(nn.Module):
    def __init__(self, res, dim):
        super().__init__()
        self.res = res
        self.reduction, self.norm = nn.Linear(4 * dim, 2 * dim, bias=False), nn.LayerNorm(4 * dim)

    def forward(self, x):
        B, L, C = x.shape
        x = x.view(B, self.res, self.res, C)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x.view(B, -1, 4 * C)))


class RefLayer(nn.Module):
    def __init__(self, dim, res, depth, heads, window, attn_type, downsample):
        super().__init__()
        self.blocks = nn.ModuleList(
            [RefBlock(dim, res, heads, window, 0 if i % 2 == 0 else window // 2, attn_type) for i in range(depth)]
        )
        self.downsample = RefPatchMerging(res, dim) if downsample else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class RefPatchEmbed(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj, self.norm = nn.Conv2d(3, dim, 4, 4), nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class RefFLattenSwin(nn.Module):
    def __init__(self, img_size, embed_dim, depths, num_heads, linear_window, window, num_classes, types="LLSS"):
        super().__init__()
        self.patch_embed = RefPatchEmbed(embed_dim)
        res = img_size // 4
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            self.layers.append(
                RefLayer(
                    embed_dim * 2**i,
                    res // 2**i,
                    depth,
                    num_heads[i],
                    linear_window if types[i] == "L" else window,
                    types[i],
                    downsample=i < len(depths) - 1,
                )
            )
        self.norm = nn.LayerNorm(embed_dim * 2 ** (len(depths) - 1))
        self.head = nn.Linear(embed_dim * 2 ** (len(depths) - 1), num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(1))


def _randomize(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(noise * (0.5 if "norm" in name else 0.2) + (1.0 if name.endswith("norm1.weight") else 0.0))


def _reference():
    ref = RefFLattenSwin(128, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10).eval()
    _randomize(ref)
    return ref


class _CfgNode(dict):
    """Stands in for yacs's CfgNode (the authors pickle their config in every checkpoint)."""


_CfgNode.__module__, _CfgNode.__qualname__ = "yacs.config", "CfgNode"


def _save_authors_checkpoint(path, ref, monkeypatch):
    module = types.ModuleType("yacs.config")
    module.CfgNode = _CfgNode
    monkeypatch.setitem(sys.modules, "yacs", types.ModuleType("yacs"))
    monkeypatch.setitem(sys.modules, "yacs.config", module)
    state = ref.state_dict()
    torch.save(
        {
            "model": state,
            "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]},
            "lr_scheduler": {"last_epoch": 299},
            "max_accuracy": 82.1,
            "epoch": 299,
            "config": _CfgNode(MODEL=_CfgNode(TYPE="flatten_swin", LA=_CfgNode(ATTN_TYPE="LLSS"))),
            "state_dict_ema": {k: torch.zeros_like(v) for k, v in state.items()},
        },
        path,
    )
    assert "attn_mask" in "".join(state) and "relative_position_index" in "".join(state)
    assert any(k.startswith("layers.0.downsample.") for k in state)  # the authors' layout


def test_authors_checkpoint_loads_through_timm_and_matches_reference(tmp_path, monkeypatch):
    ref = _reference()
    path = tmp_path / "flatten_swin_t.pth"
    _save_authors_checkpoint(path, ref, monkeypatch)
    model = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **TINY).eval()
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        expected = ref(x)
        actual = model(x)
    assert expected.abs().max() > 0.1  # a meaningful comparison, not two near-zero outputs
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_authors_checkpoint_at_another_resolution_and_window(tmp_path, monkeypatch):
    ref = _reference()
    path = tmp_path / "flatten_swin_t.pth"
    _save_authors_checkpoint(path, ref, monkeypatch)
    # 128 weights into a 160 model with softmax window 5: stage-2 positional encodings (16x16 -> 20x20) and the
    # bias tables (7x7 -> 9x9) are resized; stage 1 keeps its 32x32 table (a 40x40 map is windowed).
    kwargs = dict(TINY, img_size=160, window_size=5)
    model = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kwargs).eval()
    stage2 = model.layers[1].blocks[0].attn
    assert stage2.positional_encoding.shape == (1, 400, 32)
    source = ref.layers[1].blocks[0].attn.positional_encoding.detach()
    grid = source.reshape(1, 16, 16, 32).permute(0, 3, 1, 2)
    resized = F.interpolate(grid, size=(20, 20), mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(stage2.positional_encoding.detach(), resized.reshape(1, 400, 32))
    assert model.layers[2].blocks[0].attn.relative_position_bias_table.shape == (81, 4)
    torch.testing.assert_close(model.layers[0].blocks[1].attn.qkv.weight, ref.layers[0].blocks[1].attn.qkv.weight)
    with torch.no_grad():
        out = model(torch.randn(1, 3, 160, 160))
    assert out.shape == (1, 10) and torch.isfinite(out).all()


def test_malicious_checkpoint_is_refused_through_timm(tmp_path):
    ran = []

    class Payload:
        def __reduce__(self):
            return (ran.append, ("ran",))

    path = tmp_path / "evil.pth"
    torch.save({"model": {"x": torch.zeros(1)}, "config": Payload()}, path)
    with pytest.raises(UntrustedCheckpointError, match="trusted=True"):
        timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **TINY)
    assert ran == []


def test_classifier_of_another_size_is_left_initialised(tmp_path, monkeypatch):
    ref = _reference()
    path = tmp_path / "flatten_swin_t.pth"
    _save_authors_checkpoint(path, ref, monkeypatch)
    kwargs = dict(TINY, num_classes=3)
    model = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kwargs)
    assert model.head.weight.shape == (3, 128)
    torch.testing.assert_close(model.norm.weight, ref.norm.weight)


# ------------------------------------------------------------------------------------------------------------------
# any input size, features, intermediates
# ------------------------------------------------------------------------------------------------------------------
def _tiny(**overrides):
    torch.manual_seed(0)
    return timm.create_model(NAME, **dict(TINY, **overrides)).eval()


def test_odd_non_square_input_classifies_and_extracts_features():
    model = _tiny()
    x = torch.randn(1, 3, 333, 517)
    with torch.no_grad():
        assert model(x).shape == (1, 10)
    features = timm.create_model(NAME, features_only=True, **TINY).eval()
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        maps = features(x)
    sizes = [(84, 130), (42, 65), (21, 33), (11, 17)]
    assert [tuple(m.shape) for m in maps] == [(1, 16 * 2**i, *sizes[i]) for i in range(4)]


def test_forward_intermediates_agree_with_features_and_forward_features():
    model = _tiny()
    x = torch.randn(1, 3, 100, 140)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        assert [t.shape[1] for t in intermediates] == [16, 32, 64, 128]
        early = model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)
        torch.testing.assert_close(early[0], intermediates[1])
        normed = model.forward_intermediates(x, indices=1, norm=True, intermediates_only=True)
        torch.testing.assert_close(normed[0], final)
        model.prune_intermediate_layers(indices=[0, 1])
        pruned = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    assert len(model.layers) == 2
    for a, b in zip(pruned, intermediates[:2]):
        torch.testing.assert_close(a, b)


def test_larger_runtime_maps_use_padded_linear_windows():
    model = _tiny()  # tables for 128: 32x32 in stage 1, 16x16 in stage 2
    attn = model.layers[0].blocks[0].attn
    assert attn.window_size == (32, 32) and attn.pos_size == (32, 32)
    with torch.no_grad():
        out = model.forward_features(torch.randn(1, 3, 200, 136))  # stage 1: 50x34 -> 2x2 padded windows
    assert out.shape == (1, 128, 7, 5) and torch.isfinite(out).all()


def test_set_input_size_resizes_tables_and_keeps_requires_grad():
    model = _tiny()
    model.layers[0].blocks[0].attn.positional_encoding.requires_grad_(False)
    model.set_input_size(img_size=(96, 64))
    first = model.layers[0].blocks[0].attn
    assert first.positional_encoding.shape == (1, 24 * 16, 16) and first.pos_size == (24, 16)
    assert not first.positional_encoding.requires_grad
    assert model.layers[1].blocks[0].attn.positional_encoding.shape == (1, 12 * 8, 32)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 96, 64)).shape == (1, 10)


def test_img_size_at_creation_sets_linear_tables():
    model = timm.create_model(NAME, device="meta", **dict(TINY, img_size=(64, 256)))
    assert model.layers[0].blocks[0].attn.pos_size == (16, 32)  # 16x64 map, clamped to the 32 window
    assert model.layers[1].blocks[0].attn.pos_size == (8, 32)
    big = timm.create_model("flatten_swin_base_patch4_384", device="meta")
    assert big.layers[0].blocks[0].attn.positional_encoding.shape == (1, 96 * 96, 128)
    assert big.layers[1].blocks[0].attn.positional_encoding.shape == (1, 48 * 48, 256)
    assert big.layers[3].blocks[0].attn.relative_position_bias_table.shape == (23 * 23, 32)


# ------------------------------------------------------------------------------------------------------------------
# timm API
# ------------------------------------------------------------------------------------------------------------------
def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError):
        timm.create_model(NAME, device="meta", not_an_argument=1)


def test_default_cfg_and_api():
    model = timm.create_model(NAME, device="meta")
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (3, 224, 224) and cfg["pool_size"] == (7, 7)
    assert cfg["paper_ids"] == "arXiv:2308.00442" and cfg["classifier"] == "head"
    assert model.num_features == model.head_hidden_size == 768
    assert [f["reduction"] for f in model.feature_info] == [4, 8, 16, 32]
    names = [n for n, _ in model.named_parameters()]
    import fnmatch

    for pattern in model.no_weight_decay():
        assert any(fnmatch.fnmatch(n, pattern) for n in names), pattern
    model.reset_classifier(5)
    assert model.get_classifier().out_features == 5 and model.get_classifier().weight.device.type == "meta"


def test_grad_checkpointing_keeps_outputs_and_every_parameter_gets_a_gradient():
    model = _tiny(drop_path_rate=0.0)
    x = torch.randn(2, 3, 72, 88)
    with torch.no_grad():
        expected = model(x)
    model.set_grad_checkpointing(True)
    model.train()
    out = model(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_global_pool_off_returns_maps():
    model = _tiny(global_pool="")
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 96))
    assert out.shape == (1, 10, 2, 3)


def test_torchscript_and_fx():
    from timm.layers import create_feature_extractor

    model = _tiny()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        expected = model(x)
        scripted = torch.jit.script(model)
        torch.testing.assert_close(scripted(x), expected)
    extractor = create_feature_extractor(model, return_nodes=["layers.3", "layers.1"])  # timm's tracer settings
    with torch.no_grad():
        out = extractor(x)
        taps = model.forward_intermediates(x, indices=[1, 3], intermediates_only=True)
    torch.testing.assert_close(out["layers.1"], taps[0])
    torch.testing.assert_close(out["layers.3"], taps[1])


def test_meta_device_build_has_no_real_storage():
    model = timm.create_model("flatten_swin_base_patch4_384", device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    assert math.isclose(count_params(model), 91.43e6, rel_tol=0.001)


def test_direct_class_rejects_inconsistent_stage_lists():
    with pytest.raises(ValueError, match="one entry per stage"):
        FlattenSwin(depths=(2, 2), num_heads=(1, 2, 3), attn_layers=("focused", "window"), device="meta")


def test_bf16_autocast_stays_finite_at_large_activations():
    model = _tiny()
    x = torch.randn(1, 3, 96, 128) * 16  # large activations: the cubed kernel features overflow half precision
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert torch.isfinite(out).all()
