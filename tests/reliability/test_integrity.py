"""Every checkpoint and weights file is verified before use: a damaged byte is named, never loaded.

- A torch zip archive (a training ``.ckpt``): the CRC-32 of every entry and the declared sizes. 4 KB of flipped bytes
  in the middle of a run's ``best.ckpt`` used to evaluate silently to another accuracy (exit 0); ``linvit eval``,
  ``linvit export`` and ``ckpt_path=`` now give one line naming the file and the entry, exit != 0.
- A safetensors file: its header (length, JSON, dtypes, shapes, offsets) against the file's size, and the SHA-256 in
  the ``config.json`` beside ``model.safetensors`` (exports and ``linvit convert`` write it), or recorded by linvit
  when it wrote the file (``.linvit-written.json``; training records every checkpoint's).
- NaN/Inf weights are refused through a ``local-dir:`` folder and by ``linvit convert`` (``--allow-non-finite`` /
  ``allow_non_finite=True`` warn instead).
- Every checkpoint a training run gives Lightning is verified and logged with how it is read.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from omegaconf import OmegaConf
from PIL import Image
from safetensors.torch import load_file, save_file

from linvit.cli import main as linvit_main
from linvit.io import (
    CheckpointError,
    DamagedCheckpointError,
    NonFiniteWeightsError,
    check_checkpoint_intact,
    load_checkpoint_file,
    verify_file,
)
from linvit.io.destination import file_sha256, recorded_sha256, write_file
from linvit.train.runs.run import resolve_ckpt_path
from linvit.utils.progress import is_progress_line

MODEL = "linvit_nano"
FLIPPED = 4096  # bytes flipped in the middle of a checkpoint


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 2-step training run of linvit_nano at 32 px (exported by the run), and the lines it logged."""
    from train_helpers import FAST, SHORT, compose

    from linvit.train.runs.run import train

    out = tmp_path_factory.mktemp("run")
    overrides = [
        "model=linvit",
        f"model.model_name={MODEL}",
        *FAST,
        "data.img_size=32",
        *SHORT,
    ]
    records = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.INFO)
    try:
        train(compose(overrides, out))
    finally:
        root.removeHandler(records)
        root.setLevel(level)
    return out, records.lines


