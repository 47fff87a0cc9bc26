"""`linvit --help` and `linvit CMD --help` answer at once: the console script (linvit_cli) imports neither torch nor
timm before a command runs, and every command still finds linvit's models registered with timm when it runs.

Checked by what a fresh interpreter imported, not by timing it (the cold times are in README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from linvit.cli import _command_names

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "timm", "lightning", "torchvision", "numpy", "PIL", "safetensors")
# runs the console script's entry point as pip's `linvit` script does, then reports what it imported
SCRIPT = """
import json, sys
import linvit_cli
try:
    status = linvit_cli.main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
report = {"status": status, "imported": sorted(m for m in HEAVY if m in sys.modules)}
if "linvit" in sys.modules and "timm" in sys.modules:
    import timm
    report["version"] = getattr(sys.modules["linvit"], "__version__", None)
    report["registered"] = timm.is_model("linvit_tiny")
sys.stderr.write("REPORT " + json.dumps(report) + "\\n")
""".replace("HEAVY", repr(HEAVY))


def _console_script(*arguments: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    line = next(line for line in result.stderr.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT ")), result


def test_the_console_script_is_the_light_entry_point():
    scripts = (REPO / "pyproject.toml").read_text().split("[project.scripts]\n")[1].split("\n\n")[0]
    assert scripts == 'linvit = "linvit_cli:main"'  # outside the package, whose __init__ imports torch and timm


@pytest.mark.parametrize("command", ["", *(name.replace("_", "-") for name in _command_names())])
def test_help_imports_neither_torch_nor_timm(command):
    report, result = _console_script(*([command] if command else []), "--help")
    assert report["status"] == 0 and report["imported"] == [], (report, result.stderr[-2000:])
    if command == "train":  # Hydra's own help: the config groups, composed without importing the trainer
        assert "== Configuration groups ==" in result.stdout and "experiment:" in result.stdout
    else:
        assert result.stdout.startswith(f"usage: linvit {command}".rstrip()), result.stdout[:200]


def test_hydra_printing_the_config_needs_no_torch():
    report, result = _console_script("train", "--cfg", "job", "data=digits")
    assert report["status"] == 0 and report["imported"] == [], (report, result.stderr[-2000:])
    assert "_target_: linvit.train.data.datamodules.DigitsDataModule" in result.stdout


def test_a_command_finds_the_models_registered_and_linvit_fully_imported():
    report, result = _console_script("models", "--pattern", "linvit_nano", "--no-progress")
    assert report["status"] == 0, result.stderr[-2000:]
    assert report["registered"] is True and report["version"] is not None  # linvit/__init__.py ran before `run`
    assert result.stdout.splitlines()[1].split()[0] == "linvit_nano"
