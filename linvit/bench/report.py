"""Markdown tables, target checks and PNG plots (drawn by :mod:`linvit.bench.plots`) from ``results.json`` (no torch
needed)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from linvit.bench.cases import OPERATORS

GIB = 1024.0


def _index(data: dict) -> dict[str, dict]:
    """key -> merged record (latency fields, then memory fields under their own names)."""
    merged: dict[str, dict] = {}
    for record in data["records"]:
        row = merged.setdefault(record["key"], {"case": record["case"]})
        if record["kind"] == "memory":
            row["memory_status"] = record.get("status")
            row["memory_note"] = record.get("note")
            for field in ("peak_mib", "activation_mib", "memory_kind"):
                if field in record:
                    row[field] = record[field]
        else:
            row.update({k: v for k, v in record.items() if k not in ("case", "event", "key", "kind")})
    return merged


def suite_rows(index: dict, suite: str) -> list[dict]:
    """The merged rows of one suite (``operators``, ``backbones``, ...)."""
    return [row for row in index.values() if row["case"]["suite"] == suite]


def _fmt(value, digits: int = 1, missing: str = "–") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) < 10 and digits == 1:
            return f"{value:.2f}"
        return f"{value:.{digits}f}"
    return str(value)


def _cell(row: dict | None, field: str = "latency_ms") -> str:
    if row is None:
        return "–"
    if field in ("peak_mib", "activation_mib"):
        if row.get("memory_status") not in (None, "ok"):
            return row["memory_status"]
    elif row.get("status") != "ok":
        return row.get("status", "–")
    return _fmt(row.get(field))


def _find(rows: list[dict], **match) -> dict | None:
    for row in rows:
        if all(row["case"].get(k) == v for k, v in match.items()):
            return row
    return None


def measured(row: dict | None, field: str = "latency_ms") -> float | None:
    """The row's ``field`` where the run (and, for memory fields, its memory run) succeeded; else None."""
    if row is None or row.get("status") != "ok" or row.get(field) is None:
        return None
    if field in ("peak_mib", "activation_mib") and row.get("memory_status") != "ok":
        return None
    return row[field]


# ----------------------------------------------------------------------------------------------- targets
def _cpu_ratio(row: dict | None, reference: dict | None) -> str:
    """'; CPU-time ratio r' when both rows have CPU times (less sensitive to a shared machine than wall time)."""
    a, b = measured(row, "cpu_ms"), measured(reference, "cpu_ms")
    return f"; CPU-time ratio {a / b:.2f}" if a and b else ""


def _target(name: str, value: float | None, limit: float, at_most: bool, detail: str = "") -> dict:
    if value is None:
        verdict = "not measured"
    else:
        verdict = "met" if (value <= limit if at_most else value >= limit) else "**missed**"
    sign = "≤" if at_most else "≥"
    return {"target": name, "limit": f"{sign} {limit:g}", "value": value, "verdict": verdict, "detail": detail}


