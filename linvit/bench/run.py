"""Run the linvit benchmark suite and write its tables and plots.

    linvit bench                      # everything, CPU, 2 threads, fp32 (tens of minutes)
    linvit bench --quick              # tiny sizes, a couple of minutes (smoke test)
    linvit bench --only operators     # one suite (or a comma list: operators,backbones,training,compile)
    linvit bench --device cuda        # GPU: bf16 autocast, batch 64 at 224 and 8 at 1024

(``python -m benchmarks.run`` in a checkout: the same, with the results in ``benchmarks/results/``.) The
measurements run in worker processes (:mod:`linvit.bench.worker`) started with ``OMP_WAIT_POLICY=PASSIVE`` and the
thread count set in their environment before they import torch, one for all latencies of a suite and a fresh one for
each memory measurement. Results merge into ``<out>/results.json`` (a re-run replaces the rows it measures again
and keeps the others), then ``<out>/RESULTS.md`` and the PNG plots are rewritten from it. ``<out>`` is ``--out``,
else ``<results folder>/<device>`` (``tmp/quick`` for ``--quick``), the results folder being ``./bench-results``
for ``linvit bench``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from linvit.bench import cases as suite_cases
from linvit.bench.report import REPORT_FILES
from linvit.io.destination import DestinationError, check_destination, prepare_folder, write_text

# The folder that holds the linvit package these modules belong to (a checkout's root, or site-packages): workers
# import the same linvit from there.
CODE_ROOT = Path(__file__).resolve().parents[2]
PROG = "linvit bench"
RESULTS_KIND = "bench-results"  # results.json, in the folder's record of what linvit wrote (linvit.io.destination)


def default_results_dir() -> Path:
    """Where ``linvit bench`` writes without ``--out``: ``bench-results`` in the working directory (never inside
    the installed package)."""
    return Path.cwd() / "bench-results"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="linvit speed and memory benchmarks against timm baselines."
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny sizes and short timings (a couple of minutes)")
    parser.add_argument("--only", default=None, help=f"comma list of suites among {', '.join(suite_cases.SUITES)}")
    parser.add_argument("--out", default=None, help="results folder (default <results folder>/<device>)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --out: replace results.json, RESULTS.md and the plots there when linvit did not write them (the "
        "default results folder is linvit's own)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=None, choices=("fp32", "bf16", "fp16"), help="fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per worker (default 2 on CPU)")
    parser.add_argument("--maps", default=None, help="operator map sides, e.g. 32,56,64,128,256")
    parser.add_argument("--heads", default=None, help="operator heads×dim configs, e.g. 3x32,4x32,8x64")
    parser.add_argument(
        "--ops", default=None, help="operators to run (default all): " + ",".join(suite_cases.OPERATORS)
    )
    parser.add_argument("--modes", default=None, help="operator modes (default fwd,fwdbwd)")
    parser.add_argument(
        "--models", default=None, help="backbones/training/compile/deploy models (default: each suite's own list)"
    )
    parser.add_argument(
        "--runtimes", default=None, help="deploy suite runtimes, e.g. torch_eager,onnxruntime_cpu (default all)"
    )
    parser.add_argument(
        "--sizes",
        default=None,
        help="backbone input sizes, e.g. 224,1024,2560x1600 (W×H); the deploy suite takes the square ones",
    )
    parser.add_argument("--batch", type=int, default=None, help="backbone batch (default 1 on CPU; 64/32/8/2 on CUDA)")
    parser.add_argument("--train-size", type=int, default=None, help="training input side (default 224)")
    parser.add_argument("--train-batch", type=int, default=None, help="training batch (default 32)")
    parser.add_argument("--compile-sizes", default=None, help="torch.compile sizes (default 224,1024)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-case memory processes")
    parser.add_argument("--no-latency", action="store_true", help="measure memory only (keeps earlier latencies)")
    parser.add_argument("--repeats", type=int, default=None, help="most timed calls per case")
    parser.add_argument("--budget", type=float, default=None, help="seconds of timed calls per case")
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure the committed code of the git checkout linvit runs from (git archive HEAD into a temporary "
        "folder), not the working tree",
    )
    parser.add_argument("--case-timeout", type=float, default=None, help="seconds before a case is abandoned")
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr (a line as each case starts)")


def _csv(text: str | None, default):
    return list(default) if text is None else [item.strip() for item in text.split(",") if item.strip()]


def _settings(args) -> dict:
    cuda = args.device.startswith("cuda")
    quick = args.quick
    suites = _csv(args.only, ("operators", "backbones", "training") if quick else suite_cases.SUITES)
    unknown = sorted(set(suites) - set(suite_cases.SUITES))
    if unknown:
        raise SystemExit(f"--only: unknown suite(s) {unknown}; choose among {list(suite_cases.SUITES)}")
    runtimes = _csv(args.runtimes, suite_cases.RUNTIMES)
    unknown = sorted(set(runtimes) - set(suite_cases.RUNTIMES))
    if unknown:
        raise SystemExit(f"--runtimes: unknown runtime(s) {unknown}; choose among {list(suite_cases.RUNTIMES)}")
    ops = _csv(args.ops, suite_cases.OPERATORS)
    unknown = sorted(set(ops) - set(suite_cases.OPERATORS))
    if unknown:
        raise SystemExit(f"--ops: unknown operator(s) {unknown}; choose among {list(suite_cases.OPERATORS)}")
    return {
        "suites": suites,
        "cuda": cuda,
        "dtype": args.dtype or ("bf16" if cuda else "fp32"),
        "threads": args.threads or (None if cuda else 2),
        "maps": [int(m) for m in _csv(args.maps, (16, 32) if quick else suite_cases.OPERATOR_MAPS)],
        "heads": suite_cases.parse_heads(args.heads)
        if args.heads
        else ([(2, 16)] if quick else suite_cases.HEAD_CONFIGS),
        "ops": ops,
        "runtimes": runtimes,
        "modes": _csv(args.modes, ("fwd", "fwdbwd")),
        "models": _csv(args.models, suite_cases.BACKBONES),
        "train_models": _csv(
            args.models, ("linvit_tiny", "swin_tiny_patch4_window7_224") if quick else suite_cases.TRAINING_MODELS
        ),
        "sizes": suite_cases.parse_sizes(args.sizes)
        if args.sizes
        else ([(64, 64)] if quick else suite_cases.BACKBONE_SIZES),
        "train_size": args.train_size or (64 if quick else 224),
        "train_batch": args.train_batch or (2 if quick else 64 if cuda else 32),
        "compile_sizes": [int(s) for s in _csv(args.compile_sizes, (64,) if quick else (224, 1024))],
        "repeats": args.repeats or (3 if quick else 10),
        "budget": args.budget or (0.5 if quick else 15.0),
        "case_timeout": args.case_timeout or (120.0 if quick else 900.0),
        "memory": not args.no_memory,
        "latency": not args.no_latency,
        "quick": quick,
    }


def _backbone_batch(settings: dict, batch: int | None):
    def batch_for(height: int, width: int) -> int:
        if batch:
            return batch
        if not settings["cuda"]:
            return 1
        pixels = height * width
        return 64 if pixels <= 224 * 224 else 32 if pixels <= 512 * 512 else 8 if pixels <= 1024 * 1024 else 2

    return batch_for


def _worker_env(settings: dict, kind: str) -> dict:
    env = dict(os.environ)
    env.update(OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if settings["threads"]:
        env.update(OMP_NUM_THREADS=str(settings["threads"]), MKL_NUM_THREADS=str(settings["threads"]))
    if kind == "memory":
        # Large blocks always come from mmap and go back on free, so resident memory follows live tensors.
        env.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(settings["code_root"]), env.get("PYTHONPATH", "")) if p)
    return env


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=CODE_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _snapshot(into: str) -> Path:
    """The committed tree (HEAD) extracted into ``into``; workers then import linvit from there."""
    if not (CODE_ROOT / ".git").exists():
        raise SystemExit(
            f"--snapshot measures the committed code of a git checkout, and linvit runs from {CODE_ROOT}, which is "
            "not one: run it from a clone of linvit (pip install -e .), or leave --snapshot out."
        )
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=CODE_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return Path(into)


def _describe(case: dict) -> str:
    skip = {"suite", "batch"}
    return case["suite"] + " " + " ".join(f"{k}={v}" for k, v in case.items() if k not in skip)


def _report_line(record: dict) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('note', '')}"
    parts = []
    fields = (("latency_ms", "ms"), ("peak_mib", "MiB peak"), ("activation_mib", "MiB act"), ("gain", "x"))
    for field, unit in fields + (("gemm_peak_gflops", "GFLOP/s GEMM peak"),):
        if field in record:
            parts.append(f"{record[field]:.2f} {unit}")
    return ", ".join(parts) or "ok"


def run_workers(cases: list[dict], kind: str, settings: dict, fresh_per_case: bool, progress: Any = None) -> list[dict]:
    """Run ``cases`` in worker processes; a case that crashes its worker or outlives its timeout is recorded.

    ``progress`` (a :class:`linvit.utils.progress.Progress`) is told each case as it starts; its result line goes to
    stdout when it ends."""
    by_key = {suite_cases.case_key(case): case for case in cases}
    records: list[dict] = []
    batches = [[case] for case in cases] if fresh_per_case else [cases]
    with tempfile.TemporaryDirectory(prefix="linvit-bench-") as tmp:
        for batch_index, batch in enumerate(batches):
            remaining = list(batch)
            attempt = 0
            while remaining:
                attempt += 1
                cases_path = Path(tmp, f"cases-{batch_index}-{attempt}.json")
                out_path = Path(tmp, f"out-{batch_index}-{attempt}.jsonl")
                cases_path.write_text(json.dumps(remaining))
                out_path.touch()
                command = [sys.executable, "-m", "linvit.bench.worker", "--kind", kind, "--cases", str(cases_path)]
                command += ["--out", str(out_path), "--device", settings["device"], "--dtype", settings["dtype"]]
                command += ["--repeats", str(settings["repeats"]), "--budget", str(settings["budget"])]
                if settings["quick"]:
                    command += ["--warmup", "1"]
                process = subprocess.Popen(
                    command, cwd=settings["code_root"], env=_worker_env(settings, kind), start_new_session=True
                )
                seen = 0
                started_at = time.time()
                running_key = None
                timed_out = False
                while True:
                    finished = process.poll() is not None
                    lines = out_path.read_text().splitlines()
                    for line in lines[seen:]:
                        event = json.loads(line)
                        if event["event"] == "start":
                            running_key, started_at = event["key"], time.time()
                            if progress is not None and running_key in by_key:
                                progress.step(
                                    f"{kind} {_describe(by_key[running_key])}", (len(records) + 1, len(cases))
                                )
                        else:
                            records.append(event)
                            running_key = None
                            print(f"  [{kind}] {_describe(event['case'])}: {_report_line(event)}", flush=True)
                    seen = len(lines)
                    if finished:
                        break
                    if time.time() - started_at > settings["case_timeout"]:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait()
                        timed_out = True
                        break
                    time.sleep(0.2)
                done = {record["key"] for record in records}
                remaining = [case for case in remaining if suite_cases.case_key(case) not in done]
                if remaining:
                    # The first case without a result is the one that killed (or outlived) the worker.
                    failed = remaining.pop(0)
                    key = suite_cases.case_key(failed)
                    if running_key not in (None, key):
                        raise RuntimeError(f"worker order mismatch: {running_key} vs {key}")
                    why = (
                        f"timeout after {settings['case_timeout']:.0f} s"
                        if timed_out
                        else f"worker died (exit {process.returncode})"
                    )
                    record = {"event": "result", "key": key, "kind": kind, "case": failed, "status": "error"}
                    record["note"] = why
                    records.append(record)
                    print(f"  [{kind}] {_describe(failed)}: error: {why}", flush=True)
    return records


def _merge(out_dir: Path, run_info: dict, records: list[dict], force: bool = False) -> dict:
    path = out_dir / "results.json"
    data = json.loads(path.read_text()) if path.exists() else {"runs": [], "records": []}
    fresh = {(r["key"], r["kind"]) for r in records}
    data["records"] = [r for r in data["records"] if (r["key"], r["kind"]) not in fresh]
    data["records"].extend(records)
    data["runs"].append(run_info)
    write_text(path, json.dumps(data, indent=1, sort_keys=True), RESULTS_KIND, force=force)
    return data


def main(argv: list[str] | None = None, *, results_dir: Path | None = None, prog: str = PROG) -> int:
    """Parse ``argv`` and run; ``results_dir`` and ``prog`` are the entry point's (``python -m benchmarks.run``
    passes the checkout's ``benchmarks/results`` and its own name)."""
    args = build_parser(prog).parse_args(argv)
    command = argv if argv is not None else sys.argv[1:]
    return run(args, command=command, results_dir=results_dir, prog=prog)


