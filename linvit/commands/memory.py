"""``linvit memory MODEL --size HxW``: will it fit? Predicted peak memory per stage, measured on request, and the
largest input (and batch) under a budget."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "Predict a model's peak memory at an input size (per stage, inference or training) without running it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="timm model name, e.g. linvit_tiny (see `linvit models`)")
    parser.add_argument("--size", default=None, help="input HxW, e.g. 1024x1024 or 1600x2560 (default: native)")
    parser.add_argument("--batch", type=int, default=1, help="images per batch (default 1)")
    parser.add_argument("--train", action="store_true", help="AdamW training steps instead of inference")
    parser.add_argument(
        "--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="autocast precision (weights stay fp32)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if present, else cpu")
    parser.add_argument(
        "--budget", default=None, help="memory budget, e.g. 80GiB or 16GB: also find the largest input and batch"
    )
    parser.add_argument("--measure", action="store_true", help="also run it once for real and print the measurement")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="measure on the CPU with glibc's default malloc (keeps freed blocks; see docs/memory.md)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress on stderr (the steps of --measure and --budget)"
    )


def _stage_table(estimate, format_bytes) -> list[str]:
    kept = "kept for backward" if estimate.train else "output"
    rows = [("stage", "grid", "tokens", "attention", "peak", kept)]
    for stage in estimate.stages:
        grid = f"{stage.grid[0]}×{stage.grid[1]}" if stage.grid else "-"
        peak, kept_bytes = format_bytes(stage.peak_bytes), format_bytes(stage.kept_bytes)
        rows.append((stage.name, grid, str(stage.tokens), stage.attention, peak, kept_bytes))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {2, 4, 5}
    return [
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


def _report(estimate, format_bytes) -> list[str]:
    work = "training (AdamW)" if estimate.train else "inference"
    shape = f"{estimate.batch}×{estimate.height}×{estimate.width}"
    lines = [f"{estimate.model}: {work}, batch×H×W {shape}, {estimate.dtype}, {estimate.device}"]
    lines.append("predicted by a dry run on fake tensors (no memory used, nothing computed)")
    if estimate.stages:
        lines += ["", *_stage_table(estimate, format_bytes), ""]
    state = [
        f"parameters {format_bytes(estimate.parameter_bytes)}",
        f"buffers {format_bytes(estimate.buffer_bytes)}",
        f"input {format_bytes(estimate.input_bytes)}",
    ]
    if estimate.train:
        state.append(f"optimizer state {format_bytes(estimate.optimizer_bytes)}")
    lines.append("held throughout: " + ", ".join(state))
    where = f" (during {estimate.peak_at})" if estimate.peak_at else ""
    lines.append(
        f"peak: {format_bytes(estimate.peak_bytes)}{where} = {format_bytes(estimate.state_bytes)} held throughout"
        f" + {format_bytes(estimate.activation_bytes)} activations, gradients and workspaces"
    )
    return lines


def _notes(device: str) -> list[str]:
    if device == "cuda":
        return [
            "CUDA: what torch.cuda.max_memory_allocated reports; the CUDA context and the caching allocator's reserve"
            " come on top. Untested on a GPU (docs/memory.md)."
        ]
    return [
        "CPU: tensor memory as a process holds it when malloc returns freed blocks; with glibc's defaults the"
        " resident size runs above it (set MALLOC_MMAP_THRESHOLD_=65536 to avoid that, docs/memory.md)."
    ]


def run(args: argparse.Namespace) -> int:
    import timm
    import torch

    from linvit.dense.extract import parse_size
    from linvit.memory import estimate_memory
    from linvit.memory.fit import largest_batch, largest_size
    from linvit.memory.measure import measure_memory
    from linvit.memory.units import format_bytes, parse_bytes
    from linvit.utils.progress import Progress

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        if not timm.is_model(args.model):
            raise ValueError(f"Unknown model {args.model!r}; `linvit models` lists linvit's, timm.list_models() all.")
        if args.size is not None:
            height, width = parse_size(args.size)
        else:
            height, width = timm.get_pretrained_cfg(args.model).input_size[1:]
        budget = parse_bytes(args.budget) if args.budget is not None else None
        options = {"train": args.train, "dtype": args.dtype, "device": device}
        estimate = estimate_memory(args.model, height, width, args.batch, **options)
    except ValueError as error:
        print(f"linvit memory: error: {error}", file=sys.stderr)
        return 2

    result = {"estimate": estimate.to_dict()}
    lines = _report(estimate, format_bytes)
    progress = Progress("memory", enabled=not args.no_progress)
    if args.measure:
        progress.step(f"measuring: running {args.model} for real in a fresh process")
        measured = measure_memory(args.model, height, width, args.batch, default_malloc=args.default_malloc, **options)
        error = estimate.peak_bytes / measured.peak_bytes - 1 if measured.peak_bytes > 0 else float("nan")
        result["measurement"] = {**measured.__dict__, "prediction_error": error}
        lines.append(
            f"measured: {format_bytes(measured.peak_bytes)} ({measured.kind}; {measured.seconds:.0f} s):"
            f" predicted {error:+.1%} from measured"
        )
    if budget is not None:
        progress.step(f"searching the largest input under {format_bytes(budget)} (dry runs)")
        size_fit = largest_size(args.model, budget, (height, width), args.batch, **options)
        progress.step(f"searching the largest batch under {format_bytes(budget)} (dry runs)")
        batch_fit = largest_batch(args.model, budget, height, width, **options)
        result["budget"] = {
            "budget_bytes": budget,
            "largest_size": size_fit.estimate.to_dict() if size_fit.estimate else None,
            "largest_batch": batch_fit.estimate.to_dict() if batch_fit.estimate else None,
        }
        lines.append(f"budget {format_bytes(budget)}:")
        fit = size_fit.estimate
        at_least = "at least " if size_fit.capped else ""
        lines.append(
            f"  largest {height}×{width}-shaped input at batch {args.batch}: "
            + (
                f"{at_least}{fit.height}×{fit.width} (peak {format_bytes(fit.peak_bytes)})"
                if fit
                else "none, not even the smallest"
            )
            + f"; {size_fit.dry_runs} dry runs"
        )
        fit = batch_fit.estimate
        at_least = "at least " if batch_fit.capped else ""
        lines.append(
            f"  largest batch at {height}×{width}: "
            + (f"{at_least}{fit.batch} (peak {format_bytes(fit.peak_bytes)})" if fit else "none, not even 1")
            + f"; {batch_fit.dry_runs} dry runs"
        )
    lines += [f"note: {note}" for note in (*estimate.notes, *_notes(device))]
    if args.json:
        stream = getattr(args, "data_stream", sys.stdout)
        stream.write(json.dumps(result, indent=2) + "\n")
    else:
        print("\n".join(lines))
    return 0
