"""Writes never lose a user's file (issue 34): every file linvit writes goes through linvit.io.destination.write_file.

A temporary name in the destination's folder renamed into place (a kill leaves the old file or the new one), a record
of what linvit wrote there (so rerunning a command needs no --force, and a user's file is refused without it), the
input never replaced, and a destination that cannot be written is one line naming it (exit 1), in training too.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linvit.cli import main
from linvit.io.destination import RECORD_NAME, TEMPORARY_SUFFIX, DestinationError, remove_own_temporaries
from linvit.utils.progress import is_progress_line

REPO = Path(__file__).resolve().parents[2]


def _one_line(err: str) -> str:
    """The one error line of ``err``, its progress lines (``[linvit export 1/3] ...``) aside."""
    lines = [line for line in err.strip().splitlines() if line.strip() and not is_progress_line(line)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step training run of timm's tiny test_resnet, exported by train.py's own export step."""
    from train_helpers import FAST, SHORT, TINY_TIMM, compose

    from linvit.train.runs.run import train

    out = tmp_path_factory.mktemp("run")
    train(compose([*TINY_TIMM, *FAST, *SHORT, "test=false"], out))
    assert (out / "model.safetensors").is_file() and (out / "checkpoints" / "best.ckpt").is_file()
    return out


# -- export ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_export_refuses_a_users_file_without_force(tmp_path, capsys, fmt):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    code = main(["export", "--model", "test_resnet", "--format", fmt, "--out", str(notes)])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and str(notes) in line and "--force" in line, line
    assert notes.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_export_never_replaces_the_runs_checkpoint(run_dir, capsys):
    """``--out RUN/checkpoints/best.ckpt`` (the input): refused even with --force; ``last.ckpt`` (linvit's, but as a
    checkpoint): refused without --force."""
    best, last = run_dir / "checkpoints" / "best.ckpt", run_dir / "checkpoints" / "last.ckpt"
    before = best.read_bytes(), last.read_bytes()
    for extra in ([], ["--force"]):
        assert main(["export", str(run_dir), "--format", "pt2", "--out", str(best), *extra]) == 1
        line = _one_line(capsys.readouterr().err)
        assert str(best) in line and "is the input" in line, line
    assert main(["export", str(run_dir), "--format", "pt2", "--out", str(last)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(last) in line and "did not write it as pt2" in line and "--force" in line, line
    assert (best.read_bytes(), last.read_bytes()) == before


def test_exporting_a_run_again_needs_no_force_and_force_replaces_only_its_files(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir)]) == 0  # the run's own model.safetensors + config.json: linvit wrote them
    capsys.readouterr()
    folder = tmp_path / "shipped"
    folder.mkdir()
    mine = {
        "model.safetensors": b"the user's weights",
        "notes.txt": b"notes",
        "model.safetensors.tmp": b"a user's file with a temporary-looking name",
        ".config.json.tmp": b"another",
    }
    for name, content in mine.items():
        (folder / name).write_bytes(content)
    assert main(["export", str(run_dir), "--out", str(folder)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(folder / "model.safetensors") in line and "--force" in line, line
    assert not (folder / "config.json").exists(), "nothing is written when one of the two is refused"
    assert main(["export", str(run_dir), "--out", str(folder), "--force"]) == 0
    for name, content in mine.items():
        if name != "model.safetensors":
            assert (folder / name).read_bytes() == content, name
    assert (folder / "model.safetensors").read_bytes() != mine["model.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*mine, "config.json", RECORD_NAME])
    assert main(["export", str(run_dir), "--out", str(folder)]) == 0  # linvit's now: no --force needed


def test_export_destinations_that_cannot_be_written_are_one_line(run_dir, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    a_folder = tmp_path / "folder.pt2"
    a_folder.mkdir()
    cases = [
        (["--format", "pt2", "--out", str(a_folder)], "it is a folder"),
        (["--format", "pt2", "--out", str(a_file / "model.pt2")], "not a folder"),
        (["--out", str(a_file)], "it is a file, not a folder"),  # safetensors: --out is a folder
        (["--out", str(a_file / "sub")], "not a folder"),
    ]
    for extra, reason in cases:
        assert main(["export", str(run_dir), *extra, "--force"]) == 1, extra
        line = _one_line(capsys.readouterr().err)
        assert reason in line and str(a_file if "a_file" in " ".join(extra) else a_folder) in line, line
    assert a_file.read_text() == "x" and not any(a_folder.iterdir())


# -- convert ---------------------------------------------------------------------------------------------------------
def test_convert_force_into_a_folder_keeps_the_users_files(tmp_path, capsys):
    import timm

    import linvit.models  # noqa: F401

    source = tmp_path / "trained.pth"
    torch.save(timm.create_model("linvit_nano", num_classes=4).state_dict(), source)
    folder = tmp_path / "weights"
    folder.mkdir()
    mine = {"model.safetensors.tmp": b"mine", "config.json.tmp": b"mine too", "config.json": b"{}"}
    for name, content in mine.items():
        (folder / name).write_bytes(content)
    assert main(["convert", str(source), str(folder), "--model", "linvit_nano"]) == 1
    assert "config.json" in _one_line(capsys.readouterr().err)
    assert main(["convert", str(source), str(folder), "--model", "linvit_nano", "--force"]) == 0
    assert (folder / "model.safetensors.tmp").read_bytes() == b"mine"
    assert (folder / "config.json.tmp").read_bytes() == b"mine too"
    assert (folder / "config.json").read_bytes() != b"{}"
    assert main(["convert", str(source), str(source), "--model", "linvit_nano", "--force"]) == 1  # SRC itself
    assert "is the input" in _one_line(capsys.readouterr().err)


# -- temporaries -----------------------------------------------------------------------------------------------------
def test_only_linvits_own_temporaries_are_removed(tmp_path):
    from linvit.train.modules.callbacks import unique_temporary
    from linvit.train.modules.fault_tolerance import remove_stale_temporaries

    users = [tmp_path / ".notes.tmp", tmp_path / ".last.ckpt.1234.tmp", tmp_path / "x.linvit-tmp"]
    for path in users:
        path.write_text("the user's")
    ours = unique_temporary(tmp_path / "last.ckpt")
    ours.write_bytes(b"half")
    staged = tmp_path / f".model.onnx.0123abcd{TEMPORARY_SUFFIX}"  # an ONNX staging folder a kill left
    staged.mkdir()
    (staged / "model.onnx").write_bytes(b"half")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([ours, staged])
    assert all(path.read_text() == "the user's" for path in users)
    assert remove_own_temporaries(tmp_path) == []


# -- training: a full disk, a log folder that cannot be made ----------------------------------------------------------
def test_a_full_disk_during_a_checkpoint_write_is_one_error_line(tmp_path, capsys, monkeypatch):
    """The second epoch's checkpoint hits ENOSPC (the writer is monkeypatched): ``error: ...`` naming the file, exit 1,
    and the first epoch's checkpoints intact."""
    from train_helpers import FAST, SHORT, TINY_TIMM, compose

    from linvit.train.runs.hydra_app import run_task

    run = tmp_path / "run"
    real_save, saves = torch.save, []

    def save_until_the_disk_is_full(obj, file, *args, **kwargs):
        if hasattr(file, "write") and isinstance(obj, dict) and "state_dict" in obj:
            saves.append(getattr(file, "name", "?"))
            if len(saves) > 2:  # epoch 1 wrote best.ckpt and last.ckpt
                file.write(b"x" * 1000)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, file, *args, **kwargs)

    cfg = compose([*TINY_TIMM, *FAST, *SHORT, "trainer.max_epochs=2", "test=false", "export.enabled=false"], run)
    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    with pytest.raises(SystemExit) as stopped:
        run_task(cfg)
    assert stopped.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the disk is full" in errors[0] and str(run / "checkpoints") in errors[0], errors
    monkeypatch.undo()
    for name in ("best.ckpt", "last.ckpt"):
        checkpoint = torch.load(run / "checkpoints" / name, weights_only=True)
        assert checkpoint["epoch"] == 0, name
    assert not list((run / "checkpoints").glob(f"*{TEMPORARY_SUFFIX}"))


def test_a_log_folder_that_cannot_be_made_is_one_error_line(tmp_path, capsys):
    """``paths.log_dir`` under a file (ENOTDIR). A read-only folder would do the same, but the tests run as root,
    where chmod does not stop writes; the ENOSPC/EROFS path is the test above."""
    from linvit.train.runs.hydra_app import main as train_main

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with pytest.raises(SystemExit) as stopped:
            train_main([f"paths.log_dir={a_file / 'logs'}", "trainer.max_epochs=1"])
    finally:  # Hydra's handlers write to this test's captured stream: not to the next test's
        root.handlers[:], root.level = handlers, level
    assert "error:" in str(stopped.value.code) and str(a_file / "logs") in str(stopped.value.code)
    assert "a part of the path is not a folder" in str(stopped.value.code)
    assert "Traceback" not in capsys.readouterr().err


def test_a_run_directory_under_a_file_is_one_error_line(tmp_path, capsys):
    from train_helpers import FAST, SHORT, TINY_TIMM, compose

    from linvit.train.runs.hydra_app import run_task

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as stopped:
        run_task(compose([*TINY_TIMM, *FAST, *SHORT], a_file / "run"))
    assert stopped.value.code == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and str(a_file / "run") in line, line


# -- a kill in the middle of an export -------------------------------------------------------------------------------
_CHILD = """
import sys, time, torch
from pathlib import Path
from linvit.utils import deploy

class Tiny(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(3, 4, 3)
    def forward(self, x):
        return self.conv(x).mean((2, 3))

target = Path(sys.argv[1])
old = Tiny(0).eval()
{write_old}
new = Tiny(1).eval()
program = deploy.export_program(new)

def half_then_wait(*args, **kwargs):  # the new file is being written ... and the process is killed
    destination = next(a for a in args if isinstance(a, (str, Path)) or hasattr(a, "write"))
    if hasattr(destination, "write"):
        destination.write(b"PK" + b"x" * 78_000)
        destination.flush()
    else:
        Path(destination).write_bytes(b"x" * 78_000)
    print("writing", flush=True)
    time.sleep(120)

{patch}
{write_new}
"""


def _kill_mid_write(target: Path, write_old: str, patch: str, write_new: str) -> None:
    child = _CHILD.format(write_old=write_old, patch=patch, write_new=write_new)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    process = subprocess.Popen([sys.executable, "-c", child, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout.readline().strip() == "writing"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=120)
    assert process.returncode == -signal.SIGKILL


def _old_outputs() -> torch.Tensor:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3)
    return conv(torch.ones(1, 3, 16, 16)).mean((2, 3))


def _only_the_file_and_leftovers(folder: Path, name: str) -> None:
    leftovers = [p for p in folder.iterdir() if p.name not in (name, RECORD_NAME)]
    assert leftovers and all(p.name.startswith(".") and p.name.endswith(TEMPORARY_SUFFIX) for p in leftovers)
    remove_own_temporaries(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, RECORD_NAME])


@pytest.mark.slow  # a child process that traces a model (~15 s on 2 shared cores)
def test_sigkill_during_a_pt2_export_leaves_the_old_file(tmp_path):
    target = tmp_path / "model.pt2"
    _kill_mid_write(
        target,
        "deploy.save_program(deploy.export_program(old), target)",
        "torch.export.save = half_then_wait",
        "deploy.save_program(program, target)",
    )
    program = torch.export.load(str(target))  # the old file, whole
    torch.testing.assert_close(program.module()(torch.ones(1, 3, 16, 16)), _old_outputs())
    _only_the_file_and_leftovers(tmp_path, target.name)


@pytest.mark.slow  # a child process that traces and exports two models to ONNX (~25 s on 2 shared cores)
def test_sigkill_during_an_onnx_export_leaves_the_old_file(tmp_path):
    import numpy as np
    import onnxruntime

    target = tmp_path / "model.onnx"
    _kill_mid_write(
        target,
        "deploy.export_onnx(old, target)",
        "from torch.onnx._internal.exporter._onnx_program import ONNXProgram\nONNXProgram.save = half_then_wait",
        "deploy.export_onnx(new, target, program=program)",
    )
    session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"image": np.ones((1, 3, 16, 16), dtype=np.float32)})
    np.testing.assert_allclose(logits, _old_outputs().detach().numpy(), rtol=1e-4, atol=1e-5)
    assert not target.with_name("model.onnx.data").exists(), "a model under 2 GB is one file"
    _only_the_file_and_leftovers(tmp_path, target.name)


