"""FLatten-PVTv2: sizes against the paper, the authors' checkpoints, any input size, the timm plumbing."""

from __future__ import annotations

import math
import re
import sys

import pytest
import timm
import torch
import torch.nn.functional as F
from _authors_pvt import AuthorsPvtV2
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

import linvit.models.flatten_pvt_v2  # noqa: F401  (registers the models)
from linvit.utils import count_macs, count_params

# (params, MACs at 224) published in the FLatten paper (arXiv 2308.00442, table of PVT results); B3/B4 are unpublished
PUBLISHED = {
    "flatten_pvt_v2_b0": (3.6e6, 0.58e9),
    "flatten_pvt_v2_b1": (12.9e6, 2.22e9),
    "flatten_pvt_v2_b2": (22.6e6, 4.25e9),
}
ALL_NAMES = [f"flatten_pvt_v2_b{i}" for i in range(6)]
# what the authors' code builds (parameters, counted from their models/flatten_pvt_v2.py; their configs' ratios 1111)
AUTHORS_CODE_PARAMS = {"flatten_pvt_v2_b5": 67_061_544}

# A small configuration of the same classes for the heavy checks.
SMALL = {"embed_dims": (16, 32, 48, 64), "depths": (1, 1, 2, 1), "num_heads": (1, 2, 3, 4), "mlp_ratios": (2, 2, 2, 2)}
SMALL_IMG = 64


def _small(**kwargs):
    return timm.create_model("flatten_pvt_v2_b0", **{**SMALL, "img_size": SMALL_IMG, **kwargs})


def _save_authors_file(path, model, cfg_class):
    config = cfg_class(MODEL=cfg_class(TYPE="flatten_pvt_v2_b0", LA=cfg_class(PVT_LA_SR_RATIOS=1111)))
    save_authors_checkpoint(path, model, config, max_accuracy=71.1)


# ----------------------------------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_NAMES)
def test_param_count_matches_paper(name):
    model = timm.create_model(name, device="meta")
    params = count_params(model)
    if name in PUBLISHED:
        assert params == pytest.approx(PUBLISHED[name][0], rel=0.01)
    elif name in AUTHORS_CODE_PARAMS:
        assert params == AUTHORS_CODE_PARAMS[name]
    else:  # unpublished: at least ordered by depth
        assert params > PUBLISHED["flatten_pvt_v2_b2"][0]


def test_reductions_have_the_authors_parameter_counts():
    """Counted from their code: B5 with la_sr_ratios 8421 82,807,336; B2 with linear=True (and 8421, which their
    linear mode needs at 224) 22,788,136."""
    assert count_params(timm.create_model("flatten_pvt_v2_b5", la_sr_ratios="8421", device="meta")) == 82_807_336
    linear = timm.create_model("flatten_pvt_v2_b2", linear=True, device="meta")
    assert count_params(linear) == 22_788_136
    assert linear.stages[0].blocks[0].attn.positional_encoding.shape == (1, 49, 64)


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
def _authors_model(img_size, embed=SMALL, **kwargs):
    torch.manual_seed(0)
    return randomize(AuthorsPvtV2(img_size, num_classes=10, **embed, **kwargs)).eval()


def _load(reference, path, cfg_class, img_size, **kwargs):
    _save_authors_file(path, reference, cfg_class)
    overlay = {"file": str(path)}
    return _small(num_classes=10, img_size=img_size, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs).eval()


# native at 64 (maps 16, 8, 4, 2), half and twice that
@pytest.mark.parametrize("img_size", [32, 64, 128])
def test_authors_checkpoint_matches_their_model_at_and_around_its_size(img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size)
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size)
    assert_same_outputs(model, reference, img_size)


# la_sr_ratios 8421: keys and values from the map reduced 8x8, 4x4, 2x2 (1x1, 2x2, 4x4 grids at 32, 64, 128)
@pytest.mark.parametrize("img_size", [32, 64, 128])
def test_reduced_keys_match_the_authors(img_size, tmp_path, fake_yacs):
    reference = _authors_model(img_size, la_sr_ratios="8421")
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size, la_sr_ratios=(8, 4, 2, 1))
    assert model.stages[1].blocks[0].attn.sr.weight.shape[-2:] == (4, 4)
    assert_same_outputs(model, reference, img_size)


