"""``linvit viz``: attention distributions (focused / ReLU / ELU+1 linear vs softmax) and attention rank plots."""

from __future__ import annotations

import argparse

HELP = "Visualise attention: kernels side by side for one query point (attention), or rank with/without DWC (rank)."


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", metavar="IMAGE", help="an image file, or skimage:<name> (e.g. skimage:chelsea)")
    parser.add_argument(
        "--model", default="linvit_nano", help="timm backbone giving the features (default linvit_nano)"
    )
    parser.add_argument("--checkpoint", default=None, help="backbone weights; default random init (said on the plot)")
    parser.add_argument("--level", type=int, default=0, help="feature level (0 = the highest resolution)")
    parser.add_argument("--size", default=None, help="resize the image to HxW first (default native size)")
    parser.add_argument("--focusing-factor", type=float, default=3.0, help="p of the focused kernel (default 3)")
    parser.add_argument("--output", "-o", required=True, help="PNG to write")
    parser.add_argument(
        "--force", action="store_true", help="replace --output when it exists and linvit did not write it"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="viz_kind", metavar="KIND", required=True)
    attention = kinds.add_parser("attention", help="attention of one query point under each kernel, one PNG")
    _common(attention)
    attention.add_argument("--query", default="0.5,0.5", help="query point y,x as fractions of the image or pixels")
    rank = kinds.add_parser("rank", help="rank of the N×N attention matrix with and without DWC, for several N")
    _common(rank)
    rank.add_argument("--grids", default="4,6,8,12,16,24", help="token grid sides s (N = s²), comma-separated")
    rank.add_argument("--head-dim", type=int, default=16, help="head dimension d (default 16)")
    rank.add_argument("--dwc-kernel-size", type=int, default=5, help="DWC kernel size (default 5, as FLatten)")


def run(args: argparse.Namespace) -> int:
    import sys

    from linvit.dense.backbone import check_model_name
    from linvit.dense.extract import load_image, parse_size
    from linvit.io.destination import DestinationError, check_destination
    from linvit.viz.plots import backbone_features, plot_attention_comparison, plot_rank_study, rank_study

    try:
        check_destination(args.output, "plot", force=args.force)  # before the model runs
    except DestinationError as error:
        print(f"linvit viz: error: {error}", file=sys.stderr)
        return 1
    try:
        check_model_name(args.model)
        image = load_image(args.image)
        size = parse_size(args.size)
        if size is not None:
            import torch.nn.functional as F
            from torch import from_numpy

            resized = F.interpolate(from_numpy(image).permute(2, 0, 1)[None].float(), size=size, mode="bilinear")
            image = resized[0].permute(1, 2, 0).clamp(0, 255).round().byte().numpy()
        features, stride = backbone_features(image, args.model, args.checkpoint, args.level)
        weights = f"weights from {args.checkpoint}" if args.checkpoint else "random-init weights (no checkpoint)"
        note = f"features: {args.model} level {args.level} (stride {stride}), {weights}"
        if args.viz_kind == "attention":
            query = [float(v) for v in args.query.split(",")]
            if len(query) != 2:
                raise ValueError(f"--query must be y,x (two numbers), got {args.query!r}.")
            spread = plot_attention_comparison(
                image, features, query, args.output, focusing_factor=args.focusing_factor, note=note, force=args.force
            )
            summary = ", ".join(f"{k} {v:.0f}" for k, v in spread.items())
            print(f"wrote {args.output} (tokens each kernel spreads over: {summary})")
        else:
            grids = [int(v) for v in args.grids.split(",")]
            study = rank_study(
                features, grids, args.head_dim, args.dwc_kernel_size, focusing_factor=args.focusing_factor
            )
            plot_rank_study(study, args.output, note=note + "; DWC kernel: PyTorch default init", force=args.force)
            ranks = "; ".join(f"{k}: {v}" for k, v in study["rank"].items())
            print(f"wrote {args.output} (N = {study['N']}; ranks {ranks})")
    except DestinationError as error:  # the PNG cannot be written: unwritable folder, disk full
        print(f"linvit viz: error: {error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"linvit viz: error: {error}", file=sys.stderr)
        return 2
    return 0