def _copy_run(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _flip_middle(path: Path, count: int = FLIPPED) -> int:
    """Flip ``count`` bytes in the middle of ``path``; returns the first offset flipped."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    for offset in range(start, start + count):
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    return start


def _entry_at(path: Path, offset: int) -> str:
    """The zip entry whose stored bytes hold ``offset`` (its data follow a 30-byte local header, name and extra)."""
    with zipfile.ZipFile(path) as archive, path.open("rb") as handle:
        for entry in archive.infolist():
            handle.seek(entry.header_offset + 26)
            name_length, extra_length = struct.unpack("<HH", handle.read(4))
            data_start = entry.header_offset + 30 + name_length + extra_length
            if data_start <= offset < data_start + entry.compress_size:
                return entry.filename
    raise AssertionError(f"no entry holds byte {offset}")


def _one_line(text: str) -> str:
    """The one error line of ``text``, its progress lines (``[linvit convert 1/3] ...``) aside."""
    lines = [line for line in text.splitlines() if line.strip() and not is_progress_line(line)]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# ------------------------------------------------------------------------------------------------ training records
def test_a_training_run_records_its_checkpoints_and_says_how_it_loads_them(trained):
    run, lines = trained
    for name in ("best.ckpt", "last.ckpt"):
        checkpoint = run / "checkpoints" / name
        assert recorded_sha256(checkpoint) == file_sha256(checkpoint), name
    config = json.loads((run / "config.json").read_text())
    assert config["sha256"] == file_sha256(run / "model.safetensors")
    best = run / "checkpoints" / "best.ckpt"
    entries = len(zipfile.ZipFile(best).infolist())
    testing = [line for line in lines if line.startswith("testing ")]
    assert testing == [
        f"testing {best} (verified: CRC-32 of {entries} zip entries, recorded SHA-256; torch.load(weights_only=True))"
    ], lines
    assert any(line.startswith("Restoring states from the checkpoint path") for line in lines), lines  # Lightning's
    assert not any("weights_only` was not set" in line for line in lines), lines


# ------------------------------------------------------------------------------------------------ flipped bytes
@pytest.mark.parametrize("command", ["eval", "export"])
def test_flipped_bytes_in_a_trained_checkpoint_are_named_by_the_commands(trained, tmp_path, capsys, command):
    run = _copy_run(trained[0], tmp_path)
    checkpoint = run / "checkpoints" / "best.ckpt"
    entry = _entry_at(checkpoint, len(checkpoint.read_bytes()) // 2)
    _flip_middle(checkpoint)
    extra = ["--out", str(tmp_path / "out")] if command == "export" else ["--accelerator", "cpu"]
    assert linvit_main([command, str(run), *extra]) != 0
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert f"'{checkpoint}' is damaged: entry '{entry}' fails its CRC check" in line, line
    assert "acc1" not in captured.out and not (tmp_path / "out").exists()


@pytest.mark.parametrize("trusted", [False, True])
def test_ckpt_path_names_the_damaged_entry_before_anything_is_built(trained, tmp_path, trusted):
    run = _copy_run(trained[0], tmp_path)
    checkpoint = run / "checkpoints" / "last.ckpt"
    entry = _entry_at(checkpoint, len(checkpoint.read_bytes()) // 2)
    _flip_middle(checkpoint)
    cfg = OmegaConf.create({"ckpt_path": str(checkpoint), "trust_checkpoint": trusted, "paths": {"output_dir": "x"}})
    with pytest.raises(DamagedCheckpointError) as error:
        resolve_ckpt_path(cfg)
    line = _one_line(str(error.value))
    assert f"'{checkpoint}' is damaged: entry '{entry}' fails its CRC check" in line, line


def test_resume_from_a_damaged_last_ckpt_names_the_intact_best(trained, tmp_path):
    run = _copy_run(trained[0], tmp_path)
    _flip_middle(run / "checkpoints" / "last.ckpt")
    cfg = OmegaConf.create({"resume": True, "paths": {"output_dir": str(run)}})
    with pytest.raises(DamagedCheckpointError, match=r"fails its CRC check.*ckpt_path=.*best\.ckpt"):
        resolve_ckpt_path(cfg)


@pytest.mark.slow  # a train.py process: ~15 s
def test_train_py_ckpt_path_prints_one_line_and_exits_1(trained, tmp_path):
    import subprocess
    import sys

    from train_helpers import FAST, REPO, TINY_TIMM

    run = _copy_run(trained[0], tmp_path)
    checkpoint = run / "checkpoints" / "best.ckpt"
    entry = _entry_at(checkpoint, len(checkpoint.read_bytes()) // 2)
    _flip_middle(checkpoint)
    command = [sys.executable, str(REPO / "train.py"), *TINY_TIMM, *FAST, f"ckpt_path={checkpoint}",
               f"paths.output_dir={tmp_path / 'resumed'}", "hydra.job_logging.root.level=CRITICAL"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    line = _one_line(result.stderr)
    assert f"'{checkpoint}' is damaged: entry '{entry}' fails its CRC check" in line, line


def test_a_checkpoint_replaced_after_the_run_differs_from_its_recorded_sha256(trained, tmp_path):
    run = _copy_run(trained[0], tmp_path)
    best, last = run / "checkpoints" / "best.ckpt", run / "checkpoints" / "last.ckpt"
    shutil.copyfile(last, best)  # an intact archive, but not the one the run saved as best.ckpt
    cfg = OmegaConf.create({"ckpt_path": str(best), "paths": {"output_dir": "x"}})
    with pytest.raises(DamagedCheckpointError) as error:
        resolve_ckpt_path(cfg)
    line = _one_line(str(error.value))
    assert f"'{best}' is damaged" in line and "recorded when linvit saved it (.linvit-written.json)" in line, line


def test_the_zip_directory_and_local_headers_are_checked(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save({"w": torch.randn(256, 256), "b": torch.randn(256)}, path)
    with zipfile.ZipFile(path) as archive:
        entry = next(info for info in archive.infolist() if info.filename.endswith("data/0"))
    data = bytearray(path.read_bytes())
    data[entry.header_offset + 30] ^= 0x01  # the entry's name in its local header
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpointError, match=rf"entry '{entry.filename}' cannot be read"):
        load_checkpoint_file(path)


def test_absurd_declared_sizes_are_refused_before_reading(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save({"w": torch.randn(64, 64)}, path)
    data = bytearray(path.read_bytes())
    directory = data.rfind(b"PK\x01\x02")  # the last central directory entry
    name_length = struct.unpack_from("<H", data, directory + 28)[0]
    name = data[directory + 46 : directory + 46 + name_length].decode()
    struct.pack_into("<I", data, directory + 24, 0xFFFFFFF0)  # its uncompressed size: ~4 GB in a small file
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpointError, match=rf"entry '{name}' declares 4,294,967,280 bytes"):
        check_checkpoint_intact(path)


# ------------------------------------------------------------------------------------------------ safetensors
def _exported(trained: tuple[Path, list[str]], tmp_path: Path) -> Path:
    folder = tmp_path / "exported"
    folder.mkdir()
    for name in ("model.safetensors", "config.json"):
        shutil.copyfile(trained[0] / name, folder / name)
    return folder


def _flip_tensor_byte(path: Path) -> None:
    """Flip one byte inside the last tensor's data (the header still matches the file)."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_exported_weights_is_caught_by_the_sha256_in_config_json(trained, tmp_path, capsys):
    folder = _exported(trained, tmp_path)
    timm.create_model(f"local-dir:{folder}", pretrained=True)  # intact: loads
    weights = folder / "model.safetensors"
    _flip_tensor_byte(weights)
    expected = f"'{weights}' is damaged: its SHA-256"
    with pytest.raises(DamagedCheckpointError, match="the SHA-256 in config.json beside it") as error:
        timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert expected in _one_line(str(error.value))
    image = _image(tmp_path)
    assert linvit_main(["predict", str(image), "--model", MODEL, "--checkpoint", str(folder)]) != 0
    assert expected in _one_line(capsys.readouterr().err)
    out = tmp_path / "model.pt2"
    assert (
        linvit_main(["export", "--model", MODEL, "--checkpoint", str(folder), "--format", "pt2", "--out", str(out)])
        != 0
    )
    assert expected in _one_line(capsys.readouterr().err) and not out.exists()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda data: data.__setitem__(slice(0, 8), struct.pack("<Q", 1 << 40)), "its header length says"),
        (lambda data: data.__setitem__(9, ord("}")), "its header is not plain JSON"),
        (lambda data: data.__setitem__(slice(-100, None), b""), "its data section is"),
        (lambda data: data.extend(b"\0" * 8), "its data section is"),
    ],
    ids=["length", "json", "cut", "grown"],
)
def test_a_damaged_safetensors_header_is_named(tmp_path, damage, says):
    path = tmp_path / "weights.safetensors"
    save_file({"a": torch.randn(8, 8), "b": torch.randn(16)}, str(path))
    data = bytearray(path.read_bytes())
    damage(data)
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpointError) as error:
        load_checkpoint_file(path)
    assert f"'{path}' is damaged: {says}" in _one_line(str(error.value))