# linear=True (PVTv2-Li): their table has num_patches // sr^2 positions and must be the 7x7 pooled grid, so their
# model builds only where every stage's map is 7 times its ratio: 224 with 8421 (their setting), 448 with 16-8-4-2;
# no smaller size exists (the last stage's map would be under 7). linvit pools to 7x7 at any size.
@pytest.mark.parametrize("img_size, ratios", [(224, "8421"), pytest.param(448, (16, 8, 4, 2), marks=pytest.mark.slow)])
def test_linear_pvt_v2_matches_the_authors(img_size, ratios, tmp_path, fake_yacs):
    reference = _authors_model(img_size, la_sr_ratios=ratios, linear=True)
    model = _load(reference, tmp_path / "authors.pth", fake_yacs, img_size, linear=True)
    assert model.stages[3].blocks[0].attn.positional_encoding.shape[1] == 49
    assert_same_outputs(model, reference, img_size)


# the authors' attn_type letter S: PVT's softmax attention over keys and values reduced by sr_ratios 8, 4, 2, 1 (their
# Attention), or with linear=True pooled to 7x7 (and the L stages' tables on 7x7 grids: their linear mode needs 224)
@pytest.mark.parametrize(
    "attn_type, img_size, options",
    [
        ("LLSS", 64, {}),
        ("SSSS", 32, {}),
        ("SLSL", 64, {"la_sr_ratios": "8421"}),
        ("LSLS", 224, {"la_sr_ratios": "8421", "linear": True}),
    ],
)
def test_softmax_stages_match_the_authors(attn_type, img_size, options, tmp_path, fake_yacs):
    reference = _authors_model(img_size, attn_type=attn_type, **options)
    path = tmp_path / "authors.pth"
    model = _load(reference, path, fake_yacs, img_size, attn_layers=attn_type, **options)
    kinds = [type(stage.blocks[0].attn).__name__ == "SpatialReductionAttention" for stage in model.stages]
    assert kinds == [letter == "S" for letter in attn_type]
    assert_same_outputs(model, reference, img_size)


def test_the_advice_for_softmax_stages_builds_a_model_that_loads(tmp_path, fake_yacs):
    """Every option the message names is one that builds a model the checkpoint loads into."""
    cases = [
        ("LLSS", 64, {}, {}, {"attn_layers": "LLSS"}),
        (
            "LLSS",
            64,
            {"la_sr_ratios": "8421"},
            {"la_sr_ratios": "1121"},
            {"attn_layers": "LLSS", "la_sr_ratios": "8411"},
        ),
        (
            "SLSL",
            224,
            {"la_sr_ratios": "8421", "linear": True},
            {"linear": True},
            {"attn_layers": "SLSL", "linear": True},
        ),
        (
            "LSLS",
            224,
            {"la_sr_ratios": "8421", "linear": True},
            {"attn_layers": "LSLS"},
            {"attn_layers": "LSLS", "linear": True},
        ),
    ]
    for attn_type, img_size, theirs, ours, advice in cases:
        reference = _authors_model(img_size, attn_type=attn_type, **theirs)
        path = tmp_path / "authors.pth"
        with pytest.raises(ValueError, match="build the model with") as error:
            _load(reference, path, fake_yacs, img_size, **ours)
        match = re.search(r"build the model with (.*?)\.?$", str(error.value))
        assert match and eval(f"dict({match.group(1)})") == advice, str(error.value)  # noqa: S307 (our message)
        model = _load(reference, path, fake_yacs, img_size, **{**ours, **advice})
        assert_same_outputs(model, reference, img_size)


