"""``linvit convert``: authors' training checkpoints -> safetensors that timm.create_model loads."""

from __future__ import annotations

import json
import sys
import types

import pytest
import timm
import torch

import linvit.models  # noqa: F401  (registers the models)
from linvit.cli import main


class CfgNode(dict):
    """Stands in for yacs's CfgNode, which the authors pickle into every checkpoint."""


CfgNode.__module__ = "yacs.config"


@pytest.fixture
def yacs_module(monkeypatch):
    module = types.ModuleType("yacs.config")
    module.CfgNode = CfgNode
    monkeypatch.setitem(sys.modules, "yacs", types.ModuleType("yacs"))
    monkeypatch.setitem(sys.modules, "yacs.config", module)


def _to_authors_swin_layout(state_dict):
    """linvit's FLatten-Swin keys -> the authors' (patch merging at the END of the previous stage, stored buffers)."""
    out = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if parts[0] == "layers" and parts[2] == "downsample":
            parts[1] = str(int(parts[1]) - 1)
        out[".".join(parts)] = value
        if key.endswith("relative_position_bias_table"):
            window = (int(value.shape[0] ** 0.5) + 1) // 2
            out[key.replace("relative_position_bias_table", "relative_position_index")] = torch.zeros(
                window**2, window**2, dtype=torch.long
            )
    return out


def _random_state(name, seed=0, **model_args):
    """Random weights for a registered model, without initialising a real model (built on meta)."""
    generator = torch.Generator().manual_seed(seed)
    meta = timm.create_model(name, device="meta", **model_args)
    return {
        k: (torch.randn(v.shape, generator=generator) * 0.02).to(v.dtype)
        if v.is_floating_point()
        else torch.zeros_like(v, device="cpu")
        for k, v in meta.state_dict().items()
    }


def _authors_file(path, state, ema_state=None):
    checkpoint = {
        "model": state,
        "optimizer": {"state": {}},
        "lr_scheduler": {"last_epoch": 0},
        "max_accuracy": 80.0,
        "epoch": 299,
        "config": CfgNode(MODEL=CfgNode(TYPE="flatten")),
    }
    if ema_state is not None:
        checkpoint["state_dict_ema"] = ema_state
    torch.save(checkpoint, path)


def test_convert_infers_swin_and_the_result_loads_through_timm(tmp_path, yacs_module, capsys):
    name = "flatten_swin_tiny_patch4_224"
    state = _random_state(name)
    src, dst = tmp_path / "flatten_swin_t.pth", tmp_path / "flatten_swin_t.safetensors"
    _authors_file(src, _to_authors_swin_layout(state))
    assert main(["convert", str(src), str(dst)]) == 0
    assert name in capsys.readouterr().out
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(dst)})
    for key, value in model.state_dict().items():
        if key in state:
            torch.testing.assert_close(value, state[key], msg=key)


def test_convert_deit_with_model_name_and_ema(tmp_path, yacs_module):
    name = "flatten_deit_tiny_patch16_224"
    regular, ema = _random_state(name, seed=1), _random_state(name, seed=2)
    src, dst = tmp_path / "deit.pth", tmp_path / "deit.safetensors"
    _authors_file(src, regular, ema)
    assert main(["convert", str(src), str(dst), "--model", name, "--ema"]) == 0
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(dst)})
    torch.testing.assert_close(model.blocks[3].attn.positional_encoding, ema["blocks.3.attn.positional_encoding"])
    # A second run refuses to overwrite without --force; inference picks DeiT from the keys alone.
    assert main(["convert", str(src), str(dst)]) == 2
    assert main(["convert", str(src), str(dst), "--force"]) == 0
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(dst)})
    torch.testing.assert_close(loaded.head.weight, regular["head.weight"])


def test_convert_reports_misfits_and_untrusted_files(tmp_path, capsys):
    src = tmp_path / "other.pth"
    torch.save({"model": {"encoder.weight": torch.zeros(3, 3)}}, src)
    assert main(["convert", str(src), str(tmp_path / "out.safetensors")]) == 1
    assert "No registered linvit model fits" in capsys.readouterr().err
    assert main(["convert", str(src), str(tmp_path / "o.safetensors"), "--model", "flatten_deit_tiny_patch16_224"]) == 1
    assert "do not fit flatten_deit_tiny_patch16_224" in capsys.readouterr().err

    class Payload:
        def __reduce__(self):
            return (print, ("payload ran",))

    evil = tmp_path / "evil.pth"
    torch.save({"model": {"x": torch.zeros(1)}, "config": Payload()}, evil)
    assert main(["convert", str(evil), str(tmp_path / "e.safetensors")]) == 1
    captured = capsys.readouterr()
    assert "trusted" in captured.err and "payload ran" not in captured.out


