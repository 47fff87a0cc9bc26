"""A damaged training checkpoint (zero bytes, cut short, an HTML page saved as ``.ckpt``) is named in one line
by every command that reads one: ``linvit eval``, ``linvit export``, ``train.py ckpt_path=...`` and a resume from the
run's ``last.ckpt``, which also says which checkpoint to resume from instead. Never a traceback, and never the
advice to trust the file (which would run code from it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from linvit.cli import main as linvit_main
from linvit.io import CheckpointError
from linvit.train.runs.run import resolve_ckpt_path

HPARAMS = {"model_name": "linvit_nano", "num_classes": 10, "in_chans": 3, "model_kwargs": {"img_size": 32}}
HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in</body></html>\n"
# what the one-line error says about each kind of damage
KINDS = {"empty": "empty (0 bytes)", "truncated": "incomplete or damaged", "html": "an HTML page"}


def _good_checkpoint(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"hyper_parameters": HPARAMS, "state_dict": {"w": torch.randn(64, 64)}, "epoch": 0}, path)
    return path


def _damage(path: Path, kind: str) -> Path:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        data = _good_checkpoint(path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(HTML)
    return path


def _run_dir(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    data = {"_target_": "linvit.train.data.datamodules.DigitsDataModule"}
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    return run, _damage(run / "checkpoints" / "best.ckpt", kind)


def _assert_one_line_naming(err: str, path: Path, kind: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and KINDS[kind] in lines[0], err
    assert "Traceback" not in err and "pickled Python objects" not in err and "trust" not in err, err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["eval", "export"])
def test_commands_name_a_damaged_checkpoint_in_one_line(tmp_path, capsys, command, kind):
    run, checkpoint = _run_dir(tmp_path, kind)
    extra = ["--out", str(tmp_path / "out")] if command == "export" else ["--accelerator", "cpu"]
    assert linvit_main([command, str(run), *extra]) == 2
    _assert_one_line_naming(capsys.readouterr().err, checkpoint, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_train_ckpt_path_names_a_damaged_checkpoint(tmp_path, kind):
    ckpt = _damage(tmp_path / "given.ckpt", kind)
    for trusted in (False, True):  # trusted: only checked to be intact (its code is not run twice)
        cfg = OmegaConf.create({"ckpt_path": str(ckpt), "paths": {"output_dir": str(tmp_path)}})
        with pytest.raises(CheckpointError) as error:
            resolve_ckpt_path(OmegaConf.merge(cfg, {"trust_checkpoint": trusted}))
        _assert_one_line_naming(str(error.value), ckpt, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_a_damaged_last_ckpt_names_the_checkpoint_to_fall_back_to(tmp_path, kind):
    checkpoints = tmp_path / "checkpoints"
    best = _good_checkpoint(checkpoints / "best.ckpt")
    _damage(checkpoints / "broken_too.ckpt", "empty")  # never suggested
    last = _damage(checkpoints / "last.ckpt", kind)
    cfg = OmegaConf.create({"resume": True, "paths": {"output_dir": str(tmp_path)}})
    with pytest.raises(CheckpointError) as error:
        resolve_ckpt_path(cfg)
    message = str(error.value)
    _assert_one_line_naming(message, last, kind)
    assert f"ckpt_path={best}" in message and "broken_too" not in message
    best.unlink()
    with pytest.raises(CheckpointError, match=r"no other checkpoint: to start it over, move last\.ckpt"):
        resolve_ckpt_path(cfg)


def test_train_py_prints_the_one_line_and_exits_with_1(tmp_path, capsys):
    from train_helpers import FAST, TINY_TIMM, compose

    from linvit.train.runs.hydra_app import run_task

    ckpt = _damage(tmp_path / "page.ckpt", "html")
    cfg = compose([*TINY_TIMM, *FAST, f"ckpt_path={ckpt}"], tmp_path / "run")
    with pytest.raises(SystemExit) as stopped:
        run_task(cfg)
    assert stopped.value.code == 1
    _assert_one_line_naming(capsys.readouterr().err.replace("error: ", ""), ckpt, "html")
    assert not (tmp_path / "run" / "checkpoints").exists()
