"""The benchmark's deploy suite: eager PyTorch beside ONNX Runtime on the CPU (`linvit bench --only deploy`)."""

from __future__ import annotations

import argparse

import pytest

from linvit.bench.cases import DEPLOY_MODELS, DEPLOY_SIZES, RUNTIMES, SUITES, deploy_cases


def test_deploy_cases_pair_every_runtime_with_eager():
    assert "deploy" in SUITES and DEPLOY_MODELS == ("linvit_tiny",) and DEPLOY_SIZES == (512, 1024)
    cases = deploy_cases(list(DEPLOY_MODELS), list(DEPLOY_SIZES))
    assert {(c["size"], c["runtime"]) for c in cases} == {(s, r) for s in (512, 1024) for r in RUNTIMES}


def test_deploy_table_reports_the_ratio_to_eager():
    from linvit.bench.report import _deploy_table

    rows = {}
    for runtime, ms in (("torch_eager", 300.0), ("onnxruntime_cpu", 200.0)):
        case = {"suite": "deploy", "model": "linvit_tiny", "size": 512, "runtime": runtime, "batch": 1}
        rows[runtime] = {"case": case, "status": "ok", "latency_ms": ms}
    text = "\n".join(_deploy_table(rows))
    assert "| linvit_tiny | 512² | onnxruntime_cpu | 200 | 1.50× |" in text


@pytest.mark.slow
def test_deploy_cases_measure_in_process():
    pytest.importorskip("onnxruntime")
    import torch

    from linvit.bench import worker

    args = argparse.Namespace(dtype="fp32", budget=0.01, repeats=1, warmup=1)
    for case in deploy_cases(["linvit_nano"], [96]):
        assert worker.run_case(case, "latency", torch.device("cpu"), args)["latency_ms"] > 0


def test_deploy_table_reports_int8_against_fp32_onnxruntime():
    from linvit.bench.report import _deploy_table

    rows = {}
    for runtime, ms in (("torch_eager", 300.0), ("onnxruntime_cpu", 200.0), ("onnxruntime_int8", 125.0)):
        case = {"suite": "deploy", "model": "linvit_tiny", "size": 512, "runtime": runtime, "batch": 1}
        rows[runtime] = {"case": case, "status": "ok", "latency_ms": ms}
    text = "\n".join(_deploy_table(rows))
    assert "| linvit_tiny | 512² | onnxruntime_int8 | 125 | 2.40× |" in text
    assert "- linvit_tiny at 512²: int8 1.60× faster than fp32" in text
