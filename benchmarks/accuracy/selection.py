"""Checkpoint-selection rules compared on the runs recorded with ``--test-every-epoch``.

    python -m benchmarks.accuracy.selection   # a Markdown table, from benchmarks/accuracy/runs/*.json

Each rule sees what a checkpoint callback sees during training (each validation's accuracy, loss and image count,
in order) and names one validated epoch; the run's ``epoch_curve`` then gives the test top-1 of that epoch's
weights. So every rule is judged on the same runs, without a run per rule. ``oracle`` (the best test top-1 of any
epoch) is no rule: it bounds what choosing can gain.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from linvit.train.modules.callbacks import accuracy_standard_error

HERE = Path(__file__).resolve().parent
Curve = Sequence[dict]


def highest(curve: Curve) -> int:
    """linvit's rule before 2026-12-07 (``within_error=false``): the highest validation top-1; a tie goes to the lower
    validation loss."""
    chosen = 0
    for i, row in enumerate(curve):
        best = curve[chosen]
        tie = row["val_acc1"] == best["val_acc1"] and row["val_loss"] < best["val_loss"]
        if row["val_acc1"] > best["val_acc1"] or tie:
            chosen = i
    return chosen


def last(curve: Curve) -> int:
    """The last validated epoch."""
    return len(curve) - 1


def lowest_loss(curve: Curve) -> int:
    """The lowest validation loss."""
    return min(range(len(curve)), key=lambda i: (curve[i]["val_loss"], -i))


def within_one_error(curve: Curve) -> int:
    """The latest validation within one standard error of the best validation top-1 so far: a later epoch that
    validates one image below an earlier one is not worse on evidence, and has trained longer. The rule of
    ``callbacks.model_checkpoint.within_error`` (linvit's default since 2026-12-07)."""
    chosen, best = 0, -1.0
    for i, row in enumerate(curve):
        best = max(best, row["val_acc1"])
        if row["val_acc1"] >= best - accuracy_standard_error(best, row["val_images"]):
            chosen = i
    return chosen


def best_of_three(curve: Curve) -> int:
    """The latest epoch of the three consecutive validations of highest mean top-1 (ties: the later); a run of
    fewer validations is one window."""
    ends = range(min(2, len(curve) - 1), len(curve))
    means = {i: sum(row["val_acc1"] for row in curve[max(0, i - 2) : i + 1]) for i in ends}
    return max(ends, key=lambda i: (means[i], i))


RULES: dict[str, Callable[[Curve], int]] = {
    "highest": highest,
    "last": last,
    "lowest loss": lowest_loss,
    "within one error": within_one_error,
    "best of three": best_of_three,
}


EMA_RULES = ("highest", "last", "within one error")  # also judged on the EMA weights' curve


def ema_view(curve: Curve) -> list[dict] | None:
    """The curve as the EMA weights see it (their validation and test in the raw weights' columns); None where the
    run has no EMA weights or their validation was not recorded."""
    keys = ("val_ema_acc1", "val_ema_loss", "test_ema_acc1")
    if any(row.get(key) is None for row in curve for key in keys):
        return None
    return [
        {**row, "val_acc1": row["val_ema_acc1"], "val_loss": row["val_ema_loss"], "test_acc1": row["test_ema_acc1"]}
        for row in curve
    ]


def chosen_test(curve: Curve) -> dict[str, tuple[int, float]]:
    """Each rule's (epoch, test top-1 in %) on one run, on the raw weights and (``..., EMA``) on the EMA weights
    where the run recorded their validation, with the oracle."""
    out = {name: (curve[rule(curve)]["epoch"], 100 * curve[rule(curve)]["test_acc1"]) for name, rule in RULES.items()}
    ema = ema_view(curve)
    for name in EMA_RULES if ema is not None else ():
        chosen = ema[RULES[name](ema)]
        out[f"{name}, EMA"] = (chosen["epoch"], 100 * chosen["test_acc1"])
    top = max(range(len(curve)), key=lambda i: curve[i]["test_acc1"])
    out["oracle"] = (curve[top]["epoch"], 100 * curve[top]["test_acc1"])
    return out


def read_curve(path: str | Path) -> list[dict]:
    """The rows of an ``epoch_test.csv`` (:mod:`benchmarks.accuracy.epoch_test`) as numbers; a column left empty
    (no EMA) or missing (a file written before it was added) is None."""
    rows = []
    with Path(path).open(newline="") as file:
        for raw in csv.DictReader(file):
            row = {key: float(value) if value not in (None, "") else None for key, value in raw.items()}
            row["epoch"], row["step"], row["val_images"] = int(row["epoch"]), int(row["step"]), int(row["val_images"])
            rows.append(row)
    return rows


def load_curves(folder: Path = HERE / "runs") -> dict[str, dict]:
    """The recorded runs with an ``epoch_curve`` (the name of their CSV beside them): name -> row, the curve read."""
    rows = {}
    for path in sorted(folder.glob("*.json")):
        row = json.loads(path.read_text())
        if row.get("epoch_curve"):
            rows[row["name"]] = {**row, "epoch_curve": read_curve(folder / row["epoch_curve"])}
    return rows


def table(rows: dict[str, dict]) -> list[str]:
    """Markdown: test top-1 of each rule's choice, per run (set, model) as the mean over its seeds, and over all
    runs; then how many runs each rule moves up and down against ``highest`` (on the runs it was judged on)."""
    by_run: dict[str, list[dict[str, tuple[int, float]]]] = {}
    for row in rows.values():
        by_run.setdefault(row["run"], []).append(chosen_test(row["epoch_curve"]))
    names = list(dict.fromkeys(name for seeds in by_run.values() for seed in seeds for name in seed))
    names.sort(key=lambda name: name == "oracle")  # the bound last
    base = "highest"  # the default before 2026-12-07: each rule is judged against it on the same runs
    lines = ["| run (seeds) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}  # (highest's, the rule's) per run
    for run, seeds in by_run.items():
        cells = []
        for name in names:
            values = [seed[name][1] for seed in seeds if name in seed]
            pairs[name] += [(seed[base][1], seed[name][1]) for seed in seeds if name in seed]
            cells.append(f"{sum(values) / len(values):.2f}" if values else "-")
        lines.append(f"| {run.removeprefix('folder_')} ({len(seeds)}) | " + " | ".join(cells) + " |")
    lines.append(
        "| mean (runs) | "
        + " | ".join(f"{sum(v for _, v in p) / len(p):.2f} ({len(p)})" if p else "-" for p in pairs.values())
        + " |"
    )
    lines.append(
        "| runs up / down against highest | "
        + " | ".join(f"{sum(v > t for t, v in p)} / {sum(v < t for t, v in p)}" for p in pairs.values())
        + " |"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=HERE / "runs", help="folder of recorded runs (*.json)")
    args = parser.parse_args(argv)
    rows = load_curves(args.runs)
    if not rows:
        sys.stderr.write(f"no run in {args.runs} has an epoch_curve: record some with --test-every-epoch\n")
        return 1
    sys.stdout.write("\n".join(table(rows)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
