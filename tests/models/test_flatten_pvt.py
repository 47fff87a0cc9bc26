"""FLatten-PVT (v1): sizes against the paper, the authors' checkpoints, any input size, the timm plumbing."""

from __future__ import annotations

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

import linvit.models.flatten_pvt
from linvit.utils import count_macs, count_params

# (params, MACs at 224) published in the FLatten paper (arXiv 2308.00442); M and L are unpublished
PUBLISHED = {
    "flatten_pvt_tiny": (12.2e6, 2.04e9),
    "flatten_pvt_small": (21.7e6, 4.03e9),
}
ALL_NAMES = ["flatten_pvt_tiny", "flatten_pvt_small", "flatten_pvt_medium", "flatten_pvt_large"]

SMALL = {"embed_dims": (16, 32, 48, 64), "depths": (1, 1, 2, 1), "num_heads": (1, 2, 3, 4), "mlp_ratios": (2, 2, 2, 2)}
SMALL_IMG = 64


def _small(**kwargs):
    return timm.create_model("flatten_pvt_tiny", **{**SMALL, "img_size": SMALL_IMG, **kwargs})


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


# ----------------------------------------------------------------------------------------------------------------
# The authors' model restated line by line (LeapLabTHU/FLatten-Transformer models/flatten_pvt.py), limited to the
# path their configs use (linear attention everywhere, no spatial reduction). Their key names, their math, and
# their final `norm`, which is built but never used.
# ----------------------------------------------------------------------------------------------------------------
class AuthorsMlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


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
        return x + self.mlp(self.norm2(x))


class AuthorsPatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = patch_size
        self.H = self.W = img_size // patch_size
        self.num_patches = self.H * self.W
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        B, C, H, W = x.shape
        x = self.norm(self.proj(x).flatten(2).transpose(1, 2))
        return x, (H // self.patch_size, W // self.patch_size)


class AuthorsPvt(nn.Module):
    def __init__(self, img_size, embed_dims, depths, num_heads, mlp_ratios, num_classes=1000):
        super().__init__()
        for i in range(4):
            patch_embed = AuthorsPatchEmbed(
                img_size if i == 0 else img_size // (2 ** (i + 1)),
                4 if i == 0 else 2,
                3 if i == 0 else embed_dims[i - 1],
                embed_dims[i],
            )
            setattr(self, f"patch_embed{i + 1}", patch_embed)
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, patch_embed.num_patches, embed_dims[i])))
            blocks = [
                AuthorsBlock(embed_dims[i], patch_embed.num_patches, num_heads[i], mlp_ratios[i])
                for _ in range(depths[i])
            ]
            setattr(self, f"block{i + 1}", nn.ModuleList(blocks))
        self.norm = nn.LayerNorm(embed_dims[3], eps=1e-6)  # never used in forward
        self.head = nn.Linear(embed_dims[3], num_classes)

    def _get_pos_embed(self, pos_embed, patch_embed, H, W):
        if self.patch_embed1.num_patches == H * W:
            return pos_embed
        grid = pos_embed.reshape(1, patch_embed.H, patch_embed.W, -1).permute(0, 3, 1, 2)
        return F.interpolate(grid, size=(H, W), mode="bilinear").reshape(1, -1, H * W).permute(0, 2, 1)

    def forward(self, x):
        B = x.shape[0]
        for i in range(4):
            patch_embed = getattr(self, f"patch_embed{i + 1}")
            x, (H, W) = patch_embed(x)
            x = x + self._get_pos_embed(getattr(self, f"pos_embed{i + 1}"), patch_embed, H, W)
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, H, W)
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


def _save_authors_file(path, model, cfg_class, ema=False):
    config = cfg_class(MODEL=cfg_class(TYPE="flatten_pvt_tiny", LA=cfg_class(PVT_LA_SR_RATIOS=1111)))
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": {"state": {}, "param_groups": [{"lr": 5e-4, "params": [0]}]},
        "lr_scheduler": {"last_epoch": 299},
        "max_accuracy": 77.8,
        "epoch": 299,
        "config": config,
    }
    torch.save(checkpoint, path)


# ----------------------------------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_NAMES)
def test_param_count_matches_paper(name):
    params = count_params(timm.create_model(name, device="meta"))
    if name in PUBLISHED:
        assert params == pytest.approx(PUBLISHED[name][0], rel=0.01)
    else:  # unpublished: at least larger than S
        assert params > PUBLISHED["flatten_pvt_small"][0]


