"""Train linvit_nano and a timm model of similar size with the same recipe; record accuracy and wall time.

    python -m benchmarks.accuracy.run                        # every run below (about an hour on 2 CPU cores)
    python -m benchmarks.accuracy.run --only digits          # the default run and its baseline (minutes)
    python -m benchmarks.accuracy.run --only fashion_mnist   # needs dataset-fashion-mnist (apt)
    python -m benchmarks.accuracy.run --only folders         # the folder runs below (about 1.5 hours)
    python -m benchmarks.accuracy.run --only folder_digits_3x40_linvit_nano   # one of them (minutes)
    python -m benchmarks.accuracy.run --only folder_digits_10 --seeds 1,2       # more seeds of a set's runs
    python -m benchmarks.accuracy.run --only folder_digits_10 --test-every-epoch  # and every epoch's test top-1

The folder runs write real and synthetic sets as ImageNet-layout folders (:mod:`benchmarks.accuracy.folders`, into
``<log dir>/folders``) and train linvit_nano, resnet18 and efficientvit_b0 (timm) on each with the one command a new
user types, ``python train.py data=imagefolder data.root=DIR`` (= ``linvit train ...``): every training value
``auto`` (batch, epochs, augmentation, class count, input size), chosen from the folder.

Each run is ``python train.py <overrides>`` in a subprocess (with ``OMP_WAIT_POLICY=PASSIVE``); its test metrics
(``metrics.json`` of the run directory) and wall time go to ``benchmarks/accuracy/runs/<run>.json``; then
``results.json`` (all runs) and ``RESULTS.md`` are rewritten from them, with one learning-curve PNG per run.

``--seeds``: the runs again with ``seed=<n>`` (initialisation, augmentation and batch order; the folder sets stay the
same images), recorded as ``<run>_seed<n>``. A 3-class, 40-per-class set tests on 300 images and validates on 30:
one seed's checkpoint can move a row by 5 points, so RESULTS.md also shows each run's mean over its seeds.

``--test-every-epoch``: each run also tests every validated epoch's weights (:mod:`benchmarks.accuracy.epoch_test`,
``runs/<run>.epochs.csv``; the training is the same, its wall time recorded without the extra passes), and
RESULTS.md compares checkpoint-selection rules on those curves (:mod:`benchmarks.accuracy.selection`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BASELINE = "efficientvit_b0"  # timm's EfficientViT (MIT): linear attention too, 2.1M parameters

# name -> (dataset, model, train.py overrides); a baseline uses the linvit experiment's recipe with model=timm
RUNS: dict[str, tuple[str, str, list[str]]] = {
    "digits_linvit_nano": ("digits", "linvit_nano", ["experiment=digits_linvit_nano"]),
    f"digits_{BASELINE}": (
        "digits",
        BASELINE,
        ["experiment=digits_linvit_nano", "model=timm", f"model.model_name={BASELINE}"],
    ),
    "fashion_mnist_linvit_nano": ("fashion_mnist", "linvit_nano", ["experiment=fashion_mnist_linvit_nano"]),
    f"fashion_mnist_{BASELINE}": (
        "fashion_mnist",
        BASELINE,
        ["experiment=fashion_mnist_linvit_nano", "model=timm", f"model.model_name={BASELINE}"],
    ),
}

# folder sets: name -> benchmarks.accuracy.folders.write_folder arguments (the first classes, the first images)
FOLDER_SETS: dict[str, dict] = {
    "digits_3x40": {"name": "digits", "classes": 3, "per_class": 40, "val_per_class": 10, "test_per_class": 100},
    "digits_10": {"name": "digits", "val_per_class": 20, "test_per_class": 50},
    "fashion_mnist_3x40": {
        "name": "fashion_mnist",
        "classes": 3,
        "per_class": 40,
        "val_per_class": 10,
        "test_per_class": 100,
    },
    "fashion_mnist_10x500": {"name": "fashion_mnist", "per_class": 500, "val_per_class": 50, "test_per_class": 200},
    "shapes_3x100": {"name": "shapes", "per_class": 100, "val_per_class": 20, "test_per_class": 100},
    "wallpapers_11x60": {"name": "wallpapers", "per_class": 60, "val_per_class": 10, "test_per_class": 50},
}
FOLDER_MODELS: dict[str, list[str]] = {
    "linvit_nano": [],
    "resnet18": ["model=timm", "model.model_name=resnet18"],
    BASELINE: ["model=timm", f"model.model_name={BASELINE}"],
}
FOLDERS = "<folders>"  # in an override: the folder the sets are written into
# how a run chose best.ckpt (callbacks.model_checkpoint), recorded with it
HIGHEST = "highest"  # the highest val/acc1, a tie to the lower val/loss: every run recorded before 2026-12-07
WITHIN_ERROR = "within one error"  # the latest val/acc1 within one standard error of the best so far
RUNS.update(
    {
        f"folder_{folder_set}_{model}": (
            f"folder_{folder_set}",
            model,
            ["data=imagefolder", f"data.root={FOLDERS}/{folder_set}", *model_overrides],
        )
        for folder_set in FOLDER_SETS
        for model, model_overrides in FOLDER_MODELS.items()
    }
)


def _write_folder_set(dataset: str, folders: Path) -> None:
    """The set of a folder run (``folder_<set>``), written into ``folders`` unless it is there."""
    from benchmarks.accuracy.folders import write_folder

    name = dataset.removeprefix("folder_")
    if not (folders / name / "train").is_dir():
        options = dict(FOLDER_SETS[name])
        write_folder(options.pop("name"), folders / name, **options)


def _params(model_name: str) -> int:
    code = (
        f"import timm, linvit; m = timm.create_model({model_name!r}, num_classes=10); "
        "print(sum(p.numel() for p in m.parameters()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    return int(out.stdout.split()[-1])


def seed_run_name(name: str, seed: int) -> str:
    """The recorded name of run ``name`` at ``seed`` (seed 0 is the run itself)."""
    return name if seed == 0 else f"{name}_seed{seed}"


EVERY_EPOCH = [  # --test-every-epoch: benchmarks.accuracy.epoch_test's callback, which does not change the training
    "+callbacks.epoch_test._target_=benchmarks.accuracy.epoch_test.EpochTestRecorder",
    "+callbacks.epoch_test.path=${paths.output_dir}/epoch_test.csv",
]


def run_one(name: str, log_dir: Path, extra: list[str], seed: int = 0, every_epoch: bool = False) -> dict:
    dataset, model, overrides = RUNS[name]
    if seed:
        overrides = [*overrides, f"seed={seed}"]
    recorded = seed_run_name(name, seed)
    run_dir = log_dir / recorded
    shown = list(overrides)  # the command as recorded: <folders> stands for the folder the sets are in
    if dataset.startswith("folder_"):
        _write_folder_set(dataset, log_dir / "folders")
        overrides = [o.replace(FOLDERS, str(log_dir / "folders")) for o in overrides]
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = [*overrides, *extra, f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false"]
    overrides += EVERY_EPOCH if every_epoch else []
    shown += extra
    command = [sys.executable, "train.py", *overrides]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{recorded} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    plot = HERE / f"{name}.png"  # seed 0's curves only: the other seeds' stay in their run directories
    if not seed:
        shutil.copyfile(run_dir / "learning_curves.png", plot)
    curve = None
    if every_epoch:  # the curve beside the run's record, and the training's own time without the test passes
        curve = HERE / "runs" / f"{recorded}.epochs.csv"
        curve.parent.mkdir(exist_ok=True)
        shutil.copyfile(run_dir / "epoch_test.csv", curve)
        from benchmarks.accuracy.selection import read_curve  # torch and Lightning: only for the runs that need them

        wall -= sum(row["seconds"] for row in read_curve(curve))
    return {
        "name": recorded,
        "run": name,
        "seed": seed,
        "dataset": dataset,
        "model": model,
        "params": _params(model),
        "command": "python train.py " + " ".join(shlex.quote(o) for o in shown),
        "test_acc1": metrics.get("test/acc1"),
        "test_acc5": metrics.get("test/acc5"),
        "test_ema_acc1": metrics.get("test_ema/acc1"),
        "wall_s": round(wall, 1),
        "train_s": round(metrics.get("time/total_s", float("nan")), 1),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}",
        "plot": plot.name if not seed else None,
        "checkpoint_rule": _checkpoint_rule(run_dir),
        **({"epoch_curve": curve.name} if curve else {}),
    }


def _checkpoint_rule(run_dir: Path) -> str:
    """How the run chose ``best.ckpt``, from its ``config.yaml``: ``callbacks.model_checkpoint.within_error`` or not."""
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    checkpoint = (config.get("callbacks") or {}).get("model_checkpoint") or {}
    return WITHIN_ERROR if checkpoint.get("within_error") else HIGHEST


def write_report(rows: dict[str, dict]) -> None:
    (HERE / "results.json").write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    first = {name: row for name, row in rows.items() if name in RUNS}  # seed 0: the run as first recorded
    lines = [
        "# Accuracy: linvit_nano beside timm models, same recipe",
        "",
        "Written by `python -m benchmarks.accuracy.run` (do not edit by hand). Test top-1 of the best-validation",
        "checkpoint (raw weights and EMA weights), on the held-out test split; wall time of the whole",
        "`python train.py` process (start-up, training, validation, test, export) on a shared machine.",
        "`folder_*` runs: sets written as ImageNet-layout folders (`<folders>`: `benchmarks/accuracy/folders.py`),",
        "trained with `data=imagefolder data.root=DIR` and nothing else (every training value `auto`).",
        "",
        "`best.ckpt` rule: `highest` is the highest `val/acc1` (a tie to the lower `val/loss`), the default of every",
        "run before 2026-12-07; `within one error` the latest `val/acc1` within one standard error of the best so far",
        "(`callbacks.model_checkpoint.within_error`, the default since; see the checkpoint rules below).",
        "",
        "| run | params | test top-1 | test top-1 (EMA) | test top-5 | wall time | command | `best.ckpt` rule |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in first.values():
        ema = f"{100 * row['test_ema_acc1']:.2f}%" if row.get("test_ema_acc1") is not None else "-"
        lines.append(
            f"| {row['name']} | {row['params'] / 1e6:.2f}M | {100 * row['test_acc1']:.2f}% | {ema} "
            f"| {100 * row['test_acc5']:.2f}% | {row['wall_s'] / 60:.1f} min | `{row['command']}` "
            f"| {row.get('checkpoint_rule', HIGHEST)} |"
        )
    lines += _seeds_table(rows)
    lines += _rules_table()
    lines += ["", "Machines and dates:", ""]
    lines += [f"- {row['name']}: {row['machine']}, {row['date']}" for row in rows.values()]
    lines += ["", "Learning curves (seed 0):", ""]
    lines += [f"![{row['name']}]({row['plot']})" for row in first.values()]
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")


def _run_and_seed(row: dict) -> tuple[str, int]:
    """(run, seed) of a recorded row; rows from before ``--seeds`` are their run at seed 0."""
    return row.get("run", row["name"]), row.get("seed", 0)


def _seeds_table(rows: dict[str, dict]) -> list[str]:
    """Test top-1 of every run recorded at more than one seed: each seed's, the mean and the range."""
    by_run: dict[str, dict[int, float]] = {}
    for row in rows.values():
        run, seed = _run_and_seed(row)
        by_run.setdefault(run, {})[seed] = 100 * row["test_acc1"]
    by_run = {run: accs for run, accs in by_run.items() if len(accs) > 1}
    if not by_run:
        return []
    lines = [
        "",
        "Over seeds (`--seeds`: `seed=<n>` on the same command; the same images): test top-1 of each seed's",
        "best-validation checkpoint.",
        "",
        "| run | seeds | test top-1 per seed | mean | range |",
        "|---|---:|---|---:|---:|",
    ]
    for run, accs in by_run.items():
        values = [accs[seed] for seed in sorted(accs)]
        per_seed = ", ".join(f"{value:.2f}" for value in values)
        mean = sum(values) / len(values)
        lines.append(
            f"| {run} | {','.join(map(str, sorted(accs)))} | {per_seed} | {mean:.2f}% "
            f"| {max(values) - min(values):.2f} |"
        )
    return lines


