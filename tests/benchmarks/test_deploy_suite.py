"""The benchmark's deploy suite: eager PyTorch beside ONNX Runtime on the CPU (`linvit bench --only deploy`)."""

from __future__ import annotations

import argparse

import pytest

from linvit.bench.cases import DEPLOY_MODELS, DEPLOY_SIZES, RUNTIMES, SUITES, deploy_cases


def test_deploy_cases_pair_every_runtime_with_eager():
    assert "deploy" in SUITES and DEPLOY_SIZES == (512, 1024, 2048)
    # issue 37: linvit's two families beside the peers a user would deploy instead
    assert {"linvit_tiny", "swin_tiny_patch4_window7_224", "convnext_tiny", "efficientvit_b2"} <= set(DEPLOY_MODELS)
    assert {"torch_eager", "torch_eager_bf16", "torch_compile", "onnxruntime_cpu", "onnxruntime_int8"} == set(RUNTIMES)
    cases = deploy_cases(list(DEPLOY_MODELS), list(DEPLOY_SIZES))
    assert {(c["model"], c["size"], c["runtime"]) for c in cases} == {
        (m, s, r) for m in DEPLOY_MODELS for s in DEPLOY_SIZES for r in RUNTIMES
    }


def test_deploy_suite_takes_the_models_and_sizes_given(tmp_path):
    from linvit.bench import run

    args = run.build_parser().parse_args(["--only", "deploy", "--models", "convnext_tiny", "--sizes", "256"])
    settings = run._settings(args)
    sizes = [height for height, width in settings["sizes"] if height == width]
    cases = deploy_cases(run._csv(args.models, DEPLOY_MODELS), sizes, settings["runtimes"])
    assert {(c["model"], c["size"]) for c in cases} == {("convnext_tiny", 256)}
    assert {c["runtime"] for c in cases} == set(RUNTIMES)
    args = run.build_parser().parse_args(["--only", "deploy", "--runtimes", "torch_eager, onnxruntime_int8"])
    assert run._settings(args)["runtimes"] == ["torch_eager", "onnxruntime_int8"]
    with pytest.raises(SystemExit, match="unknown runtime"):
        run._settings(run.build_parser().parse_args(["--only", "deploy", "--runtimes", "tensorrt"]))


def test_deploy_table_reports_the_ratio_to_eager():
    from linvit.bench.report import _deploy_table

    rows = {}
    for runtime, ms in (("torch_eager", 300.0), ("onnxruntime_cpu", 200.0)):
        case = {"suite": "deploy", "model": "linvit_tiny", "size": 512, "runtime": runtime, "batch": 1}
        rows[runtime] = {"case": case, "status": "ok", "latency_ms": ms}
    text = "\n".join(_deploy_table(rows))
    assert "| linvit_tiny | 512² | onnxruntime_cpu | 200 | – | 1.50× |" in text


def test_deploy_table_compares_best_runtimes_and_growth():
    from linvit.bench.report import _deploy_table

    timings = {
        ("linvit_tiny", 512, "torch_eager"): 300.0,
        ("linvit_tiny", 512, "onnxruntime_cpu"): 200.0,
        ("linvit_tiny", 512, "onnxruntime_int8"): 50.0,  # int8 and bf16 are not the fp32 best
        ("linvit_tiny", 512, "torch_eager_bf16"): 60.0,
        ("linvit_tiny", 1024, "torch_eager"): 1000.0,
        ("linvit_tiny", 1024, "onnxruntime_cpu"): 900.0,
        ("convnext_tiny", 512, "torch_eager"): 250.0,
        ("convnext_tiny", 512, "torch_compile"): 400.0,
        ("convnext_tiny", 1024, "torch_eager"): 1500.0,
    }
    rows = {}
    for (model, size, runtime), ms in timings.items():
        case = {"suite": "deploy", "model": model, "size": size, "runtime": runtime, "batch": 1}
        rows[(model, size, runtime)] = {"case": case, "status": "ok", "latency_ms": ms, "min_ms": ms - 1}
    text = "\n".join(_deploy_table(rows))
    assert "| convnext_tiny | 512² | torch_eager | 250 | 0.80 |" in text  # 200 / 250
    assert "| linvit_tiny | 512² | onnxruntime_cpu | 200 | 1.00 |" in text
    assert "| convnext_tiny | 1024² | torch_eager | 1,500 | 0.60 |" in text  # 900 / 1500
    assert "| linvit_tiny | onnxruntime_cpu | 4.5× |" in text  # 900 / 200
    assert "| convnext_tiny | torch_compile |" not in text  # no 1024² row to grow to


