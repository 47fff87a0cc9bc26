"""`linvit memory`: the per-stage report, JSON, the budget search, measurement, and refusals."""

import json

import pytest

from linvit.cli import main
from linvit.memory import estimate_memory
from linvit.memory.units import format_bytes


def test_report_per_stage(capsys):
    assert main(["memory", "linvit_nano", "--size", "256x384"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("stage "))
    rows = [line.split() for line in lines[header + 1 : header + 5]]
    assert [row[0] for row in rows] == ["stages.0", "stages.1", "stages.2", "stages.3"]
    assert [row[1] for row in rows] == ["64×96", "32×48", "16×24", "8×12"]
    assert [int(row[2]) for row in rows] == [64 * 96, 32 * 48, 16 * 24, 8 * 12]
    assert "focused linear" in lines[header + 1] and "window softmax 8×8" in lines[header + 4]
    expected = estimate_memory("linvit_nano", 256, 384)
    assert f"peak: {format_bytes(expected.peak_bytes)} (during stages.0)" in out
    assert "inference, batch×H×W 1×256×384, fp32, cpu" in out
    assert "MALLOC_MMAP_THRESHOLD_" in out  # the CPU note


def test_json_training(capsys):
    assert main(["memory", "linvit_nano", "--size", "128", "--train", "--batch", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    estimate = result["estimate"]
    assert (estimate["batch"], estimate["height"], estimate["width"], estimate["train"]) == (2, 128, 128, True)
    assert estimate["optimizer_bytes"] > 2 * estimate["parameter_bytes"]
    assert [stage["name"] for stage in estimate["stages"]] == ["stages.0", "stages.1", "stages.2", "stages.3"]
    assert estimate["peak_bytes"] == estimate["state_bytes"] + estimate["activation_bytes"]


def test_budget_reports_largest_input_and_batch(capsys):
    budget = estimate_memory("linvit_nano", 512, 512, batch=3).peak_bytes
    assert main(["memory", "linvit_nano", "--size", "512x512", "--budget", f"{budget}B", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["budget"]
    assert fit["budget_bytes"] == budget
    assert fit["largest_batch"]["batch"] == 3
    largest = fit["largest_size"]
    assert largest["height"] == largest["width"] and largest["height"] % 256 == 0  # linvit_nano: no padding
    assert largest["peak_bytes"] <= budget


def test_budget_text(capsys):
    assert main(["memory", "linvit_nano", "--size", "256x512", "--budget", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "budget 1.0 GiB:" in out
    assert "largest 256×512-shaped input at batch 1: " in out and "largest batch at 256×512: " in out


def test_measure_prints_measured_beside_predicted(capsys):
    assert main(["memory", "linvit_nano", "--size", "224", "--measure", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)  # the whole of stdout: the measuring step is said on stderr
    assert "[linvit memory] measuring: running linvit_nano for real in a fresh process" in err
    measurement = result["measurement"]
    assert measurement["kind"] == "peak RSS, malloc returns freed blocks"
    assert abs(measurement["prediction_error"]) <= 0.15
    assert measurement["peak_bytes"] > result["estimate"]["parameter_bytes"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no_such_model"], "Unknown model 'no_such_model'"),
        (["linvit_nano", "--size", "12xab"], "is not HxW"),
        (["linvit_nano", "--budget", "80"], "e.g. 80GiB"),
        (["linvit_nano", "--batch", "0"], "batch must be a positive integer"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, message, capsys):
    assert main(["memory", *argv]) == 2
    assert message in capsys.readouterr().err


def test_other_libraries_window_attention_names_its_window(capsys):
    """timm's Swin: its own WindowAttention class, labelled with the window it attends in."""
    assert main(["memory", "swin_tiny_patch4_window7_224", "--size", "224"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("layers.")]
    assert [row.split()[0] for row in rows] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert all("WindowAttention 7×7 ×" in row for row in rows)
