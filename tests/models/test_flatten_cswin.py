"""FLatten-CSwin: sizes against the paper, the authors' checkpoints, stripes at any size, the timm plumbing."""

from __future__ import annotations

import sys

import pytest
import timm
import torch
from _authors_cswin import AuthorsCSWin
from _flatten_testing import (
    assert_classifier_api,
    assert_every_parameter_gets_a_gradient,
    assert_fx_feature_extraction_matches_eager,
    assert_grad_checkpointing_keeps_outputs,
    assert_same_outputs,
    assert_torchscript_matches_eager,
    randomize,
    save_authors_checkpoint,
)

import linvit.models.flatten_cswin
from linvit.attention import FocusedLinearLePEAttention, stripe_attention_reference
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


def _save_authors_file(path, model, cfg_class):
    config = cfg_class(MODEL=cfg_class(TYPE="FLatten_CSWin_64_24181_tiny_224", LA=cfg_class(ATTN_TYPE="LLSS")))
    save_authors_checkpoint(path, model, config, max_accuracy=83.1)


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
def _authors_model(img_size, **kwargs):
    return randomize(AuthorsCSWin(img_size, num_classes=10, **{**SMALL, **kwargs})).eval()


def _load(reference, path, cfg_class, img_size, **kwargs):
    _save_authors_file(path, reference, cfg_class)
    overlay = {"file": str(path)}
    return _small(num_classes=10, img_size=img_size, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs).eval()


# SMALL is native at 64 (maps 16, 8, 4, 2). At 32 stage 3's map is its 2-wide stripe: the authors' block there has
# one branch over the map, which linvit's two stripe branches equal (their LePE split in halves); at 128 stage 3
# has four stripes per branch.
@pytest.mark.parametrize("img_size", [32, 64, 128])
def test_authors_checkpoint_matches_their_model_at_and_around_its_size(img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size)
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size)
    assert_same_outputs(model, reference, img_size)


def test_loads_the_authors_whole_file_without_its_config_class(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG)
    path = tmp_path / "flatten_cswin_small_cfg.pth"
    _save_authors_file(path, reference, fake_yacs)
    del sys.modules["yacs.config"]
    model = _small(num_classes=10, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).eval()
    assert_same_outputs(model, reference, SMALL_IMG, batch=1)


# ----------------------------------------------------------------------------------------------------------------
# stripe linear attention: the authors' la_split_size (e.g. 56-28-14-7 at 448)
# ----------------------------------------------------------------------------------------------------------------
# Stripes (8, 4) in the linear stages: the maps at 32 (8, 4: one branch each), at 64 two branches of 16x8 / 8x16 and
# 8x4 / 4x8 (their 56-28 at 448), at 128 four stripes per branch.
SPLITS = (8, 4, 2, 1)
STRIPED = {"num_heads": (2, 2, 4, 8)}  # two branches take half the heads each


@pytest.mark.parametrize("img_size", [32, 64, 128])
def test_stripe_linear_attention_matches_the_authors(img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size, la_split_size=SPLITS, **STRIPED)
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size, la_split_size="8-4-2-1", **STRIPED)
    branches = model.stages[0].blocks[0].attns
    expected = ["full"] if img_size == 32 else ["vertical", "horizontal"]
    assert [branch.direction for branch in branches] == expected
    assert_same_outputs(model, reference, img_size)


@pytest.mark.slow
def test_published_tiny_with_the_authors_stripes_at_224_448_and_896(tmp_path, fake_yacs):
    """FLatten-CSwin-T with the authors' default la_split_size 56-28-14-7: one global branch at 224, two stripe
    branches (112x56 and 56x112 in stage 1) at 448, four stripes per branch at 896; random weights, float64. Their
    code builds CSwin-T at multiples of 224 only (stage 3's 7-wide stripes, stage 4's map), so no smaller size."""
    config = {"embed_dim": 64, "depths": (2, 4, 18, 1), "num_heads": (2, 4, 8, 16), "split_size": (1, 2, 7, 7)}
    for img_size in (224, 448, 896):
        depths = config["depths"] if img_size < 896 else (1, 1, 1, 1)  # the stripes, not the depth, at 896
        reference = AuthorsCSWin(img_size, **{**config, "depths": depths}, la_split_size=(56, 28, 14, 7))
        randomize(reference).eval()
        _save_authors_file(tmp_path / "authors.pth", reference, fake_yacs)
        overlay = {"file": str(tmp_path / "authors.pth")}
        model = timm.create_model(
            "flatten_cswin_tiny_224", **{**config, "depths": depths}, img_size=img_size, la_split_size="56-28-14-7",
            pretrained=True, pretrained_cfg_overlay=overlay,
        ).eval()  # fmt: skip
        x = torch.randn(1, 3, img_size, img_size, dtype=torch.float64)
        with torch.no_grad():
            expected, actual = reference.double()(x), model.double()(x)
        assert torch.isfinite(expected).all() and expected.abs().max() > 0.1
        torch.testing.assert_close(actual, expected, atol=1e-9, rtol=1e-9)


