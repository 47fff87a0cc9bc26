"""`linvit predict` on many images (files, folders, globs) in batches, CSV/JSON output, and the model named by the
checkpoint's own config (config.json, a converted file's metadata, a training run) instead of --model."""

from __future__ import annotations

import csv
import io
import json
import os

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from linvit.cli import main
from linvit.commands._image_inputs import expand_images
from linvit.commands.predict import predict

LABELS = ["cat", "dog", "fox", "owl"]
CONFIG = {
    "architecture": "linvit_nano",
    "num_classes": 4,
    "model_args": {"img_size": 32},
    "pretrained_cfg": {"input_size": [3, 32, 32], "crop_pct": 1.0},
    "label_names": LABELS,
}


def _image(path, seed: int, size=(40, 30)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = (np.random.default_rng(seed).random((*size, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(path)
    return str(path)


@pytest.fixture
def weights(tmp_path):
    """A folder as `linvit export` writes it: model.safetensors + config.json naming the model (4 classes, 32 px)."""
    torch.manual_seed(0)
    folder = tmp_path / "weights"
    folder.mkdir()
    save_file(
        timm.create_model("linvit_nano", num_classes=4, img_size=32).state_dict(), str(folder / "model.safetensors")
    )
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


@pytest.fixture
def images(tmp_path):
    """imgs/{0,1,2}.png, imgs/sub/{3,4}.jpg, a text file, a hidden file and a link back to imgs/ (a loop)."""
    root = tmp_path / "imgs"
    for index, name in enumerate(["0.png", "1.png", "2.png", "sub/3.jpg", "sub/4.jpg"]):
        _image(root / name, seed=index)
    (root / "notes.txt").write_text("not an image")
    (root / ".hidden.png").write_bytes(b"passed over")
    os.symlink("..", root / "sub" / "loop")
    return root


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# ------------------------------------------------------------------------------------------------ many images
def test_a_folder_gives_one_csv_row_per_image_in_sorted_order(tmp_path, weights, images, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "imgs", "--checkpoint", "weights", "--format", "csv", "--topk", "2"]) == 0
    captured = capsys.readouterr()
    rows = _csv_rows(captured.out)
    expected = [os.path.join("imgs", name) for name in ["0.png", "1.png", "2.png", "sub/3.jpg", "sub/4.jpg"]]
    assert [row["path"] for row in rows] == expected  # the loop was not followed, the text and hidden files not taken
    assert list(rows[0]) == ["path", "class_1", "label_1", "probability_1", "class_2", "label_2", "probability_2"]
    for row in rows:  # each row is that image's own prediction
        alone = predict(row["path"], None, "weights", topk=2)
        assert [int(row["class_1"]), int(row["class_2"])] == [index for index, _, _ in alone]
        assert [row["label_1"], row["label_2"]] == [label for _, _, label in alone]
        np.testing.assert_allclose([float(row["probability_1"]), float(row["probability_2"])],
                                   [p for _, p, _ in alone], rtol=1e-4)  # fmt: skip
    assert "imgs/notes.txt" in captured.err and "not images" in captured.err
    assert "loop" in captured.err and "not followed" in captured.err


def test_batches_give_what_one_image_at_a_time_gives(weights, images, capsys):
    outputs = []
    for batch_size in ("1", "4"):
        assert main(["predict", str(images), "--checkpoint", str(weights), "--json", "--batch-size", batch_size]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    one, four = outputs
    assert [record["path"] for record in one] == [record["path"] for record in four] and len(one) == 5
    for a, b in zip(one, four):
        assert [t["class"] for t in a["top"]] == [t["class"] for t in b["top"]]
        np.testing.assert_allclose(
            [t["probability"] for t in a["top"]], [t["probability"] for t in b["top"]], rtol=1e-4
        )
    assert len({record["top"][0]["probability"] for record in one}) == 5, "each image has its own prediction"


def test_a_quoted_glob_is_expanded_by_linvit_and_files_mix_with_it(tmp_path, weights, images, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["predict", "imgs/*.png", "imgs/sub/4.jpg", "--checkpoint", "weights", "--json", "--topk", "1"]
    assert main(args) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["path"] for r in records] == ["imgs/0.png", "imgs/1.png", "imgs/2.png", "imgs/sub/4.jpg"]
    assert all(len(r["top"]) == 1 and r["top"][0]["label"] in LABELS for r in records)
    assert main(["predict", "imgs/*.gif", "--checkpoint", "weights"]) == 1
    err = capsys.readouterr().err
    assert "no images in 'imgs/*.gif' ('imgs/*.gif' matches no file)" in _one_error(err)
    assert main(["predict", "imgs/notes.*", "--checkpoint", "weights"]) == 1
    assert "'imgs/notes.txt'" in _one_error(capsys.readouterr().err)  # the file it found is not an image


def test_several_images_as_text_name_each_path(weights, images, capsys):
    first, second = str(images / "0.png"), str(images / "1.png")
    assert main(["predict", first, second, "--checkpoint", str(weights), "--topk", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == first and lines[4] == second and len(lines) == 8
    assert lines[1].startswith("  1.") and lines[1].split()[-1] in LABELS


def test_an_unreadable_image_is_skipped_with_a_warning_or_stops_with_bad_files_error(weights, images, capsys):
    bad = images / "sub" / "broken.png"
    bad.write_bytes(b"not a png at all")
    assert main(["predict", str(images), "--checkpoint", str(weights), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert len(_csv_rows(captured.out)) == 5 and str(bad) not in captured.out
    assert f"warning: skipped: cannot read image '{bad}'" in captured.err
    assert main(["predict", str(images), "--checkpoint", str(weights), "--bad-files", "error"]) == 1
    captured = capsys.readouterr()
    assert str(bad) in _one_error(captured.err) and captured.out == ""
    assert main(["predict", str(bad), str(images / "missing.png"), "--checkpoint", str(weights)]) == 1
    assert "none of the 2 images could be read" in _one_error(capsys.readouterr().err)


def test_progress_goes_to_stderr_in_lines_when_it_is_not_a_terminal(weights, images, capsys):
    assert main(["predict", str(images), "--checkpoint", str(weights), "--batch-size", "2", "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert "predict: 5/5 images (100%)" in captured.err and "predict:" not in captured.out
    assert main(["predict", str(images), "--checkpoint", str(weights), "--format", "csv"]) == 0  # one batch
    assert "predict:" not in capsys.readouterr().err


def test_the_number_of_images_is_bounded(weights, images, capsys):
    assert main(["predict", str(images), "--checkpoint", str(weights), "--max-images", "3"]) == 1
    assert "--max-images" in _one_error(capsys.readouterr().err)


def test_expand_images_walks_each_folder_once_and_never_round_a_loop(tmp_path, images):
    os.symlink(images / "sub", tmp_path / "sub_again")
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink(tmp_path / "a" / "b" / "c", tmp_path / "a" / "b" / "c")  # a link to itself: ELOOP
    found = expand_images([str(images), str(images / "0.png"), str(tmp_path / "sub_again"), str(tmp_path / "a")])
    assert [os.path.relpath(p, images) for p in found.paths] == ["0.png", "1.png", "2.png", "sub/3.jpg", "sub/4.jpg"]
    assert not found.single_file
    assert expand_images([str(images / "0.png")]).single_file


# ------------------------------------------------------------------------------------------------ output files
def test_output_is_written_through_linvit_and_never_replaces_what_it_did_not_write(weights, images, tmp_path, capsys):
    out = tmp_path / "predictions.csv"
    command = ["predict", str(images), "--checkpoint", str(weights), "--format", "csv", "--output", str(out)]
    assert main(command) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"to {out}" in captured.err
    assert len(_csv_rows(out.read_text())) == 5
    assert main(command) == 0  # its own file: replaced without --force
    capsys.readouterr()
    mine = tmp_path / "mine.csv"
    mine.write_text("my own notes\n")
    assert main([*command[:-1], str(mine)]) == 1
    assert "--force" in _one_error(capsys.readouterr().err) and mine.read_text() == "my own notes\n"
    assert main([*command[:-1], str(mine), "--force"]) == 0
    assert _csv_rows(mine.read_text())[0]["path"] == str(images / "0.png")
    for an_input in (images / "1.png", weights / "config.json"):
        before = an_input.read_bytes()
        assert main([*command[:-1], str(an_input), "--force"]) == 1
        assert "it is the input" in _one_error(capsys.readouterr().err) and an_input.read_bytes() == before


# ------------------------------------------------------------------------------------------------ the model's name
def test_the_model_comes_from_config_json(weights, images, capsys):
    image = str(images / "2.png")
    assert main(["predict", image, "--checkpoint", str(weights), "--topk", "4"]) == 0
    without = capsys.readouterr().out
    assert main(["predict", image, "--checkpoint", str(weights), "--topk", "4", "--model", "linvit_nano"]) == 0
    assert capsys.readouterr().out == without and len(without.splitlines()) == 4
    assert {line.split()[-1] for line in without.splitlines()} == set(LABELS)


def test_the_model_comes_from_the_metadata_linvit_convert_writes(tmp_path, images):
    torch.manual_seed(0)
    model = timm.create_model("linvit_nano", num_classes=3, img_size=32).eval()
    weights = tmp_path / "converted.safetensors"
    metadata = {"model": "linvit_nano", "model_args": json.dumps({"img_size": 32})}
    save_file(model.state_dict(), str(weights), metadata=metadata)
    image = str(images / "0.png")
    x = timm.data.create_transform(**timm.data.resolve_data_config(model=model))(Image.open(image).convert("RGB"))
    with torch.no_grad():
        reference = model(x.unsqueeze(0)).softmax(-1)[0]
    results = predict(image, None, str(weights), topk=3)
    assert [index for index, _, _ in results] == reference.argsort(descending=True).tolist()
    np.testing.assert_allclose([p for _, p, _ in results], reference.sort(descending=True).values, rtol=1e-4)


@pytest.mark.parametrize(
    "architecture",
    ["not_a_model_xyz", "hf-hub:someone/model", "local-dir:/tmp", "resnet18.a1_in1k", 42, ["linvit_nano"]],
)
def test_a_name_in_config_json_picks_only_a_registered_architecture(weights, images, capsys, architecture):
    (weights / "config.json").write_text(json.dumps(dict(CONFIG, architecture=architecture)))
    for trust in ([], ["--trusted"]):  # trust lets the arguments through, never another source of weights
        assert main(["predict", str(images / "0.png"), "--checkpoint", str(weights), *trust]) == 1
        line = _one_error(capsys.readouterr().err)
        assert str(weights / "config.json") in line and "architecture=" in line and "--model" in line, line


def test_a_named_model_still_takes_only_allowed_arguments(weights, images, capsys):
    config = dict(CONFIG, model_args={"img_size": 32, "pretrained": True})
    (weights / "config.json").write_text(json.dumps(config))
    assert main(["predict", str(images / "0.png"), "--checkpoint", str(weights)]) == 1
    line = _one_error(capsys.readouterr().err)
    assert "model_args.pretrained" in line and "config.json" in line


def test_without_a_name_anywhere_one_line_says_to_pass_model(tmp_path, images, capsys):
    image = str(images / "0.png")
    assert main(["predict", image]) == 2
    assert "pass --model" in _one_error(capsys.readouterr().err)
    torch.manual_seed(0)
    save_file(timm.create_model("linvit_nano", num_classes=4).state_dict(), str(tmp_path / "bare.safetensors"))
    assert main(["predict", image, "--checkpoint", str(tmp_path / "bare.safetensors")]) == 1
    line = _one_error(capsys.readouterr().err)
    assert "pass --model" in line and "bare.safetensors" in line
    assert main(["predict", image, "--checkpoint", str(tmp_path / "bare.safetensors"), "--model", "linvit_nano"]) == 0


# ------------------------------------------------------------------------------------------------ a training run
def _run(tmp_path, model_name="linvit_nano"):
    """A run directory as training leaves it: config.yaml and checkpoints/best.ckpt (hyper-parameters, the
    DataModule's preprocessing and class names)."""
    import yaml

    from linvit.train.modules.classification import ImageClassifier

    torch.manual_seed(0)
    module = ImageClassifier("linvit_nano", num_classes=3, model_kwargs={"img_size": 16}, ema={"enabled": False})
    hparams = dict(module.hparams, model_name=model_name)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    data = {"_target_": "linvit.train.data.datamodules.DigitsDataModule", "img_size": 16}
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    data_state = {
        "data_config": {"input_size": (3, 16, 16), "interpolation": "bilinear", "crop_pct": 1.0,
                        "crop_mode": "center", "mean": (0.5,) * 3, "std": (0.25,) * 3},
        "class_names": ["zero", "one", "two"],
    }  # fmt: skip
    checkpoint = {"hyper_parameters": hparams, "state_dict": module.state_dict(), "DigitsDataModule": data_state}
    torch.save(checkpoint, run / "checkpoints" / "best.ckpt")
    return run


def test_a_training_run_predicts_as_its_export_does(tmp_path, images, capsys):
    run = _run(tmp_path)
    assert main(["predict", str(images), "--checkpoint", str(run), "--json", "--topk", "3"]) == 0
    from_run = json.loads(capsys.readouterr().out)
    assert {t["label"] for t in from_run[0]["top"]} == {"zero", "one", "two"}
    assert main(["export", str(run), "--out", str(tmp_path / "exported")]) == 0
    capsys.readouterr()
    assert main(["predict", str(images), "--checkpoint", str(tmp_path / "exported"), "--json", "--topk", "3"]) == 0
    from_export = json.loads(capsys.readouterr().out)
    for a, b in zip(from_run, from_export, strict=True):
        assert [t["class"] for t in a["top"]] == [t["class"] for t in b["top"]]
        np.testing.assert_allclose(
            [t["probability"] for t in a["top"]], [t["probability"] for t in b["top"]], rtol=1e-5
        )
    ckpt = run / "checkpoints" / "best.ckpt"
    assert main(["predict", str(images / "0.png"), "--checkpoint", str(ckpt), "--model", "resnet18"]) == 1
    assert "trained linvit_nano" in _one_error(capsys.readouterr().err)


def test_a_run_naming_an_unregistered_model_or_a_hostile_config_is_refused(tmp_path, images, capsys):
    run = _run(tmp_path, model_name="hf-hub:someone/model")
    image = str(images / "0.png")
    assert main(["predict", image, "--checkpoint", str(run)]) == 1
    line = _one_error(capsys.readouterr().err)
    assert "best.ckpt" in line and "model" in line, line
    (run / "config.yaml").write_text("data:\n  _target_: builtins.eval\n")
    assert main(["predict", image, "--checkpoint", str(run)]) == 1
    line = _one_error(capsys.readouterr().err)
    assert "config.yaml" in line and "_target_" in line, line


def test_bad_options_are_one_line(weights, images, capsys):
    image = str(images / "0.png")
    for extra in (["--topk", "0"], ["--batch-size", "0"], ["--json", "--format", "csv"]):
        assert main(["predict", image, "--checkpoint", str(weights), *extra]) == 2
        assert extra[0] in _one_error(capsys.readouterr().err)
