"""Run directories, checkpoints and config.json files from strangers build nothing outside linvit's allow-list.

Each attack writes a file when it succeeds; the tests check that the command refuses, names the key and the opt-in,
and that the file was never written. With the opt-in the same attack runs, which shows it was the check that held.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from linvit.cli import main as linvit_main
from linvit.train.runs.checkpoint_hparams import check_classifier_hparams
from linvit.train.runs.hydra_app import config_dir
from linvit.train.runs.run import resolve_ckpt_path
from linvit.utils.saved_config import (
    TRUSTED_TARGETS,
    UntrustedConfigError,
    check_model_arguments,
    check_targets,
)

REPO = Path(__file__).resolve().parents[2]

HPARAMS = {"model_name": "linvit_nano", "num_classes": 10, "in_chans": 3, "model_kwargs": {"img_size": 32}}


def _run_dir(tmp_path: Path, data: dict, hparams: dict | None = None) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    torch.save({"hyper_parameters": hparams or HPARAMS, "state_dict": {}}, run / "checkpoints" / "best.ckpt")
    return run


def _open_for_writing(target: Path) -> dict:
    """A config node that Hydra would turn into ``open(target, "w")``: creates the file. (Its arguments are keywords:
    ``_args_`` is itself refused when a run's config.yaml is read, see test_trust_configs.py.)"""
    return {"_target_": "builtins.open", "file": str(target), "mode": "w"}


def test_eval_refuses_a_data_target_outside_the_allow_list(tmp_path, capsys):
    victim = tmp_path / "written_by_the_config"
    run = _run_dir(tmp_path, _open_for_writing(victim))
    assert linvit_main(["eval", str(run), "--accelerator", "cpu"]) == 1  # refused as config.yaml is read back
    err = capsys.readouterr().err
    assert "data._target_='builtins.open'" in err and "--trusted" in err and str(run / "config.yaml") in err
    assert not victim.exists()


def test_eval_with_trusted_builds_what_the_config_names(tmp_path):
    victim = tmp_path / "written_by_the_config"
    run = _run_dir(tmp_path, _open_for_writing(victim))
    with pytest.raises(Exception):  # noqa: B017 - a file object is no DataModule; only the side effect matters
        linvit_main(["eval", str(run), "--accelerator", "cpu", "--trusted"])
    assert victim.exists()


def test_eval_refuses_a_nested_target_inside_an_allowed_datamodule(tmp_path, capsys):
    victim = tmp_path / "written_by_the_config"
    data = {"_target_": "linvit.train.data.datamodules.DigitsDataModule", "extra": _open_for_writing(victim)}
    assert linvit_main(["eval", str(_run_dir(tmp_path, data)), "--accelerator", "cpu"]) == 1
    assert "data.extra._target_" in capsys.readouterr().err
    assert not victim.exists()


def _allowed_class_that_opens(victim: Path, which: str) -> dict:
    """An allow-listed class as an argument, with arguments that open ``victim`` (the issue's two examples)."""
    if which == "segmentation_checkpoint":
        return {
            "_target_": "linvit.train.modules.segmentation.SegmentationModule",
            "backbone": "linvit_nano",
            "num_classes": 2,
            "checkpoint": str(victim),
        }
    return {
        "_target_": "linvit.train.modules.classification.ImageClassifier",
        "model_name": "linvit_nano",
        "num_classes": 10,
        "pretrained": True,
        "model_kwargs": {"pretrained_cfg_overlay": {"file": str(victim)}},
    }


@pytest.mark.parametrize("which", ["segmentation_checkpoint", "classifier_pretrained_file"])
def test_eval_builds_only_the_top_level_datamodule_not_an_allowed_class_below_it(tmp_path, capsys, monkeypatch, which):
    victim = tmp_path / "victim.pth"
    torch.save({"weights": torch.zeros(1)}, victim)
    opened = []
    real_open = Path.open

    def watch(path, *args, **kwargs):
        if Path(path).resolve() == victim.resolve():
            opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Path, "open", watch)
    monkeypatch.setattr(torch, "load", lambda *a, **k: opened.append(a) or {})
    data = {
        "_target_": "linvit.train.data.datamodules.DigitsDataModule",
        "extra": _allowed_class_that_opens(victim, which),
    }
    assert linvit_main(["eval", str(_run_dir(tmp_path, data)), "--accelerator", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "data.extra._target_" in err and "--trusted" in err, err
    assert not opened


def test_eval_refuses_a_model_class_as_the_datamodule(tmp_path, capsys):
    data = _allowed_class_that_opens(tmp_path / "victim.pth", "classifier_pretrained_file")
    assert linvit_main(["eval", str(_run_dir(tmp_path, data)), "--accelerator", "cpu"]) == 1
    assert "data._target_='linvit.train.modules.classification.ImageClassifier'" in capsys.readouterr().err


def test_a_target_in_checkpoint_hyperparameters_is_refused_even_when_allow_listed(tmp_path):
    nested = {"_target_": "linvit.train.data.datamodules.DigitsDataModule"}
    with pytest.raises(UntrustedConfigError, match=r"hyper_parameters\.model_kwargs\.act_layer\._target_"):
        check_classifier_hparams({**HPARAMS, "model_kwargs": {"act_layer": nested}}, "x.ckpt")
    ckpt = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {"data": nested}, "state_dict": {}}, ckpt)
    cfg = OmegaConf.create({"ckpt_path": str(ckpt), "resume": True, "paths": {"output_dir": str(tmp_path)}})
    with pytest.raises(UntrustedConfigError, match=r"hyper_parameters\.data\._target_"):
        resolve_ckpt_path(cfg)


