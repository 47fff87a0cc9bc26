"""``linvit eval RUN_DIR``: a training run's checkpoint on its test (or validation) split: top-1/top-5 of a
classification run, mIoU of a segmentation run. The run's DataModule is built from its ``config.yaml`` through
linvit's allow-list (:mod:`linvit.train.runs.saved_run`), without Hydra."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HELP = "Evaluate a training run's checkpoint on the run's data: top-1, top-5 (raw and EMA weights) or mIoU; loss."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (holding config.yaml and checkpoints/) or a .ckpt inside one")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best", help="default: best")
    parser.add_argument("--split", choices=("test", "val"), default="test", help="default: test")
    parser.add_argument("--batch-size", type=int, default=None, help="evaluation batch size (default: the run's)")
    parser.add_argument("--num-workers", type=int, default=None, help="data loader workers (default: the run's)")
    parser.add_argument("--accelerator", default="auto", help="cpu, gpu, auto (default)")
    parser.add_argument("--precision", default="32-true", help="32-true (default), bf16-mixed, 16-mixed")
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a data option of the run's config, e.g. --data root=/data/imagenet (repeatable)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the metrics as JSON on stdout (progress and logs go to stderr)"
    )
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="trust the run directory: load a checkpoint that needs full unpickling and build classes its config "
        "names outside linvit's own (both run code from the files: only for runs you trust)",
    )
    parser.add_argument(
        "--allow-non-finite",
        action="store_true",
        help="load weights that hold NaN/Inf (named in a warning) instead of stopping; the evaluation still fails "
        "if the model's outputs are not finite",
    )


def _run_dir(checkpoint: Path) -> Path:
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def run(args: argparse.Namespace) -> int:
    import lightning.pytorch as pl

    from linvit.io import CheckpointError, check_finite_weights
    from linvit.train.runs.export import find_checkpoint, load_checkpoint
    from linvit.train.runs.saved_run import build_from_config, load_run_config, module_from_checkpoint, set_option
    from linvit.utils.saved_config import TRUSTED_DATAMODULES, UntrustedConfigError

    try:
        checkpoint = find_checkpoint(args.run, args.checkpoint)
    except FileNotFoundError as error:
        sys.stderr.write(f"linvit eval: {error}\n")
        return 2
    config_path = _run_dir(checkpoint) / "config.yaml"
    if not config_path.is_file():
        sys.stderr.write(f"linvit eval: {config_path} not found: the run directory's resolved config is needed.\n")
        return 2
    try:  # bounded, plain YAML; no Hydra special keys (unless --trusted); every value of its type
        config = load_run_config(config_path, trusted=args.trusted)
    except ValueError as error:
        sys.stderr.write(f"linvit eval: {error}\n")
        return 1
    data_cfg = config.get("data") or {}
    for item in args.data:
        key, sep, value = item.partition("=")
        if not sep:
            sys.stderr.write(f"linvit eval: --data expects KEY=VALUE, got {item!r}\n")
            return 2
        set_option(data_cfg, key, value)
    if args.batch_size:
        data_cfg["eval_batch_size"] = args.batch_size
    if args.num_workers is not None:
        data_cfg["num_workers"] = args.num_workers
        data_cfg["persistent_workers"] = False
    try:
        # a run directory is data from someone: build only linvit's own classes from it (unless --trusted)
        datamodule = build_from_config(
            data_cfg, config_path, trusted=args.trusted, prefix="data", allowed=TRUSTED_DATAMODULES
        )
        saved = load_checkpoint(checkpoint, trusted=args.trusted, opt_in="--trusted")
        weights = saved.get("state_dict") or {}
        check_finite_weights(weights, str(checkpoint), allow=args.allow_non_finite, opt_out="--allow-non-finite")
        # the weights come from the checkpoint: never fetch pretrained ones first
        model = module_from_checkpoint(
            saved,
            (config.get("model") or {}).get("_target_"),
            checkpoint,
            trusted=args.trusted,
            datamodule=datamodule,
        )
    except (UntrustedConfigError, CheckpointError) as error:
        sys.stderr.write(f"linvit eval: {error}\n")
        return 2
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    datamodule.setup("test")
    loader = datamodule.test_dataloader() if args.split == "test" else datamodule.val_dataloader()
    results = trainer.test(model, dataloaders=loader, verbose=not args.json)
    metrics = {k.replace("test", args.split, 1): float(v) for k, v in results[0].items()}
    non_finite = sorted(key for key, value in metrics.items() if not math.isfinite(value))
    if non_finite:
        sys.stderr.write(
            f"linvit eval: the model computed NaN/Inf on the {args.split} split of {checkpoint} "
            f"({', '.join(f'{key}={metrics[key]}' for key in non_finite)}): its weights or the data hold values it "
            "cannot compute with; no metrics reported.\n"
        )
        return 1
    if args.json:
        stream = getattr(args, "data_stream", sys.stdout)  # the real stdout (linvit.cli sends the rest to stderr)
        stream.write(json.dumps({"checkpoint": str(checkpoint), **metrics}, indent=2) + "\n")
        stream.flush()
    else:
        for key in sorted(metrics):
            if key.endswith(("acc1", "acc5", "mIoU")):
                sys.stdout.write(f"{key}: {100 * metrics[key]:.2f}%\n")
    return 0
