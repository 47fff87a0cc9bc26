"""The benchmark suite (linvit.bench) runs end to end at tiny sizes and writes its tables and plots (no timed
assertions), through the checkout's entry point (python -m benchmarks.run) and through `linvit bench`."""

from __future__ import annotations

import json

import pytest

import benchmarks.run as checkout_entry
from linvit.bench import report, run
from linvit.bench.cases import case_key, operator_cases, parse_heads, parse_sizes


def _records(out_dir) -> list[dict]:
    return json.loads((out_dir / "results.json").read_text())["records"]


@pytest.mark.slow  # ~10 s; test_linvit_bench_writes_below_the_working_directory runs the suite in the default tier
def test_operator_suite_runs_and_reports(tmp_path):
    # Worker processes are the slow part (one per memory case): forward only, three operators.
    ops = "authors_focused,sdpa_global,linvit_focused"
    argv = ["--quick", "--only", "operators", "--maps", "8", "--heads", "2x8", "--ops", ops, "--modes", "fwd"]
    argv += ["--out", str(tmp_path)]
    assert checkout_entry.main(argv + ["--repeats", "1", "--budget", "0.01"]) == 0
    records = _records(tmp_path)
    latency = {r["case"]["op"]: r for r in records if r["kind"] == "latency" and r["case"]["mode"] == "fwd"}
    for op in ("authors_focused", "sdpa_global"):
        assert latency[op]["status"] == "ok", latency[op]
        assert latency[op]["latency_ms"] > 0
    # linvit's operator is measured once it exists; it may be missing, never broken.
    assert latency["linvit_focused"]["status"] in ("ok", "skipped"), latency["linvit_focused"]
    memory = [r for r in records if r["kind"] == "memory" and r["status"] == "ok"]
    assert memory and all(r["peak_mib"] > 0 for r in memory)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## Targets" in text and "authors_focused" in text and "python -m benchmarks.run" in text
    assert (tmp_path / "operators_latency.png").stat().st_size > 0


def _worker_args():
    import argparse

    return argparse.Namespace(dtype="fp32", budget=0.01, repeats=1, warmup=1)


def test_backbone_and_training_cases_measure_in_process():
    import torch

    from linvit.bench import worker
    from linvit.bench.cases import backbone_cases, training_cases
    from linvit.bench.operators import Unavailable

    cpu = torch.device("cpu")
    backbone = backbone_cases(["resnet18"], [(32, 40)], lambda h, w: 1)[0]
    latency = worker.run_case(backbone, "latency", cpu, _worker_args())
    assert latency["latency_ms"] > 0 and latency["macs"] > 0 and latency["pixels"] == 32 * 40
    memory = worker.run_case(backbone, "memory", cpu, _worker_args())
    assert memory["peak_mib"] > 0
    for case in training_cases(["resnet18"], 32, 2):
        step = worker.run_case(case, "latency", cpu, _worker_args())
        assert step["latency_ms"] > 0
    with pytest.raises(Unavailable, match="not registered"):
        worker.run_case(dict(backbone, model="not_a_registered_model"), "latency", cpu, _worker_args())


@pytest.mark.slow
def test_backbone_and_training_suites_run_and_skip_missing_models(tmp_path):
    argv = ["--quick", "--only", "backbones,training", "--models", "resnet18,not_a_registered_model", "--sizes", "32"]
    argv += ["--train-size", "32", "--train-batch", "2", "--out", str(tmp_path), "--repeats", "1", "--budget", "0.01"]
    assert run.main(argv) == 0
    records = _records(tmp_path)
    resnet = [r for r in records if r["case"]["model"] == "resnet18"]
    assert resnet and all(r["status"] == "ok" for r in resnet), resnet
    missing = [r for r in records if r["case"]["model"] == "not_a_registered_model"]
    assert missing and all(r["status"] == "skipped" for r in missing)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## 2. Backbones" in text and "## 3. Training step" in text and "MFU" in text


def test_a_rerun_replaces_only_its_own_rows(tmp_path):
    first = {"key": "a", "kind": "latency", "case": {"suite": "x"}}
    second = {"key": "b", "kind": "latency", "case": {"suite": "x"}}
    info = {"date": "d", "command": "c", "settings": {"suites": []}, "machine": {}}
    run._merge(tmp_path, info, [first, second])
    data = run._merge(tmp_path, info, [dict(first, value=2)])
    assert sorted((r["key"], r.get("value")) for r in data["records"]) == [("a", 2), ("b", None)]
    assert len(data["runs"]) == 2


def _latency(case: dict, ms: float, **extra) -> dict:
    return {"key": case_key(case), "kind": "latency", "case": case, "status": "ok", "latency_ms": ms, **extra}


def test_targets_compare_ratios_measured_in_the_run():
    cases = {
        c["op"]: c
        for c in operator_cases(
            [56], [(3, 32)], ["linvit_focused", "authors_focused", "timm_window_sdpa"], modes=("fwd",)
        )
    }
    data = {
        "runs": [],
        "records": [
            _latency(cases["linvit_focused"], 9.0),
            _latency(cases["authors_focused"], 30.0),
            _latency(cases["timm_window_sdpa"], 10.0),
        ],
    }
    rows = {t["target"]: t for t in report.targets(report._index(data))}
    window = rows["focused / window softmax SDPA, 56² tokens, C=96, 3 heads, fwd"]
    assert window["value"] == pytest.approx(0.9) and window["verdict"] == "met"
    speedup = rows["speed-up over the authors' formulation, 56², 3 heads, fwd"]
    assert speedup["value"] == pytest.approx(30 / 9) and speedup["verdict"] == "met"
    assert rows["focused / window softmax SDPA, 128² tokens, C=128, 4 heads, fwd"]["verdict"] == "not measured"


def test_parsers():
    assert parse_heads("3x32, 8x64") == [(3, 32), (8, 64)]
    assert parse_sizes("224,2560x1600") == [(224, 224), (1600, 2560)]
    with pytest.raises(ValueError, match="HEADSxDIM"):
        parse_heads("3")


def test_linvit_bench_command_takes_the_suite_options():
    from linvit import cli
    from linvit.commands import bench

    args = cli.build_parser().parse_args(["bench", "--quick", "--only", "operators", "--heads", "3x32"])
    assert args._run is bench.run
    assert args.quick and args.only == "operators" and args.heads == "3x32"
    assert not args.no_progress and cli.build_parser().parse_args(["bench", "--no-progress"]).no_progress


def test_linvit_bench_writes_below_the_working_directory(tmp_path, monkeypatch, capsys):
    """`linvit bench` runs the suite of the package and, without --out, writes to ./bench-results (never into the
    installed package); tests/packaging/test_wheel.py runs it from a wheel."""
    from linvit.cli import main as linvit_main

    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--quick", "--only", "operators", "--maps", "8", "--heads", "2x8", "--ops", "linvit_linear"]
    argv += ["--modes", "fwd", "--no-memory", "--repeats", "1", "--budget", "0.01"]
    assert linvit_main(argv) == 0
    # each case said on stderr as it starts (the machine's description first), its result on stdout as it ends
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[linvit bench")]
    assert [line.split("] ")[0] for line in progress] == ["[linvit bench 1/2", "[linvit bench 2/2"], progress
    assert "op=linvit_linear" in progress[1]
    out = tmp_path / "bench-results" / "tmp" / "quick"
    [record] = [r for r in _records(out) if r["case"].get("op") == "linvit_linear"]
    assert record["status"] == "ok" and record["latency_ms"] > 0
    assert "`linvit bench" in (out / "RESULTS.md").read_text()
