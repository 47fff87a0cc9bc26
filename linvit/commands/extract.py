"""``linvit extract``: multi-scale features of images at native (or a given) resolution → safetensors + PCA PNGs."""

from __future__ import annotations

import argparse

from linvit.commands._image_limits import add_image_limit_arguments, image_limits

HELP = "Extract multi-scale backbone features of images (any size) to safetensors, with PCA-colour PNGs."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "images", nargs="+", metavar="IMAGE", help="image files, or skimage:<name> (e.g. skimage:astronaut)"
    )
    parser.add_argument("--model", required=True, help="timm model name, e.g. linvit_tiny, linvit_nano, resnet50")
    parser.add_argument(
        "--checkpoint", default=None, help="local weights (.pth/.ckpt/.safetensors); default random init"
    )
    parser.add_argument("--size", default=None, help="resize every image to HxW (e.g. 1024x1024); default native size")
    parser.add_argument("--output", "-o", default="features", help="output folder (default: ./features)")
    parser.add_argument("--name", default="features.safetensors", help="file name of the features in the output folder")
    parser.add_argument(
        "--out-indices", default=None, help="comma-separated feature levels, e.g. 0,1,2,3 (default all)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="images per batch among images of equal size")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32", help="compute precision")
    parser.add_argument("--save-dtype", choices=("fp32", "fp16", "bf16"), default="fp32", help="dtype of saved maps")
    parser.add_argument("--pad-to-stride", action="store_true", help="pad inputs to a multiple of the largest stride")
    parser.add_argument("--no-png", action="store_true", help="do not write the PCA PNGs")
    parser.add_argument(
        "--force", action="store_true", help="replace output files that exist and that linvit did not write"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_image_limit_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    import torch
    from tqdm import tqdm

    from linvit.dense.backbone import check_model_name, create_feature_backbone
    from linvit.dense.extract import (
        extract_features,
        image_to_tensor,
        load_image,
        parse_size,
        save_features,
        unique_stems,
    )
    from linvit.io.destination import DestinationError, check_destination
    from linvit.viz.pca import plot_feature_pca

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    try:
        check_destination(Path(args.output) / args.name, "features", force=args.force)  # before the model runs
    except DestinationError as error:
        print(f"linvit extract: error: {error}", file=sys.stderr)
        return 1
    try:
        size = parse_size(args.size)
        check_model_name(args.model)
        out_indices = [int(i) for i in args.out_indices.split(",")] if args.out_indices else None
        limits = image_limits(args)
        images = [load_image(source, limits) for source in args.images]
        backbone = create_feature_backbone(
            args.model, checkpoint=args.checkpoint, out_indices=out_indices, pad_to_stride=args.pad_to_stride
        )
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"linvit extract: error: {error}", file=sys.stderr)
        return 2

    import timm

    config = timm.data.resolve_data_config({}, model=backbone.model)
    inputs = [image_to_tensor(image, config["mean"], config["std"], size) for image in images]
    stems = unique_stems(args.images)
    show_progress = not args.no_progress
    features = extract_features(
        backbone,
        inputs,
        batch_size=args.batch_size,
        device=args.device,
        dtype=dtypes[args.precision],
        progress=(lambda it: tqdm(it, desc="extract", unit="batch")) if show_progress else None,
    )
    output = Path(args.output)
    metadata = {
        "model": args.model,
        "checkpoint": str(args.checkpoint) if args.checkpoint else "none (random init)",
        "strides": backbone.strides,
        "channels": backbone.channels,
        "mean": list(config["mean"]),
        "std": list(config["std"]),
        "images": {
            stem: {"source": source, "original_size": list(image.shape[:2]), "input_size": list(tensor.shape[-2:])}
            for stem, source, image, tensor in zip(stems, args.images, images, inputs)
        },
    }
    try:
        path = save_features(
            output / args.name, dict(zip(stems, features)), metadata, dtype=dtypes[args.save_dtype], force=args.force
        )
    except DestinationError as error:
        print(f"linvit extract: error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({len(stems)} image(s), {len(backbone.strides)} levels, strides {backbone.strides})")
    if not args.no_png:
        weights = "checkpoint weights" if args.checkpoint else "random-init weights"
        pairs = zip(stems, images, inputs, features)
        for stem, image, tensor, levels in tqdm(pairs, total=len(stems), desc="pca png", disable=not show_progress):
            shown = image
            if size is not None:
                shown = (tensor.permute(1, 2, 0) * torch.tensor(config["std"]) + torch.tensor(config["mean"])).clamp(
                    0, 1
                )
                shown = (shown.numpy() * 255).round().astype("uint8")
            try:
                png = plot_feature_pca(
                    shown,
                    levels,
                    backbone.strides,
                    output / f"{stem}_pca.png",
                    title=f"{args.model} ({weights}): PCA of features",
                    force=args.force,
                )
            except DestinationError as error:
                print(f"linvit extract: error: {error}", file=sys.stderr)
                return 1
            print(f"wrote {png}")
    return 0
