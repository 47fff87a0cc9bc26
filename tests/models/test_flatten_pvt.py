"""FLatten-PVT (v1): sizes against the paper, the authors' checkpoints, any input size, the timm plumbing."""

from __future__ import annotations

import re
import sys

import pytest
import timm
import torch
import torch.nn.functional as F
from _authors_pvt import AuthorsPvt
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

import linvit.models.flatten_pvt
from linvit.models.flatten_pvt_reduction import SpatialReductionAttention
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


def _save_authors_file(path, model, cfg_class):
    config = cfg_class(MODEL=cfg_class(TYPE="flatten_pvt_tiny", LA=cfg_class(PVT_LA_SR_RATIOS=1111)))
    save_authors_checkpoint(path, model, config, max_accuracy=77.8)


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
def _authors_model(img_size, **kwargs):
    torch.manual_seed(0)
    return randomize(AuthorsPvt(img_size, num_classes=10, **SMALL, **kwargs)).eval()


def _load(reference, path, cfg_class, img_size, **kwargs):
    _save_authors_file(path, reference, cfg_class)
    overlay = {"file": str(path)}
    return _small(num_classes=10, img_size=img_size, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs).eval()


# native at 64 (maps 16, 8, 4, 2), half and twice that
@pytest.mark.parametrize("img_size", [32, 64, 128])
def test_authors_checkpoint_matches_their_model_at_and_around_its_size(img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size)
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size)
    assert not any(name.startswith("norm.") for name in model.state_dict())  # the unused norm is gone
    assert_same_outputs(model, reference, img_size)


# la_sr_ratios 8421: keys and values from the map reduced 8x8, 4x4, 2x2 (1x1, 2x2, 4x4 grids at 32, 64, 128)
@pytest.mark.parametrize("img_size", [32, 64, 128])
def test_reduced_keys_match_the_authors(img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size, la_sr_ratios="8421")
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size, la_sr_ratios="8421")
    assert model.stages[0].blocks[0].attn.sr.weight.shape[-2:] == (8, 8)
    assert_same_outputs(model, reference, img_size)


# the authors' attn_type letter S: PVT's softmax attention, keys and values from the map reduced by their sr_ratios
# 8, 4, 2, 1 (maps 16, 8, 4, 2 at 64: every S stage attends over 2x2 keys); la_sr_ratios applies to L stages only
@pytest.mark.parametrize(
    "attn_type, la_sr_ratios, img_size",
    [("LLSS", "1111", 32), ("LLSS", "1111", 64), ("LLSS", "1111", 128), ("SSSS", "1111", 64), ("SLSL", "8421", 64)],
)
def test_softmax_stages_match_the_authors(attn_type, la_sr_ratios, img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size, la_sr_ratios=la_sr_ratios, attn_type=attn_type)
    path = tmp_path / "authors.pth"
    model = _load(reference, path, fake_yacs, img_size, attn_layers=attn_type, la_sr_ratios=la_sr_ratios)
    assert model.attn_layers == tuple("S" if letter == "S" else "focused" for letter in attn_type)
    softmax = [stage.blocks[0].attn for stage, letter in zip(model.stages, attn_type) if letter == "S"]
    assert all(isinstance(attn, SpatialReductionAttention) for attn in softmax)
    assert [attn.sr_ratio for attn in softmax] == [r for r, letter in zip((8, 4, 2, 1), attn_type) if letter == "S"]
    assert_same_outputs(model, reference, img_size)


@pytest.mark.slow
def test_published_tiny_with_softmax_stages_matches_the_authors(tmp_path, fake_yacs):
    """FLatten-PVT-T as published with the authors' attn_type LLSS (softmax stages 3-4, reduced 2x2 and not at all),
    random weights, float64, at 224."""
    torch.manual_seed(0)
    shapes = dict(linvit.models.flatten_pvt_v2.PVT_STAGE_SHAPES, depths=(2, 2, 2, 2))
    reference = randomize(AuthorsPvt(224, num_classes=10, attn_type="LLSS", **shapes)).eval()
    path = tmp_path / "authors.pth"
    _save_authors_file(path, reference, fake_yacs)
    overlay = {"file": str(path)}
    model = timm.create_model(
        "flatten_pvt_tiny", num_classes=10, attn_layers="LLSS", pretrained=True, pretrained_cfg_overlay=overlay
    ).eval()
    assert_same_outputs(model, reference, 224, batch=1)


def _advice(error: pytest.ExceptionInfo) -> dict:
    """The creation arguments an error message says to build the model with."""
    match = re.search(r"build the model with (.*?)\.?$", str(error.value))
    assert match, str(error.value)
    return eval(f"dict({match.group(1)})")  # noqa: S307 (our own message)


