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
    # A second run replaces what linvit wrote without --force; inference picks DeiT from the keys alone. A file
    # linvit did not write there is refused without --force.
    assert main(["convert", str(src), str(dst)]) == 0
    dst.write_bytes(b"the user's own file")
    assert main(["convert", str(src), str(dst)]) == 1
    assert dst.read_bytes() == b"the user's own file"
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


# ----------------------------------------------------------------------------------------------------------------
# round trips against the authors' models: convert, reload with the printed load line, compare
# ----------------------------------------------------------------------------------------------------------------
def _round_trip(tmp_path, capsys, reference, img_size, flags=()):
    """Save ``reference``'s weights (the authors' layout) as their training file, convert it with ``flags``, reload
    the result with the load line convert printed, and the ``.pth`` directly with the recorded creation arguments;
    both give the authors' model's outputs (float64, 1e-6). Returns the recorded arguments and the printed text."""
    from safetensors import safe_open

    src, dst = tmp_path / "authors.pth", tmp_path / "converted.safetensors"
    _authors_file(src, reference.state_dict())
    assert main(["convert", str(src), str(dst), *flags]) == 0
    captured = capsys.readouterr()
    assert "resized" not in captured.err, captured.err
    load_line = next(line for line in captured.out.splitlines() if line.startswith("load it with: "))
    converted = eval(load_line.removeprefix("load it with: "), {"timm": timm}).eval()  # the line as printed
    with safe_open(str(dst), framework="pt") as handle:
        metadata = handle.metadata()
    model_args = json.loads(metadata.get("model_args", "{}"))
    overlay = {"file": str(src)}
    direct = timm.create_model(metadata["model"], pretrained=True, pretrained_cfg_overlay=overlay, **model_args).eval()
    x = torch.randn(1, 3, img_size, img_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference.double()(x)
        from_file, from_pth = converted.double()(x), direct.double()(x)
    assert expected.abs().max() > 0.1
    assert (from_file - from_pth).abs().max() <= 1e-6
    assert (from_file - expected).abs().max() <= 1e-6
    return metadata["model"], model_args, captured.out


def _seeded(module):
    from _flatten_testing import randomize

    return randomize(module).eval()


B0 = {"embed_dims": (32, 64, 160, 256), "depths": (2, 2, 2, 2), "num_heads": (1, 2, 5, 8), "mlp_ratios": (8, 8, 4, 4)}
PVT_T = {
    "embed_dims": (64, 128, 320, 512),
    "depths": (2, 2, 2, 2),
    "num_heads": (1, 2, 5, 8),
    "mlp_ratios": (8, 8, 4, 4),
}


@pytest.mark.parametrize(
    "name, options, img_size, expected",
    [
        ("flatten_pvt_v2_b0", {}, 256, {"img_size": 256}),
        # the authors' pooled form needs their ratios: its tables are the 7x7 grid of a 224 map reduced 8421
        ("flatten_pvt_v2_b0", {"linear": True, "la_sr_ratios": "8421"}, 224, {"linear": True}),
        ("flatten_pvt_v2_b0", {"la_sr_ratios": "8421"}, 320, {"la_sr_ratios": "8421", "img_size": 320}),
        ("flatten_pvt_tiny", {"la_sr_ratios": "8421"}, 256, {"la_sr_ratios": "8421", "img_size": 256}),
    ],
)
@pytest.mark.parametrize("with_model", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_pvt_sizes_and_options_are_inferred(
    tmp_path, yacs_module, capsys, name, options, img_size, expected, with_model
):
    """The authors' PVTv2-B0 at 256, with linear=True, with la_sr_ratios='8421' at 320, and PVT-T with '8421' at
    256: convert reads the size and the option from the weights (with --model, and finding the model without it),
    and the converted file gives the authors' outputs."""
    from _authors_pvt import AuthorsPvt, AuthorsPvtV2

    if name == "flatten_pvt_tiny":
        reference = AuthorsPvt(img_size, **PVT_T, **options)
    else:
        reference = AuthorsPvtV2(img_size, **B0, **options)
    flags = ["--model", name] if with_model else []
    found, model_args, out = _round_trip(tmp_path, capsys, _seeded(reference), img_size, flags)
    assert found == name and model_args == expected
    assert f"inferred from the weights' shapes: {', '.join(f'{k}={v!r}' for k, v in expected.items())}" in out


SWIN_SMALL = {"embed_dim": 16, "depths": [2, 2, 2, 2], "num_heads": [2, 2, 4, 4], "linear_window_size": 32}


def test_swin_training_size_is_inferred_with_model_kwargs(tmp_path, yacs_module, capsys):
    """A small FLatten-Swin (linear window 32, window 4) trained at 256: stage 2's table is its 32x32 map (28x28 at
    the default 224). The architecture comes from --model-kwargs, the size from the tables."""
    from _authors_swin import RefFLattenSwin

    reference = RefFLattenSwin(256, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10)
    kwargs = json.dumps({**SWIN_SMALL, "window_size": 4})
    flags = ["--model", "flatten_swin_tiny_patch4_224", "--model-kwargs", kwargs]
    _, model_args, out = _round_trip(tmp_path, capsys, _seeded(reference), 256, flags)
    assert model_args == {**SWIN_SMALL, "window_size": 4, "img_size": 256, "num_classes": 10}
    assert "inferred from the weights' shapes: img_size=256, num_classes=10" in out


@pytest.mark.parametrize(
    "name, img_size, expected",
    [
        ("flatten_pvt_tiny", 224, {"attn_layers": "LLSS"}),
        ("flatten_pvt_v2_b0", 256, {"attn_layers": "LLSS", "img_size": 256}),
    ],
)
def test_pvt_softmax_stages_are_inferred(tmp_path, yacs_module, capsys, name, img_size, expected):
    """The authors' PVT-T and PVTv2-B0 with attn_type 'LLSS' (PVT's softmax attention in stages 3-4): the filter's
    advice names attn_layers, convert follows it, and the converted file gives the authors' outputs."""
    from _authors_pvt import AuthorsPvt, AuthorsPvtV2

    if name == "flatten_pvt_tiny":
        reference = AuthorsPvt(img_size, **PVT_T, attn_type="LLSS")
    else:
        reference = AuthorsPvtV2(img_size, **B0, attn_type="LLSS")
    found, model_args, out = _round_trip(tmp_path, capsys, _seeded(reference), img_size, ["--model", name])
    assert found == name and model_args == expected
    assert "attn_layers='LLSS'" in out.split("inferred from the weights' shapes: ")[1].splitlines()[0]


def test_swin_mixed_stages_and_ape_are_inferred(tmp_path, yacs_module, capsys):
    """A small FLatten-Swin with the authors' mixed stage (LLMS1: stage 3's first block linear, the rest softmax)
    and their absolute position embedding, trained at 256: attn_layers and ape come from the filter's advice, the
    size from the tables; only the architecture is given."""
    from _authors_swin import RefFLattenSwin

    reference = RefFLattenSwin(
        256, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10, types="LLMS1", ape=True
    )
    kwargs = json.dumps({**SWIN_SMALL, "window_size": 4})
    flags = ["--model", "flatten_swin_tiny_patch4_224", "--model-kwargs", kwargs]
    _, model_args, out = _round_trip(tmp_path, capsys, _seeded(reference), 256, flags)
    inferred = {"attn_layers": "LLMS1", "ape": True, "img_size": 256, "num_classes": 10}
    assert model_args == {**SWIN_SMALL, "window_size": 4, **inferred}
    assert "attn_layers='LLMS1'" in out and "ape=True" in out


CSWIN_SMALL = {"embed_dim": 16, "depths": [1, 1, 2, 1], "num_heads": [2, 2, 4, 8], "split_size": [1, 2, 2, 2]}


@pytest.mark.parametrize(
    "given, inferred",
    [({"img_size": 64}, {"la_split_size": "8-4-2-1"}), ({"la_split_size": "8-4-2-1"}, {"img_size": 64})],
)
def test_cswin_stripes_or_size_are_inferred(tmp_path, yacs_module, capsys, given, inferred):
    """A small FLatten-CSwin with the authors' stripes 8-4 (two branches in both linear stages at 64, their 56-28 at
    448): given the size, convert finds the stripe widths; given the stripes, the size."""
    from _authors_cswin import AuthorsCSWin

    reference = AuthorsCSWin(64, num_classes=10, la_split_size=(8, 4, 2, 1), **CSWIN_SMALL)
    flags = ["--model", "flatten_cswin_tiny_224", "--model-kwargs", json.dumps({**CSWIN_SMALL, **given})]
    _, model_args, _ = _round_trip(tmp_path, capsys, _seeded(reference), 64, flags)
    assert model_args == {**CSWIN_SMALL, **given, **inferred, "num_classes": 10}


def test_cswin_attention_per_stage_is_inferred(tmp_path, yacs_module, capsys):
    """A small FLatten-CSwin whose third stage is linear too (attn_type 'LLLS'; linvit's default is 'LLSS'): the
    filter's advice names attn_layers and convert follows it."""
    from _authors_cswin import AuthorsCSWin

    reference = AuthorsCSWin(64, num_classes=10, attn_type="LLLS", **CSWIN_SMALL)
    flags = ["--model", "flatten_cswin_tiny_224", "--model-kwargs", json.dumps({**CSWIN_SMALL, "img_size": 64})]
    _, model_args, _ = _round_trip(tmp_path, capsys, _seeded(reference), 64, flags)
    assert model_args == {**CSWIN_SMALL, "img_size": 64, "attn_layers": "LLLS", "num_classes": 10}


@pytest.mark.slow
@pytest.mark.parametrize("stripes", [None, (56, 28, 14, 7)])
def test_published_cswin_tiny_at_448_round_trips_without_model(tmp_path, yacs_module, capsys, stripes):
    """FLatten-CSwin-T trained at 448, with the authors' stripes 56-28-14-7 (two branches in stages 1-2) or with
    stripes that are the maps (one branch): convert finds the model, the size and the stripes."""
    from _authors_cswin import AuthorsCSWin

    config = {"embed_dim": 64, "depths": (2, 4, 18, 1), "num_heads": (2, 4, 8, 16), "split_size": (1, 2, 7, 7)}
    reference = AuthorsCSWin(448, **config, la_split_size=stripes)
    name, model_args, _ = _round_trip(tmp_path, capsys, _seeded(reference), 448)
    expected = {"img_size": 448, **({"la_split_size": "56-28-14-7"} if stripes else {})}
    assert name == "flatten_cswin_tiny_224" and model_args == expected


@pytest.mark.slow
def test_published_swin_tiny_at_448_round_trips_without_model(tmp_path, yacs_module, capsys):
    from _authors_swin import RefFLattenSwin

    reference = RefFLattenSwin(448, 96, (2, 2, 6, 2), (3, 6, 12, 24), linear_window=56, window=7, num_classes=1000)
    name, model_args, _ = _round_trip(tmp_path, capsys, _seeded(reference), 448)
    assert name == "flatten_swin_tiny_patch4_224" and model_args == {"img_size": 448}


# ----------------------------------------------------------------------------------------------------------------
# a folder DST: model.safetensors + timm's config.json, loaded by timm's local-dir source with no other argument
# ----------------------------------------------------------------------------------------------------------------
def test_convert_to_a_folder_loads_with_local_dir(tmp_path, yacs_module, capsys):
    """The small FLatten-Swin trained at 256 (authors' layout) converted into a folder: config.json names the model
    and every creation argument (the inferred size and class count among them), and
    ``timm.create_model('local-dir:' + folder, pretrained=True)`` (also as the printed line) builds it with them and
    loads the weights through the family's filter unchanged: the authors' outputs, as the converted .pth gives."""
    from _authors_swin import RefFLattenSwin
    from safetensors import safe_open

    reference = _seeded(RefFLattenSwin(256, 16, (2, 2, 2, 2), (2, 2, 4, 4), linear_window=32, window=4, num_classes=10))
    src, folder = tmp_path / "authors.pth", tmp_path / "converted"
    _authors_file(src, reference.state_dict())
    name = "flatten_swin_tiny_patch4_224"
    kwargs = {**SWIN_SMALL, "window_size": 4}
    assert main(["convert", str(src), str(folder), "--model", name, "--model-kwargs", json.dumps(kwargs)]) == 0
    captured = capsys.readouterr()
    assert "resized" not in captured.err, captured.err
    assert sorted(p.name for p in folder.iterdir()) == [".linvit-written.json", "config.json", "model.safetensors"]
    model_args = {**kwargs, "img_size": 256, "num_classes": 10}

    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == name and config["model_args"] == model_args
    assert config["num_classes"] == 10 and config["num_features"] == 128
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [3, 256, 256] and cfg["num_classes"] == 10 and cfg["pool_size"] is None
    assert not {"file", "url", "hf_hub_id", "source", "architecture"} & set(cfg), cfg
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:  # as a .safetensors DST's
        metadata = handle.metadata()
    assert metadata["model"] == name and json.loads(metadata["model_args"]) == model_args

    load_line = next(line for line in captured.out.splitlines() if line.startswith("load it with: "))
    assert load_line == f"load it with: timm.create_model('local-dir:{folder}', pretrained=True)", load_line
    from_line = eval(load_line.removeprefix("load it with: "), {"timm": timm}).eval()  # the line as printed
    local = timm.create_model("local-dir:" + str(folder), pretrained=True).eval()
    direct = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(src)}, **model_args).eval()
    assert tuple(local.pretrained_cfg["input_size"]) == (3, 256, 256)
    for key, value in direct.state_dict().items():  # the filter passed the converted weights through as they are
        torch.testing.assert_close(local.state_dict()[key], value, rtol=0, atol=0, msg=key)
    x = torch.randn(1, 3, 256, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference.double()(x)
        outputs = [model.double()(x) for model in (local, from_line, direct)]
    assert expected.abs().max() > 0.1
    for output in outputs:
        assert (output - outputs[-1]).abs().max() <= 1e-6
        assert (output - expected).abs().max() <= 1e-6


def test_convert_folder_refusals_and_force(tmp_path, capsys):
    """A folder whose model.safetensors / config.json linvit did not write is refused without --force (and a file
    where a folder is named, even with it); --force replaces those two and leaves the rest; other files in it, an
    empty folder, or a path ending in '/', are written without it. predict and export take the folder as
    --checkpoint."""
    import numpy as np
    from PIL import Image

    torch.manual_seed(0)
    state = timm.create_model("linvit_nano", num_classes=10).state_dict()  # initialised: it computes finite outputs
    src = tmp_path / "trained.pth"
    torch.save(state, src)
    folder = tmp_path / "weights.v1"  # a suffix that is not a weight file's: a folder
    folder.mkdir()
    (folder / "README.md").write_text("mine\n")
    (folder / "config.json").write_text("{}\n")  # not linvit's
    assert main(["convert", str(src), str(folder), "--model", "linvit_nano"]) == 1
    err = capsys.readouterr().err
    assert "did not write" in err and "--force" in err and str(folder / "config.json") in err, err
    assert (folder / "config.json").read_text() == "{}\n" and not (folder / "model.safetensors").exists()
    assert main(["convert", str(src), str(folder), "--model", "linvit_nano", "--force"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        ".linvit-written.json",
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert (folder / "README.md").read_text() == "mine\n"
    assert json.loads((folder / "config.json").read_text())["model_args"] == {"num_classes": 10}

    empty = tmp_path / "empty.safetensors"  # an existing folder, whatever its name
    empty.mkdir()
    assert main(["convert", str(src), str(empty), "--model", "linvit_nano"]) == 0
    assert (empty / "model.safetensors").is_file() and (empty / "config.json").is_file()
    trailing = str(tmp_path / "new" / "nested") + "/"
    assert main(["convert", str(src), trailing, "--model", "linvit_nano"]) == 0
    out = capsys.readouterr().out
    assert f"timm.create_model('local-dir:{trailing}', pretrained=True)" in out, out
    model = timm.create_model("local-dir:" + trailing, pretrained=True)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)

    afile = tmp_path / "plainfile"
    afile.write_text("x")
    for extra in ([], ["--force"]):
        assert main(["convert", str(src), str(afile), "--model", "linvit_nano", *extra]) == 1
        assert "is a file, not a folder" in capsys.readouterr().err
    assert afile.read_text() == "x"

    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((40, 30, 3)) * 255).astype("uint8")).save(image)
    assert main(["predict", str(image), "--model", "linvit_nano", "--checkpoint", str(folder), "--topk", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["predict", str(image), "--model", "linvit_nano", "--checkpoint", str(tmp_path / "new")]) == 1
    assert "holds no model.safetensors" in capsys.readouterr().err
    from linvit.commands.export import _model_from_name  # export --model NAME --checkpoint FOLDER builds this

    options = {"trusted": False, "num_classes": None, "features_only": False}
    exported, source, _ = _model_from_name(
        types.SimpleNamespace(model="linvit_nano", checkpoint=str(folder), **options)
    )
    assert exported.num_classes == 10 and source.endswith("model.safetensors)"), source
    torch.testing.assert_close(exported.head.fc.weight, state["head.fc.weight"], rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------
# what the weights' keys and shapes settle without options, and the option a refusal names
# ----------------------------------------------------------------------------------------------------------------
def test_the_family_of_softmax_stages_is_recognised():
    """The authors' PVT-T with attn_type 'LLSS': the family filter refuses the default model (its stages 3-4 are
    linear); model inference follows the refusal's advice (attn_layers) instead of dropping the family."""
    from _authors_pvt import AuthorsPvt

    from linvit.commands.convert import _family_mapping

    state = AuthorsPvt(224, **PVT_T, attn_type="LLSS").state_dict()
    representative = timm.create_model("flatten_pvt_tiny", device="meta")
    mapped = _family_mapping("flatten_pvt_tiny", representative, state)
    assert mapped is not None and "stages.3.blocks.1.attn.qkv.weight" in mapped
    assert "stages.3.blocks.1.attn.scale" not in mapped  # softmax blocks have no focused scale


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flatten_pvt_tiny", "flatten_pvt_v2_b0"])
def test_pvt_softmax_stages_convert_without_model(tmp_path, yacs_module, capsys, name):
    """The authors' PVT-T and PVTv2-B0 with attn_type 'LLSS' convert without --model: the model and attn_layers
    come from the weights, and the converted file gives the authors' outputs."""
    from _authors_pvt import AuthorsPvt, AuthorsPvtV2

    if name == "flatten_pvt_tiny":
        reference = AuthorsPvt(224, **PVT_T, attn_type="LLSS")
    else:
        reference = AuthorsPvtV2(224, **B0, attn_type="LLSS")
    found, model_args, out = _round_trip(tmp_path, capsys, _seeded(reference), 224)
    assert found == name and model_args == {"attn_layers": "LLSS"}, (found, model_args)
    assert "inferred from the weights' shapes: attn_layers='LLSS'" in out


@pytest.mark.parametrize("with_model", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_swin_dwc_kernel_is_inferred(tmp_path, yacs_module, capsys, with_model):
    """A FLatten-Swin with a 3x3 DWC (the authors' layout): dwc_kernel_size=3 is read from the dwc weights' shape,
    with --model or without, and the converted weights load exactly with the printed arguments."""
    name = "flatten_swin_tiny_patch4_224"
    state = _random_state(name, dwc_kernel_size=3)
    src, dst = tmp_path / "swin_dwc3.pth", tmp_path / "swin_dwc3.safetensors"
    _authors_file(src, _to_authors_swin_layout(state))
    assert main(["convert", str(src), str(dst), *(["--model", name] if with_model else [])]) == 0
    out = capsys.readouterr().out
    assert "inferred from the weights' shapes: dwc_kernel_size=3" in out, out
    assert f"timm.create_model('{name}', pretrained=True, dwc_kernel_size=3, pretrained_cfg_overlay" in out, out
    model = timm.create_model(name, pretrained=True, dwc_kernel_size=3, pretrained_cfg_overlay={"file": str(dst)})
    assert model.layers[0].blocks[0].attn.dwc.weight.shape[-2:] == (3, 3)
    for key, value in model.state_dict().items():
        if key in state:
            torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)


def test_dwc_options_read_only_a_kernel_that_differs():
    from linvit.commands._checkpoint_fit import dwc_options

    swin = timm.create_model("flatten_swin_tiny_patch4_224", device="meta")
    assert dwc_options(swin, swin.state_dict()) == {}
    three = timm.create_model("flatten_swin_tiny_patch4_224", device="meta", dwc_kernel_size=3)
    assert dwc_options(swin, three.state_dict()) == {"dwc_kernel_size": 3}
    mixed = {**swin.state_dict(), "layers.0.blocks.0.attn.dwc.weight": torch.zeros(32, 1, 3, 3)}
    assert dwc_options(swin, mixed) == {}  # two kernel sizes: no single option builds it
    nano = timm.create_model("linvit_nano", device="meta")  # takes its kernel per stage in attn_layers
    assert dwc_options(nano, {"stages.0.blocks.0.attn.dwc.weight": torch.zeros(32, 1, 3, 3)}) == {}


def test_a_non_square_checkpoint_names_img_size(tmp_path, capsys):
    """PVTv2-B0 weights trained at 224x320: no square size fits their tables, so convert refuses in one line that
    names --img-size H W and sizes that fit every table; with --img-size 224 320 the weights convert exactly."""
    name = "flatten_pvt_v2_b0"
    state = _random_state(name, img_size=(224, 320))
    src = tmp_path / "wide.pth"
    torch.save(state, src)
    assert main(["convert", str(src), str(tmp_path / "a.safetensors"), "--model", name]) == 1
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1, err
    assert "non-square" in err and "--img-size H W" in err and "224 320" in err, err
    assert not (tmp_path / "a.safetensors").exists()
    dst = tmp_path / "b.safetensors"
    assert main(["convert", str(src), str(dst), "--model", name, "--img-size", "224", "320"]) == 0
    assert "img_size=[224, 320]" in capsys.readouterr().out
    model = timm.create_model(name, pretrained=True, img_size=(224, 320), pretrained_cfg_overlay={"file": str(dst)})
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_a_non_square_checkpoint_without_model_names_the_model_and_img_size(tmp_path, capsys):
    src = tmp_path / "wide.pth"
    torch.save(_random_state("flatten_pvt_tiny", img_size=(224, 320)), src)
    assert main(["convert", str(src), str(tmp_path / "a.safetensors")]) == 1
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1, err
    assert "--model flatten_pvt_tiny --img-size H W" in err and "224 320" in err, err


@pytest.mark.slow  # searches every registered model
def test_a_misfit_without_another_fitting_model_names_model_kwargs(tmp_path, capsys):
    src = tmp_path / "shallow.pth"
    torch.save(_random_state("flatten_pvt_v2_b0", depths=(1, 1, 1, 1)), src)
    assert main(["convert", str(src), str(tmp_path / "a.safetensors"), "--model", "flatten_pvt_v2_b0"]) == 1
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1 and "--model-kwargs" in err, err


def _error_lines(err: str) -> list[str]:
    """stderr less convert's progress lines (``[linvit convert i/n] ...``): the one error line a refusal prints."""
    return [line for line in err.strip().splitlines() if not line.startswith("[linvit ")]