def test_write_file_names_a_full_disk_and_keeps_the_old_file(tmp_path):
    from linvit.io.destination import write_file

    target = tmp_path / "results.json"
    write_file(target, lambda tmp: tmp.write_text("old"), "results")

    def full(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(DestinationError, match="the disk is full") as error:
        write_file(target, full, "results")
    assert str(target) in str(error.value) and target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, "results.json"]


def test_an_interrupted_pt2_write_leaves_the_old_file_under_its_name(tmp_path, monkeypatch):
    """The default tier's version of the SIGKILL test (the slow tier kills a real process): the writer stops half-way
    (KeyboardInterrupt), the old program still loads, no partial file is left, and writing again needs no --force."""
    from linvit.utils.deploy import save_program

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x * 2

    target = tmp_path / "model.pt2"
    save_program(torch.export.export(Tiny(), (torch.ones(2),)), target)
    real_save = torch.export.save

    def half_then_interrupted(program, file, *args, **kwargs):
        file.write(b"PK" + b"x" * 78_000)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.export, "save", half_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_program(torch.export.export(Tiny(), (torch.ones(3),)), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, "model.pt2"]
    torch.testing.assert_close(torch.export.load(str(target)).module()(torch.ones(2)), torch.full((2,), 2.0))
    monkeypatch.setattr(torch.export, "save", real_save)
    save_program(torch.export.export(Tiny(), (torch.ones(3),)), target)  # linvit wrote it: no force needed


def test_viz_extract_and_bench_refuse_a_users_file_without_force(tmp_path, capsys):
    from linvit.bench import run as bench_run

    picture = tmp_path / "holiday.png"
    picture.write_bytes(b"the user's picture")
    assert main(["viz", "attention", "skimage:chelsea", "--output", str(picture)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(picture) in line and "--force" in line, line
    features = tmp_path / "features.safetensors"
    features.write_bytes(b"the user's features")
    assert main(["extract", "skimage:chelsea", "--model", "linvit_nano", "--output", str(tmp_path)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(features) in line and "--force" in line, line
    results = tmp_path / "results.json"
    results.write_text('{"mine": true}')
    assert bench_run.main(["--out", str(tmp_path), "--quick"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(results) in line and "--force" in line, line
    assert picture.read_bytes() == b"the user's picture" and features.read_bytes() == b"the user's features"
    assert results.read_text() == '{"mine": true}'