@pytest.mark.parametrize(
    "name, model_args",
    [
        ("linvit_nano", {"num_classes": 10}),
        ("linvit_nano", {"num_classes": 0, "in_chans": 1}),
        ("flatten_pvt_v2_b0", {"num_classes": 10}),
    ],
)
def test_convert_weights_with_another_class_or_channel_count(tmp_path, capsys, name, model_args):
    """linvit's own weights (or converted ones) for another class count: inferred, converted, and the printed load
    command creates the model they fit."""
    state = _random_state(name, **model_args)
    src, dst = tmp_path / "trained.pth", tmp_path / "trained.safetensors"
    torch.save(state, src)
    assert main(["convert", str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    expected = ", ".join(f"{key}={value}" for key, value in model_args.items())
    assert f"timm.create_model('{name}', pretrained=True, {expected}, pretrained_cfg_overlay" in out, out
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(dst)}, **model_args)
    assert model.state_dict().keys() == state.keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], msg=key)
    assert main(["convert", str(src), str(dst), "--force", "--model", name]) == 0


def test_convert_with_the_wrong_model_names_the_one_that_fits(tmp_path, capsys):
    src = tmp_path / "nano.pth"
    torch.save(_random_state("linvit_nano", num_classes=10), src)
    assert main(["convert", str(src), str(tmp_path / "out.safetensors"), "--model", "linvit_tiny"]) == 1
    err = capsys.readouterr().err
    assert "do not fit linvit_tiny" in err and "They fit linvit_nano created with num_classes=10" in err, err
    assert len(err) < 1500


def test_convert_keeps_the_training_size_and_resizes_only_when_asked(tmp_path, yacs_module, capsys):
    """A checkpoint trained at 448 keeps its tables: the size is inferred from them (recorded in the weights'
    metadata and the load line), or given with --img-size; --img-size 224 asks for a resize, which stderr reports."""
    from safetensors import safe_open

    name = "flatten_swin_tiny_patch4_224"
    state = _random_state(name, img_size=448)
    src = tmp_path / "swin448.pth"
    _authors_file(src, _to_authors_swin_layout(state))
    for extra in ([], ["--img-size", "448"]):
        dst = tmp_path / f"swin448{len(extra)}.safetensors"
        assert main(["convert", str(src), str(dst), "--model", name, *extra]) == 0
        captured = capsys.readouterr()
        assert f"timm.create_model('{name}', pretrained=True, img_size=448, pretrained_cfg_overlay" in captured.out
        assert ("inferred from the weights' shapes: img_size=448" in captured.out) == (not extra), captured.out
        assert "resized" not in captured.err
        with safe_open(str(dst), framework="pt") as handle:
            assert json.loads(handle.metadata()["model_args"]) == {"img_size": 448}
        model = timm.create_model(name, pretrained=True, img_size=448, pretrained_cfg_overlay={"file": str(dst)})
        for key, value in model.state_dict().items():
            if key in state:
                torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)
    dst = tmp_path / "swin224.safetensors"
    assert main(["convert", str(src), str(dst), "--model", name, "--img-size", "224"]) == 0
    captured = capsys.readouterr()
    assert "resized 2 positional" in captured.err and "--img-size" in captured.err, captured.err
    assert "img_size=224" in captured.out


@pytest.mark.parametrize(
    "name, options",
    [("flatten_pvt_v2_b0", {"linear": True}), ("flatten_pvt_tiny", {"la_sr_ratios": "8421"})],
)
def test_convert_checkpoints_built_with_options(tmp_path, yacs_module, capsys, name, options):
    """Weights of a model built with an option convert with --model-kwargs, exactly, and the load line passes it."""
    import json

    state = _random_state(name, **options)
    src, dst = tmp_path / "option.pth", tmp_path / "option.safetensors"
    _authors_file(src, state)
    kwargs = json.dumps(options)
    assert main(["convert", str(src), str(dst), "--model", name, "--model-kwargs", kwargs]) == 0
    out = capsys.readouterr().out
    expected = ", ".join(f"{key}={value!r}" for key, value in options.items())
    assert f"timm.create_model('{name}', pretrained=True, {expected}, pretrained_cfg_overlay" in out, out
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(dst)}, **options)
    for key, value in model.state_dict().items():
        if key in state:
            torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)
    assert main(["convert", str(src), str(tmp_path / "x.safetensors"), "--model-kwargs", kwargs]) == 1
    assert "--model NAME" in capsys.readouterr().err
    assert main(["convert", str(src), str(tmp_path / "y.safetensors"), "--model", name, "--model-kwargs", "{"]) == 1
    assert "not JSON" in capsys.readouterr().err