def targets(index: dict) -> list[dict]:
    ops = suite_rows(index, "operators")
    bbs = suite_rows(index, "backbones")
    train = suite_rows(index, "training")
    out = []
    for size, heads, limit in ((128, 4, 0.8), (56, 3, 1.0)):
        for mode in ("fwd", "fwdbwd"):
            common = {"map": size, "heads": heads, "head_dim": 32, "mode": mode}
            focused = measured(_find(ops, op="linvit_focused", **common))
            windows = {name: measured(_find(ops, op=name, **common)) for name in ("linvit_window", "timm_window_sdpa")}
            windows = {k: v for k, v in windows.items() if v is not None}
            best = min(windows, key=windows.get) if windows else None
            ratio = focused / windows[best] if focused is not None and best else None
            label = f"focused / window softmax SDPA, {size}² tokens, C={heads * 32}, {heads} heads, {mode}"
            cpu = _cpu_ratio(_find(ops, op="linvit_focused", **common), best and _find(ops, op=best, **common))
            out.append(_target(label, ratio, limit, True, f"vs fastest window: {best}{cpu}" if best else ""))
            authors_row = _find(ops, op="authors_focused", **common)
            authors = measured(authors_row)
            speedup = authors / focused if authors is not None and focused is not None else None
            label = f"speed-up over the authors' formulation, {size}², {heads} heads, {mode}"
            cpu = _cpu_ratio(authors_row, _find(ops, op="linvit_focused", **common))
            out.append(_target(label, speedup, 2.0, False, cpu.lstrip("; ")))

    def latency(model: str, size: int) -> float | None:
        return measured(_find(bbs, model=model, height=size, width=size))

    tiny = latency("linvit_tiny", 1024)
    for other, limit in (("swin_tiny_patch4_window7_224", 0.6), ("convnext_tiny", 0.8)):
        ref = latency(other, 1024)
        value = tiny / ref if tiny is not None and ref is not None else None
        cpu = _cpu_ratio(
            _find(bbs, model="linvit_tiny", height=1024, width=1024), _find(bbs, model=other, height=1024, width=1024)
        )
        out.append(_target(f"linvit_tiny / {other} latency at 1024²", value, limit, True, cpu.lstrip("; ")))
    row = _find(bbs, model="linvit_tiny", height=1024, width=1024) or {}
    # On a shared machine wall-clock MFU swings with the load (the GEMM peak and the model run at different
    # moments); the CPU-time MFU compares work done per CPU second and is the one judged when present.
    wall = f"wall-clock MFU {row['mfu']:.2f}" if row.get("mfu") else ""
    out.append(
        _target(
            "linvit_tiny model-FLOP utilisation at 1024² (fraction of GEMM peak)",
            row.get("mfu_cpu", row.get("mfu")),
            0.5,
            False,
            f"CPU-time MFU; {wall}" if row.get("mfu_cpu") else wall,
        )
    )
    fs, sw = latency("flatten_swin_tiny_patch4_224", 224), latency("swin_tiny_patch4_window7_224", 224)
    out.append(_target("flatten_swin_tiny / swin_tiny latency at 224²", fs / sw if fs and sw else None, 1.1, True))
    small = measured(_find(bbs, model="linvit_tiny", height=1024, width=1024), "activation_mib")
    large = measured(_find(bbs, model="linvit_tiny", height=2048, width=2048), "activation_mib")
    out.append(
        _target(
            "linvit_tiny inference activation memory 2048² / 1024²",
            large / small if large and small else None,
            4.4,
            True,
            "peak RSS above the resident size before the forward",
        )
    )
    total = measured(_find(bbs, model="linvit_tiny", height=2048, width=2048), "peak_mib")
    out.append(_target("linvit_tiny 2048² peak memory (GiB, whole process)", total / GIB if total else None, 8.0, True))
    lt = _find(train, model="linvit_tiny", checkpointing=False)
    st = _find(train, model="swin_tiny_patch4_window7_224", checkpointing=False)
    lt_ips, st_ips = measured(lt, "images_per_s"), measured(st, "images_per_s")
    out.append(
        _target(
            "training images/s linvit_tiny / swin_tiny",
            lt_ips / st_ips if lt_ips and st_ips else None,
            1.0,
            False,
            _cpu_ratio(st, lt).replace("ratio", "ratio swin/linvit").lstrip("; "),
        )
    )
    plain = measured(lt, "activation_mib")
    ckpt = measured(_find(train, model="linvit_tiny", checkpointing=True), "activation_mib")
    out.append(
        _target(
            "linvit_tiny training activation memory, checkpointing / plain",
            ckpt / plain if ckpt and plain else None,
            0.5,
            True,
        )
    )
    comp = [r for r in suite_rows(index, "compile") if r.get("status") == "ok"]
    if comp:
        breaks = sum(r.get("attention_breaks", 0) for r in comp)
        out.append(
            _target(f"graph breaks inside attention under torch.compile ({len(comp)} model×size)", breaks, 0, True)
        )
    return out


