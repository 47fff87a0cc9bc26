"""Trust comes only from the user's own flag; every config a command reads back is bounded, allow-listed and typed.

A weights file's side config (``config.json``, safetensors metadata, a ``local-dir:`` folder's ``config.json``), a
checkpoint's hyper-parameters and a run's ``config.yaml`` are data from someone else. The attacks here plant a
pickle whose unpickling writes a marker file, then try to make linvit unpickle it through such a config; each test
checks the one-line refusal names the file and the key, and that the marker was never written. With ``--trusted``
the same attack runs, which shows it was the check that held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import linvit.models  # noqa: F401  (registers linvit's families)
from linvit.cli import main as linvit_main
from linvit.utils.progress import is_progress_line
from linvit.utils.saved_config import UntrustedConfigError

REPO = Path(__file__).resolve().parents[2]
HPARAMS = {"model_name": "linvit_nano", "num_classes": 10, "in_chans": 3, "model_kwargs": {"img_size": 32}}


class _RunsCode:
    """Unpickling this writes ``marker``: proof that code from the file ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def nano_state():
    torch.manual_seed(0)
    return timm.create_model("linvit_nano", num_classes=10).state_dict()


@pytest.fixture
def image(tmp_path):
    from PIL import Image

    path = tmp_path / "x.png"
    Image.new("RGB", (32, 32), (120, 30, 200)).save(path)
    return str(path)