def run(args, command: list[str] | None = None, results_dir: Path | None = None, prog: str = PROG) -> int:
    """Run the suites ``args`` selects; ``command`` (the arguments as given) and ``prog`` are recorded with the
    results, which go to ``args.out`` or below ``results_dir`` (default :func:`default_results_dir`)."""
    settings = _settings(args)
    settings["device"] = args.device
    try:
        with tempfile.TemporaryDirectory(prefix="linvit-snapshot-") as snapshot_dir:
            settings["code_root"] = _snapshot(snapshot_dir) if args.snapshot else CODE_ROOT
            return _run_suites(args, settings, f"{prog} {shlex.join(command or [])}", results_dir)
    except DestinationError as error:  # a results file that is not linvit's, an unwritable folder, a full disk
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1


def _run_suites(args, settings: dict, command: str, results_dir: Path | None) -> int:
    default_out = (results_dir or default_results_dir()) / (
        "tmp/quick" if settings["quick"] else args.device.split(":")[0]
    )
    out_dir = Path(args.out) if args.out else default_out
    # the default folder is linvit's own (results written before the record existed are replaced); --out may be the
    # user's: its files are replaced only when linvit wrote them, or with --force (checked before measuring)
    force = bool(getattr(args, "force", False)) or not args.out
    out_dir = prepare_folder(out_dir)
    check_destination(out_dir / "results.json", RESULTS_KIND, force=force)
    for name in REPORT_FILES:
        check_destination(out_dir / name, "plot" if name.endswith(".png") else "bench-report", force=force)
    started = datetime.datetime.now(datetime.timezone.utc)
    from linvit.utils.progress import Progress

    progress = Progress("bench", enabled=not getattr(args, "no_progress", False))
    print(f"linvit benchmarks -> {out_dir} ({', '.join(settings['suites'])}; {settings['dtype']} on {args.device})")

    records: list[dict] = []
    machine_case = [{"suite": "machine", "gemm_size": 1024 if settings["quick"] else 2048}]
    for suite in settings["suites"]:
        print(f"suite {suite}", flush=True)
        if suite == "operators":
            cases = suite_cases.operator_cases(
                settings["maps"], settings["heads"], settings["ops"], modes=settings["modes"]
            )
            memory_cases = cases
            if settings["quick"]:  # one fresh process per case is the slow part; keep the largest map only
                memory_cases = [c for c in cases if c["map"] == max(settings["maps"]) and c["mode"] == "fwd"]
        elif suite == "backbones":
            batch_for = _backbone_batch(settings, args.batch)
            cases = memory_cases = suite_cases.backbone_cases(settings["models"], settings["sizes"], batch_for)
        elif suite == "training":
            cases = suite_cases.training_cases(
                settings["train_models"], settings["train_size"], settings["train_batch"]
            )
            memory_cases = cases
        elif suite == "deploy":
            sizes = [height for height, width in settings["sizes"] if height == width] if args.sizes else None
            models = _csv(args.models, suite_cases.DEPLOY_MODELS)
            sizes = sizes or list(suite_cases.DEPLOY_SIZES)
            cases = suite_cases.deploy_cases(list(models), sizes, settings["runtimes"])
            memory_cases = []
        else:
            cases = suite_cases.compile_cases(settings["models"], settings["compile_sizes"])
            memory_cases = []
        # The machine's description and GEMM peak come from the first worker, in the same conditions as the cases.
        if settings["latency"] or machine_case:
            latency_cases = cases if settings["latency"] else []
            records += run_workers(
                machine_case + latency_cases, "latency", settings, fresh_per_case=False, progress=progress
            )
            machine_case = []
        if settings["memory"] and memory_cases:
            records += run_workers(memory_cases, "memory", settings, fresh_per_case=True, progress=progress)

    machine = next((r for r in records if r["case"]["suite"] == "machine"), {})
    records = [r for r in records if r["case"]["suite"] != "machine"]
    run_info = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()),
        "command": command.strip(),
        "git": {
            "commit": _git("rev-parse", "--short", "HEAD"),
            "measured": "committed tree (--snapshot)" if args.snapshot else "working tree",
            "uncommitted_files": len(_git("status", "--porcelain", "--", "linvit", "benchmarks").splitlines()),
        },
        "settings": {k: v for k, v in settings.items() if k not in ("heads", "sizes", "code_root")},
        "machine": {k: v for k, v in machine.items() if k not in ("event", "key", "kind", "case", "status")},
    }
    data = _merge(out_dir, run_info, records, force=force)
    from linvit.bench.report import write_report

    report = write_report(out_dir, data, force=force)
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