def _rules_table() -> list[str]:
    """The checkpoint-selection rules on the runs recorded with per-epoch test curves (``--test-every-epoch``)."""
    from benchmarks.accuracy import selection

    curves = selection.load_curves(HERE / "runs")
    if not curves:
        return []
    return [
        "",
        "Checkpoint rules (`python -m benchmarks.accuracy.selection`): the test top-1 of the epoch each rule would",
        "keep as `best.ckpt`, from the runs' per-epoch test curves (`--test-every-epoch`, `runs/<run>.epochs.csv`),",
        "mean over each run's seeds; `..., EMA`: the EMA weights' validation chooses and their test scores;",
        "`oracle`: the best epoch's test top-1, which no rule can see.",
        "",
        *selection.table(curves),
    ]


def _load_rows() -> dict[str, dict]:
    """Every recorded run: ``runs/<name>.json`` (one file per run, so that concurrent invocations never clash), in
    the order of ``RUNS``, each run's seeds after it."""
    rows = {}
    path = HERE / "results.json"
    if path.is_file():
        rows.update(json.loads(path.read_text()))
    for run_file in sorted((HERE / "runs").glob("*.json")):
        rows[run_file.stem] = json.loads(run_file.read_text())
    order = {name: i for i, name in enumerate(RUNS)}
    kept = [row for row in rows.values() if _run_and_seed(row)[0] in order]
    kept.sort(key=lambda row: (order[_run_and_seed(row)[0]], _run_and_seed(row)[1]))
    return {row["name"]: row for row in kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of datasets or run names (default: all)")
    parser.add_argument("--log-dir", type=Path, default=REPO_ROOT / "outputs" / "accuracy_benchmark")
    parser.add_argument("--report-only", action="store_true", help="rewrite RESULTS.md from the recorded runs")
    parser.add_argument("--seeds", default="0", help="comma list of seeds to run each at (default: 0)")
    parser.add_argument(
        "--test-every-epoch",
        action="store_true",
        help="also test every validated epoch's weights (recorded as runs/<run>.epochs.csv; for comparing "
        "checkpoint-selection rules: python -m benchmarks.accuracy.selection)",
    )
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides for every run")
    args = parser.parse_args(argv)
    wanted = [w for w in args.only.split(",") if w]
    groups = {"folders": [n for n in RUNS if n.startswith("folder_")]}
    wanted = [n for w in wanted for n in groups.get(w, [w])]
    names = [n for n, (dataset, _, _) in RUNS.items() if not wanted or n in wanted or dataset in wanted]
    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    for name, seed in [] if args.report_only else [(n, s) for s in seeds for n in names]:
        sys.stdout.write(f"{seed_run_name(name, seed)} ...\n")
        sys.stdout.flush()
        row = run_one(name, args.log_dir, args.overrides, seed, args.test_every_epoch)
        (HERE / "runs").mkdir(exist_ok=True)
        (HERE / "runs" / f"{row['name']}.json").write_text(json.dumps(row, indent=2, sort_keys=True) + "\n")
        sys.stdout.write(f"  test top-1 {100 * row['test_acc1']:.2f}% in {row['wall_s']:.0f} s\n")
        write_report(_load_rows())
    write_report(_load_rows())
    return 0


if __name__ == "__main__":
    sys.exit(main())
