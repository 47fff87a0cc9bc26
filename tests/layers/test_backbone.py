"""The backbone frame and the token stage, across every family that builds on them."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

import linvit.models  # noqa: F401  (registers the models)
from linvit.attention import FocusedLinearAttention
from linvit.layers import Backbone, PreNormBlock, StagedBackbone, TokenStage, conv_grids, drop_path_rates

# one small variant per staged family (same code paths as the registered models)
STAGED = {
    "linvit_nano": {"depths": (1, 1, 2, 1)},
    "flatten_swin_tiny_patch4_224": {"embed_dim": 16, "depths": (1, 1, 2, 1), "num_heads": (1, 2, 2, 4)},
    "flatten_pvt_tiny": {"embed_dims": (16, 32, 40, 64), "depths": (1, 1, 1, 1)},
    "flatten_pvt_v2_b0": {"embed_dims": (16, 32, 40, 64), "depths": (1, 1, 1, 1)},
    "flatten_cswin_tiny_224": {"embed_dim": 16, "depths": (1, 1, 2, 1), "num_heads": (2, 2, 4, 4)},
}


def _small(name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{**STAGED[name], "img_size": 64, **kwargs}).eval()


@pytest.mark.parametrize("name", sorted(STAGED))
def test_every_hierarchical_family_is_a_staged_backbone(name):
    model = _small(name)
    assert isinstance(model, StagedBackbone)
    assert all(isinstance(stage, TokenStage) for stage in model.stage_modules())
    assert isinstance(timm.create_model("flatten_deit_tiny_patch16_224", depth=1), Backbone)


@pytest.mark.parametrize("name", sorted(STAGED))
def test_stage_grids_are_the_maps_the_stages_produce(name):
    model = _small(name)
    size = (64, 96)  # a multiple of every stride, so FLatten-Swin's grids (its linear window) equal its maps too
    with torch.no_grad():
        maps = model.forward_intermediates(torch.randn(1, 3, *size), intermediates_only=True)
    assert model.stage_grids(size) == [tuple(m.shape[-2:]) for m in maps]


@pytest.mark.parametrize("name", sorted(STAGED))
def test_set_input_size_resizes_every_table_to_its_stage_grid(name):
    model = _small(name, attn_layers="focused") if "cswin" not in name else _small(name)
    model.set_input_size((96, 128))
    for stage, grid in zip(model.stage_modules(), model.stage_grids((96, 128))):
        for module in stage.modules():
            if isinstance(module, FocusedLinearAttention) and module.positional_encoding is not None:
                assert module.pos_size == grid
                assert module.positional_encoding.shape[1] == grid[0] * grid[1]
    with pytest.raises(ValueError, match="cannot change its patch size"):
        model.set_input_size((96, 128), patch_size=8)


@pytest.mark.parametrize("name", sorted(STAGED))
def test_group_matcher_puts_every_parameter_in_a_group(name):
    model = _small(name)
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sum(len(names) for names in groups.values()) == len(list(model.parameters()))
    assert len(groups) >= len(timm.models.group_parameters(model, model.group_matcher(coarse=True))) > 2


@pytest.mark.parametrize("name", [n for n in sorted(STAGED) if "cswin" not in n])
@pytest.mark.parametrize("attention", ["softmax", "window", "hybrid", {"name": "linear", "dwc_kernel_size": 3}])
def test_one_vocabulary_for_every_family(name, attention):
    """The same names (and {name: ..., **kwargs} specs) build in every family whose blocks take any attention."""
    model = _small(name, attn_layers=("focused", attention, attention, "focused"))
    with torch.no_grad():
        assert model(torch.randn(1, 3, 50, 70)).shape == (1, 1000)
    kind = dict(attention) if isinstance(attention, dict) else {"name": attention}
    assert model.attn_layers[1] == kind["name"]


def test_families_reject_the_same_unknown_name_the_same_way():
    for name in STAGED:
        with pytest.raises(ValueError, match="Unknown attention 'performer'; valid names are focused"):
            _small(name, attn_layers="performer")
    with pytest.raises(ValueError, match="FlattenCSwin cannot build 'window' attention; its stages take focused"):
        _small("flatten_cswin_tiny_224", attn_layers="window")
    with pytest.raises(ValueError, match="FlattenDeiT cannot build 'window'"):
        timm.create_model("flatten_deit_tiny_patch16_224", depth=1, attn_layers="window")


def test_authors_letters_are_aliases():
    swin = _small("flatten_swin_tiny_patch4_224", attn_layers="LLSS")
    assert swin.attn_layers == ("focused", "focused", "window", "window")
    cswin = _small("flatten_cswin_tiny_224", attn_layers="LSLS")
    assert cswin.attn_layers == ("focused", "stripe", "focused", "stripe")


def test_token_stage_runs_blocks_on_tokens_with_checkpointing_and_resizes_tables():
    torch.manual_seed(0)
    blocks = [PreNormBlock.build(8, 2, "focused", {"pos_size": (3, 3)}) for _ in range(2)]
    stage = TokenStage(blocks, nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.LayerNorm(8))
    x = torch.randn(2, 4, 6, 10)
    expected = stage(x)
    assert expected.shape == (2, 8, 3, 5)
    stage.grad_checkpointing = True
    torch.testing.assert_close(stage(x), expected)
    stage.set_grid((3, 5))
    assert [block.attn.pos_size for block in stage.blocks] == [(3, 5), (3, 5)]
    assert sorted({key.split(".")[0] for key in stage.state_dict()}) == ["blocks", "downsample", "norm"]


def test_geometry_helpers():
    assert conv_grids((225, 97), 3, stem=(7, 4, 3), downsample=(3, 2, 1)) == [(57, 25), (29, 13), (15, 7)]
    assert conv_grids((225, 97), 2, stem=(1, 4, 0), downsample=(1, 2, 0)) == [(57, 25), (29, 13)]  # rounding up
    rates = drop_path_rates(0.3, (1, 2, 1))
    assert [len(stage) for stage in rates] == [1, 2, 1]
    assert sum(rates, []) == pytest.approx([0.0, 0.1, 0.2, 0.3])
