"""``linvit export ... --format onnx --quantize int8``: the fp32 file just written, quantized beside it.

With a training run: static quantization calibrated on up to :data:`CALIBRATION_IMAGES` images of the run's validation
split (drawn with :data:`CALIBRATION_SEED`), read with the evaluation transform as the deployed model will see images:
augmented training images widen the ranges with values (random erasing's noise, strong colour changes) that
deployment never shows, which costs int8 its resolution where the real values lie. Where the run validates on its test
split (no held-out validation images), the training split instead (each image's augmentation seeded, so the file
repeats), so that the test images stay unseen. Then the fp32 and the int8 file are evaluated on the run's test split
with ONNX Runtime. With ``--model``: dynamic quantization, and the two
files compared on :data:`SAMPLE_IMAGES` seeded random images at the model's native size. Either way the numbers are
printed and written beside the int8 file (``model.int8.json``, see :func:`linvit.utils.quantize.report_path`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

CALIBRATION_IMAGES = 256
CALIBRATION_SEED = 0
CALIBRATION_BATCH = 16
SAMPLE_IMAGES = 8


def check_destinations(out: Path, force: bool) -> None:
    """Refuse, before the export's minutes, an int8 file or report that exists and that linvit did not write."""
    from linvit.io.destination import check_destination
    from linvit.utils.quantize import int8_path, report_path

    check_destination(int8_path(out), "onnx", force=force)
    check_destination(report_path(int8_path(out)), "quantization-report", force=force)


def quantize_export(args: argparse.Namespace, fp32: Path, model: Any) -> tuple[Path, Path]:
    """Quantize the exported ``fp32`` file as ``args`` asks; print and record the comparison. Returns the int8 file
    and its report."""
    from linvit.io.destination import write_text
    from linvit.utils.quantize import QUANTIZED_OP_TYPES, int8_path, report_path

    int8 = int8_path(fp32)
    report: dict[str, Any] = {"fp32": fp32.name, "int8": int8.name, "quantized_op_types": list(QUANTIZED_OP_TYPES)}
    if args.run is not None:
        report.update(_static_from_run(args, fp32, int8))
    else:
        report.update(_dynamic_with_samples(args, fp32, int8, model))
    import onnxruntime

    report["onnxruntime"] = onnxruntime.__version__
    path = write_text(report_path(int8), json.dumps(report, indent=2) + "\n", "quantization-report", force=args.force)
    return int8, path


def _static_from_run(args: argparse.Namespace, fp32: Path, int8: Path) -> dict[str, Any]:
    from linvit.utils.quantize import compare_onnx, quantize_static_int8

    datamodule = _run_datamodule(args)
    split = "validation" if datamodule.val_set is not datamodule.test_set else "training"
    calibration = _calibration_batches(datamodule.val_set if split == "validation" else datamodule.train_set)
    quantize_static_int8(fp32, int8, calibration, force=args.force)
    loader = datamodule.test_dataloader()
    comparison = compare_onnx(fp32, int8, ((images.numpy(), labels.numpy()) for images, labels in loader))
    sys.stdout.write(
        f"quantized to int8 (static, QDQ, per-channel weights; calibrated on {sum(len(b) for b in calibration)} "
        f"{split} images): {int8}\n"
        f"  test split ({comparison['images']} images, ONNX Runtime): top-1 fp32 {100 * comparison['fp32_top1']:.2f}%"
        f", int8 {100 * comparison['int8_top1']:.2f}% ({comparison['top1_change_points']:+.2f} points); predictions "
        f"agree on {100 * comparison['top1_agreement']:.2f}%\n"
    )
    return {
        "method": "static",
        "format": "QDQ",
        "per_channel": True,
        "calibration": {
            "split": "val" if split == "validation" else "train",
            "images": sum(len(b) for b in calibration),
            "seed": CALIBRATION_SEED,
            "ranges": "99.999th percentile of each activation's magnitudes",
        },
        "comparison": {"split": "test", **comparison},
    }


def _dynamic_with_samples(args: argparse.Namespace, fp32: Path, int8: Path, model: Any) -> dict[str, Any]:
    from linvit.utils.deploy import input_channels, native_size
    from linvit.utils.quantize import compare_onnx, quantize_dynamic_int8

    quantize_dynamic_int8(fp32, int8, force=args.force)
    height, width = native_size(model)
    generator = np.random.default_rng(CALIBRATION_SEED)
    samples = generator.standard_normal((SAMPLE_IMAGES, input_channels(model), height, width), dtype=np.float32)
    comparison = compare_onnx(fp32, int8, [samples[i : i + 1] for i in range(SAMPLE_IMAGES)])
    sys.stdout.write(
        f"quantized to int8 (dynamic: no run, so no calibration images; give a run directory for static): {int8}\n"
        f"  on {SAMPLE_IMAGES} random images at {height}x{width}: top-1 agreement with fp32 "
        f"{100 * comparison['top1_agreement']:.1f}%, largest logit difference "
        f"{100 * comparison['max_relative_logit_difference']:.1f}% of the largest logit\n"
    )
    return {
        "method": "dynamic",
        "per_channel": True,
        "comparison": {
            "split": f"{SAMPLE_IMAGES} random images (standard normal, seed {CALIBRATION_SEED})",
            **comparison,
        },
    }


def _run_datamodule(args: argparse.Namespace) -> Any:
    """The run's DataModule, rebuilt from its ``config.yaml`` as ``linvit eval`` does (linvit's classes only unless
    ``--trusted``), set up, loading in this process."""
    from linvit.train.runs.export import find_checkpoint
    from linvit.train.runs.saved_run import build_from_config, load_run_config
    from linvit.utils.saved_config import TRUSTED_DATAMODULES

    checkpoint = find_checkpoint(args.run, args.checkpoint or "best")
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: static quantization draws its calibration images from it")
    config = load_run_config(config_path, trusted=args.trusted)
    data = dict(config.get("data") or {})
    data.update(num_workers=0, persistent_workers=False)
    datamodule = build_from_config(data, config_path, trusted=args.trusted, prefix="data", allowed=TRUSTED_DATAMODULES)
    datamodule.setup("fit")
    return datamodule


def _calibration_batches(dataset: Any) -> list[np.ndarray]:
    """Up to :data:`CALIBRATION_IMAGES` images of ``dataset`` drawn with :data:`CALIBRATION_SEED`, each read with its
    random state seeded (a training split's augmentation repeats), in batches of :data:`CALIBRATION_BATCH`."""
    import torch

    from linvit.train.data.datasets import seeded_random_state

    count = min(CALIBRATION_IMAGES, len(dataset))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(CALIBRATION_SEED))[:count]
    images = []
    for index in order.tolist():
        with seeded_random_state(CALIBRATION_SEED * 1_000_003 + index):
            images.append(dataset[index][0].numpy())
    return [np.stack(images[i : i + CALIBRATION_BATCH]) for i in range(0, count, CALIBRATION_BATCH)]
