"""FLatten-Swin: published sizes, the authors' checkpoints, any input size, timm API details.

Heavy checks use a tiny configuration built through the same registered names (keyword overrides), so the
code path is the one users take.
"""

from __future__ import annotations

import math
import re
import sys
import types

import pytest
import timm
import torch
import torch.nn.functional as F
from _authors_swin import RefFLattenSwin
from _flatten_testing import assert_same_outputs

import linvit.models  # noqa: F401  (registers the models)
import linvit.models.flatten_swin
from linvit.attention import resize_relative_position_bias
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
# the authors' checkpoints: equal outputs at the native size and below and above it (tests/models/_authors_swin.py)
# ------------------------------------------------------------------------------------------------------------------
def _randomize(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(noise * (0.5 if "norm" in name else 0.2) + (1.0 if name.endswith("norm1.weight") else 0.0))


def _reference(img_size=128):
    ref = RefFLattenSwin(img_size, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10).eval()
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
    assert "relative_position_index" in "".join(state)
    assert any(k.startswith("layers.0.downsample.") for k in state)  # the authors' layout


def _load_authors(ref, path, monkeypatch, **kwargs):
    _save_authors_checkpoint(path, ref, monkeypatch)
    overlay = {"file": str(path)}
    return timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=overlay, **dict(TINY, **kwargs)).eval()


# TINY is native at 128: stage maps 32, 16, 8, 4. At 64 the authors shrink stage 4's softmax window to its 2x2 map
# (a 3x3 bias table: it must land in the centre of linvit's 7x7 one); at 256 stage 1 (64x64) exceeds the 32 linear
# window, so every second linear block rolls its map by 16 (no mask), as the authors' blocks do.
@pytest.mark.parametrize("img_size", [64, 128, 256])
def test_authors_checkpoint_matches_their_model_at_and_around_its_size(img_size, tmp_path, monkeypatch):
    ref = _reference(img_size)
    model = _load_authors(ref, tmp_path / "flatten_swin_t.pth", monkeypatch, img_size=img_size)
    assert_same_outputs(model, ref, img_size)


def test_linear_blocks_shift_only_where_the_map_exceeds_the_linear_window(tmp_path, monkeypatch):
    """Without the roll of its linear blocks, linvit departs from the authors above the linear window (the
    difference issue 14 measured: 4e-4 for FLatten-Swin-T at 448), and at the native size nothing changes."""
    for img_size, departs in ((128, False), (256, True)):
        ref = _reference(img_size)
        path = tmp_path / f"{img_size}.pth"
        model = _load_authors(ref, path, monkeypatch, img_size=img_size, shift_linear_windows=False)
        x = torch.randn(1, 3, img_size, img_size, dtype=torch.float64)
        with torch.no_grad():
            difference = (model.double()(x) - ref.double()(x)).abs().max().item()
        assert (difference > 1e-3) == departs, (img_size, difference)
    shifted = _tiny().layers[0].blocks
    assert [type(block).__name__ for block in shifted] == ["PreNormBlock", "ShiftedLinearBlock"]


