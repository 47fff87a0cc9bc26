"""`linvit export` / `linvit eval`: a trained run round-trips through timm.create_model with equal outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import timm
import torch

import linvit  # noqa: F401  (registers the models)
from linvit.cli import main as linvit_main

REPO = Path(__file__).resolve().parents[2]
MODEL = "linvit_nano" if timm.is_model("linvit_nano") else "test_vit"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step training run of a tiny model (EMA on), exported by train.py's own export step."""
    sys.path.insert(0, str(REPO / "tests" / "train"))
    try:
        from train_helpers import FAST, compose
    finally:
        sys.path.remove(str(REPO / "tests" / "train"))
    from linvit.train.runs.run import train

    out = tmp_path_factory.mktemp("run")
    overrides = [
        "model=linvit",
        f"model.model_name={MODEL}",
        *FAST,
        "data.img_size=32",
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=2",
        "+trainer.limit_val_batches=1",
        "model.ema.decay=0.5",
    ]
    metrics = train(compose(overrides, out))
    (out / "test_metrics.json").write_text(json.dumps(metrics))
    return out


def _trained_model(run_dir: Path, ema: bool = False):
    from linvit.train.modules.classification import ImageClassifier

    module = ImageClassifier.load_from_checkpoint(run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    return (module.model_ema.module if ema else module.model).eval()


def test_train_exports_timm_loadable_weights(run_dir):
    weights = run_dir / "model.safetensors"
    config = json.loads((run_dir / "config.json").read_text())
    assert weights.is_file() and config["architecture"] == MODEL and config["num_classes"] == 10
    assert config["pretrained_cfg"]["input_size"] == [3, 32, 32]
    assert config["label_names"] == [str(i) for i in range(10)]
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    expected = _trained_model(run_dir)(x)
    # by name, as in the README
    by_name = timm.create_model(
        MODEL,
        pretrained=True,
        pretrained_cfg_overlay={"file": str(weights), "num_classes": 10},
        num_classes=10,
        img_size=32,
    ).eval()
    torch.testing.assert_close(by_name(x), expected)
    # from the folder: architecture, classes and creation arguments come from config.json
    from_folder = timm.create_model(f"local-dir:{run_dir}", pretrained=True).eval()
    torch.testing.assert_close(from_folder(x), expected)
    assert tuple(from_folder.pretrained_cfg["mean"]) == (0.5, 0.5, 0.5)


def test_export_command_ema_weights(run_dir, tmp_path, capsys):
    assert linvit_main(["export", str(run_dir), "--ema", "--out", str(tmp_path / "ema")]) == 0
    assert "local-dir:" in capsys.readouterr().out
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model = timm.create_model(f"local-dir:{tmp_path / 'ema'}", pretrained=True).eval()
    torch.testing.assert_close(model(x), _trained_model(run_dir, ema=True)(x))
    assert not torch.allclose(model(x), _trained_model(run_dir)(x))  # really the EMA weights


def test_the_printed_loading_line_loads_the_trained_weights(run_dir, tmp_path, capsys, monkeypatch):
    """`linvit export` prints a line to paste: it used to build the architecture with random weights."""
    assert linvit_main(["export", str(run_dir), "--out", str(tmp_path / "raw")]) == 0
    line = next(text for text in capsys.readouterr().out.splitlines() if text.startswith("load: "))
    monkeypatch.chdir(tmp_path)  # the line works from any directory
    namespace: dict = {}
    exec(line.removeprefix("load: "), namespace)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(namespace["model"].eval()(x), _trained_model(run_dir)(x))


def test_export_command_errors(tmp_path, capsys):
    assert linvit_main(["export", str(tmp_path)]) == 2
    assert "no last.ckpt" in capsys.readouterr().err


def test_eval_command_reproduces_the_test_metrics(run_dir, capsys):
    assert linvit_main(["eval", str(run_dir), "--json", "--accelerator", "cpu"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)  # stdout is the JSON and nothing else
    assert "Testing" in captured.err  # the progress bar went to stderr
    trained = json.loads((run_dir / "test_metrics.json").read_text())
    assert metrics["test/acc1"] == pytest.approx(trained["test/acc1"])
    assert metrics["test_ema/acc1"] == pytest.approx(trained["test_ema/acc1"])


class _RunsCode:
    """Unpickling this touches a marker file: proof that loading ran code named by the checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_checkpoint_that_runs_code_is_refused_naming_trusted(tmp_path, capsys, command):
    marker = tmp_path / "code_ran"
    (tmp_path / "config.yaml").write_text("data: {_target_: linvit.train.data.datamodules.DigitsDataModule}\n")
    torch.save({"state_dict": {}, "hyper_parameters": _RunsCode(marker)}, tmp_path / "evil.ckpt")
    code = linvit_main([command, str(tmp_path / "evil.ckpt")])
    assert code != 0
    assert not marker.exists(), "loading executed code from the checkpoint"
    assert "--trusted" in capsys.readouterr().err


@pytest.mark.slow  # ~50 s of tracing on 2 shared cores; tests/test_deploy.py traces the families in the default tier
def test_export_command_writes_onnx_of_a_run(run_dir, tmp_path, capsys):
    """`linvit export RUN --format onnx`: the trained classifier at sizes it never saw (batch and size dynamic)."""
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra (pip install 'linvit[onnx]')")
    pytest.importorskip("onnxscript", reason="the onnx extra (pip install 'linvit[onnx]')")
    out = tmp_path / "run.onnx"
    assert linvit_main(["export", str(run_dir), "--format", "onnx", "--out", str(out)]) == 0
    assert f"{out} (one file)" in capsys.readouterr().out
    assert not out.with_name("run.onnx.data").exists()
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    model = _trained_model(run_dir)
    for batch, size in ((1, (32, 32)), (1, (40, 56)), (3, (64, 48))):  # the run's own size first
        x = torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = model(x).numpy()
        got = session.run(None, {"image": x.numpy()})[0]
        assert got.shape == (batch, 10) and abs(got - expected).max() < 1e-4


@pytest.mark.slow  # linvit_nano traced twice (~40 s on 2 shared cores); tests/test_deploy_sizes.py covers the logic
def test_export_command_writes_a_pt2_of_a_run_that_runs_at_the_runs_size(run_dir, tmp_path, capsys):
    """`linvit export RUN --format pt2` of a run at data.img_size=32 (the quick start's size): its last map is one
    token, below the sizes a dynamic program of the model takes (33 up), so the program is static at 32x32 (its
    one-token maps make ops ask whether the batch is 1: batch 1 too) and the command says so; loaded with
    torch.export.load it gives the trained model's outputs there."""
    out = tmp_path / "run.pt2"
    assert linvit_main(["export", str(run_dir), "--format", "pt2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "batch 1, height and width static at the native size 32x32" in printed, printed
    assert "from 33x33 up" in printed and "--format onnx serves every size" in printed, printed
    program = torch.export.load(str(out)).module()
    model = _trained_model(run_dir)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), atol=1e-4, rtol=0)