def test_safetensors_offsets_must_match_dtype_and_shape(tmp_path):
    path = tmp_path / "weights.safetensors"
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2],
              "data_offsets": [8, 16]}}  # fmt: skip
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 16)
    with pytest.raises(DamagedCheckpointError, match=r"tensor 'a' \(F32 \[4\]\) needs 16 bytes, its offsets give 8"):
        verify_file(path)


def test_a_recorded_sha256_mismatch_is_named(tmp_path):
    path = tmp_path / "weights.safetensors"
    write_file(path, lambda tmp: save_file({"w": torch.randn(32, 32)}, str(tmp)), kind="safetensors")
    load_checkpoint_file(path)
    _flip_tensor_byte(path)
    with pytest.raises(DamagedCheckpointError) as error:
        load_checkpoint_file(path)
    line = _one_line(str(error.value))
    assert f"'{path}' is damaged: its SHA-256" in line and "recorded when linvit saved it" in line, line
    legacy = tmp_path / "legacy.pth"  # a pickle without a zip's CRCs: only the record can tell
    write_file(legacy, lambda tmp: torch.save({"w": torch.ones(64)}, tmp, _use_new_zipfile_serialization=False),
               kind="pth")  # fmt: skip
    _flip_tensor_byte(legacy)
    with pytest.raises(DamagedCheckpointError, match="recorded when linvit saved it"):
        check_checkpoint_intact(legacy)