# MACs counted as in tests/models/test_flatten_pvt_v2.py. Measured: T 2.037G, S 4.030G (M 7.04G, L 10.38G unpublished).
@pytest.mark.parametrize("name", ["flatten_pvt_tiny", pytest.param("flatten_pvt_small", marks=pytest.mark.slow)])
def test_macs_match_paper(name):
    assert count_macs(timm.create_model(name), (3, 224, 224)) == pytest.approx(PUBLISHED[name][1], rel=0.01)


# ----------------------------------------------------------------------------------------------------------------
# the authors' checkpoints
# ----------------------------------------------------------------------------------------------------------------
def test_authors_checkpoint_loads_through_timm_with_identical_outputs(tmp_path, fake_yacs):
    torch.manual_seed(0)
    reference = _randomize(AuthorsPvt(SMALL_IMG, num_classes=10, **SMALL)).eval()
    path = tmp_path / "flatten_pvt_small_cfg.pth"
    _save_authors_file(path, reference, fake_yacs)
    del sys.modules["yacs.config"]

    model = _small(num_classes=10, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).eval()
    assert not any(name.startswith("norm.") for name in model.state_dict())  # the unused norm is gone
    x = torch.randn(2, 3, SMALL_IMG, SMALL_IMG, dtype=torch.float64)
    with torch.no_grad():
        expected = reference.double()(x)
        actual = model.double()(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_authors_checkpoint_converts_to_another_resolution(tmp_path, fake_yacs):
    reference = _randomize(AuthorsPvt(SMALL_IMG, num_classes=10, **SMALL))
    path = tmp_path / "authors.pth"
    _save_authors_file(path, reference, fake_yacs)
    model = _small(num_classes=10, img_size=96, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    stage = model.stages[0]
    assert stage.pos_embed.shape == (1, 24 * 24, SMALL["embed_dims"][0])
    table = reference.pos_embed1.detach().reshape(1, 16, 16, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(table, size=(24, 24), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    torch.testing.assert_close(stage.pos_embed.detach(), expected)
    assert stage.blocks[0].attn.positional_encoding.shape == (1, 24 * 24, SMALL["embed_dims"][0])


def test_filter_accepts_converted_state_dicts():
    model = _small()
    converted = linvit.models.flatten_pvt.checkpoint_filter_fn(model.state_dict(), model)
    assert converted.keys() == model.state_dict().keys()


# ----------------------------------------------------------------------------------------------------------------
# any input size, features, intermediates, gradients
# ----------------------------------------------------------------------------------------------------------------
def test_full_size_tiny_runs_non_square_input():
    model = timm.create_model("flatten_pvt_tiny").eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 333, 517)).shape == (1, 1000)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_NAMES[1:])
def test_full_size_runs_non_square_input(name):
    model = timm.create_model(name).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 333, 517)).shape == (1, 1000)


def test_features_only_non_square_pads_every_pixel_in():
    model = timm.create_model("flatten_pvt_tiny", features_only=True, **{**SMALL, "img_size": SMALL_IMG}).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        features = model(torch.randn(1, 3, 333, 517))
    expected_hw = [(84, 130), (42, 65), (21, 33), (11, 17)]  # ceil: the padded input keeps the last rows/columns
    assert [tuple(f.shape) for f in features] == [(1, c, h, w) for c, (h, w) in zip(SMALL["embed_dims"], expected_hw)]


def test_forward_intermediates_consistent():
    model = _small().eval()
    x = torch.randn(2, 3, 70, 90)
    with torch.no_grad():
        final, taps = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        early = model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)
        torch.testing.assert_close(early[0], taps[1])
        model.prune_intermediate_layers(indices=[0, 2])
        pruned = model.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
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
        expected = model(x)
        model.set_input_size(96)
        actual = model(x)
    assert model.stages[0].pos_embed.shape[1] == 24 * 24
    assert model.stages[0].pos_embed.requires_grad
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_timm_api():
    assert_classifier_api(_small(num_classes=7), SMALL["embed_dims"][-1], "flatten_pvt_tiny")


def test_torchscript_matches_eager():
    assert_torchscript_matches_eager(_randomize(_small()).eval(), torch.randn(1, 3, 60, 90))


def test_fx_feature_extraction_matches_eager():
    assert_fx_feature_extraction_matches_eager(_randomize(_small()).eval(), torch.randn(1, 3, 60, 90))
