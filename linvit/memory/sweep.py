"""Predicted against measured peak memory for the smallest model of every linvit family: the table in
docs/memory.md, and what the tests check.

    python -m linvit.memory.sweep --sizes 224,512,1024 [--default-malloc] > table.md

Each row is one dry run and one measured run in a fresh process (:func:`measure_memory`); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import timm
from timm.models import model_entrypoint

import linvit.models  # noqa: F401  (registers the families)
from linvit.memory.estimate import estimate_memory
from linvit.memory.measure import measure_runs
from linvit.memory.units import format_bytes

__all__ = ["Row", "family_models", "compare", "markdown"]


def family_models() -> dict[str, str]:
    """{family module: its smallest registered model (fewest parameters)} for every linvit family."""
    sizes: dict[str, tuple[int, str]] = {}
    for name in timm.list_models():
        module = getattr(model_entrypoint(name), "__module__", "") or ""
        if not module.startswith("linvit.models."):
            continue
        family = module.rsplit(".", 1)[1]
        params = sum(p.numel() for p in timm.create_model(name, device="meta").parameters())
        if family not in sizes or params < sizes[family][0]:
            sizes[family] = (params, name)
    return {family: name for family, (_, name) in sorted(sizes.items())}


@dataclass(frozen=True)
class Row:
    model: str
    size: int
    train: bool
    predicted_bytes: int
    measured_bytes: int
    default_malloc_bytes: int | None = None

    @property
    def error(self) -> float:
        """Predicted relative to measured: +0.05 is 5% above."""
        return self.predicted_bytes / self.measured_bytes - 1


def compare(
    models: Iterable[str], sizes: Iterable[int], modes: Iterable[bool] = (False, True), default_malloc: bool = False
) -> list[Row]:
    """One :class:`Row` per model, square size and mode (False: inference, True: training); all measured in one
    process (and once more with glibc's defaults when ``default_malloc``)."""
    runs = [
        {"model": model, "height": size, "width": size, "train": train}
        for model in models
        for size in sizes
        for train in modes
    ]
    predicted = []
    for run in runs:
        predicted.append(estimate_memory(run["model"], run["height"], run["width"], train=run["train"]).peak_bytes)
        print(f"predicted {run}", file=sys.stderr, flush=True)
    measured = measure_runs(runs)
    glibc = measure_runs(runs, default_malloc=True) if default_malloc else [None] * len(runs)
    return [
        Row(run["model"], run["height"], run["train"], guess, real.peak_bytes, other.peak_bytes if other else None)
        for run, guess, real, other in zip(runs, predicted, measured, glibc)
    ]


def markdown(rows: list[Row]) -> str:
    glibc = any(row.default_malloc_bytes is not None for row in rows)
    header = "| model | input | work | predicted | measured | predicted vs measured |"
    rule = "|---|---|---|---:|---:|---:|"
    if glibc:
        header += " measured, glibc defaults |"
        rule += "---:|"
    lines = [header, rule]
    for row in rows:
        line = (
            f"| `{row.model}` | {row.size}×{row.size} | {'training' if row.train else 'inference'} "
            f"| {format_bytes(row.predicted_bytes)} | {format_bytes(row.measured_bytes)} | {row.error:+.1%} |"
        )
        if glibc:
            extra = row.default_malloc_bytes / row.measured_bytes - 1 if row.default_malloc_bytes else float("nan")
            line += f" {format_bytes(row.default_malloc_bytes or 0)} ({extra:+.0%}) |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="224,512,1024", help="comma-separated square input sizes")
    parser.add_argument("--models", default=None, help="comma-separated models (default: each family's smallest)")
    parser.add_argument("--default-malloc", action="store_true", help="add a column measured with glibc's defaults")
    args = parser.parse_args(argv)
    models = args.models.split(",") if args.models else list(family_models().values())
    rows = compare(models, [int(size) for size in args.sizes.split(",")], default_malloc=args.default_malloc)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
