"""``linvit check-data ROOT``: what an ImageFolder dataset holds and what training would trip over, before training."""

from __future__ import annotations

import argparse
import sys

from linvit.commands._image_limits import add_image_limit_arguments, image_limits

HELP = (
    "Check an ImageFolder dataset before training: images per class and split, unreadable files, images in two "
    "splits or classes, classes out of balance, symlinks, sizes and modes (exit status 1 on problems)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", help="dataset folder, as data.root (a folder without train/val/test is one split)")
    parser.add_argument(
        "--workers", type=int, default=None, help="threads decoding images (default: the cores available, up to 8)"
    )
    parser.add_argument(
        "--max-imbalance",
        type=float,
        default=10.0,
        metavar="R",
        help="flag a split whose largest class has more than R times the images of its smallest (default: 10)",
    )
    add_image_limit_arguments(parser, "data.max_pixels / data.max_aspect in training")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from linvit.train.data.check import check_image_folder
    from linvit.train.data.options import available_cores

    workers = args.workers if args.workers is not None else min(8, available_cores())
    if workers < 1:
        print(f"error: --workers must be at least 1, got {workers}", file=sys.stderr)
        return 2

    if not args.max_imbalance >= 1:  # NaN too
        print(f"error: --max-imbalance must be at least 1, got {args.max_imbalance}", file=sys.stderr)
        return 2

    try:
        limits = image_limits(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def progress(stream, total):
        return tqdm(stream, total=total, desc="decoding", unit="image", disable=not sys.stderr.isatty())

    try:
        report = check_image_folder(
            args.root, workers=workers, progress=progress, limits=limits, max_imbalance=args.max_imbalance
        )
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report.format())
    return 1 if report.problems() else 0