def _planted(folder: Path, nano_state, model_args: dict, extra: dict | None = None) -> tuple[Path, Path]:
    """``folder/weights.pth`` that runs code when unpickled, and a config.json beside it; (weights, marker)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "code_ran"
    torch.save({"state_dict": nano_state, "evil": _RunsCode(marker)}, folder / "weights.pth")
    config = {"architecture": "linvit_nano", "num_classes": 10, "model_args": model_args, **(extra or {})}
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "weights.pth", marker


def _one_line(err: str) -> str:
    """The one error line of ``err``, its progress lines (``[linvit export 1/3] ...``) aside."""
    lines = [line for line in err.strip().splitlines() if line.strip() and not is_progress_line(line)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------- config.json beside weights
ATTACKS = [
    ({"trusted": True, "in_chans": 3}, "model_args.trusted"),
    ({"allow_non_finite": True}, "model_args.allow_non_finite"),
    ({"pretrained_cfg_overlay": {"file": "other.pth"}}, "model_args.pretrained_cfg_overlay"),
    ({"checkpoint_path": "other.pth"}, "model_args.checkpoint_path"),
    ({"no_such_argument": 1}, "model_args.no_such_argument"),
    ({"device": "meta"}, "model_args.device"),
    ({"img_size": {"height": 32}}, "model_args.img_size"),
    ({"embed_dims": [[32], [64]]}, "model_args.embed_dims[0]"),
    ({"embed_dims": list(range(1000))}, "model_args.embed_dims"),
]


@pytest.mark.parametrize("model_args, named", ATTACKS, ids=[named for _, named in ATTACKS])
def test_predict_refuses_a_config_json_key_outside_the_allow_list_and_runs_nothing(
    tmp_path, nano_state, image, capsys, model_args, named
):
    weights, marker = _planted(tmp_path / "w", nano_state, model_args)
    assert linvit_main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(weights)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert named in line and str(weights.with_name("config.json")) in line and "--trusted" in line, line
    assert not marker.exists(), "code from the weights file ran"


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"pretrained_cfg": {"file": "/etc/passwd"}}, "pretrained_cfg.file"),
        ({"pretrained_cfg": {"hf_hub_id": "someone/model"}}, "pretrained_cfg.hf_hub_id"),
        ({"checkpoint": "other.pth"}, "checkpoint"),
        ({"num_classes": "10"}, "num_classes"),
    ],
)
def test_predict_refuses_other_config_json_keys(tmp_path, nano_state, image, capsys, extra, named):
    weights, marker = _planted(tmp_path / "w", nano_state, {"in_chans": 3}, extra)
    assert linvit_main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(weights)]) == 1
    assert named in _one_line(capsys.readouterr().err)
    assert not marker.exists()


def test_export_pt2_refuses_a_config_json_that_turns_trust_on(tmp_path, nano_state, capsys):
    weights, marker = _planted(tmp_path / "w", nano_state, {"trusted": True, "in_chans": 3})
    out = tmp_path / "model.pt2"
    args = ["export", "--model", "linvit_nano", "--checkpoint", str(weights), "--format", "pt2", "--out", str(out)]
    assert linvit_main(args) != 0
    assert "model_args.trusted" in _one_line(capsys.readouterr().err)
    assert not marker.exists() and not out.exists()


def test_with_trusted_the_same_file_is_unpickled(tmp_path, nano_state, image):
    """The opt-in still lifts the check: it was the allow-list, nothing else, that kept the code from running."""
    weights, marker = _planted(tmp_path / "w", nano_state, {"trusted": True, "in_chans": 3})
    linvit_main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(weights), "--trusted"])
    assert marker.exists()


@pytest.mark.parametrize("kind", ["too_large", "too_deep", "fifo", "folder", "yaml_tag"])
def test_a_config_json_that_is_not_a_small_plain_file_is_refused_without_hanging(
    tmp_path, nano_state, image, capsys, kind
):
    weights, marker = _planted(tmp_path / "w", nano_state, {"in_chans": 3})
    config = weights.with_name("config.json")
    config.unlink()
    if kind == "too_large":
        config.write_text(json.dumps({"label_names": ["x" * 100] * 20_000}))
    elif kind == "too_deep":
        config.write_text("[" * 200 + "]" * 200)
    elif kind == "fifo":
        os.mkfifo(config)  # opening it for reading would block until a writer comes
    elif kind == "folder":
        config.mkdir()
    else:
        config.write_text('{"model_args": {"in_chans": NaN}}')
    assert linvit_main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(weights)]) == 1
    assert "config.json" in _one_line(capsys.readouterr().err)
    assert not marker.exists()


def test_safetensors_metadata_cannot_set_trust(tmp_path, nano_state, image, capsys):
    weights = tmp_path / "model.safetensors"
    save_file(dict(nano_state), str(weights), metadata={"model_args": json.dumps({"trusted": True})})
    assert linvit_main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(weights)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "model_args.trusted" in line and str(weights) in line


def test_a_local_dir_config_json_cannot_set_trust(tmp_path, nano_state):
    """timm reads a ``local-dir:`` folder's config.json itself; linvit's builder checks what it added."""
    folder = tmp_path / "folder"
    folder.mkdir()
    marker = folder / "code_ran"
    torch.save({"state_dict": nano_state, "evil": _RunsCode(marker)}, folder / "pytorch_model.bin")
    config = {
        "architecture": "linvit_nano",
        "num_classes": 10,
        "model_args": {"trusted": True},
        "pretrained_cfg": {"custom_load": True, "num_classes": 10},
    }
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UntrustedConfigError, match=r"model_args\.trusted.*config\.json"):
        timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert not marker.exists()


def test_a_python_caller_may_still_pass_trust_in_code(tmp_path, nano_state):
    weights = tmp_path / "weights.pth"
    marker = tmp_path / "code_ran"
    torch.save({"state_dict": nano_state, "evil": _RunsCode(marker)}, weights)
    overlay = {"file": str(weights), "num_classes": 10}
    timm.create_model("linvit_nano", pretrained=True, num_classes=10, pretrained_cfg_overlay=overlay, trusted=True)
    assert marker.exists()


# ------------------------------------------------------------------------------- what linvit wrote still loads
def _exported_folder(tmp_path: Path, nano_state) -> Path:
    from linvit.train.runs.export import export_checkpoint

    ckpt = tmp_path / "best.ckpt"
    torch.save({"hyper_parameters": HPARAMS, "state_dict": {f"model.{k}": v for k, v in nano_state.items()}}, ckpt)
    export_checkpoint(ckpt, tmp_path / "exported")
    return tmp_path / "exported"


def test_a_folder_written_by_export_predicts_and_loads_from_local_dir(tmp_path, nano_state, image, capsys):
    folder = _exported_folder(tmp_path, nano_state)
    assert linvit_main(["predict", image, "--model", "linvit_nano", "--checkpoint", str(folder), "--topk", "2"]) == 0
    assert "1." in capsys.readouterr().out
    assert timm.create_model(f"local-dir:{folder}", pretrained=True).num_classes == 10


def test_a_folder_written_by_convert_predicts(tmp_path, image, capsys):
    torch.manual_seed(0)
    source = tmp_path / "authors.pth"
    torch.save({"model": timm.create_model("flatten_pvt_v2_b0", img_size=64, num_classes=7).state_dict()}, source)
    folder = tmp_path / "converted"
    assert linvit_main(["convert", str(source), f"{folder}/", "--model", "flatten_pvt_v2_b0"]) == 0
    capsys.readouterr()
    assert json.loads((folder / "config.json").read_text())["model_args"]  # the training size was recorded
    args = ["predict", image, "--model", "flatten_pvt_v2_b0", "--checkpoint", str(folder), "--topk", "1"]
    assert linvit_main(args) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------------------- a run's config.yaml
def _run_dir(tmp_path: Path, config_text: str, hparams: dict | None = None) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(config_text)
    torch.save({"hyper_parameters": hparams or HPARAMS, "state_dict": {}}, run / "checkpoints" / "best.ckpt")
    return run


DIGITS = "linvit.train.data.datamodules.DigitsDataModule"
RUN_CONFIG_ATTACKS = [
    ("data: !!python/object/apply:os.system ['touch {marker}']\n", "python/object/apply:os.system is not read"),
    (f"data:\n  _target_: {DIGITS}\n  _partial_: true\n", "data._partial_"),
    (f"data:\n  _target_: {DIGITS}\n  _recursive_: false\n", "data._recursive_"),
    (f"data:\n  _target_: {DIGITS}\n  _convert_: object\n", "data._convert_"),
    (f"data:\n  _target_: {DIGITS}\n  _args_: ['{{marker}}']\n", "data._args_"),
    ('data:\n  "_target_ ": builtins.open\n  file: "{marker}"\n  mode: w\n', "'_target_ '"),
    ("_target_: builtins.open\nfile: '{marker}'\n", "_target_"),
    ("trainer:\n  plugins:\n    _target_: builtins.open\n    file: '{marker}'\n", "trainer.plugins._target_"),
    ("data: &a [*a]\n", "aliases"),
    (f"data:\n  _target_: {DIGITS}\ntrainer:\n  max_epochs: [1, 2]\n", "trainer.max_epochs=[1, 2]"),
    (f"data:\n  _target_: {DIGITS}\n  mean: [.nan]\n", "data.mean=[nan]"),
    (f"data:\n  _target_: {DIGITS}\n  no_such_option: 1\n", "data.no_such_option"),
]


@pytest.mark.parametrize("command", ["eval", "export"])
@pytest.mark.parametrize("text, named", RUN_CONFIG_ATTACKS, ids=[named for _, named in RUN_CONFIG_ATTACKS])
def test_a_run_config_yaml_outside_the_allow_list_is_one_line_naming_file_and_key(
    tmp_path, capsys, command, text, named
):
    marker = tmp_path / "code_ran"
    run = _run_dir(tmp_path, text.format(marker=marker))
    extra = ["--out", str(tmp_path / "out")] if command == "export" else ["--accelerator", "cpu"]
    code = linvit_main([command, str(run), *extra])
    line = _one_line(capsys.readouterr().err)
    assert code != 0 and named in line and "config.yaml" in line, line
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_run_config_yaml_that_is_a_fifo_is_refused_without_hanging(tmp_path, capsys):
    run = _run_dir(tmp_path, "")
    (run / "config.yaml").unlink()
    os.mkfifo(run / "config.yaml")
    assert linvit_main(["export", str(run), "--out", str(tmp_path / "out")]) == 1
    assert "not a regular file" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "hparams, named",
    [
        ({**HPARAMS, "model_kwargs": {"trusted": True}}, "hyper_parameters.model_kwargs.trusted"),
        ({**HPARAMS, "model_kwargs": {"allow_non_finite": True}}, "hyper_parameters.model_kwargs.allow_non_finite"),
        ({**HPARAMS, "no_such_hparam": 1}, "hyper_parameters.no_such_hparam"),
    ],
)
def test_checkpoint_hyperparameters_are_allow_listed(tmp_path, capsys, hparams, named):
    run = _run_dir(tmp_path, f"data:\n  _target_: {DIGITS}\n", hparams)
    assert linvit_main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    assert named in _one_line(capsys.readouterr().err)


def test_the_config_yaml_a_run_writes_passes(tmp_path):
    """What Hydra writes for the shipped configs (callbacks, logger and trainer targets, _convert_) is read back."""
    from omegaconf import OmegaConf
    from train_helpers import compose

    from linvit.train.runs.saved_run import load_run_config

    for data in ("digits", "cifar10", "imagefolder", "seg_synthetic"):
        overrides = [f"data={data}"] + (["model=seg_fpn"] if data.startswith("seg") else [])
        cfg = compose(overrides, tmp_path / data)
        path = tmp_path / f"{data}.yaml"
        path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
        assert load_run_config(path)["data"]["_target_"]


# ------------------------------------------------------------------------------------- typed values in train.py
@pytest.mark.parametrize(
    "override, named",
    [
        ("trainer.max_epochs=[1,2]", "trainer.max_epochs=[1, 2] (list) must be auto or an integer"),
        ("data.mean=[nan]", "data.mean=[nan] (list) must be a list of 1 to 4 finite numbers"),
        ("data.std=[0.5,0]", "data.std=[0.5, 0] (list) must be a list of 1 to 4 finite numbers above 0"),
        ("data.mean=0.5", "data.mean=0.5 (float) must be a list"),
        ("model.optimizer.lr=nan", "model.optimizer.lr=nan (float) must be a finite number"),
        ("model.optimizer.weight_decay=inf", "model.optimizer.weight_decay=inf (float) must be a finite number"),
        ("data.batch_size=[64]", "data.batch_size=[64] (list) must be auto or an integer"),
    ],
)
def test_train_names_a_value_of_the_wrong_type_and_exits_1_before_anything(tmp_path, capsys, override, named):
    from train_helpers import compose

    from linvit.train.runs.hydra_app import run_task

    cfg = compose([override], tmp_path / "run")
    with pytest.raises(SystemExit) as stopped:
        run_task(cfg)
    assert stopped.value.code == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and named in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # two train.py processes (Hydra, Lightning imports): ~50 s on 2 shared cores
@pytest.mark.parametrize(
    "override, named", [("trainer.max_epochs=[1,2]", "trainer.max_epochs"), ("data.mean=[nan]", "data.mean")]
)
def test_train_py_names_the_key(tmp_path, override, named):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), override, f"paths.log_dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0] and "Traceback" not in result.stderr, result.stderr