# the model as built by default, with the advice this message gave before (la_sr_ratios='1121': an error of its own
# then), and with the options convert infers from the shapes (la_sr_ratios from every sr convolution)
@pytest.mark.parametrize("kwargs", [{}, {"la_sr_ratios": "1121"}, {"attn_layers": "SSSS"}])
def test_the_advice_for_softmax_stages_builds_a_model_that_loads(kwargs, tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG, attn_type="LLSS")
    path = tmp_path / "authors.pth"
    with pytest.raises(ValueError, match="build the model with") as error:
        _load(reference, path, fake_yacs, SMALL_IMG, **kwargs)
    assert _advice(error) == {"attn_layers": "LLSS"}
    if not kwargs:
        assert "stage 3 of the checkpoint is softmax attention (the authors' S) but the model's is focused linear " in (
            str(error.value)
        )
    assert_same_outputs(_load(reference, path, fake_yacs, SMALL_IMG, **_advice(error)), reference, SMALL_IMG)
    # what convert passes: the letters and the ratio it reads from stage 3's 2x2 convolution, which S stages ignore
    model = _load(reference, path, fake_yacs, SMALL_IMG, attn_layers="LLSS", la_sr_ratios="1121")
    assert_same_outputs(model, reference, SMALL_IMG)


@pytest.mark.parametrize(
    "attn_type, la_sr_ratios, advice",
    [("SSLL", "1121", {"attn_layers": "SSLL", "la_sr_ratios": "1121"}), ("LSLS", "8421", None)],
)
def test_the_advice_names_every_option_the_checkpoint_needs(attn_type, la_sr_ratios, advice, tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG, attn_type=attn_type, la_sr_ratios=la_sr_ratios)
    path = tmp_path / "authors.pth"
    with pytest.raises(ValueError, match="build the model with") as error:
        _load(reference, path, fake_yacs, SMALL_IMG, sr_ratios=(4, 4, 4, 4))
    if advice is not None:
        assert _advice(error) == {**advice, "sr_ratios": "8421"}
    assert_same_outputs(_load(reference, path, fake_yacs, SMALL_IMG, **_advice(error)), reference, SMALL_IMG)


def test_softmax_stage_options_are_checked():
    with pytest.raises(ValueError, match="sr_ratios needs one positive reduction ratio per stage"):
        _small(attn_layers="LLSS", sr_ratios="842", device="meta")
    with pytest.raises(ValueError, match=r"Unknown attention 'LLXS'; valid names are focused, .*, L, S\."):
        _small(attn_layers="LLXS", device="meta")
    with pytest.raises(TypeError, match="the authors' S stage takes no arguments"):
        _small(attn_layers=["L", "L", {"name": "S", "attn_drop": 0.1}, "S"], device="meta")
    model = _small(attn_layers=("focused", "L", "S", "softmax"), sr_ratios=(2, 2, 2, 2), device="meta")
    assert model.attn_layers == ("focused", "focused", "S", "softmax")
    assert model.stages[2].blocks[0].attn.sr_ratio == 2
    assert type(model.stages[3].blocks[0].attn).__name__ == "GlobalAttention"  # linvit's name: no reduction


def test_softmax_stages_run_any_size_script_and_train():
    model = randomize(_small(attn_layers="SLSL")).eval()
    x = torch.randn(1, 3, 70, 90)  # maps no multiple of the ratios: the reduction drops the remainder
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    assert_torchscript_matches_eager(model, x)
    assert_fx_feature_extraction_matches_eager(model, x)
    assert_every_parameter_gets_a_gradient(_small(attn_layers="LLSS", num_classes=3), x)


def test_loads_the_authors_whole_file_without_its_config_class(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG)
    path = tmp_path / "flatten_pvt_small_cfg.pth"
    _save_authors_file(path, reference, fake_yacs)
    del sys.modules["yacs.config"]
    model = _small(num_classes=10, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).eval()
    assert_same_outputs(model, reference, SMALL_IMG)


def test_a_reduction_of_another_ratio_is_named(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG, la_sr_ratios="8421")
    message = (
        r"stage 1 of the checkpoint reduces keys and values 8x8 \(la_sr_ratios\) but the model's takes keys and values "
        r"from every token \(no reduction\): build the model with la_sr_ratios='8421'"
    )
    with pytest.raises(ValueError, match=message):
        _load(reference, tmp_path / "authors.pth", fake_yacs, SMALL_IMG)


def test_authors_checkpoint_converts_to_another_resolution(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG)
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
    assert_grad_checkpointing_keeps_outputs(randomize(_small()).eval(), torch.randn(1, 3, 64, 80))


def test_set_input_size_resizes_tables_and_keeps_outputs():
    model = randomize(_small()).eval()
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
    assert_torchscript_matches_eager(randomize(_small()).eval(), torch.randn(1, 3, 60, 90))


def test_fx_feature_extraction_matches_eager():
    assert_fx_feature_extraction_matches_eager(randomize(_small()).eval(), torch.randn(1, 3, 60, 90))