def test_rolled_linear_windows_wrap_around_the_map():
    """The second linear block attends within 32x32 windows of the map rolled by (-16, -16): its output at a token
    equals that of an unshifted window attention run on the rolled map, rolled back."""
    model = _tiny()
    block = model.layers[0].blocks[1]
    hw = (64, 48)
    x = torch.randn(1, hw[0] * hw[1], 16)
    with torch.no_grad():
        rolled = torch.roll(block.norm1(x).view(1, *hw, 16), (-16, -16), (1, 2)).reshape(1, -1, 16)
        attended = torch.roll(block.attn(rolled, hw).view(1, *hw, 16), (16, 16), (1, 2)).reshape(1, -1, 16)
        expected = x + attended
        expected = expected + block.mlp(block.norm2(expected))
        torch.testing.assert_close(block(x, hw), expected)
        # a map no larger than the window along a dimension is not rolled along it
        narrow = torch.randn(1, 64 * 20, 16)
        rolled = torch.roll(block.norm1(narrow).view(1, 64, 20, 16), -16, 1).reshape(1, -1, 16)
        attended = torch.roll(block.attn(rolled, (64, 20)).view(1, 64, 20, 16), 16, 1).reshape(1, -1, 16)
        expected = narrow + attended
        torch.testing.assert_close(block(narrow, (64, 20)), expected + block.mlp(block.norm2(expected)))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "sizes", "depths"),
    [
        ("flatten_swin_tiny_patch4_224", (96, 224, 448), (2, 2, 6, 2)),
        ("flatten_swin_base_patch4_384", (192, 384, 768), (2, 2, 2, 2)),  # B's 18 stage-3 blocks add nothing new
    ],
)
def test_published_configuration_matches_the_authors_at_three_sizes(name, sizes, depths, tmp_path, monkeypatch):
    """The published widths, heads and windows against the authors' at their size, half of it (softmax windows
    shrunk to the map) and twice it (stage 1 beyond the linear window: its second blocks roll), with random weights,
    in float64 (Swin-T whole; B-384 with two blocks per stage)."""
    config = timm.create_model(name, depths=depths, device="meta")
    linear_window = config.linear_window_size[0]
    heads = [stage.blocks[0].attn.num_heads for stage in config.layers]
    embed_dim = config.feature_info[0]["num_chs"]
    for img_size in sizes:
        ref = RefFLattenSwin(img_size, embed_dim, depths, heads, linear_window, config.window_size, 1000).eval()
        _randomize(ref)
        _save_authors_checkpoint(tmp_path / "authors.pth", ref, monkeypatch)
        overlay = {"file": str(tmp_path / "authors.pth")}
        kwargs = {"img_size": img_size, "depths": depths}
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs).eval()
        assert_same_outputs(model, ref, img_size, batch=1)


def test_tables_the_authors_shrank_land_in_the_centre(tmp_path, monkeypatch):
    """Built at 64, the authors' stage-4 window is its 2x2 map with a 3x3 table: linvit keeps its 7x7 table (window
    4) with theirs in the centre (offsets -1..1), the other offsets repeating the nearest edge."""
    ref = _reference(64)
    model = _load_authors(ref, tmp_path / "authors.pth", monkeypatch, img_size=64)
    theirs = ref.layers[3].blocks[0].attn.relative_position_bias_table.detach()
    assert theirs.shape == (9, 4)
    ours = model.layers[3].blocks[0].attn.relative_position_bias_table.detach().reshape(7, 7, 4)
    torch.testing.assert_close(ours[2:5, 2:5], theirs.reshape(3, 3, 4))
    torch.testing.assert_close(ours[0, 0], theirs[0])  # the corner offset (-3, -3) takes that of (-1, -1)
    torch.testing.assert_close(ours[3, 6], theirs.reshape(3, 3, 4)[1, 2])
    # stage 3 (a 4x4 map, window 4) is unshrunk: the table is copied as it is
    torch.testing.assert_close(
        model.layers[2].blocks[1].attn.relative_position_bias_table,
        ref.layers[2].blocks[1].attn.relative_position_bias_table,
    )


def test_centre_relative_position_bias_crops_and_embeds_by_offset():
    from linvit.attention.window import centre_relative_position_bias, relative_position_bias, relative_position_index

    table = torch.randn(13 * 13, 2)
    cropped = centre_relative_position_bias(table, (7, 7), (6, 6))
    # a 6x6 window reads the same biases from its own 11x11 table as from the 13x13 table of a clamped 7x7 window
    torch.testing.assert_close(
        relative_position_bias(cropped, relative_position_index((6, 6)), (6, 6), (6, 6)),
        relative_position_bias(table, relative_position_index((7, 7)), (7, 7), (6, 6)),
    )
    torch.testing.assert_close(centre_relative_position_bias(cropped, (6, 6), (7, 7)).view(13, 13, 2)[1:-1, 1:-1],
                               table.view(13, 13, 2)[1:-1, 1:-1])  # fmt: skip
    rectangular = centre_relative_position_bias(table, (7, 7), (3, 5))
    torch.testing.assert_close(rectangular.view(5, 9, 2), table.view(13, 13, 2)[4:9, 2:11])
    with pytest.raises(ValueError, match="a relative position bias table of a 6x6 window has 121 rows, got 169"):
        centre_relative_position_bias(table, (6, 6), (7, 7))