@pytest.mark.slow
def test_deploy_cases_measure_in_process():
    pytest.importorskip("onnxruntime")
    import torch

    from linvit.bench import worker
    from linvit.bench.models import cpu_has_bf16
    from linvit.bench.operators import Unavailable

    args = argparse.Namespace(dtype="fp32", budget=0.01, repeats=1, warmup=1)
    for case in deploy_cases(["linvit_nano"], [96]):
        if case["runtime"] == "torch_eager_bf16" and not cpu_has_bf16():
            # A CPU without bf16 instructions (CI's machine) would emulate it: the case says so and is not timed.
            with pytest.raises(Unavailable, match="no bf16 instructions"):
                worker.run_case(case, "latency", torch.device("cpu"), args)
            continue
        assert worker.run_case(case, "latency", torch.device("cpu"), args)["latency_ms"] > 0


def test_bf16_case_is_refused_in_one_line_on_a_cpu_without_bf16(monkeypatch):
    import torch

    from linvit.bench import models
    from linvit.bench.operators import Unavailable

    monkeypatch.setattr(models, "cpu_has_bf16", lambda: False)
    case = {"suite": "deploy", "model": "linvit_nano", "size": 64, "runtime": "torch_eager_bf16", "batch": 1}
    with pytest.raises(Unavailable, match="no bf16 instructions"):
        models.deploy_callable(case, torch.device("cpu"), "fp32")
    monkeypatch.setattr(models, "cpu_has_bf16", lambda: True)
    run, _ = models.deploy_callable(case, torch.device("cpu"), "fp32")
    assert run().dtype == torch.bfloat16  # autocast ran the model in bf16


def test_deploy_table_reports_int8_against_fp32_onnxruntime():
    from linvit.bench.report import _deploy_table

    rows = {}
    for runtime, ms in (("torch_eager", 300.0), ("onnxruntime_cpu", 200.0), ("onnxruntime_int8", 125.0)):
        case = {"suite": "deploy", "model": "linvit_tiny", "size": 512, "runtime": runtime, "batch": 1}
        rows[runtime] = {"case": case, "status": "ok", "latency_ms": ms}
    text = "\n".join(_deploy_table(rows))
    assert "| linvit_tiny | 512² | onnxruntime_int8 | 125 | – | 2.40× |" in text
    assert "- linvit_tiny at 512²: int8 1.60× faster than fp32" in text


def test_the_report_draws_the_deploy_suite_beside_its_tables(tmp_path):
    pytest.importorskip("matplotlib")
    from linvit.bench.report import write_report

    records = []
    for model, size, runtime, ms in (
        ("linvit_tiny", 512, "torch_eager", 300.0),
        ("linvit_tiny", 1024, "torch_eager", 1200.0),
        ("convnext_tiny", 512, "onnxruntime_cpu", 250.0),
    ):
        case = {"suite": "deploy", "model": model, "size": size, "runtime": runtime, "batch": 1}
        records.append({"key": f"{model}-{size}-{runtime}", "kind": "latency", "case": case, "status": "ok",
                        "latency_ms": ms})  # fmt: skip
    write_report(tmp_path, {"records": records, "runs": []})
    text = (tmp_path / "RESULTS.md").read_text()
    assert "![deploy_latency.png](deploy_latency.png)" in text and "| linvit_tiny | torch_eager | 4.0× |" in text
    assert (tmp_path / "deploy_latency.png").read_bytes().startswith(b"\x89PNG")
