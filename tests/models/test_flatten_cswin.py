"""FLatten-CSwin: sizes against the paper, the authors' checkpoints, stripes at any size, the timm plumbing."""

from __future__ import annotations

import sys
import types

import pytest
import timm
import torch
from _flatten_testing import (
    assert_classifier_api,
    assert_every_parameter_gets_a_gradient,
    assert_fx_feature_extraction_matches_eager,
    assert_grad_checkpointing_keeps_outputs,
    assert_torchscript_matches_eager,
)
from torch import nn

import linvit.models.flatten_cswin
from linvit.attention import stripe_attention_reference
from linvit.models.flatten_cswin import LePEAttention
from linvit.utils import count_macs, count_params

NAMES = ["flatten_cswin_tiny_224", "flatten_cswin_small_224", "flatten_cswin_base_224", "flatten_cswin_base_384"]
# published in the FLatten paper (arXiv 2308.00442) for the tiny model only
PUBLISHED_TINY = (21.2e6, 4.32e9)

# A small configuration of the same classes: stage 3 keeps two stripe branches (map 4, stripe 2), stage 4 one.
SMALL = {"embed_dim": 16, "depths": (1, 1, 2, 1), "num_heads": (1, 2, 4, 8), "split_size": (1, 2, 2, 2)}
SMALL_IMG = 64


def _small(**kwargs):
    return timm.create_model("flatten_cswin_tiny_224", **{**SMALL, "img_size": SMALL_IMG, **kwargs})


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


