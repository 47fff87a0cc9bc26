"""The two primitives every untrusted read and every write goes through: ``linvit.io.bounded`` (JSON/YAML from a file
nobody vouched for) and the record of ``linvit.io.destination`` (what linvit wrote, and its SHA-256)."""

from __future__ import annotations

import json
import os

import pytest

from linvit.io.bounded import MAX_NESTING, UntrustedFileError, parse_json, parse_yaml, read_yaml
from linvit.io.destination import RECORD_NAME, file_sha256, recorded_sha256s, write_file
from linvit.io.integrity import verify_file


@pytest.mark.parametrize(
    "text, named",
    [
        ("evil: !!python/object/apply:os.system ['true']\n", "python/object/apply:os.system"),
        ("evil: !!python/name:os.system\n", "python/name:os.system"),
        ("evil: !!binary aGk=\n", "binary"),
        ("evil: !custom 1\n", "!custom"),
        ("a: &a [1]\nb: *a\n", "aliases"),
        ('"_target_ ": builtins.eval\n', "'_target_ '"),
        ("a: " + "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1) + "\n", "nested deeper"),
    ],
)
def test_yaml_that_only_an_unsafe_loader_reads_is_one_line_naming_it(text, named):
    with pytest.raises(UntrustedFileError) as error:
        parse_yaml(text, "run/config.yaml")
    message = str(error.value)
    assert "run/config.yaml" in message and named in message and "\n" not in message, message


def test_plain_yaml_reads_as_plain_data_and_a_date_stays_text():
    assert parse_yaml("a: 1\nb: [1.5, x]\nwhen: 2026-12-03\nnone: null\n", "c") == {
        "a": 1,
        "b": [1.5, "x"],
        "when": "2026-12-03",
        "none": None,
    }


def test_json_constants_and_size_are_refused():
    with pytest.raises(UntrustedFileError, match="NaN, which is not JSON"):
        parse_json('{"mean": [NaN]}', "config.json")
    with pytest.raises(UntrustedFileError, match="over the 16 "):
        parse_json('{"a": "' + "x" * 32 + '"}', "config.json", limit=16)


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(UntrustedFileError, match="not a regular file"):
        read_yaml(fifo)


def test_a_kill_between_the_record_and_the_rename_leaves_a_record_that_accepts_the_old_file(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    def weights(value: float):
        return lambda tmp: save_file({"w": torch.full((4,), value)}, str(tmp))

    path = tmp_path / "model.safetensors"
    write_file(path, weights(1.0), "weights")
    old_bytes, old = path.read_bytes(), file_sha256(path)

    def killed(source, destination):  # the process dies after the record was written, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_file(path, weights(2.0), "weights")
    monkeypatch.undo()
    assert path.read_bytes() == old_bytes and old in recorded_sha256s(path)
    verify_file(path)  # the intact old file is not called damaged
    write_file(path, weights(2.0), "weights")  # still linvit's: no --force needed
    assert recorded_sha256s(path) == (file_sha256(path),)
    assert json.loads((tmp_path / RECORD_NAME).read_text())[path.name]["sha256"] == file_sha256(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, path.name]