# ----------------------------------------------------------------------------------------------- tables
def _operator_tables(index: dict) -> list[str]:
    ops = suite_rows(index, "operators")
    if not ops:
        return []
    lines = ["## 1. Operators", ""]
    lines += [f"- `{name}`: {text}" for name, text in OPERATORS.items()]
    lines += [
        "",
        "Batch 1; latency in ms (median); memory = peak RSS above the resident size before the call (MiB).",
        "",
    ]
    configs = sorted({(r["case"]["heads"], r["case"]["head_dim"]) for r in ops})
    maps = sorted({r["case"]["map"] for r in ops})
    names = [n for n in OPERATORS if any(r["case"]["op"] == n for r in ops)]
    for heads, head_dim in configs:
        for mode in ("fwd", "fwdbwd"):
            for field, title in (("latency_ms", "latency ms"), ("activation_mib", "memory MiB")):
                mode_name = "forward" if mode == "fwd" else "forward+backward"
                lines.append(f"**{heads}×{head_dim} heads (C={heads * head_dim}), {mode_name}, {title}**")
                lines.append("")
                lines.append("| operator | " + " | ".join(f"{m}² ({m * m:,})" for m in maps) + " |")
                lines.append("|---|" + "---:|" * len(maps))
                for name in names:
                    cells = [
                        _cell(_find(ops, op=name, map=m, heads=heads, head_dim=head_dim, mode=mode), field)
                        for m in maps
                    ]
                    lines.append(f"| {name} | " + " | ".join(cells) + " |")
                lines.append("")
    return lines