def test_tables_of_another_configured_window_are_resized_bicubically(tmp_path, monkeypatch):
    """A checkpoint whose windows were not shrunk (its stage 3 shifts: the map exceeded the window) has another
    configured window than a window-5 model: its tables are resized bicubically, as the authors' fine-tuning does."""
    ref = _reference(128)
    model = _load_authors(ref, tmp_path / "authors.pth", monkeypatch, img_size=128, window_size=5)
    for stage in (2, 3):
        theirs = ref.layers[stage].blocks[0].attn.relative_position_bias_table.detach()
        expected = resize_relative_position_bias(theirs, 81)
        torch.testing.assert_close(model.layers[stage].blocks[0].attn.relative_position_bias_table.detach(), expected)


def test_a_stage_of_another_attention_kind_is_named(tmp_path, monkeypatch):
    ref = _reference(128)
    with pytest.raises(ValueError, match=r"stage 3 of the checkpoint is window softmax attention but stage 3 of "
                       r"the model is focused linear attention: build the model .*attn_layers='LLSS'"):  # fmt: skip
        _load_authors(ref, tmp_path / "authors.pth", monkeypatch, attn_layers="LLLS")


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


@pytest.mark.parametrize("options", [{}, {"ape": True, "depths": (2, 2, 4, 2), "attn_layers": "MMMS1"}])
def test_torchscript_and_fx(options):
    from timm.layers import create_feature_extractor

    model = _tiny(**options)
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


