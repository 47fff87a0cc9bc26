"""FLatten-PVTv2: sizes against the paper, the authors' checkpoints, any input size, the timm plumbing."""

from __future__ import annotations

import math
import sys
import types

import pytest
import timm
import torch
import torch.nn.functional as F
from _flatten_testing import (
    assert_classifier_api,
    assert_every_parameter_gets_a_gradient,
    assert_fx_feature_extraction_matches_eager,
    assert_grad_checkpointing_keeps_outputs,
    assert_torchscript_matches_eager,
)
from torch import nn

import linvit.models.flatten_pvt_v2  # noqa: F401  (registers the models)
from linvit.utils import count_macs, count_params

# (params, MACs at 224) published in the FLatten paper (arXiv 2308.00442, table of PVT results); B3/B4 are unpublished
PUBLISHED = {
    "flatten_pvt_v2_b0": (3.6e6, 0.58e9),
    "flatten_pvt_v2_b1": (12.9e6, 2.22e9),
    "flatten_pvt_v2_b2": (22.6e6, 4.25e9),
}
ALL_NAMES = [f"flatten_pvt_v2_b{i}" for i in range(5)]

# A small configuration of the same classes for the heavy checks.
SMALL = {"embed_dims": (16, 32, 48, 64), "depths": (1, 1, 2, 1), "num_heads": (1, 2, 3, 4), "mlp_ratios": (2, 2, 2, 2)}
SMALL_IMG = 64


def _small(**kwargs):
    return timm.create_model("flatten_pvt_v2_b0", **{**SMALL, "img_size": SMALL_IMG, **kwargs})


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


# ----------------------------------------------------------------------------------------------------------------
# The authors' model restated line by line (LeapLabTHU/FLatten-Transformer models/flatten_pvt_v2.py), limited to
# the path their configs use (linear attention in every stage, no spatial reduction). Their key names and math.
# ----------------------------------------------------------------------------------------------------------------
class AuthorsDWConv(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, bias=True, groups=dim)

    def forward(self, x, H, W):
        B, N, C = x.shape
        x = x.transpose(1, 2).view(B, C, H, W)
        return self.dwconv(x).flatten(2).transpose(1, 2)


class AuthorsMlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.dwconv = AuthorsDWConv(hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x, H, W):
        return self.fc2(self.act(self.dwconv(self.fc1(x), H, W)))


class AuthorsFocusedLinearAttention(nn.Module):
    def __init__(self, dim, num_patches, num_heads, focusing_factor=3, kernel_size=5):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=True)
        self.kv = nn.Linear(dim, dim * 2, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.focusing_factor = focusing_factor
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, groups=head_dim, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, num_patches, dim))

    def forward(self, x, H, W):
        B, N, C = x.shape
        q = self.q(x)
        kv = self.kv(x).reshape(B, -1, 2, C).permute(2, 0, 1, 3)
        k, v = kv[0], kv[1]
        n = k.shape[1]
        k = k + self.positional_encoding
        scale = nn.Softplus()(self.scale)
        q = nn.ReLU()(q) + 1e-6
        k = nn.ReLU()(k) + 1e-6
        q = q / scale
        k = k / scale
        q_norm = q.norm(dim=-1, keepdim=True)
        k_norm = k.norm(dim=-1, keepdim=True)
        q = q**self.focusing_factor
        k = k**self.focusing_factor
        q = (q / q.norm(dim=-1, keepdim=True)) * q_norm
        k = (k / k.norm(dim=-1, keepdim=True)) * k_norm
        q = q.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(B, n, self.num_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, n, self.num_heads, -1).permute(0, 2, 1, 3)
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (n**-0.5)) @ (v * (n**-0.5))
        x = q @ kv * z
        x = x.transpose(1, 2).reshape(B, N, C)
        v = v.reshape(B * self.num_heads, H, W, -1).permute(0, 3, 1, 2)
        x = x + self.dwc(v).reshape(B, C, N).permute(0, 2, 1)
        return self.proj(x)


