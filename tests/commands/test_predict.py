"""`linvit predict`: top-k with labels from config.json, safetensors metadata or ImageNet."""

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from linvit.cli import main
from linvit.commands.predict import predict


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(0).random((40, 30, 3)) * 255).astype("uint8")).save(path)
    return str(path)


def _digits_model():
    torch.manual_seed(0)
    return timm.create_model("linvit_nano", in_chans=1, num_classes=10)


def _expected_top(model, image, k):
    """Reference: the same preprocessing written out (greyscale, resize + centre crop at 224, /255, normalise)."""
    cfg = timm.data.resolve_data_config(model=model)
    mean, std = sum(cfg["mean"]) / 3, sum(cfg["std"]) / 3
    transform = timm.data.create_transform(**dict(cfg, mean=(mean,), std=(std,)))
    with Image.open(image) as img:
        x = transform(img.convert("L")).unsqueeze(0)
    with torch.no_grad():
        probs = model.eval()(x).softmax(-1)[0]
    values, indices = probs.topk(k)
    return indices.tolist(), values.tolist()


def test_labels_from_safetensors_metadata(tmp_path, image):
    model = _digits_model()
    names = [f"digit-{i}" for i in range(10)]
    weights = tmp_path / "weights.safetensors"
    save_file(model.state_dict(), str(weights), metadata={"label_names": json.dumps(names)})
    results = predict(image, "linvit_nano", str(weights), topk=5)
    indices, probs = _expected_top(model, image, 5)
    assert [r[0] for r in results] == indices
    np.testing.assert_allclose([r[1] for r in results], probs, rtol=1e-4)
    assert [r[2] for r in results] == [names[i] for i in indices]


def test_labels_and_args_from_config_json(tmp_path, image):
    model = _digits_model()
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    config = {
        "architecture": "linvit_nano",
        "num_classes": 10,
        "model_args": {"in_chans": 1},
        "pretrained_cfg": {"mean": [0.5], "std": [0.5], "input_size": [1, 32, 32], "crop_pct": 1.0},
        "label_names": [str(i) for i in range(10)],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    results = predict(image, "linvit_nano", str(tmp_path / "model.safetensors"), topk=3)
    assert len(results) == 3
    assert all(label == str(index) for index, _, label in results)
    assert results[0][1] >= results[1][1] >= results[2][1]


def test_cli_prints_imagenet_labels_without_checkpoint(image, capsys):
    assert main(["predict", image, "--model", "linvit_nano", "--topk", "5"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 5 and lines[0].startswith("1.")
    assert "%" in lines[0] and "class" in lines[0]
    assert len(lines[0].split("  ")) >= 3  # an ImageNet label follows the class index
    assert "random weights" in captured.err


def test_cli_state_dict_without_labels(tmp_path, image, capsys):
    model = _digits_model()
    torch.save(model.state_dict(), tmp_path / "plain.pth")
    assert main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(tmp_path / "plain.pth")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    indices, _ = _expected_top(model, image, 5)
    assert [int(line.split("class")[1].split()[0]) for line in lines] == indices


def test_cli_reports_missing_files(tmp_path, image, capsys):
    assert main(["predict", str(tmp_path / "missing.png"), "--model", "linvit_nano"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(tmp_path / "none.pth")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_cli_unknown_model(image, capsys):
    assert main(["predict", image, "--model", "not_a_model_xyz"]) == 1
    assert "linvit models" in capsys.readouterr().err


@pytest.mark.parametrize("model_name, with_config", [("linvit_nano", True), ("linvit_nano", False), ("resnet18", True)])
def test_cli_names_a_truncated_safetensors_file(tmp_path, image, capsys, model_name, with_config):
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10)
    weights = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(weights))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    if with_config:
        # classes and channels known: the weights are read once, by the model's loader (timm's, for resnet18)
        config = {"architecture": model_name, "num_classes": 10, "model_args": {"in_chans": 3}}
        (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["predict", image, "--model", model_name, "--checkpoint", str(weights)]) == 1
    err = capsys.readouterr().err
    assert str(weights) in err and "truncated or corrupt" in err, err
    assert "Traceback" not in err


def test_model_args_recorded_by_convert_build_the_model(tmp_path, image):
    """Weights `linvit convert` wrote carry their creation arguments (training size, options) in the safetensors
    metadata: predict builds the model with them, so the tables load as trained instead of being resized."""
    from linvit.commands.predict import read_side_config
    from linvit.utils.saved_config import UntrustedConfigError

    torch.manual_seed(0)
    model = timm.create_model("flatten_pvt_v2_b0", img_size=256, num_classes=7).eval()
    weights = tmp_path / "converted.safetensors"
    save_file(model.state_dict(), str(weights), metadata={"model_args": json.dumps({"img_size": 256})})
    assert read_side_config(weights, "flatten_pvt_v2_b0") == {"model_args": {"img_size": 256}}
    cfg = timm.data.resolve_data_config(model=model)
    with Image.open(image) as img:
        x = timm.data.create_transform(**cfg)(img.convert("RGB")).unsqueeze(0)
    with torch.no_grad():
        values, indices = model(x).softmax(-1)[0].topk(3)
    results = predict(image, "flatten_pvt_v2_b0", str(weights), topk=3)
    assert [r[0] for r in results] == indices.tolist()
    np.testing.assert_allclose([r[1] for r in results], values.tolist(), rtol=1e-4)

    loading = tmp_path / "loading.safetensors"
    overlay = {"pretrained_cfg_overlay": {"file": "other.pth"}}
    save_file(model.state_dict(), str(loading), metadata={"model_args": json.dumps(overlay)})
    with pytest.raises(UntrustedConfigError):
        read_side_config(loading, "flatten_pvt_v2_b0")
    assert read_side_config(loading, "flatten_pvt_v2_b0", trusted=True) == {"model_args": overlay}