def test_stripe_tables_are_one_stripe_of_the_map_and_follow_the_input_size(tmp_path, fake_yacs):
    model = _small(img_size=64, la_split_size=SPLITS, device="meta", **STRIPED)
    vertical, horizontal = model.stages[0].blocks[0].attns
    assert vertical.focused.positional_encoding.shape == (1, 16 * 8, 8)  # half the 16 channels
    assert horizontal.focused.pos_size == (8, 16) and model.stages[1].blocks[0].attns[0].focused.pos_size == (8, 4)
    # a 64 checkpoint into a model built at 128: the stripe tables are resized from (16, 8) to (32, 8)
    reference = _authors_model(64, la_split_size=SPLITS, **STRIPED)
    loaded = _load(reference, tmp_path / "authors.pth", fake_yacs, 128, la_split_size=SPLITS, **STRIPED)
    table = reference.stage1[0].attns[0].positional_encoding.detach().reshape(1, 16, 8, 8).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(table, size=(32, 8), mode="bicubic", align_corners=False)
    torch.testing.assert_close(
        loaded.stages[0].blocks[0].attns[0].focused.positional_encoding, expected.flatten(2).transpose(1, 2)
    )
    loaded.set_input_size(64)
    torch.testing.assert_close(
        loaded.stages[0].blocks[0].attns[1].focused.positional_encoding.shape, torch.Size((1, 8 * 16, 8))
    )


def test_stripe_checkpoint_in_a_whole_map_model_names_the_cause(tmp_path, fake_yacs):
    """Issue 14: this used to fail with '... tokens are not a square grid; convert it at the resolution it was
    trained at', which names the wrong cause."""
    reference = _authors_model(64, la_split_size=SPLITS, **STRIPED)
    with pytest.raises(ValueError, match=r"stage 1 of the checkpoint attends in 2 linear stripe branches .* but the "
                       r"model in one branch over its whole 16x16 map: build the model with the checkpoint's "
                       r"la_split_size and img_size"):  # fmt: skip
        _load(reference, tmp_path / "authors.pth", fake_yacs, 64, **STRIPED)
    whole = _authors_model(64, **STRIPED)
    with pytest.raises(ValueError, match=r"stage 1 of the checkpoint attends in one linear branch over the whole map "
                       r"but the model in 2 stripe branches \(8 wide on its 16x16 map"):  # fmt: skip
        _load(whole, tmp_path / "whole.pth", fake_yacs, 64, la_split_size=SPLITS, **STRIPED)
    kinds = "stage 3 of the checkpoint is stripe softmax attention but stage 3 of the model is focused linear attention"
    with pytest.raises(ValueError, match=kinds + ": build the model with the checkpoint's attention per stage"):
        _load(whole, tmp_path / "whole.pth", fake_yacs, 64, attn_layers="LLLS", **STRIPED)


def test_striped_model_scripts_traces_and_trains():
    branch = randomize(FocusedLinearLePEAttention(8, 2, (4, 4), direction="horizontal", split_size=4)).eval()
    qkv = torch.randn(1, 10 * 13, 24)
    assert_torchscript_matches_eager(branch, qkv, (10, 13))  # the whole striped model scripts too, slowly
    model = randomize(_small(img_size=64, la_split_size=SPLITS, **STRIPED)).eval()
    x = torch.randn(1, 3, 70, 90)  # stripes of maps that are no multiple of them
    assert_fx_feature_extraction_matches_eager(model, x)
    assert_every_parameter_gets_a_gradient(_small(img_size=64, la_split_size=SPLITS, **STRIPED), x)