def _backbone_tables(index: dict, gemm_peak: float | None) -> list[str]:
    rows = suite_rows(index, "backbones")
    if not rows:
        return []
    sizes = sorted({(r["case"]["height"], r["case"]["width"]) for r in rows}, key=lambda s: s[0] * s[1])
    models = list(dict.fromkeys(r["case"]["model"] for r in rows))
    lines = ["## 2. Backbones (inference)", "", "Latency in ms (median), per batch:", ""]
    lines.append("| model | " + " | ".join(f"{w}×{h}" for h, w in sizes) + " |")
    lines.append("|---|" + "---:|" * len(sizes))
    for model in models:
        cells = [_cell(_find(rows, model=model, height=h, width=w)) for h, w in sizes]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Details. MFU = 2·MACs·batch / latency / measured GEMM peak ({_fmt(gemm_peak, 0)} GFLOP/s in the last run); "
        "MFU (CPU time) = the same with this process's CPU time per call and the GEMM's FLOP per CPU-second, "
        "much less disturbed by other processes on a shared machine. CPU ms counts all threads of the process.",
        "",
    ]
    lines.append(
        "| model | size | batch | latency ms | CPU ms | images/s | peak MiB | activation MiB | GMACs/image | MFU "
        "| MFU (CPU time) |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in models:
        for h, w in sizes:
            row = _find(rows, model=model, height=h, width=w)
            if row is None:
                continue
            macs = row.get("macs")
            mfu = row.get("mfu")
            mfu_cpu = row.get("mfu_cpu")
            lines.append(
                f"| {model} | {w}×{h} | {row['case']['batch']} | {_cell(row)} | {_cell(row, 'cpu_ms')} "
                f"| {_cell(row, 'images_per_s')} "
                f"| {_cell(row, 'peak_mib')} | {_cell(row, 'activation_mib')} "
                f"| {_fmt(macs / 1e9 if macs else None, 2)} | {_fmt(100 * mfu if mfu else None)}{'%' if mfu else ''} "
                f"| {_fmt(100 * mfu_cpu if mfu_cpu else None)}{'%' if mfu_cpu else ''} |"
            )
    lines.append("")
    return lines


def _training_table(index: dict) -> list[str]:
    rows = suite_rows(index, "training")
    if not rows:
        return []
    lines = ["## 3. Training step (forward + backward + AdamW)", ""]
    lines.append(
        "| model | size | batch | grad checkpointing | step ms | CPU ms | images/s | peak MiB | activation MiB |"
    )
    lines.append("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for row in rows:
        c = row["case"]
        lines.append(
            f"| {c['model']} | {c['size']} | {c['batch']} | {'yes' if c['checkpointing'] else 'no'} | {_cell(row)} "
            f"| {_cell(row, 'cpu_ms')} "
            f"| {_cell(row, 'images_per_s')} | {_cell(row, 'peak_mib')} | {_cell(row, 'activation_mib')} |"
        )
    lines += ["", "Activation memory = peak RSS during a step above the resident size after the first step", ""]
    return lines


def _compile_table(index: dict) -> list[str]:
    rows = suite_rows(index, "compile")
    if not rows:
        return []
    lines = ["## 4. torch.compile (inference, batch 1)", ""]
    lines.append("| model | size | graphs | graph breaks | in attention | eager ms | compiled ms | gain | compile s |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        c = row["case"]
        if row.get("status") != "ok":
            lines.append(f"| {c['model']} | {c['size']} | {row.get('status')} | | | | | | |")
            continue
        lines.append(
            f"| {c['model']} | {c['size']} | {row['graphs']} | {row['graph_breaks']} | {row['attention_breaks']} "
            f"| {_fmt(row['eager_ms'])} | {_fmt(row['compiled_ms'])} | {row['gain']:.2f}× | {_fmt(row['compile_s'])} |"
        )
    reasons = sorted({reason for row in rows for reason in row.get("break_reasons", [])})
    if reasons:
        lines += ["", "Graph-break reasons seen:", ""] + [f"- `{reason}`" for reason in reasons]
    lines.append("")
    return lines


DEPLOY_SUBJECT = "linvit_tiny"  # the model the deploy suite compares with each peer's best runtime


def _deploy_table(index: dict) -> list[str]:
    rows = suite_rows(index, "deploy")
    if not rows:
        return []
    lines = ["## 5. Deployment runtimes on the CPU (inference, batch 1)", ""]
    lines.append("| model | size | runtime | ms (median) | min ms | vs eager |")
    lines.append("|---|---:|---|---:|---:|---:|")
    for row in rows:
        c = row["case"]
        eager = _find(rows, model=c["model"], size=c["size"], runtime="torch_eager")
        ratio = measured(eager) / measured(row) if measured(eager) and measured(row) else None
        versus = "1.00×" if c["runtime"] == "torch_eager" else (f"{ratio:.2f}×" if ratio else "–")
        lines.append(
            f"| {c['model']} | {c['size']}² | {c['runtime']} | {_cell(row)} | {_cell(row, 'min_ms')} | {versus} |"
        )
    lines += ["", "`vs eager`: eager latency over this runtime's (above 1: faster than eager PyTorch).", ""]
    for row in rows:  # the int8 file against the fp32 one it was quantized from (issue 37's target: 1.5x)
        c = row["case"]
        fp32 = _find(rows, model=c["model"], size=c["size"], runtime="onnxruntime_cpu")
        if c["runtime"] == "onnxruntime_int8" and measured(fp32) and measured(row):
            lines.append(f"- {c['model']} at {c['size']}²: int8 {measured(fp32) / measured(row):.2f}× faster than fp32")
    if lines[-1] != "":
        lines.append("")
    lines += _deploy_best_table(rows) + _deploy_growth_table(rows)
    return lines


REDUCED_PRECISION = ("onnxruntime_int8", "torch_eager_bf16")  # they change the numbers, not only the speed


def _best(rows: list[dict], model: str, size: int) -> dict | None:
    """The fastest measured fp32 runtime of ``model`` at ``size``."""
    candidates = [
        row
        for row in rows
        if row["case"]["model"] == model
        and row["case"]["size"] == size
        and row["case"]["runtime"] not in REDUCED_PRECISION
        and measured(row)
    ]
    return min(candidates, key=measured, default=None)


def _deploy_best_table(rows: list[dict]) -> list[str]:
    """Each model's best fp32 runtime per size, and linvit_tiny's best over it (below 1: linvit_tiny is faster)."""
    models = list(dict.fromkeys(row["case"]["model"] for row in rows))
    sizes = sorted({row["case"]["size"] for row in rows})
    lines = [
        f"Best fp32 runtime per model; `{DEPLOY_SUBJECT} / it`: {DEPLOY_SUBJECT}'s best over this model's best"
        f" (below 1: {DEPLOY_SUBJECT} is faster).",
        "",
        f"| model | size | best runtime | ms | {DEPLOY_SUBJECT} / it |",
        "|---|---:|---|---:|---:|",
    ]
    for size in sizes:
        subject = _best(rows, DEPLOY_SUBJECT, size)
        for model in models:
            best = _best(rows, model, size)
            if best is None:
                continue
            ratio = f"{measured(subject) / measured(best):.2f}" if subject is not None else "–"
            lines.append(f"| {model} | {size}² | {best['case']['runtime']} | {_cell(best)} | {ratio} |")
    return [*lines, ""]


def _deploy_growth_table(rows: list[dict]) -> list[str]:
    """Latency at the largest size over the smallest, per model and runtime (16 for 4× the side: linear in pixels)."""
    sizes = sorted({row["case"]["size"] for row in rows})
    if len(sizes) < 2:
        return []
    small, large = sizes[0], sizes[-1]
    pixels = (large / small) ** 2
    lines = [
        f"Cost growth {large}² / {small}² ({pixels:.0f}× the pixels; {pixels:.0f}× is linear in them):",
        "",
        "| model | runtime | growth |",
        "|---|---|---:|",
    ]
    for row in rows:
        c = row["case"]
        if c["size"] != large:
            continue
        base = _find(rows, model=c["model"], size=small, runtime=c["runtime"])
        if measured(base) and measured(row):
            lines.append(f"| {c['model']} | {c['runtime']} | {measured(row) / measured(base):.1f}× |")
    return [*lines, ""]


def _notes(index: dict) -> list[str]:
    notes = defaultdict(list)
    for row in index.values():
        for status_field, note_field in (("status", "note"), ("memory_status", "memory_note")):
            if row.get(status_field) not in (None, "ok"):
                notes[f"{row[status_field]}: {row.get(note_field)}"].append(row["case"])
    if not notes:
        return []
    lines = ["## Skipped or failed", ""]
    for note, cases in sorted(notes.items()):
        what = sorted({c.get("op") or c.get("model") or c["suite"] for c in cases})
        lines.append(f"- {note} — {len(cases)} case(s): {', '.join(what)}")
    lines.append("")
    return lines


def _add_derived(index: dict, gemm_peak: float | None, gemm_per_cpu_s: float | None = None) -> None:
    for row in index.values():
        case = row["case"]
        if row.get("status") != "ok" or "latency_ms" not in row:
            continue
        batch = case.get("batch", 1)
        if case["suite"] in ("backbones", "training"):
            row["images_per_s"] = batch / (row["latency_ms"] / 1e3)
        if case["suite"] == "backbones" and row.get("macs") and gemm_peak:
            row["mfu"] = 2 * row["macs"] * batch / (row["latency_ms"] / 1e3) / (gemm_peak * 1e9)
        if case["suite"] == "backbones" and row.get("macs") and row.get("cpu_ms") and gemm_per_cpu_s:
            row["mfu_cpu"] = 2 * row["macs"] * batch / (row["cpu_ms"] / 1e3) / (gemm_per_cpu_s * 1e9)


def _machine_lines(data: dict) -> list[str]:
    lines = ["## Runs", ""]
    for run in data["runs"]:
        m = run.get("machine", {})
        versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
        lines.append(
            f"- {run['date']} ({run.get('seconds', '?')} s): `{run['command']}` — suites "
            f"{', '.join(run['settings']['suites'])}, {run['settings']['dtype']}, "
            f"device {run['settings'].get('device')}, threads {m.get('torch_threads')}"
        )
        git = run.get("git")
        if git:
            lines.append(
                f"  - code: commit {git.get('commit')}, {git.get('measured')} "
                f"({git.get('uncommitted_files')} uncommitted file(s) under linvit/ and benchmarks/ at the time)"
            )
        lines.append(
            f"  - {m.get('gpu') or m.get('cpu')} ({m.get('cpu_count')} CPUs, {m.get('memory_gib')} GiB); "
            f"fp32 GEMM peak {_fmt(m.get('gemm_peak_gflops'), 0)} GFLOP/s; {versions}; env {m.get('env')}"
        )
    lines.append("")
    return lines


def render(data: dict) -> str:
    index = _index(data)
    last = data["runs"][-1] if data["runs"] else {}
    machine = last.get("machine", {})
    dtype = last.get("settings", {}).get("dtype", "fp32")
    gemm_peak = machine.get(f"gemm_peak_gflops_{dtype}") or machine.get("gemm_peak_gflops")
    gemm_per_cpu_s = machine.get(f"gemm_gflop_per_cpu_s_{dtype}") or machine.get("gemm_gflop_per_cpu_s")
    _add_derived(index, gemm_peak, gemm_per_cpu_s)
    lines = ["# linvit benchmark results", ""]
    lines += [
        "Generated by `linvit bench` / `python -m benchmarks.run` (see benchmarks/README.md). Timings are medians "
        "after warm-up; memory comes "
        "from a fresh process per case. Compare ratios within one run: the machine may be shared and noisy.",
        "",
        "## Targets",
        "",
        "| target | limit | measured | verdict | note |",
        "|---|---|---:|---|---|",
    ]
    for t in targets(index):
        lines.append(f"| {t['target']} | {t['limit']} | {_fmt(t['value'], 2)} | {t['verdict']} | {t['detail']} |")
    lines.append("")
    lines += _machine_lines(data)
    lines += _operator_tables(index)
    lines += _backbone_tables(index, gemm_peak)
    lines += _training_table(index)
    lines += _compile_table(index)
    lines += _deploy_table(index)
    lines += _notes(index)
    plots = ["operators_latency.png", "operators_memory.png", "backbones_latency.png", "backbones_memory.png"]
    if suite_rows(index, "deploy"):
        plots.append("deploy_latency.png")
    lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


REPORT_FILES = (
    "RESULTS.md",
    "operators_latency.png",
    "operators_memory.png",
    "backbones_latency.png",
    "backbones_memory.png",
    "deploy_latency.png",
)


def write_report(out_dir: Path, data: dict | None = None, force: bool = False) -> Path:
    """Rewrite ``RESULTS.md`` and the plots in ``out_dir`` from its ``results.json``.

    Written through :mod:`linvit.io.destination`: one of :data:`REPORT_FILES` that exists and that linvit did not
    write is refused unless ``force`` (checked before any is written)."""
    from linvit.io.destination import check_destination, write_text

    for name in REPORT_FILES:
        check_destination(Path(out_dir) / name, "plot" if name.endswith(".png") else "bench-report", force=force)
    out_dir = Path(out_dir)
    if data is None:
        data = json.loads((out_dir / "results.json").read_text())
    text = render(data)
    index = _index(data)
    from linvit.bench.plots import plot_backbones, plot_deploy, plot_operators  # imports matplotlib: when drawing

    memory = "peak memory above baseline (MiB)"
    plot_operators(index, out_dir, "latency_ms", "latency (ms)", "operators_latency.png", force=force)
    plot_operators(index, out_dir, "activation_mib", memory, "operators_memory.png", force=force)
    plot_backbones(index, out_dir, "latency_ms", "latency per image (ms)", "backbones_latency.png", force=force)
    plot_backbones(index, out_dir, "activation_mib", memory, "backbones_memory.png", force=force)
    if suite_rows(index, "deploy"):
        plot_deploy(index, out_dir, "deploy_latency.png", force=force)
    return write_text(out_dir / "RESULTS.md", text, "bench-report", force=force)


def main(argv: list[str] | None = None, default: Path = Path("bench-results") / "cpu") -> int:
    """Redraw ``RESULTS.md`` and the plots of the results folder ``argv[0]`` (default ``default``) without measuring;
    ``--force`` replaces files there that linvit did not write."""
    import sys

    from linvit.io.destination import DestinationError

    argv = sys.argv[1:] if argv is None else argv
    force = "--force" in argv
    folders = [arg for arg in argv if arg != "--force"]
    try:  # the default folder is linvit's own; another one's files are replaced when linvit wrote them, or --force
        print(write_report(Path(folders[0]) if folders else default, force=force or not folders))
    except DestinationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
