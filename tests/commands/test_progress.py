"""Progress of the long commands goes to stderr (one `[linvit COMMAND i/n]` line per step, a tqdm bar on a terminal),
never into stdout or a `--json` result, and `--no-progress` silences it (linvit.utils.progress)."""

from __future__ import annotations

import json
import re

import torch

from linvit.cli import main
from linvit.utils.progress import Progress, is_progress_line


def _progress_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if is_progress_line(line)]


def test_steps_and_items_are_lines_on_stderr(capsys):
    progress = Progress("demo", bar=False)
    progress.step("first", (1, 2))
    assert list(progress.items(["a", "b"], describe=str.upper)) == ["a", "b"]
    progress.step("no count")
    out, err = capsys.readouterr()
    assert out == ""
    assert re.fullmatch(
        r"\[linvit demo 1/2\] first \(\d+ s\)\n\[linvit demo 1/2\] A \(\d+ s\)\n"
        r"\[linvit demo 2/2\] B \(\d+ s\)\n\[linvit demo\] no count \(\d+ s\)\n",
        err,
    ), err


def test_a_terminal_gets_a_bar_and_disabled_progress_says_nothing(capsys):
    assert list(Progress("demo", bar=True).items(range(3))) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "linvit demo:" in err and "0/3" in err and not _progress_lines(err)  # tqdm's bar, not the lines
    quiet = Progress("demo", enabled=False)
    quiet.step("hidden")
    assert list(quiet.items([1, 2])) == [1, 2]
    assert capsys.readouterr() == ("", "")


def test_models_names_each_model_on_stderr(capsys):
    assert main(["models", "--pattern", "linvit_n*"]) == 0
    out, err = capsys.readouterr()
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert names and [line.split("] ")[1].split(" (")[0] for line in _progress_lines(err)] == names
    assert [line.split("]")[0] for line in _progress_lines(err)] == [
        f"[linvit models {i}/{len(names)}" for i in range(1, len(names) + 1)
    ]
    assert not any(is_progress_line(line) for line in out.splitlines())
    assert main(["models", "--pattern", "linvit_n*", "--no-progress"]) == 0
    assert not _progress_lines(capsys.readouterr().err)


def test_memory_json_stays_pure_json_with_progress_on_stderr(capsys):
    """The budget's searches (dry runs); test_memory_cmd.py's --measure test checks the measuring step."""
    assert main(["memory", "linvit_nano", "--size", "64", "--budget", "1MiB", "--json"]) == 0
    out, err = capsys.readouterr()
    assert set(json.loads(out)) == {"estimate", "budget"}  # the whole of stdout
    assert [line.split("] ")[1].split(" (")[0] for line in _progress_lines(err)] == [
        "searching the largest input under 1.0 MiB",
        "searching the largest batch under 1.0 MiB",
    ], err
    assert main(["memory", "linvit_nano", "--size", "64", "--budget", "1MiB", "--json", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["budget"] and not _progress_lines(err)


def test_convert_says_each_step(tmp_path, capsys):
    import timm

    source = tmp_path / "nano.pth"
    torch.save(timm.create_model("linvit_nano", num_classes=3).state_dict(), source)
    assert main(["convert", str(source), str(tmp_path / "out.safetensors"), "--model", "linvit_nano"]) == 0
    out, err = capsys.readouterr()
    assert [line.split("] ")[0] for line in _progress_lines(err)] == [f"[linvit convert {i}/3" for i in (1, 2, 3)]
    assert f"reading {source}" in err and "fitting the weights to linvit_nano" in err
    assert out.startswith("wrote ") and not any(is_progress_line(line) for line in out.splitlines())
    assert main(["convert", str(source), str(tmp_path / "again.pth"), "--model", "linvit_nano", "--no-progress"]) == 0
    assert not _progress_lines(capsys.readouterr().err)


def test_export_says_each_step_before_it_runs(tmp_path, capsys, monkeypatch):
    """The steps' order and their place (stderr); tests/test_deploy.py exports for real (slow tier)."""
    import linvit.utils.deploy as deploy

    said_before = {}

    def export_program(model):
        said_before["tracing"] = capsys.readouterr().err
        return "program"

    def save_program(program, out, force, inputs):
        said_before["saving"] = capsys.readouterr().err
        out.write_bytes(b"program")
        return out

    class Sizes:
        def describe(self) -> str:
            return "height and width dynamic"

    monkeypatch.setattr(deploy, "export_program", export_program)
    monkeypatch.setattr(deploy, "save_program", save_program)
    monkeypatch.setattr(deploy, "program_sizes", lambda program: Sizes())
    assert main(["export", "--model", "linvit_nano", "--format", "pt2", "--out", str(tmp_path / "n")]) == 0
    out, err = capsys.readouterr()
    assert [line.split("] ")[0] for line in _progress_lines(said_before["tracing"])] == [
        "[linvit export 1/3",
        "[linvit export 2/3",
    ]
    assert [line.split("] ")[0] for line in _progress_lines(said_before["saving"])] == ["[linvit export 3/3"]
    assert out.startswith("exported linvit_nano (random weights) as pt2") and not _progress_lines(out)