# ------------------------------------------------------------------------------------------------ non-finite weights
def _poisoned_state_dict() -> tuple[dict[str, torch.Tensor], str]:
    model = timm.create_model(MODEL, num_classes=10)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    name = next(key for key, value in state.items() if value.is_floating_point() and value.numel() > 1)
    state[name].view(-1)[0] = float("nan")
    return state, name


def test_convert_refuses_non_finite_weights_unless_allowed_and_local_dir_refuses_them(tmp_path, capsys):
    state, name = _poisoned_state_dict()
    source = tmp_path / "poisoned.pth"
    torch.save(state, source)
    folder = tmp_path / "converted"
    assert linvit_main(["convert", str(source), str(folder), "--model", MODEL]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(source) in line and name in line and "--allow-non-finite" in line, line
    assert not (folder / "model.safetensors").exists()

    with pytest.warns(UserWarning, match=name):
        assert linvit_main(["convert", str(source), str(folder), "--model", MODEL, "--allow-non-finite"]) == 0
    assert json.loads((folder / "config.json").read_text())["sha256"] == file_sha256(folder / "model.safetensors")
    with pytest.raises(NonFiniteWeightsError) as error:
        timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert name in str(error.value) and "allow_non_finite=True" in str(error.value)
    with pytest.warns(UserWarning, match=name):
        model = timm.create_model(f"local-dir:{folder}", pretrained=True, allow_non_finite=True)
    assert torch.isnan(model.state_dict()[name]).any()


def test_a_local_dir_folder_without_sha256_is_still_checked_for_non_finite_weights(trained, tmp_path):
    folder = _exported(trained, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["sha256"]  # e.g. written by an older linvit
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[-1]
    weights[name].view(-1)[0] = float("inf")
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(NonFiniteWeightsError, match=rf"{name} \(1 Inf"):
        timm.create_model(f"local-dir:{folder}", pretrained=True)


def test_an_intact_file_is_verified_once_while_it_stays_the_same(tmp_path, monkeypatch):
    from linvit.io import integrity

    path = tmp_path / "weights.pth"
    torch.save({"w": torch.randn(16)}, path)
    calls = []
    monkeypatch.setattr(integrity, "_verify_zip", lambda *args: calls.append(args))
    verify_file(path)
    verify_file(path)
    assert len(calls) == 1
    torch.save({"w": torch.randn(16)}, path)  # rewritten: verified again
    verify_file(path)
    assert len(calls) == 2
    assert issubclass(DamagedCheckpointError, CheckpointError)  # the commands print it in one line


def _image(tmp_path: Path) -> Path:
    image = tmp_path / "image.png"
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype("uint8")).save(image)
    return image


@pytest.mark.parametrize("features", [False, True])
def test_weights_for_a_model_outside_linvit_are_verified_before_timm_reads_them(tmp_path, capsys, features):
    """``--model test_resnet --checkpoint FILE`` with a config.json: timm's own loader reads the file."""
    weights = tmp_path / "model.safetensors"
    state = timm.create_model("test_resnet", num_classes=10).state_dict()
    write_file(weights, lambda tmp: save_file(state, str(tmp)), kind="safetensors")
    config = {"architecture": "test_resnet", "num_classes": 10, "model_args": {"in_chans": 3}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _flip_tensor_byte(weights)
    if features:
        out = tmp_path / "features.pt2"
        command = ["export", "--model", "test_resnet", "--checkpoint", str(weights), "--features-only",
                   "--format", "pt2", "--out", str(out)]  # fmt: skip
    else:
        command = ["predict", str(_image(tmp_path)), "--model", "test_resnet", "--checkpoint", str(weights)]
    assert linvit_main(command) != 0
    line = _one_line(capsys.readouterr().err)
    assert f"'{weights}' is damaged: its SHA-256" in line and "recorded when linvit saved it" in line, line


def test_a_sha256_in_config_json_that_is_not_one_is_named(trained, tmp_path):
    folder = _exported(trained, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["sha256"] = "x" * 500
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint_file(folder / "model.safetensors")
    line = _one_line(str(error.value))
    assert str(folder / "config.json") in line and "sha256 must be the 64 hex digits" in line and len(line) < 300
