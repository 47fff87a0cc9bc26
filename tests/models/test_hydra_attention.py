"""The per-stage attention from the command line: ``python train.py model=linvit_tiny
model.attn_layers=[focused,focused,hybrid,window]``, through Hydra's compose API (as tests/train does)."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from train_helpers import compose

import linvit.models  # noqa: F401  (registers the models)


def _kinds(classifier) -> list[str]:
    stages = classifier.model.stage_modules()
    return [type(stage.blocks[0].attn).__name__ for stage in stages]


def test_the_readme_command_composes_for_linvit_tiny():
    cfg = compose(["model=linvit_tiny", "model.attn_layers=[focused,focused,hybrid,window]"])
    assert OmegaConf.to_container(cfg.model.attn_layers) == ["focused", "focused", "hybrid", "window"]
    assert cfg.model.model_name == "linvit_tiny"


def test_per_stage_names_and_specs_reach_the_model():
    overrides = ["model=linvit_nano", "model.attn_layers=[focused,{name:window,window_size:4},hybrid,softmax]"]
    classifier = instantiate(compose(overrides).model, _convert_="all")
    assert _kinds(classifier) == ["FocusedLinearAttention", "WindowAttention", "HybridAttention", "GlobalAttention"]
    assert classifier.model.stages[1].blocks[0].attn.window_size == (4, 4)
    # recorded once, with the other model arguments that export and resume read
    assert classifier.hparams["model_kwargs"]["attn_layers"][1] == {"name": "window", "window_size": 4}


def test_null_keeps_the_models_own_layout_and_other_families_take_the_same_names():
    classifier = instantiate(compose(["model=linvit_nano"]).model, _convert_="all")
    assert classifier.model.attn_layers == ("focused", "focused", "window", "window")
    swin = compose(["model=flatten_swin_tiny_patch4_224", "model.attn_layers=LLSS", "data.img_size=32"])
    small = {"img_size": 32, "embed_dim": 16, "num_heads": [1, 2, 2, 4]}
    model = instantiate(swin.model, _convert_="all", model_kwargs=small).model
    assert model.attn_layers == ("focused", "focused", "window", "window")


def test_a_wrong_name_is_explained_when_built():
    cfg = compose(["model=linvit_nano", "model.attn_layers=[focused,focused,windw,window]"])
    with pytest.raises(Exception, match="Unknown attention 'windw'; valid names are focused"):
        instantiate(cfg.model, _convert_="all")
