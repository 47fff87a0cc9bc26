"""Installed from a wheel, outside the checkout, linvit trains: `linvit train` with the configs the wheel ships.

The wheel used to hold only `linvit/` (no configs, no train.py): there was no way to train from an install, and
`linvit bench --quick` failed with "unrecognized arguments" (the suite lived in the checkout's benchmarks/; it is
linvit.bench now, and runs from the wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from train_helpers import SHORT  # one epoch of two steps

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout, installed into a folder of its own (dependencies from here)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "linvit", source / "linvit", symlinks=True, ignore=ignore)  # linvit/configs: the link
    shutil.copytree(REPO / "linvit_cli", source / "linvit_cli", ignore=ignore)  # the console script's entry point
    shutil.copytree(REPO / "configs", source / "configs", ignore=ignore)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist")]
    subprocess.run([*build, str(source)], check=True, capture_output=True, text=True, timeout=600)
    wheel = next((work / "dist").glob("linvit-*.whl"))
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(work / "site"), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, text=True, timeout=600)
    return work


def _run(installed: Path, cwd: Path, *arguments: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(installed / "site"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    command = [str(installed / "site" / "bin" / "linvit"), *arguments]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_wheel_ships_every_config(installed):
    wheel = next((installed / "dist").glob("linvit-*.whl"))
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("linvit/configs/")}
    expected = {f"linvit/configs/{path.relative_to(REPO / 'configs')}" for path in (REPO / "configs").rglob("*.yaml")}
    assert expected and shipped == expected


def test_the_installed_console_script_answers_help_without_torch(installed, tmp_path):
    """The wheel's `linvit` script enters through linvit_cli: `linvit --help` imports neither torch nor timm."""
    env = dict(os.environ, PYTHONPATH=str(installed / "site"))
    script = str(installed / "site" / "bin" / "linvit")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", script, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: linvit"), result.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert {"linvit_cli", "linvit.cli"} <= imported and "    train " in result.stdout  # every command listed
    assert not imported & {"torch", "timm", "lightning"}


@pytest.mark.slow  # a fresh interpreter importing torch/lightning/timm twice: ~40 s on 2 shared cores
def test_linvit_train_from_the_installed_wheel_outside_the_checkout(installed, tmp_path):
    own = tmp_path / "my_configs" / "experiment"
    own.mkdir(parents=True)
    (own / "tiny.yaml").write_text("# @package _global_\ndata:\n  img_size: 24\n")
    result = _run(installed, tmp_path, "train", "--config-dir", str(tmp_path / "my_configs"), "experiment=tiny", *SHORT)
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = (tmp_path / "outputs" / "digits_linvit_nano").iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["test/acc1"] <= 1.0 and (run_dir / "train.log").is_file()
    assert "img_size: 24" in (run_dir / "config.yaml").read_text()  # the user's experiment was used
    assert str(installed / "site" / "linvit") in (run_dir / ".hydra" / "hydra.yaml").read_text()  # the wheel's configs

    # the benchmark suite ships in the package: a tiny run from the wheel, its workers importing the wheel's linvit
    bench_options = ["--quick", "--only", "operators", "--maps", "8", "--heads", "2x8", "--ops", "linvit_linear"]
    bench_options += ["--modes", "fwd", "--no-memory", "--repeats", "1", "--budget", "0.01"]
    bench = _run(installed, tmp_path, "bench", *bench_options)
    assert bench.returncode == 0, bench.stderr[-4000:]
    records = json.loads((tmp_path / "bench-results" / "tmp" / "quick" / "results.json").read_text())["records"]
    assert [r["status"] for r in records if r["case"].get("op") == "linvit_linear"] == ["ok"], records