@pytest.mark.parametrize(
    "hparams, named",
    [
        ({**HPARAMS, "_instantiator": "builtins.exec"}, "hyper_parameters._instantiator"),
        ({**HPARAMS, "model_name": "local-dir:/somewhere"}, "local-dir:/somewhere"),
        ({**HPARAMS, "model_name": "no_such_model"}, "no_such_model"),
        ({**HPARAMS, "model_kwargs": {"checkpoint_path": "/tmp/x.pth"}}, "checkpoint_path"),
        ({**HPARAMS, "model_kwargs": {"pretrained_cfg_overlay": {"url": "http://x"}}}, "pretrained_cfg_overlay"),
        (
            {**HPARAMS, "model_kwargs": {"act_layer": {"_target_": "os.system"}}},
            "hyper_parameters.model_kwargs.act_layer._target_",
        ),
    ],
)
@pytest.mark.parametrize("command", ["eval", "export"])
def test_checkpoint_hyperparameters_that_load_or_call_are_refused(tmp_path, capsys, command, hparams, named):
    digits = {"_target_": "linvit.train.data.datamodules.DigitsDataModule"}
    run = _run_dir(tmp_path, digits, hparams)
    extra = ["--out", str(tmp_path / "out")] if command == "export" else []
    assert linvit_main([command, str(run), *extra]) == 2
    err = capsys.readouterr().err
    assert named in err and "--trusted" in err
    assert not (tmp_path / "out").exists()


def test_predict_refuses_model_arguments_that_load_files(tmp_path, capsys):
    from PIL import Image

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")  # never read: the config is refused first
    config = {"architecture": "linvit_nano", "model_args": {"checkpoint_path": str(tmp_path / "evil.pth")}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    image = tmp_path / "x.png"
    Image.new("RGB", (32, 32)).save(image)
    assert linvit_main(["predict", str(image), "--model", "linvit_nano", "--checkpoint", str(weights)]) == 1
    err = capsys.readouterr().err
    assert "checkpoint_path" in err and "--trusted" in err and "config.json" in err


def test_resume_refuses_a_checkpoint_whose_hyperparameters_name_a_callable(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {"data": {"_target_": "builtins.open"}}, "state_dict": {}}, ckpt)
    cfg = OmegaConf.create({"ckpt_path": str(ckpt), "resume": True, "paths": {"output_dir": str(tmp_path)}})
    with pytest.raises(UntrustedConfigError, match=r"hyper_parameters\.data\._target_.*trust_checkpoint=true"):
        resolve_ckpt_path(cfg)
    assert resolve_ckpt_path(OmegaConf.merge(cfg, {"trust_checkpoint": True})) == str(ckpt)


def test_own_configs_and_checkpoint_hyperparameters_pass():
    check_classifier_hparams(HPARAMS, "x.ckpt")
    check_model_arguments(None, {"img_size": 64, "drop_path_rate": 0.1}, "config.json")
    check_targets({"_target_": "linvit.train.data.datamodules.ImageFolderDataModule"}, "config.yaml", prefix="data")


def test_an_interpolated_target_is_not_trusted():
    config = OmegaConf.create({"data": {"_target_": "${oc.env:SOME_TARGET}"}})
    with pytest.raises(UntrustedConfigError, match=r"data\._target_"):
        check_targets(config, "config.yaml")


def test_every_data_and_model_config_of_the_project_is_in_the_allow_list():
    """A new DataModule or LightningModule config must join TRUSTED_TARGETS, or `linvit eval` would refuse its runs."""
    targets = set()
    for group in ("data", "model"):
        for path in (config_dir() / group).glob("*.yaml"):
            node = yaml.safe_load(path.read_text()) or {}
            if "_target_" in node:
                targets.add(node["_target_"])
    assert targets and targets <= TRUSTED_TARGETS, sorted(targets - TRUSTED_TARGETS)
