"""Weights with NaN/Inf are named when they are loaded (an error by default; ``allow_non_finite`` loads them with a
warning), and ``linvit predict`` / ``linvit eval`` exit non-zero when the model computes NaN/Inf, instead of
``nan%`` and ``test/loss: NaN`` with exit status 0."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
import yaml
from _families import SHALLOW_KWARGS, smallest_variant_per_family
from PIL import Image
from safetensors.torch import save_file

from linvit.cli import main as linvit_main
from linvit.io import NonFiniteWeightsError, model_family


def _poison(state_dict: dict, count: int = 2) -> list[str]:
    """NaN in the first floating-point tensor, Inf in the last (``count`` = 2): their names."""
    names = [name for name, tensor in state_dict.items() if tensor.is_floating_point() and tensor.numel() > 1]
    state_dict[names[0]].view(-1)[0] = float("nan")
    state_dict[names[-1]].view(-1)[-1] = float("inf")
    return [names[0], names[-1]][:count]


def _weights_file(tmp_path, name: str, **kwargs):
    model = timm.create_model(name, **kwargs)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    poisoned = _poison(state)
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    return path, poisoned


@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_every_family_names_non_finite_weights_at_load(tmp_path, name):
    shallow = SHALLOW_KWARGS.get(model_family(name) or "", {})
    path, poisoned = _weights_file(tmp_path, name, **shallow)
    load = {"pretrained": True, "pretrained_cfg_overlay": {"file": str(path)}, **shallow}
    with pytest.raises(NonFiniteWeightsError) as error:
        timm.create_model(name, **load)
    message = str(error.value)
    assert str(path) in message and all(tensor in message for tensor in poisoned), message
    assert "1 NaN" in message and "1 Inf" in message and "allow_non_finite=True" in message
    with pytest.warns(UserWarning, match=poisoned[0]):  # the documented opt-out
        model = timm.create_model(name, allow_non_finite=True, **load)
    assert torch.isnan(model.state_dict()[poisoned[0]]).any()


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "image.png"
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype("uint8")).save(path)
    return str(path)


@pytest.mark.parametrize("model_name", ["linvit_nano", "test_resnet"])  # a linvit family, and a timm model
def test_predict_names_non_finite_weights_and_never_prints_nan(tmp_path, capsys, image, model_name):
    path, poisoned = _weights_file(tmp_path, model_name, num_classes=10)
    command = ["predict", image, "--model", model_name, "--checkpoint", str(path)]
    assert linvit_main(command) == 1
    captured = capsys.readouterr()
    assert poisoned[0] in captured.err and "--allow-non-finite" in captured.err and "nan" not in captured.out
    with pytest.warns(UserWarning, match="NaN/Inf"):
        assert linvit_main([*command, "--allow-non-finite"]) == 1
    captured = capsys.readouterr()
    assert "computed NaN/Inf" in captured.err and "nan" not in captured.out.lower(), captured


def _run_dir(tmp_path, poison: bool):
    from linvit.train.modules.classification import ImageClassifier

    torch.manual_seed(0)
    module = ImageClassifier("linvit_nano", num_classes=10, model_kwargs={"img_size": 16}, ema={"enabled": False})
    state = {key: value.clone() for key, value in module.state_dict().items()}
    poisoned = _poison(state, count=1) if poison else []
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    data = {"_target_": "linvit.train.data.datamodules.DigitsDataModule", "img_size": 16, "eval_batch_size": 512}
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": state}, run / "checkpoints" / "best.ckpt")
    return run, poisoned


def test_eval_names_non_finite_weights_and_exits_non_zero_on_non_finite_outputs(tmp_path, capsys):
    run, poisoned = _run_dir(tmp_path, poison=True)
    command = ["eval", str(run), "--accelerator", "cpu", "--json"]
    assert linvit_main(command) == 2
    err = capsys.readouterr().err
    assert poisoned[0] in err and "best.ckpt" in err and "--allow-non-finite" in err, err
    with pytest.warns(UserWarning, match="NaN/Inf"):
        assert linvit_main([*command, "--allow-non-finite"]) == 1
    captured = capsys.readouterr()
    assert "computed NaN/Inf on the test split" in captured.err and "test/loss=nan" in captured.err
    assert "acc1" not in captured.out, "no metrics are reported"


def test_export_names_non_finite_weights(tmp_path, capsys):
    run, poisoned = _run_dir(tmp_path, poison=True)
    command = ["export", str(run), "--out", str(tmp_path / "out")]
    assert linvit_main(command) == 2
    err = capsys.readouterr().err
    assert poisoned[0].removeprefix("model.") in err and "--allow-non-finite" in err, err
    assert not (tmp_path / "out" / "model.safetensors").exists()
    with pytest.warns(UserWarning, match="NaN/Inf"):
        assert linvit_main([*command, "--allow-non-finite"]) == 0
