"""PNG plots of a benchmark run's results (``linvit.bench.report`` indexes them): operator latency or memory against
tokens, one panel per head configuration and mode, and backbone latency or memory per image against pixels."""

from __future__ import annotations

from pathlib import Path

from linvit.bench.cases import OPERATORS
from linvit.bench.report import measured, suite_rows
from linvit.io.destination import save_figure

__all__ = ["plot_backbones", "plot_operators"]


def plot_operators(index: dict, out_dir: Path, field: str, ylabel: str, filename: str, force: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [r for r in suite_rows(index, "operators") if measured(r, field) is not None]
    configs = sorted({(r["case"]["heads"], r["case"]["head_dim"]) for r in suite_rows(index, "operators")})
    if not configs:
        return
    modes = ("fwd", "fwdbwd")
    fig, axes = plt.subplots(len(modes), len(configs), figsize=(5 * len(configs), 4 * len(modes)), squeeze=False)
    for i, mode in enumerate(modes):
        for j, (heads, head_dim) in enumerate(configs):
            ax = axes[i][j]
            for color, name in enumerate(OPERATORS):
                points = sorted(
                    (r["case"]["map"] ** 2, r[field])
                    for r in ops
                    if r["case"]["op"] == name
                    and r["case"]["mode"] == mode
                    and (r["case"]["heads"], r["case"]["head_dim"]) == (heads, head_dim)
                )
                if points:
                    ax.plot(*zip(*points), marker="o", label=name, color=f"C{color}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{heads}×{head_dim} heads, {'forward' if mode == 'fwd' else 'forward+backward'}")
            ax.set_xlabel("tokens")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
    for ax in (ax for row in axes for ax in row):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            break
    fig.tight_layout()
    try:  # a file linvit did not write there: refused unless force (linvit.io.destination)
        save_figure(fig, Path(out_dir) / filename, dpi=90, force=force)
    finally:
        plt.close(fig)


def plot_backbones(index: dict, out_dir: Path, field: str, ylabel: str, filename: str, force: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in suite_rows(index, "backbones") if measured(r, field) is not None]
    fig, ax = plt.subplots(figsize=(7, 5))
    for color, model in enumerate(dict.fromkeys(r["case"]["model"] for r in suite_rows(index, "backbones"))):
        points = sorted(
            (r["case"]["height"] * r["case"]["width"], r[field] / r["case"]["batch"])
            for r in rows
            if r["case"]["model"] == model
        )
        if not points:
            continue
        style = "-" if model.startswith(("linvit_", "flatten_")) else "--"
        ax.plot(*zip(*points), style, marker="o", label=model, color=f"C{color % 10}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("pixels")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if rows:
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:  # a file linvit did not write there: refused unless force (linvit.io.destination)
        save_figure(fig, Path(out_dir) / filename, dpi=90, force=force)
    finally:
        plt.close(fig)


def plot_deploy(index: dict, out_dir: Path, filename: str, force: bool = False) -> None:
    """Deploy suite: latency against pixels, one panel per runtime, one line per model (linvit's solid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in suite_rows(index, "deploy") if measured(r) is not None]
    runtimes = list(dict.fromkeys(r["case"]["runtime"] for r in suite_rows(index, "deploy"))) or ["torch_eager"]
    models = list(dict.fromkeys(r["case"]["model"] for r in suite_rows(index, "deploy")))
    fig, axes = plt.subplots(1, len(runtimes), figsize=(3.2 * len(runtimes), 3.6), sharey=True, squeeze=False)
    for ax, runtime in zip(axes[0], runtimes):
        for color, model in enumerate(models):
            points = sorted(
                (r["case"]["size"] ** 2, r["latency_ms"])
                for r in rows
                if r["case"]["model"] == model and r["case"]["runtime"] == runtime
            )
            if points:
                style = "-" if model.startswith(("linvit_", "flatten_")) else "--"
                ax.plot(*zip(*points), style, marker="o", label=model, color=f"C{color % 10}")
        ax.set_title(runtime, fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("pixels")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("latency, batch 1 (ms)")
    if rows:
        axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    try:  # a file linvit did not write there: refused unless force (linvit.io.destination)
        save_figure(fig, Path(out_dir) / filename, dpi=90, force=force)
    finally:
        plt.close(fig)