@pytest.mark.slow
@pytest.mark.parametrize("ratios, attn_type", [("1111", "LLLL"), ("8421", "LLLL"), ("1111", "LLSS")])
def test_published_b0_matches_the_authors_at_128_224_448(ratios, attn_type, tmp_path, fake_yacs):
    """FLatten-PVTv2-B0 as published (and with their 8421 reduction, or their softmax stages LLSS), random weights,
    float64, at its size, below and twice above (their tables need maps divisible by the ratios: 128, not 112)."""
    b0 = {"embed_dims": (32, 64, 160, 256), "depths": (2, 2, 2, 2), "num_heads": (1, 2, 5, 8)}
    b0["mlp_ratios"] = (8, 8, 4, 4)
    for img_size in (128, 224, 448):
        reference = _authors_model(img_size, embed=b0, la_sr_ratios=ratios, attn_type=attn_type)
        _save_authors_file(tmp_path / "authors.pth", reference, fake_yacs)
        overlay = {"file": str(tmp_path / "authors.pth")}
        model = timm.create_model(
            "flatten_pvt_v2_b0", num_classes=10, img_size=img_size, la_sr_ratios=ratios, attn_layers=attn_type,
            pretrained=True, pretrained_cfg_overlay=overlay,
        ).eval()  # fmt: skip
        assert_same_outputs(model, reference, img_size)


def test_loads_the_authors_whole_file_without_its_config_class(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG)
    path = tmp_path / "flatten_pvt_v2_small.pth"
    _save_authors_file(path, reference, fake_yacs)
    del sys.modules["yacs.config"]  # loading must not need the config class
    model = _small(num_classes=10, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).eval()
    assert_same_outputs(model, reference, SMALL_IMG)


def test_a_reduction_of_another_kind_is_named(tmp_path, fake_yacs):
    reduced = _authors_model(SMALL_IMG, la_sr_ratios="8421")
    message = (
        r"stage 1 of the checkpoint reduces keys and values 8x8 \(la_sr_ratios\) but the model's pools keys and "
        r"values to 7x7 \(linear=True\): build the model with la_sr_ratios='8421'"
    )
    with pytest.raises(ValueError, match=message):
        _load(reduced, tmp_path / "reduced.pth", fake_yacs, SMALL_IMG, linear=True)
    pooled = _authors_model(224, la_sr_ratios="8421", linear=True)
    with pytest.raises(ValueError, match=r"pools keys and values to 7x7 \(linear=True\) but the model's takes keys and "
                       r"values from every token \(no reduction\): build the model with linear=True"):  # fmt: skip
        _load(pooled, tmp_path / "pooled.pth", fake_yacs, 224)


def test_reduction_options_are_checked():
    with pytest.raises(ValueError, match="la_sr_ratios needs one positive reduction ratio per stage"):
        _small(la_sr_ratios="842", device="meta")
    with pytest.raises(ValueError, match="la_sr_ratios and linear reduce the keys of focused attention"):
        _small(la_sr_ratios=2, attn_layers=("focused", "softmax", "focused", "focused"), device="meta")


def test_reduced_model_runs_any_size_scripts_and_trains():
    model = randomize(_small(la_sr_ratios="8421")).eval()
    x = torch.randn(1, 3, 70, 90)  # maps that are no multiple of the ratios: the reduction drops the remainder
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    assert_torchscript_matches_eager(model, x)
    assert_fx_feature_extraction_matches_eager(model, x)
    assert_every_parameter_gets_a_gradient(_small(linear=True, num_classes=3), x)
    model.set_input_size(128)
    assert model.stages[0].blocks[0].attn.pos_size == (4, 4)  # the reduced grid of the 32x32 map
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(x * 16)).all()


def test_authors_checkpoint_converts_to_another_resolution(tmp_path, fake_yacs):
    reference = _authors_model(SMALL_IMG)
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
    reference = _authors_model(SMALL_IMG)
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
    assert_grad_checkpointing_keeps_outputs(randomize(_small()).eval(), torch.randn(1, 3, 64, 80))


def test_set_input_size_resizes_tables_and_keeps_outputs():
    model = randomize(_small()).eval()
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
    assert_torchscript_matches_eager(randomize(_small()).eval(), torch.randn(1, 3, 64, 96))


def test_head_dims_are_those_of_the_paper():
    model = timm.create_model("flatten_pvt_v2_b1", device="meta")
    dims = [stage.blocks[0].attn.dwc.weight.shape[0] for stage in model.stages]
    assert dims == [64, 64, 64, 64]
    assert math.prod(model.stages[0].blocks[0].attn.positional_encoding.shape) == 56 * 56 * 64


def test_fx_feature_extraction_matches_eager():
    assert_fx_feature_extraction_matches_eager(randomize(_small()).eval(), torch.randn(1, 3, 60, 90))