class AuthorsBlock(nn.Module):
    def __init__(self, dim, num_patches, num_heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = AuthorsFocusedLinearAttention(dim, num_patches, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = AuthorsMlp(dim, int(dim * mlp_ratio))

    def forward(self, x, H, W):
        x = x + self.attn(self.norm1(x), H, W)
        return x + self.mlp(self.norm2(x), H, W)


class AuthorsOverlapPatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, stride, in_chans, embed_dim):
        super().__init__()
        self.num_patches = (img_size // stride) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        x = self.proj(x)
        _, _, H, W = x.shape
        return self.norm(x.flatten(2).transpose(1, 2)), H, W


class AuthorsPvtV2(nn.Module):
    def __init__(self, img_size, embed_dims, depths, num_heads, mlp_ratios, num_classes=1000):
        super().__init__()
        for i in range(4):
            patch_embed = AuthorsOverlapPatchEmbed(
                img_size if i == 0 else img_size // (2 ** (i + 1)),
                7 if i == 0 else 3,
                4 if i == 0 else 2,
                3 if i == 0 else embed_dims[i - 1],
                embed_dims[i],
            )
            block = nn.ModuleList(
                [
                    AuthorsBlock(embed_dims[i], patch_embed.num_patches, num_heads[i], mlp_ratios[i])
                    for _ in range(depths[i])
                ]
            )
            setattr(self, f"patch_embed{i + 1}", patch_embed)
            setattr(self, f"block{i + 1}", block)
            setattr(self, f"norm{i + 1}", nn.LayerNorm(embed_dims[i], eps=1e-6))
        self.head = nn.Linear(embed_dims[3], num_classes)

    def forward(self, x):
        B = x.shape[0]
        for i in range(4):
            x, H, W = getattr(self, f"patch_embed{i + 1}")(x)
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, H, W)
            x = getattr(self, f"norm{i + 1}")(x)
            if i != 3:
                x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        return self.head(x.mean(dim=1))


@pytest.fixture
def fake_yacs(monkeypatch):
    """`yacs.config.CfgNode` stand-in, so the saved file pickles a config object as the authors' files do."""

    class CfgNode(dict):
        pass

    CfgNode.__module__ = "yacs.config"
    CfgNode.__qualname__ = "CfgNode"
    package, module = types.ModuleType("yacs"), types.ModuleType("yacs.config")
    module.CfgNode = CfgNode
    package.config = module
    monkeypatch.setitem(sys.modules, "yacs", package)
    monkeypatch.setitem(sys.modules, "yacs.config", module)
    return CfgNode


def _save_authors_file(path, model, cfg_class):
    config = cfg_class(MODEL=cfg_class(TYPE="flatten_pvt_v2_b0", LA=cfg_class(PVT_LA_SR_RATIOS=1111)))
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": {"state": {}, "param_groups": [{"lr": 5e-4, "params": [0]}]},
            "lr_scheduler": {"last_epoch": 299},
            "max_accuracy": 71.1,
            "epoch": 299,
            "config": config,
        },
        path,
    )


# ----------------------------------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_NAMES)
def test_param_count_matches_paper(name):
    model = timm.create_model(name, device="meta")
    params = count_params(model)
    if name in PUBLISHED:
        assert params == pytest.approx(PUBLISHED[name][0], rel=0.01)
    else:  # unpublished: at least ordered by depth
        assert params > PUBLISHED["flatten_pvt_v2_b2"][0]


# MACs: torch's flop counter (linvit.utils.count_macs) counts matrix products and convolutions: the linear layers,
# the focused linear attention's per-head k v^T, S^T q and z^T q products, the depthwise convolutions; elementwise
# work (kernel map, GELU, norms) is not counted, as in the paper's fvcore-style table. Measured: B0 0.580G, B1 2.219G,
# B2 4.251G (B3 7.28G, B4 10.68G unpublished).
@pytest.mark.parametrize(
    "name",
    [
        "flatten_pvt_v2_b0",
        pytest.param("flatten_pvt_v2_b1", marks=pytest.mark.slow),
        pytest.param("flatten_pvt_v2_b2", marks=pytest.mark.slow),
    ],
)
def test_macs_match_paper(name):
    model = timm.create_model(name)
    assert count_macs(model, (3, 224, 224)) == pytest.approx(PUBLISHED[name][1], rel=0.01)


