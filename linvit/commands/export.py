"""``linvit export RUN_DIR``: a training run's checkpoint as timm weights (``model.safetensors`` + ``config.json``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Export a training run (or .ckpt) as model.safetensors + timm config.json, loadable by timm.create_model."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (holding checkpoints/) or a .ckpt file")
    parser.add_argument(
        "--checkpoint", choices=("best", "last"), default="best", help="which checkpoint of a run (default: best)"
    )
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the raw ones")
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: the run directory, or the .ckpt's run)"
    )
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="load a checkpoint that needs full unpickling (runs code from the file: only for files you trust)",
    )
    parser.add_argument(
        "--allow-non-finite", action="store_true", help="export weights that hold NaN/Inf (named in a warning)"
    )


def load_snippet(folder: Path) -> str:
    """The Python line that loads the exported weights (``pretrained=True``: without it timm builds random weights)."""
    source = f"local-dir:{folder.resolve()}"
    return f"import timm, linvit; model = timm.create_model({source!r}, pretrained=True)"


def run(args: argparse.Namespace) -> int:
    from linvit.io import allow_non_finite_weights
    from linvit.train.export import CONFIG_NAME, export_checkpoint, find_checkpoint

    try:
        checkpoint = find_checkpoint(args.run, args.checkpoint)
    except FileNotFoundError as error:
        sys.stderr.write(f"linvit export: {error}\n")
        return 2
    out = args.out
    if out is None:
        out = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    try:
        with allow_non_finite_weights(args.allow_non_finite, opt_out="--allow-non-finite"):
            weights = export_checkpoint(checkpoint, out, ema=args.ema, trusted=args.trusted, opt_in="--trusted")
    except ValueError as error:
        sys.stderr.write(f"linvit export: {error}\n")
        return 2
    kind = "EMA" if args.ema else "raw"
    sys.stdout.write(
        f"exported {checkpoint} ({kind} weights)\n  {weights}\n  {weights.parent / CONFIG_NAME}\n"
        f"load: {load_snippet(weights.parent)}\n"
    )
    return 0
