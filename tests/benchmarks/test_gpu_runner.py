"""The one-process GPU runner (linvit/bench/gpu.py, run by benchmarks/run_gpu.sh) runs end to end on the CPU at
tiny sizes, without Hydra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linvit.bench import gpu

REPO_ROOT = Path(__file__).resolve().parents[2]


def _pythonpath_blocking(folder: Path, names=("hydra", "omegaconf", "lightning")) -> str:
    """A PYTHONPATH whose first folder shadows ``names`` with packages that refuse to import (the GPU machine has
    none of hydra, omegaconf and lightning)."""
    for name in names:
        package = folder / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise ImportError('{name} is not installed on the GPU machine')\n")
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def test_quick_cpu_run_measures_every_row_without_hydra(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=_pythonpath_blocking(tmp_path / "blocked"))
    command = [sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| measure |" in done.stdout and "Byte model" in done.stdout

    [table] = out.glob("targets-*.md")
    [raw] = out.glob("targets-*.json")
    record = json.loads(raw.read_text())
    assert record["imported"] == []
    assert table.read_text().count("\n|") == len(record["rows"]) + 2  # header, separator, one line per row
    measures = [row["measure"] for row in record["rows"]]
    for expected in ("forward, 16²", "forward+backward, 16²", "forward, 8²", "achieved bandwidth", "peak memory"):
        assert any(expected in m for m in measures), expected
    for expected in ("linvit_tiny` / `convnext_tiny", "48² batch 1", "flatten_swin_tiny_patch4_224", "training img/s"):
        assert any(expected in m for m in measures), expected
    statuses = {key: m["status"] for key, m in record["measurements"].items()}
    # everything runs on the CPU except the CUDA allocator's peak memory
    assert all(s == "ok" for k, s in statuses.items() if not k.startswith("memory|")), statuses
    assert all(s == "n/a" for k, s in statuses.items() if k.startswith("memory|")), statuses
    sizes = record["sizes"]
    tokens, channels = sizes["maps"][-1] ** 2, sizes["heads"] * sizes["head_dim"]
    core = record["measurements"][f"core|{sizes['maps'][-1]}|auto"]
    assert core["bytes"] == sizes["batch"] * tokens * 4 * channels * 4  # q|k|v read + o written, fp32 here
    ratios = [row["ratio_fused"] for row in record["rows"] if row["ratio_fused"] is not None]
    assert len(ratios) == len(record["rows"]) - 1 and all(r > 0 for r in ratios)  # all but the memory row


def test_targets_and_cells():
    assert gpu.Row("m", "ms", "≤ 0.5", 1.0, 1.0, 4.0, ratio_fused=0.25).met() is True
    assert gpu.Row("m", "ms", "≤ 0.5", 3.0, 1.0, 4.0, ratio_fused=0.75).met() is False
    assert gpu.Row("m", "img/s", "≥ 1.0", 9.0, 1.0, 10.0, ratio_fused=0.9).met() is False
    assert gpu.Row("m", "s", "≤ 60 s", 42.0).met() is True
    assert gpu.Row("m", "s", "≤ 60 s", "> 75").met() is False  # stopped at the budget after 75 s
    assert gpu.Row("m", "s", "≤ 60 s", "> 30").met() is None
    assert gpu.Row("m", "ms", "", 1.0, ratio_fused=0.1).met() is None
    assert gpu.Row("m", "ms", "≤ 1.0", "skipped").met() is None
    table = gpu.markdown_table([gpu.Row("a", "ms", "≤ 0.5", 0.372, "n/a", 123.4, ratio_fused=0.003, note="why")])
    assert "| a | 0.37 ms | n/a | 123 ms | 0.00 | — | ≤ 0.5 | yes |" in table
    assert table.endswith("- a: why")


def test_rows_that_do_not_fit_the_budget_are_skipped_and_say_so():
    import torch

    bench = gpu.Bench(torch.device("cpu"), "fp32", gpu.QUICK, gpu.Budget(0.0), seconds_per_case=0.0)
    [row] = gpu.memory_rows(bench)
    assert row.fused == row.baseline == "skipped" and "time budget" in row.note
    assert gpu.compile_rows(bench, "eager")[0].fused == "skipped"


def test_a_compile_that_outlives_the_budget_is_stopped_and_reported(monkeypatch):
    import torch

    def too_slow(command, timeout, **kwargs):
        assert "--compile-child" in command and timeout > 20
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(gpu.subprocess, "run", too_slow)
    bench = gpu.Bench(torch.device("cpu"), "fp32", gpu.QUICK, gpu.Budget(100.0), seconds_per_case=0.0)
    [row] = gpu.compile_rows(bench, "inductor")
    assert row.fused.startswith("> ") and "still compiling" in row.note
    assert bench.results["compile|linvit_tiny"]["status"] == "stopped"


@pytest.mark.slow
def test_compile_child_reports_compile_time_and_gain():
    command = [sys.executable, "-m", "linvit.bench.gpu", "--compile-child", "--device", "cpu", "--compile-backend"]
    command += ["eager", "--compile-size", "32", "--compile-batch", "1"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["compile_s"] > 0 and result["eager_ms"] > 0 and result["compiled_ms"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("dev_plugins", [True, False], ids=["with_the_dev_plugins", "bare_pytest"])
def test_gpu_check_runs_both_steps_and_records_them(tmp_path, dev_plugins):
    """benchmarks/gpu_check.sh (the one command for a lent GPU) runs the kernel timing, the GPU test tier and then the
    target table, each under its own limit, and leaves versions and logs in OUT. On a machine without a GPU the timing
    and the table say there is no CUDA device and the tier skips: the script still runs every step and reports each
    exit code. The GPU machine's image
    may have pytest without pytest-xdist and pytest-timeout, whose options pyproject's addopts give: it runs there
    too."""
    environment = {**os.environ, "GPU_TIMING_SECONDS": "60", "GPU_TESTS_SECONDS": "120", "GPU_TABLE_SECONDS": "60",
                   "PYTHON": sys.executable}  # fmt: skip
    environment.pop("TRITON_INTERPRET", None)
    if not dev_plugins:  # neither importable nor loaded by pytest
        environment["PYTHONPATH"] = _pythonpath_blocking(tmp_path / "blocked", names=("xdist",))
        environment["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)],
        capture_output=True, text=True, env=environment, timeout=300, check=False,
    )  # fmt: skip
    assert (tmp_path / "gpu-tests.txt").exists() and (tmp_path / "gpu-targets.txt").exists(), done.stderr[-2000:]
    versions = (tmp_path / "gpu-versions.txt").read_text()
    assert "torch" in versions and "Triton" in versions
    if not torch.cuda.is_available():
        assert "skipped" in (tmp_path / "gpu-tests.txt").read_text(), (tmp_path / "gpu-tests.txt").read_text()[-2000:]
        assert "gpu_check: kernel timing exit 1, tests exit 0, target table exit 1" in versions
        timing = (tmp_path / "kernel-timing.log").read_text()
        assert done.returncode == 1 and "error: kernel timing needs a CUDA GPU" in timing
