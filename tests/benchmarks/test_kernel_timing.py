"""benchmarks/kernel_timing.py (GPU only): its report, whole or cut short, and its one line without a GPU."""

from __future__ import annotations

import pytest
import torch

from linvit.bench import kernel_timing


def _result(**measured):
    return {"gpu": "NVIDIA H200", "shape": "benchmark", "iterations": 20, **measured}


def test_the_report_sums_each_pass_and_lists_its_kernels_by_time():
    result = _result(
        first_call_gradient_error={"x": 1e-3},
        focused_forward={"state_kernel": {"us": 120.0, "launches": 1}, "output_kernel": {"us": 900.0, "launches": 1}},
        spills=[{"kernel": "query_grad_kernel", "config": "BLOCK_N: 64", "spills": 410}],
        configurations={"output": {"chosen": ["BLOCK_N: 32"], "measured_ms": {"BLOCK_N: 32": 0.9}}},
    )
    text = kernel_timing.report(result)
    assert "## focused, forward: 1.020 ms of kernels per call" in text
    assert text.index("`output_kernel` | 900.0") < text.index("`state_kernel` | 120.0")
    assert "x 1.00e-03" in text and "query_grad_kernel BLOCK_N: 64: 410" in text
    assert "## window, forward+backward: not measured" in text  # a run stopped before it


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so_in_one_line(capsys, tmp_path):
    assert kernel_timing.main(["--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == "error: kernel timing needs a CUDA GPU"
    assert list(tmp_path.iterdir()) == []


def test_importing_it_leaves_the_interpreter_setting_alone():
    import os
    import subprocess
    import sys

    code = "import os; import linvit.bench.kernel_timing; print(os.environ.get('TRITON_INTERPRET'))"
    environment = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_it_saves_after_each_step_and_never_over_a_users_file(monkeypatch, tmp_path, capsys):
    steps = []

    def measure(iterations, save):
        for step in ({"first_call_gradient_error": {"x": 0.0}}, {"focused_forward": {}}):
            steps.append(step)
            save(_result(**{key: value for done in steps for key, value in done.items()}))
        return _result()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(kernel_timing, "measure", measure)
    (tmp_path / "kernel-timing.md").write_text("the user's notes")
    assert kernel_timing.main(["--out", str(tmp_path)]) == 1
    assert "kernel-timing.md" in capsys.readouterr().err and steps == []  # refused before measuring
    assert (tmp_path / "kernel-timing.md").read_text() == "the user's notes"
    out = tmp_path / "fresh"
    assert kernel_timing.main(["--out", str(out)]) == 0
    assert "## focused, forward: 0.000 ms" in (out / "kernel-timing.md").read_text()
    assert '"focused_forward"' in (out / "kernel-timing.json").read_text()
