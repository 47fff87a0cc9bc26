"""``--max-pixels`` / ``--max-aspect``: the image size limits of the commands that read images (see
:mod:`linvit.io.images`, imported only when a command runs: ``linvit.io`` imports torch, ``linvit --help`` must not)."""

from __future__ import annotations

import argparse
from typing import Any


def add_image_limit_arguments(parser: argparse.ArgumentParser, counterpart: str = "") -> None:
    """``--max-pixels`` and ``--max-aspect``: the largest image decoded (checked from the header, before decoding)."""
    also = f"; as {counterpart}" if counterpart else ""
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help=f"largest image decoded, width x height (default 89,478,485: PIL's own bound){also}",
    )
    parser.add_argument(
        "--max-aspect",
        type=float,
        default=None,
        help=f"largest long side / short side of an image decoded (default 100){also}",
    )


def image_limits(args: argparse.Namespace) -> Any:
    """The :class:`~linvit.io.images.ImageLimits` of ``--max-pixels`` / ``--max-aspect`` (ValueError naming them).

    PIL's own DecompressionBombWarning is silenced for the command: these limits, checked before decoding, refuse
    every image it warns about in one line that names the option.
    """
    import warnings

    from PIL import Image

    from linvit.io.images import DEFAULT_MAX_ASPECT, DEFAULT_MAX_PIXELS, ImageLimits

    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return ImageLimits(
        max_pixels=DEFAULT_MAX_PIXELS if args.max_pixels is None else args.max_pixels,
        max_aspect=DEFAULT_MAX_ASPECT if args.max_aspect is None else args.max_aspect,
    )