# ----------------------------------------------------------------------------------------------------------------
# the authors' checkpoints
# ----------------------------------------------------------------------------------------------------------------
def test_authors_checkpoint_loads_through_timm_with_identical_outputs(tmp_path, fake_yacs):
    torch.manual_seed(0)
    reference = _randomize(AuthorsPvtV2(SMALL_IMG, num_classes=10, **SMALL)).eval()
    path = tmp_path / "flatten_pvt_v2_small.pth"
    _save_authors_file(path, reference, fake_yacs)
    del sys.modules["yacs.config"]  # loading must not need the config class

    model = _small(num_classes=10, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).eval()
    x = torch.randn(2, 3, SMALL_IMG, SMALL_IMG, dtype=torch.float64)
    with torch.no_grad():
        expected = reference.double()(x)
        actual = model.double()(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_authors_checkpoint_converts_to_another_resolution(tmp_path, fake_yacs):
    reference = _randomize(AuthorsPvtV2(SMALL_IMG, num_classes=10, **SMALL))
    path = tmp_path / "authors.pth"
    _save_authors_file(path, reference, fake_yacs)
    model = _small(num_classes=10, img_size=96, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    attn = model.stages[0].blocks[0].attn
    assert attn.positional_encoding.shape == (1, 24 * 24, SMALL["embed_dims"][0])
    # the resized table is the authors' table resampled bicubically
    table = reference.block1[0].attn.positional_encoding.detach().reshape(1, 16, 16, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(table, size=(24, 24), mode="bicubic", align_corners=False).flatten(2).transpose(1, 2)
    torch.testing.assert_close(attn.positional_encoding.detach(), expected)


def test_filter_takes_the_whole_authors_file_dict():
    reference = _randomize(AuthorsPvtV2(SMALL_IMG, num_classes=10, **SMALL))
    model = _small(num_classes=10)
    checkpoint = {"model": reference.state_dict(), "optimizer": {"state": {}}, "epoch": 3, "config": {"TAG": "x"}}
    converted = linvit.models.flatten_pvt_v2.checkpoint_filter_fn(checkpoint, model)
    model.load_state_dict(converted, strict=True)
    fused = model.stages[1].blocks[0].attn.qkv.weight
    q, kv = reference.block2[0].attn.q.weight, reference.block2[0].attn.kv.weight
    torch.testing.assert_close(fused, torch.cat([q, kv]))


def test_filter_accepts_converted_state_dicts():
    model = _small()
    converted = linvit.models.flatten_pvt_v2.checkpoint_filter_fn(model.state_dict(), model)
    assert converted.keys() == model.state_dict().keys()


# ----------------------------------------------------------------------------------------------------------------
# any input size, features, intermediates, gradients
# ----------------------------------------------------------------------------------------------------------------
def test_full_size_b0_runs_non_square_input():
    model = timm.create_model("flatten_pvt_v2_b0").eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 333, 517)).shape == (1, 1000)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_NAMES[1:])
def test_full_size_runs_non_square_input(name):
    model = timm.create_model(name).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 333, 517)).shape == (1, 1000)


def test_features_only_non_square():
    model = timm.create_model("flatten_pvt_v2_b0", features_only=True, **dict(SMALL, img_size=SMALL_IMG)).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        features = model(torch.randn(1, 3, 333, 517))
    expected_hw = [(84, 130), (42, 65), (21, 33), (11, 17)]
    assert [tuple(f.shape) for f in features] == [(1, c, h, w) for c, (h, w) in zip(SMALL["embed_dims"], expected_hw)]


def test_forward_intermediates_consistent():
    model = _small().eval()
    x = torch.randn(2, 3, 70, 90)
    with torch.no_grad():
        final, taps = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        early = model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)
        torch.testing.assert_close(early[0], taps[1])
        assert [t.shape[1] for t in taps] == list(SMALL["embed_dims"])
        model.prune_intermediate_layers(indices=[0, 2])
        pruned = model.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
    assert len(model.stages) == 3
    torch.testing.assert_close(pruned[0], taps[0])
    torch.testing.assert_close(pruned[1], taps[2])


def test_every_parameter_gets_a_gradient():
    assert_every_parameter_gets_a_gradient(_small(num_classes=5, drop_path_rate=0.1), torch.randn(2, 3, 50, 70))


def test_grad_checkpointing_keeps_outputs():
    assert_grad_checkpointing_keeps_outputs(_randomize(_small()).eval(), torch.randn(1, 3, 64, 80))


def test_set_input_size_resizes_tables_and_keeps_outputs():
    model = _randomize(_small()).eval()
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        expected = model(x)  # tables resized on the fly
        model.set_input_size(96)
        actual = model(x)  # tables resized once
    assert model.stages[0].blocks[0].attn.positional_encoding.shape[1] == 24 * 24
    assert model.stages[0].blocks[0].attn.positional_encoding.requires_grad
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_timm_api():
    model = _small(num_classes=7)
    pooled = model.forward_head(model.forward_features(torch.randn(1, 3, 64, 64)), pre_logits=True)
    assert pooled.shape == (1, SMALL["embed_dims"][-1])
    assert_classifier_api(model, SMALL["embed_dims"][-1], "flatten_pvt_v2_b0")
    assert len(timm.models.group_parameters(model, model.group_matcher(coarse=True))) > 2


def test_meta_device_and_dtype():
    model = timm.create_model("flatten_pvt_v2_b0", device="meta", dtype=torch.bfloat16)
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in model.parameters())


def test_torchscript_matches_eager():
    assert_torchscript_matches_eager(_randomize(_small()).eval(), torch.randn(1, 3, 64, 96))


def test_head_dims_are_those_of_the_paper():
    model = timm.create_model("flatten_pvt_v2_b1", device="meta")
    dims = [stage.blocks[0].attn.dwc.weight.shape[0] for stage in model.stages]
    assert dims == [64, 64, 64, 64]
    assert math.prod(model.stages[0].blocks[0].attn.positional_encoding.shape) == 56 * 56 * 64


def test_fx_feature_extraction_matches_eager():
    assert_fx_feature_extraction_matches_eager(_randomize(_small()).eval(), torch.randn(1, 3, 60, 90))
