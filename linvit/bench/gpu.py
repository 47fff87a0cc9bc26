"""Issue 15's target table, measured in one process on one GPU (or, tiny, on the CPU as a smoke test).

    python -m linvit.bench.gpu                          # CUDA, bf16 autocast, the whole table in under 4 minutes
    python -m linvit.bench.gpu --device cpu --quick     # tiny sizes on the CPU, a few seconds (what CI runs)
    python -m linvit.bench.gpu --only operators,core    # some groups: operators, window, core, memory, models,
                                                        # training, compile

In a checkout, ``bash benchmarks/run_gpu.sh`` and ``python -m benchmarks.gpu`` run this with the results in
``benchmarks/results/cuda``.

Every row compares linvit with its baseline in the same run. Times are medians of CUDA-event intervals after a
warm-up (wall clock between calls on the CPU), under autocast (bf16 on CUDA). linvit rows run twice: with the
default backend ("auto": the Triton kernels on CUDA) and under ``linvit.ops.use_backend("torch")`` (eager), so the
table shows fused against eager. Rows that would not fit in ``--budget`` seconds are skipped and say so; the
``torch.compile`` row runs last, in a child process (cold compile caches) stopped at the budget.

Writes ``targets-<date>.md`` (the table) and ``targets-<date>.json`` (every measurement, the machine and the
command) to ``--out`` (default ``./bench-results/cuda``) and prints the table. Imports neither Hydra nor
Lightning: the GPU machine has neither.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The time budget counts from here: importing torch and timm (by linvit's package import) comes just before it,
# importing the models and the measured modules is part of the run.
STARTED = time.monotonic()

import torch  # noqa: E402

from linvit.bench.gpu_bench import FULL, QUICK, Bench, Budget, compile_measurement, machine  # noqa: E402

CODE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this linvit: the compile child imports it there
PROG = "python -m linvit.bench.gpu"
GROUPS = ("operators", "window", "core", "memory", "models", "training", "compile")
# Nominal HBM bandwidth (GB/s) of the GPUs the targets were set on; others are compared with a measured copy.
NOMINAL_HBM_GBPS = {"H200": 4800.0, "H100": 3350.0}
BYTE_MODEL = (
    "attention core traffic floor (forward): read q|k|v once and write o, B·N·(3C + C) elements of the qkv dtype "
    "(bf16: 1 KiB per token at C=128); parameters (temperature, positional table, DWC) and the fp32 S, z states "
    "are not counted"
)


@dataclass
class Row:
    measure: str
    unit: str  # of the value columns
    target: str  # "≤ 0.5", "≥ 1.0", "≤ 60 s" or "" (shown for reference)
    fused: float | str | None = None  # linvit, default backend ("auto")
    eager: float | str | None = None  # linvit under use_backend("torch")
    baseline: float | str | None = None
    ratio_fused: float | None = None
    ratio_eager: float | None = None
    note: str = ""

    def met(self) -> bool | None:
        """Whether the fused ratio (or the fused value for "… s" targets) meets the target; None if not measured."""
        if not self.target:
            return None
        sign, number = self.target.split()[:2]
        value = self.fused if self.target.endswith(" s") else self.ratio_fused
        if isinstance(value, str) and value.startswith("> ") and sign == "≤":  # stopped at the budget: a lower bound
            return False if float(value[2:]) >= float(number) else None
        if not isinstance(value, float):
            return None
        return value <= float(number) if sign == "≤" else value >= float(number)


def _value(result: dict, field: str = "ms") -> float | str:
    return float(result[field]) if result["status"] == "ok" else result["status"]


def _ratio(value, baseline) -> float | None:
    return value / baseline if isinstance(value, float) and isinstance(baseline, float) and baseline > 0 else None


def _compare(measure: str, unit: str, target: str, fused: dict, eager: dict, baseline: dict, field: str = "ms") -> Row:
    row = Row(measure, unit, target, _value(fused, field), _value(eager, field), _value(baseline, field))
    row.ratio_fused = _ratio(row.fused, row.baseline)
    row.ratio_eager = _ratio(row.eager, row.baseline)
    row.note = "; ".join(dict.fromkeys(f"{r['status']}: {r['why']}" for r in (fused, eager, baseline) if "why" in r))
    return row


MODES = {"fwd": "forward", "fwdbwd": "forward+backward"}


def operator_rows(bench: Bench) -> list[Row]:
    small, middle, large = bench.sizes.maps
    plan = [(large, "fwd", "≤ 0.5"), (large, "fwdbwd", "≤ 0.8"), (middle, "fwd", "≤ 0.8"), (middle, "fwdbwd", "")]
    plan += [(small, "fwd", "≤ 1.2"), (small, "fwdbwd", "")]
    rows = []
    for size, mode, target in plan:
        rows.append(
            _compare(
                f"focused module / timm window SDPA, {MODES[mode]}, {size}²",
                "ms",
                target,
                bench.operator("linvit_focused", size, mode, "auto"),
                bench.operator("linvit_focused", size, mode, "torch"),
                bench.operator("timm_window_sdpa", size, mode),
            )
        )
    return rows


def window_rows(bench: Bench) -> list[Row]:
    """Issue item 4: linvit's own WindowAttention (no linvit.ops inside: one column) against timm's."""
    small, middle, _ = bench.sizes.maps
    rows = []
    for size, mode, target in ((small, "fwd", "≤ 1.0"), (middle, "fwd", "≤ 1.0"), (middle, "fwdbwd", "")):
        linvit = bench.operator("linvit_window", size, mode)
        row = _compare(
            f"linvit window / timm window SDPA, {MODES[mode]}, {size}²",
            "ms",
            target,
            linvit,
            {"status": "—"},
            bench.operator("timm_window_sdpa", size, mode),
        )
        rows.append(row)
    return rows


def core_rows(bench: Bench) -> list[Row]:
    size = bench.sizes.maps[-1]
    copy = bench.copy_gbps()
    name = torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else ""
    nominal = next((gbps for gpu, gbps in NOMINAL_HBM_GBPS.items() if gpu in name), None)
    peak = {"status": "ok", "gbps": nominal} if nominal else copy
    row = _compare(
        f"attention core (qkv → o) achieved bandwidth, forward, {size}², fraction of HBM peak",
        "GB/s",
        "≥ 0.5",
        bench.core(size, "auto"),
        bench.core(size, "torch"),
        peak,
        field="gbps",
    )
    peak_text = f"nominal {nominal:.0f} GB/s" if nominal else "measured copy bandwidth"
    copy_text = f"copying {copy['mib']:.0f} MiB reached {copy['gbps']:.0f} GB/s" if copy["status"] == "ok" else ""
    row.note = "; ".join(filter(None, [f"baseline = {peak_text}", copy_text, row.note]))
    return [row]


def memory_rows(bench: Bench) -> list[Row]:
    size = bench.sizes.maps[-1]
    return [
        _compare(
            f"peak memory forward+backward, focused / window, {size}²",
            "MiB",
            "≤ 1.0",
            bench.operator("linvit_focused", size, "fwdbwd", "auto", memory=True),
            bench.operator("linvit_focused", size, "fwdbwd", "torch", memory=True),
            bench.operator("timm_window_sdpa", size, "fwdbwd", memory=True),
            field="mib",
        )
    ]


def model_rows(bench: Bench) -> list[Row]:
    s = bench.sizes
    plan = [
        ("linvit_tiny", "swin_tiny_patch4_window7_224", s.model_size, s.model_batch, "≤ 0.7"),
        ("linvit_tiny", "convnext_tiny", s.model_size, s.model_batch, "≤ 1.0"),
        ("linvit_tiny", "swin_tiny_patch4_window7_224", s.large_size, s.large_batch, "≤ 0.6"),
        ("flatten_swin_tiny_patch4_224", "swin_tiny_patch4_window7_224", s.small_size, s.small_batch, "≤ 1.0"),
    ]
    rows = []
    for linvit, baseline, size, batch, target in plan:
        rows.append(
            _compare(
                f"`{linvit}` / `{baseline}` latency, {size}² batch {batch}",
                "ms",
                target,
                bench.model(linvit, size, batch, "auto"),
                bench.model(linvit, size, batch, "torch"),
                bench.model(baseline, size, batch),
            )
        )
    return rows


def training_rows(bench: Bench) -> list[Row]:
    s = bench.sizes
    return [
        _compare(
            f"training img/s `linvit_tiny` / `swin_tiny_patch4_window7_224`, {s.small_size}² batch {s.small_batch}",
            "img/s",
            "≥ 1.0",
            bench.training("linvit_tiny", s.small_size, s.small_batch, "auto"),
            bench.training("linvit_tiny", s.small_size, s.small_batch, "torch"),
            bench.training("swin_tiny_patch4_window7_224", s.small_size, s.small_batch),
            field="images_per_s",
        )
    ]


# -- torch.compile: a child process, so a slow compile can be stopped at the budget ---------------------------------
def compile_rows(bench: Bench, compile_backend: str) -> list[Row]:
    s = bench.sizes
    measure = f"`torch.compile` time, `linvit_tiny` {s.model_size}² batch {s.model_batch} (cold caches)"
    timeout = bench.budget.left(with_reserve=False) - 5.0
    if timeout < 20.0:
        return [Row(measure, "s", "≤ 60 s", "skipped", "—", "—", note="time budget spent before this row")]
    command = [sys.executable, "-m", "linvit.bench.gpu", "--compile-child", "--device", str(bench.device)]
    command += ["--dtype", bench.dtype, "--compile-backend", compile_backend, "--compile-size", str(s.model_size)]
    command += ["--compile-batch", str(s.model_batch)]
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TRITON_CACHE_DIR=f"{cache}/triton")
        started = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=CODE_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            waited = time.perf_counter() - started
            result = {"status": "stopped", "why": f"still compiling after {waited:.0f} s (the time budget)"}
        else:
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                result = {"status": "ok", **json.loads(lines[-1])}
            else:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
                result = {"status": "error", "why": f"exit {done.returncode}: {tail}"}
    bench.results["compile|linvit_tiny"] = result
    if result["status"] == "stopped":
        return [Row(measure, "s", "≤ 60 s", f"> {waited:.0f}", "—", "—", note=result["why"])]
    row = Row(measure, "s", "≤ 60 s", _value(result, "compile_s"), "—", "—", note=result.get("why", ""))
    if result["status"] == "ok":
        row.note = f"compiled {result['compiled_ms']:.1f} ms vs eager {result['eager_ms']:.1f} ms " + (
            f"({result['eager_ms'] / result['compiled_ms']:.2f}× gain, backend {compile_backend})"
        )
    return [row]


# -- the table --------------------------------------------------------------------------------------------------
def _cell(value, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def markdown_table(rows: list[Row]) -> str:
    lines = [
        "| measure | linvit fused (auto) | linvit eager (torch) | baseline | ratio fused | ratio eager | target "
        "| met |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for row in rows:
        met = {True: "yes", False: "no", None: "—"}[row.met()]
        cells = [row.measure, _cell(row.fused, row.unit), _cell(row.eager, row.unit), _cell(row.baseline, row.unit)]
        cells += [_cell(row.ratio_fused), _cell(row.ratio_eager), row.target or "—", met]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {row.measure}: {row.note}" for row in rows if row.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda[:N] (default) or cpu")
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the CPU smoke test)")
    parser.add_argument("--only", default=None, help=f"comma list of groups among {','.join(GROUPS)}")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 220; 60 quick)")
    parser.add_argument("--seconds-per-case", type=float, default=None, help="timed seconds per measurement")
    parser.add_argument("--compile-reserve", type=float, default=None, help="seconds kept for the compile row")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compile row")
    parser.add_argument("--out", default=None, help="folder for the table and JSON (default <results folder>/cuda)")
    parser.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-size", type=int, default=1024, help=argparse.SUPPRESS)
    parser.add_argument("--compile-batch", type=int, default=8, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None, *, results_dir: Path | None = None, prog: str = PROG) -> int:
    """Parse ``argv`` and run; ``results_dir`` (default ``./bench-results``) and ``prog`` are the entry point's
    (``python -m benchmarks.gpu`` passes the checkout's ``benchmarks/results``)."""
    args = build_parser(prog).parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch; run with --device cpu --quick for the smoke test")
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if args.compile_child:
        result = compile_measurement(
            "linvit_tiny", args.compile_size, args.compile_batch, device, dtype, args.compile_backend
        )
        print(json.dumps(result))
        return 0
    groups = GROUPS if args.only is None else tuple(g.strip() for g in args.only.split(",") if g.strip())
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise SystemExit(f"--only: unknown group(s) {unknown}; choose among {', '.join(GROUPS)}")
    if args.quick and args.only is None:
        groups = tuple(g for g in groups if g != "compile")  # minutes on a CPU; the GPU run measures it
    sizes = QUICK if args.quick else FULL
    budget_s = args.budget or (60.0 if args.quick else 220.0)
    reserve = args.compile_reserve if args.compile_reserve is not None else (70.0 if "compile" in groups else 0.0)
    seconds = args.seconds_per_case or (0.05 if args.quick else 0.6)
    warmup, min_calls = (0, 1) if args.quick else (2, 3)  # quick: a smoke test of every row, not a measurement
    bench = Bench(device, dtype, sizes, Budget(budget_s, reserve, STARTED), seconds, warmup, min_calls)
    builders = {
        "operators": operator_rows,
        "window": window_rows,
        "core": core_rows,
        "memory": memory_rows,
        "models": model_rows,
        "training": training_rows,
    }
    rows: list[Row] = []
    for group in GROUPS:
        if group not in groups:
            continue
        if group == "compile":
            rows += compile_rows(bench, args.compile_backend)
        else:
            rows += builders[group](bench)
    table = markdown_table(rows)

    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    command = f"{prog} " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    info = machine(device)
    same = " Here `auto` runs the torch backend: the eager column repeats the fused one." if bench.auto_is_torch else ""
    header = (
        f"# linvit GPU targets (issue 15), {stamp}\n\n{info.get('gpu', str(device))}, "
        f"torch {info['versions']['torch']}, triton {info['versions']['triton']}, "
        f"{dtype + ' autocast' if dtype != 'fp32' else 'fp32'}, "
        f"`auto` backend = {info['auto_backend']}; "
        f"operators B={sizes.batch}, C={sizes.heads * sizes.head_dim}, {sizes.heads}×{sizes.head_dim} heads; "
        f"{bench.budget.elapsed():.0f} s.{same}\n\nCommand: `{command.strip()}`\n\nByte model: {BYTE_MODEL}.\n\n"
    )
    out = Path(args.out) if args.out else (results_dir or Path.cwd() / "bench-results") / "cuda"
    from linvit.io.destination import write_text

    # new, time-stamped names: an existing one (the same second) is replaced only when linvit wrote it
    write_text(out / f"targets-{stamp}.md", header + table + "\n", "bench-report")
    record = {
        "date": stamp,
        "command": command.strip(),
        "machine": info,
        "dtype": dtype,
        "sizes": asdict(sizes),
        "groups": list(groups),
        "budget_s": budget_s,
        "elapsed_s": bench.budget.elapsed(),
        "byte_model": BYTE_MODEL,
        "rows": [dict(asdict(row), met=row.met()) for row in rows],
        "measurements": bench.results,
        "imported": sorted({m.split(".")[0] for m in sys.modules} & {"hydra", "omegaconf", "lightning"}),
    }
    write_text(out / f"targets-{stamp}.json", json.dumps(record, indent=1, default=str) + "\n", "bench-results")
    print(header + table)
    print(f"\nwrote {out / f'targets-{stamp}.md'} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