@pytest.mark.slow
def test_striped_model_scripts():
    assert_torchscript_matches_eager(
        randomize(_small(img_size=64, la_split_size=SPLITS, **STRIPED)).eval(), torch.randn(1, 3, 70, 90)
    )


@pytest.mark.parametrize("bad", ["8-4-2", (8, 4, 0, 1), "a-b-c-d"])
def test_la_split_size_needs_one_width_per_stage(bad):
    with pytest.raises(ValueError, match="la_split_size needs one positive stripe width per stage"):
        _small(la_split_size=bad, device="meta")


@pytest.mark.parametrize("direction", ["vertical", "horizontal"])
@pytest.mark.parametrize("hw", [(8, 8), (10, 13), (3, 5)])
def test_linear_stripes_pad_and_mask_exactly(direction, hw):
    """Maps that are no multiple of the stripe: padding with masked keys equals attending within the narrower last
    stripe (the authors' steps on each stripe cut out, with the table's positions of its columns or rows)."""
    torch.manual_seed(0)
    branch = randomize(FocusedLinearLePEAttention(8, 2, (4, 4), direction=direction, split_size=4)).double()
    qkv = torch.randn(2, hw[0] * hw[1], 24, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(branch(qkv, hw), _focused_stripe_reference(branch, qkv, hw))


def _focused_stripe_reference(branch, qkv, hw):
    """Cut the map into its stripes (the last one narrower) and run the authors' focused linear attention with LePE
    on each, with the stripe table (resized to the map's stripe) at the piece's positions."""
    focused, heads = branch.focused, branch.focused.num_heads
    batch, channels = qkv.shape[0], qkv.shape[-1] // 3
    grid = qkv.reshape(batch, hw[0], hw[1], 3 * channels)
    stripe = (hw[0], min(4, hw[1])) if branch.direction == "vertical" else (min(4, hw[0]), hw[1])
    table = focused.positional_encoding.reshape(1, *focused.pos_size, channels).permute(0, 3, 1, 2)
    table = torch.nn.functional.interpolate(table, size=stripe, mode="bicubic", align_corners=False)[0]
    out = torch.zeros(batch, hw[0], hw[1], channels, dtype=qkv.dtype)
    for r0 in range(0, hw[0], stripe[0]):
        for c0 in range(0, hw[1], stripe[1]):
            piece = grid[:, r0 : r0 + stripe[0], c0 : c0 + stripe[1]]
            h, w = piece.shape[1:3]
            q, k, v = piece.reshape(batch, h * w, 3, channels).unbind(2)
            k = k + table[:, :h, :w].flatten(1).t()
            scale = torch.nn.functional.softplus(focused.scale)
            q, k = (torch.relu(q) + 1e-6) / scale, (torch.relu(k) + 1e-6) / scale
            q = q**3 / (q**3).norm(dim=-1, keepdim=True) * q.norm(dim=-1, keepdim=True)
            k = k**3 / (k**3).norm(dim=-1, keepdim=True) * k.norm(dim=-1, keepdim=True)
            q, k, v = (t.reshape(batch, h * w, heads, -1).transpose(1, 2) for t in (q, k, v))
            z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
            x = (q @ (k.transpose(-2, -1) @ v / (h * w)) * z).transpose(1, 2).reshape(batch, h, w, channels)
            v_image = v.transpose(-2, -1).reshape(batch * heads, -1, h, w)
            x = x + focused.dwc(v_image).reshape(batch, channels, h, w).permute(0, 2, 3, 1)
            x = x + branch.get_v(piece[..., 2 * channels :].permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            out[:, r0 : r0 + stripe[0], c0 : c0 + stripe[1]] = x
    return out.reshape(batch, hw[0] * hw[1], channels)


def test_authors_checkpoint_converts_to_another_resolution(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG)
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
    attn = randomize(LePEAttention(8, 2, split_size=4, direction=direction)).double()
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
    assert_grad_checkpointing_keeps_outputs(randomize(_small()).eval(), torch.randn(1, 3, 64, 80))


def test_set_input_size_resizes_tables_and_keeps_outputs():
    model = randomize(_small()).eval()
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
    assert_torchscript_matches_eager(randomize(_small()).eval(), torch.randn(1, 3, 60, 90))


def test_fx_feature_extraction_matches_eager():
    assert_fx_feature_extraction_matches_eager(randomize(_small()).eval(), torch.randn(1, 3, 60, 90))


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