# ----------------------------------------------------------------------------------------------------------------
# The authors' model restated line by line (LeapLabTHU/FLatten-Transformer models/flatten_cswin.py, after CSWin),
# square inputs at the training size only, as theirs. Their key names and their math.
# ----------------------------------------------------------------------------------------------------------------
def img2windows(img, H_sp, W_sp):
    B, C, H, W = img.shape
    img_reshape = img.view(B, C, H // H_sp, H_sp, W // W_sp, W_sp)
    return img_reshape.permute(0, 2, 4, 3, 5, 1).contiguous().reshape(-1, H_sp * W_sp, C)


def windows2img(img_splits_hw, H_sp, W_sp, H, W):
    B = int(img_splits_hw.shape[0] / (H * W / H_sp / W_sp))
    img = img_splits_hw.view(B, H // H_sp, W // W_sp, H_sp, W_sp, -1)
    return img.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


def _stripe(resolution, idx, split_size):
    if idx == -1:
        return resolution, resolution
    if idx == 0:
        return resolution, split_size
    return split_size, resolution


class AuthorsLePEAttention(nn.Module):
    def __init__(self, dim, resolution, idx, split_size, num_heads):
        super().__init__()
        self.resolution = resolution
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.H_sp, self.W_sp = _stripe(resolution, idx, split_size)
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    def im2cswin(self, x):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        x = img2windows(x, self.H_sp, self.W_sp)
        return x.reshape(-1, self.H_sp * self.W_sp, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)

    def get_lepe(self, x, func):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        x = x.view(B, C, H // self.H_sp, self.H_sp, W // self.W_sp, self.W_sp)
        x = x.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(-1, C, self.H_sp, self.W_sp)
        lepe = func(x)
        lepe = lepe.reshape(-1, self.num_heads, C // self.num_heads, self.H_sp * self.W_sp).permute(0, 1, 3, 2)
        x = x.reshape(-1, self.num_heads, C // self.num_heads, self.H_sp * self.W_sp).permute(0, 1, 3, 2)
        return x, lepe

    def forward(self, qkv):
        q, k, v = qkv[0], qkv[1], qkv[2]
        H = W = self.resolution
        B, L, C = q.shape
        q = self.im2cswin(q)
        k = self.im2cswin(k)
        v, lepe = self.get_lepe(v, self.get_v)
        q = q * self.scale
        attn = nn.functional.softmax(q @ k.transpose(-2, -1), dim=-1, dtype=q.dtype)
        x = (attn @ v) + lepe
        x = x.transpose(1, 2).reshape(-1, self.H_sp * self.W_sp, C)
        return windows2img(x, self.H_sp, self.W_sp, H, W).view(B, -1, C)


class AuthorsFocusedLinearAttention(nn.Module):
    def __init__(self, dim, resolution, idx, split_size, num_heads, focusing_factor=3, kernel_size=5):
        super().__init__()
        self.resolution = resolution
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.H_sp, self.W_sp = _stripe(resolution, idx, split_size)
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)
        self.focusing_factor = focusing_factor
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, groups=head_dim, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.H_sp * self.W_sp, dim))

    def im2cswin(self, x):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        return img2windows(x, self.H_sp, self.W_sp)

    def get_lepe(self, x, func):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        x = x.view(B, C, H // self.H_sp, self.H_sp, W // self.W_sp, self.W_sp)
        x = x.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(-1, C, self.H_sp, self.W_sp)
        lepe = func(x)
        lepe = lepe.reshape(-1, C, self.H_sp * self.W_sp).permute(0, 2, 1).contiguous()
        x = x.reshape(-1, C, self.H_sp * self.W_sp).permute(0, 2, 1).contiguous()
        return x, lepe

    def forward(self, qkv):
        q, k, v = qkv[0], qkv[1], qkv[2]
        H = W = self.resolution
        B, L, C = q.shape
        q = self.im2cswin(q)
        k = self.im2cswin(k)
        v, lepe = self.get_lepe(v, self.get_v)
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
        q = q.reshape(B, L, self.num_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(B, L, self.num_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, L, self.num_heads, -1).permute(0, 2, 1, 3)
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (L**-0.5)) @ (v * (L**-0.5))
        x = q @ kv * z
        x = x.transpose(1, 2).reshape(B, L, C)
        v = v.reshape(B * self.num_heads, self.H_sp, self.W_sp, -1).permute(0, 3, 1, 2)
        x = x + self.dwc(v).reshape(B, C, L).permute(0, 2, 1) + lepe
        return windows2img(x, self.H_sp, self.W_sp, H, W).view(B, -1, C)


class AuthorsCSWinBlock(nn.Module):
    def __init__(self, dim, reso, num_heads, split_size, attn_type, last_stage=False):
        super().__init__()
        self.patches_resolution = reso
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.norm1 = nn.LayerNorm(dim)
        if self.patches_resolution == split_size:
            last_stage = True
        self.branch_num = 1 if last_stage else 2
        self.proj = nn.Linear(dim, dim)
        cls = AuthorsFocusedLinearAttention if attn_type == "L" else AuthorsLePEAttention
        if last_stage:
            self.attns = nn.ModuleList([cls(dim, reso, -1, split_size, num_heads)])
        else:
            self.attns = nn.ModuleList([cls(dim // 2, reso, i, split_size, num_heads // 2) for i in range(2)])
        self.mlp = nn.Sequential()
        self.mlp.fc1 = nn.Linear(dim, dim * 4)
        self.mlp.act = nn.GELU()
        self.mlp.fc2 = nn.Linear(dim * 4, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x):
        B, L, C = x.shape
        img = self.norm1(x)
        qkv = self.qkv(img).reshape(B, -1, 3, C).permute(2, 0, 1, 3)
        if self.branch_num == 2:
            x1 = self.attns[0](qkv[:, :, :, : C // 2])
            x2 = self.attns[1](qkv[:, :, :, C // 2 :])
            attened_x = torch.cat([x1, x2], dim=2)
        else:
            attened_x = self.attns[0](qkv)
        x = x + self.proj(attened_x)
        return x + self.mlp(self.norm2(x))


class AuthorsMergeBlock(nn.Module):
    def __init__(self, dim, dim_out):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, 2, 1)
        self.norm = nn.LayerNorm(dim_out)

    def forward(self, x):
        B, new_HW, C = x.shape
        H = W = int(new_HW**0.5)
        x = self.conv(x.transpose(-2, -1).contiguous().view(B, C, H, W))
        B, C = x.shape[:2]
        return self.norm(x.view(B, C, -1).transpose(-2, -1).contiguous())


class Flatten2Tokens(nn.Module):  # their einops Rearrange('b c h w -> b (h w) c')
    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


class AuthorsCSWin(nn.Module):
    def __init__(self, img_size, embed_dim, depths, num_heads, split_size, attn_type="LLSS", num_classes=1000):
        super().__init__()
        la_split_size = [img_size // 4, img_size // 8, img_size // 16, img_size // 32]  # their "56-28-14-7" at 224
        self.stage1_conv_embed = nn.Sequential(
            nn.Conv2d(3, embed_dim, 7, 4, 2), Flatten2Tokens(), nn.LayerNorm(embed_dim)
        )
        dim = embed_dim
        for s in range(4):
            if s > 0:
                setattr(self, f"merge{s}", AuthorsMergeBlock(dim, dim * 2))
                dim *= 2
            split = la_split_size[s] if attn_type[s] == "L" else split_size[s]
            blocks = [
                AuthorsCSWinBlock(dim, img_size // 2 ** (s + 2), num_heads[s], split, attn_type[s], last_stage=s == 3)
                for _ in range(depths[s])
            ]
            setattr(self, f"stage{s + 1}", nn.ModuleList(blocks))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stage1_conv_embed(x)
        for blk in self.stage1:
            x = blk(x)
        for pre, blocks in zip([self.merge1, self.merge2, self.merge3], [self.stage2, self.stage3, self.stage4]):
            x = pre(x)
            for blk in blocks:
                x = blk(x)
        return self.head(torch.mean(self.norm(x), dim=1))


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
    config = cfg_class(MODEL=cfg_class(TYPE="FLatten_CSWin_64_24181_tiny_224", LA=cfg_class(ATTN_TYPE="LLSS")))
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": {"state": {}, "param_groups": [{"lr": 5e-4, "params": [0]}]},
            "lr_scheduler": {"last_epoch": 299},
            "max_accuracy": 83.1,
            "epoch": 299,
            "config": config,
        },
        path,
    )


# ----------------------------------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_param_counts(name):
    params = count_params(timm.create_model(name, device="meta"))
    if name == "flatten_cswin_tiny_224":
        assert params == pytest.approx(PUBLISHED_TINY[0], rel=0.01)
    else:  # unpublished in the FLatten paper's table: only ordered by size
        assert params > PUBLISHED_TINY[0]


@pytest.mark.slow
def test_macs_tiny_match_paper():
    """MACs counted as in test_flatten_pvt_v2.py; the stripe softmax is written out so its matmuls are counted."""
    macs = count_macs(timm.create_model("flatten_cswin_tiny_224"), (3, 224, 224))
    assert macs == pytest.approx(PUBLISHED_TINY[1], rel=0.01)


def test_structure_follows_the_authors():
    model = timm.create_model("flatten_cswin_tiny_224", device="meta")
    stage1_attn = model.stages[0].blocks[0].attns
    assert len(stage1_attn) == 1 and stage1_attn[0].focused.positional_encoding.shape == (1, 56 * 56, 64)
    assert stage1_attn[0].focused.dwc.weight.shape == (32, 1, 5, 5)
    assert stage1_attn[0].get_v.weight.shape == (64, 1, 3, 3)
    stage3_attn = model.stages[2].blocks[0].attns
    assert [branch.direction for branch in stage3_attn] == ["vertical", "horizontal"]
    assert stage3_attn[0].split_size == 7 and stage3_attn[0].get_v.weight.shape == (128, 1, 3, 3)
    assert [branch.direction for branch in model.stages[3].blocks[0].attns] == ["full"]
    model384 = timm.create_model("flatten_cswin_base_384", device="meta")
    assert model384.stages[1].blocks[0].attns[0].focused.positional_encoding.shape == (1, 48 * 48, 192)
    assert model384.stages[2].blocks[0].attns[0].split_size == 12


# ----------------------------------------------------------------------------------------------------------------
# the authors' checkpoints
# ----------------------------------------------------------------------------------------------------------------
def test_authors_checkpoint_loads_through_timm_with_identical_outputs(tmp_path, fake_yacs):
    reference = _randomize(AuthorsCSWin(SMALL_IMG, num_classes=10, **SMALL)).eval()
    path = tmp_path / "flatten_cswin_small_cfg.pth"
    _save_authors_file(path, reference, fake_yacs)
    del sys.modules["yacs.config"]

    model = _small(num_classes=10, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).eval()
    x = torch.randn(2, 3, SMALL_IMG, SMALL_IMG, dtype=torch.float64)
    with torch.no_grad():
        expected = reference.double()(x)
        actual = model.double()(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_authors_checkpoint_converts_to_another_resolution(tmp_path, fake_yacs):
    reference = _randomize(AuthorsCSWin(SMALL_IMG, num_classes=10, **SMALL))
    path = tmp_path / "authors.pth"
    _save_authors_file(path, reference, fake_yacs)
    model = _small(num_classes=10, img_size=96, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    assert model.stages[0].blocks[0].attns[0].focused.positional_encoding.shape == (1, 24 * 24, 16)
    assert model.stages[1].blocks[0].attns[0].focused.positional_encoding.shape == (1, 12 * 12, 32)
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 96, 96))).all()


def test_filter_accepts_converted_state_dicts():
    model = _small()
    converted = linvit.models.flatten_cswin.checkpoint_filter_fn(model.state_dict(), model)
    assert converted.keys() == model.state_dict().keys()


# ----------------------------------------------------------------------------------------------------------------
# stripes at any size: padding + key masking equals attending within the cut-off stripe (the package's reference)
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["vertical", "horizontal", "full"])
@pytest.mark.parametrize("hw", [(6, 9), (7, 7), (2, 3)])
def test_stripe_attention_pads_and_masks_exactly(direction, hw):
    torch.manual_seed(0)
    attn = _randomize(LePEAttention(8, 2, split_size=4, direction=direction)).double()
    qkv = torch.randn(2, hw[0] * hw[1], 24, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(qkv, hw), stripe_attention_reference(attn, qkv, hw))


# ----------------------------------------------------------------------------------------------------------------
# any input size, features, intermediates, gradients, timm plumbing
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_full_size_runs_non_square_input(name):
    model = timm.create_model(name).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 333, 517)).shape == (1, 1000)


def test_small_runs_non_square_input_and_features_only():
    model = _small().eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 333, 517)).shape == (1, 1000)
    features_model = timm.create_model(
        "flatten_cswin_tiny_224", features_only=True, **{**SMALL, "img_size": SMALL_IMG}
    ).eval()
    assert features_model.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        features = features_model(torch.randn(1, 3, 333, 517))
    expected_hw = [(83, 129), (42, 65), (21, 33), (11, 17)]
    assert [tuple(f.shape) for f in features] == [(1, 16 * 2**i, h, w) for i, (h, w) in enumerate(expected_hw)]


def test_forward_intermediates_consistent():
    model = _small().eval()
    x = torch.randn(2, 3, 70, 90)
    with torch.no_grad():
        final, taps = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        normed = model.forward_intermediates(x, indices=[3], norm=True, intermediates_only=True)
        torch.testing.assert_close(normed[0], final)
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
    table = model.stages[0].blocks[0].attns[0].focused.positional_encoding
    assert table.shape[1] == 24 * 24 and table.requires_grad
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_timm_api():
    assert_classifier_api(_small(num_classes=7), 128, "flatten_cswin_tiny_224")


def test_torchscript_matches_eager():
    assert_torchscript_matches_eager(_randomize(_small()).eval(), torch.randn(1, 3, 60, 90))


def test_fx_feature_extraction_matches_eager():
    assert_fx_feature_extraction_matches_eager(_randomize(_small()).eval(), torch.randn(1, 3, 60, 90))


def test_smallest_input_is_3x3_and_smaller_ones_name_the_minimum():
    model = _small(num_classes=4).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 3, 3)).shape == (1, 4)  # the 7x7/4 stem (padding 2) gives one token
        assert model.forward_intermediates(torch.randn(1, 3, 3, 5), intermediates_only=True)[-1].shape[-2:] == (1, 1)
    for entry in (model, model.forward_features, model.forward_intermediates):
        with pytest.raises(ValueError, match=r"FlattenCSwin needs images of at least 3x3 \(H x W\), got 2x8"):
            entry(torch.randn(1, 3, 2, 8))
    with pytest.raises(ValueError, match="in_chans=1"):
        model.forward_intermediates(torch.randn(1, 1, 32, 32))