@pytest.mark.parametrize("img_size", [128, 160])
def test_authors_absolute_position_embedding_loads_and_matches_their_model(img_size, tmp_path, monkeypatch):
    """Swin's ape=True: the authors' `absolute_pos_embed` loads into ape=True and gives their outputs at the native
    size; a model created at another size resizes it with the other tables."""
    ref = RefFLattenSwin(128, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10, ape=True)
    _randomize(ref.eval())
    model = _load_authors(ref, tmp_path / "flatten_swin_ape.pth", monkeypatch, ape=True)
    assert model.absolute_pos_embed.shape == (1, 32 * 32, 16)
    assert_same_outputs(model, ref, 128)
    if img_size != 128:
        model.set_input_size(img_size=(img_size, img_size))
        assert model.absolute_pos_embed.shape == (1, (img_size // 4) ** 2, 16)
        assert model(torch.randn(1, 3, img_size, img_size, dtype=torch.float64)).shape == (1, 10)


def test_the_advice_for_an_absolute_position_embedding_builds_a_model_that_loads(tmp_path, monkeypatch):
    """An ape checkpoint in a model without one (and the other way round) says to build with ape=True (False)."""
    with_ape = RefFLattenSwin(128, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10, ape=True)
    for ref, ours in ((with_ape, {}), (_reference(128), {"ape": True})):
        _randomize(ref.eval())
        path = tmp_path / "authors.pth"
        with pytest.raises(ValueError, match=r"absolute position embedding .*: build the model with ape=") as error:
            _load_authors(ref, path, monkeypatch, **ours)
        advice = re.search(r"build the model with ape=(True|False)", str(error.value)).group(1)
        assert advice == str(not ours)
        assert_same_outputs(_load_authors(ref, path, monkeypatch, ape=advice == "True"), ref, 128)
    # with a stage of another kind too: one message names both
    ref = RefFLattenSwin(128, 16, (2, 2, 4, 2), (2, 2, 4, 4), 32, 4, num_classes=10, types="LLMS1", ape=True)
    _randomize(ref.eval())
    with pytest.raises(ValueError, match="build the model with") as error:
        _load_authors(ref, tmp_path / "authors.pth", monkeypatch, depths=(2, 2, 4, 2))
    assert "attn_layers='LLMS1' (L = linear, S = softmax, M = the first blocks linear) and ape=True" in str(error.value)
    model = _load_authors(
        ref, tmp_path / "authors.pth", monkeypatch, depths=(2, 2, 4, 2), attn_layers="LLMS1", ape=True
    )
    assert_same_outputs(model, ref, 128)


# ------------------------------------------------------------------------------------------------------------------
# the authors' mixed stages (M with a count: the first k blocks linear, the rest softmax)
# ------------------------------------------------------------------------------------------------------------------
def _mixed_reference(img_size, attn_type, depths=(2, 2, 4, 2)):
    ref = RefFLattenSwin(
        img_size, 16, depths, (2, 2, 4, 4), linear_window=32, window=4, num_classes=10, types=attn_type
    )
    _randomize(ref.eval())
    return ref


# stage 3 (an 8x8 map at 128, 16x16 at 256) holds 4 blocks: with M1 its softmax blocks 1 and 3 shift by half their
# window, with M3 its linear blocks 0-2 keep the map (one window) and softmax block 3 shifts; MMMS1 mixes stages 1-2
# too (at 256 stage 1's 64x64 map exceeds the 32 linear window, and its softmax block 1 shifts with a mask)
@pytest.mark.parametrize(
    "attn_type, img_size", [("LLMS1", 128), ("LLMS3", 128), ("LLMS3", 256), ("MMMS1", 128), ("MMMS1", 256)]
)
def test_mixed_stages_match_the_authors(attn_type, img_size, tmp_path, monkeypatch):
    ref = _mixed_reference(img_size, attn_type)
    kwargs = {"img_size": img_size, "depths": (2, 2, 4, 2), "attn_layers": attn_type}
    model = _load_authors(ref, tmp_path / "flatten_swin_mixed.pth", monkeypatch, **kwargs)
    count = int(attn_type[4:])
    kinds = [type(block.attn).__name__ for block in model.layers[2].blocks]
    assert kinds == ["FocusedLinearAttention"] * count + ["WindowAttention"] * (4 - count)
    assert model.attn_layers[2] == f"M{count}"
    assert_same_outputs(model, ref, img_size)


@pytest.mark.slow
def test_published_tiny_with_mixed_stages_matches_the_authors(tmp_path, monkeypatch):
    """FLatten-Swin-T with the authors' attn_type LLMS3 (stage 3: 3 linear blocks in the 56 window, then 3 shifted
    7x7 softmax ones), random weights, float64, at 224 and 448 (stage 1 beyond the linear window: rolled blocks)."""
    for img_size in (224, 448):
        ref = RefFLattenSwin(img_size, 96, (2, 2, 6, 2), (3, 6, 12, 24), 56, 7, num_classes=1000, types="LLMS3")
        _randomize(ref.eval())
        _save_authors_checkpoint(tmp_path / "authors.pth", ref, monkeypatch)
        overlay = {"file": str(tmp_path / "authors.pth")}
        kwargs = {"img_size": img_size, "attn_layers": "LLMS3"}
        model = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs).eval()
        assert_same_outputs(model, ref, img_size, batch=1)


def test_mixed_stages_spelled_per_stage_build_the_same_model():
    letters = timm.create_model(NAME, **dict(TINY, depths=(2, 2, 4, 2), attn_layers="LMMS3"), device="meta")
    entries = timm.create_model(NAME, **dict(TINY, depths=(2, 2, 4, 2), attn_layers=("L", "M3", "M3", "window")))
    assert letters.attn_layers == entries.attn_layers == ("focused", "M3", "M3", "window")
    assert [name for name, _ in letters.named_parameters()] == [name for name, _ in entries.named_parameters()]
    with pytest.raises(ValueError, match="a mixed stage \\(M\\) is spelled as the authors' attn_type"):
        timm.create_model(NAME, **dict(TINY, attn_layers="LLMS"), device="meta")


@pytest.mark.parametrize(
    "theirs, ours, advice",
    [
        ("LLMS3", {}, "LLMS3"),  # the default model (LLSS)
        ("LLSS", {"attn_layers": "LLMS1"}, "LLSS"),
        (("L", "M1", "M3", "S"), {}, ("L", "M1", "M3", "S")),  # counts that differ: a tuple of letters
    ],
)
def test_the_advice_for_mixed_stages_builds_a_model_that_loads(theirs, ours, advice, tmp_path, monkeypatch):
    depths = {"depths": (2, 2, 4, 2)}
    if isinstance(theirs, str):
        ref = _mixed_reference(128, theirs)
        state = ref.state_dict()
    else:  # linvit's layout (the authors' code gives every M stage one count)
        ref = _tiny(**depths, attn_layers=theirs)
        _randomize(ref)
        state = ref.state_dict()
    with pytest.raises(ValueError, match="build the model with the checkpoint's attention per stage") as error:
        linvit.models.flatten_swin.checkpoint_filter_fn(state, _tiny(**depths, **ours))
    found = re.search(r"attn_layers=(.*?) \(L = linear", str(error.value))
    assert found and eval(found.group(1)) == advice, str(error.value)  # noqa: S307 (our own message)
    model = _tiny(**depths, attn_layers=advice)
    model.load_state_dict(linvit.models.flatten_swin.checkpoint_filter_fn(state, model))
    assert_same_outputs(model, ref, 128)
