"""``data.img_size=auto``: an input size that fits the images, and the model's stride to round it to.

A default of 224 px made 28-px digits 64 times bigger (5.4 min per epoch on 2 cores instead of seconds). ``auto``
reads the sizes of up to 256 training images (headers only, a seeded sample), takes the median shorter side, and
rounds it to a multiple of the model's output stride (at least one stride, at most 224: larger inputs are a choice
worth making explicitly, ``data.img_size=N``).
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

from linvit.io.images import ImageInputError, ImageLimits, open_image

_log = logging.getLogger(__name__)

DEFAULT_MULTIPLE = 32
MAX_AUTO_SIZE = 224
SAMPLE_SIZE = 256


def auto_img_size(
    folder: str | os.PathLike, multiple: int = DEFAULT_MULTIPLE, seed: int = 0, limits: ImageLimits | None = None
) -> tuple[int, int]:
    """(input size, median shorter side) for the images under ``folder`` (any depth), from a seeded sample.

    Files are opened by :func:`linvit.io.images.open_image` (FIFOs never opened; sizes beyond ``limits`` left out).
    """
    from linvit.train.data.image_folder import ReadableByPil

    readable = ReadableByPil()
    paths = sorted(_image_paths(Path(folder), readable))
    if not paths:
        raise ValueError(f"data.img_size=auto: no image files under {folder}; set data.img_size=N.")
    sample = random.Random(seed).sample(paths, min(SAMPLE_SIZE, len(paths)))
    sides = []
    for path in sample:
        try:
            with open_image(path, limits) as image:  # reads the header, not the pixels
                sides.append(min(image.size))
        except ImageInputError:
            continue  # unreadable files are training's concern (data.bad_files)
    if not sides:
        raise ValueError(f"data.img_size=auto: none of {len(sample)} sampled files under {folder} could be read.")
    median = sorted(sides)[len(sides) // 2]
    return round_to_multiple(median, multiple), median


def _image_paths(folder: Path, readable: Any) -> list[str]:
    """Files under ``folder`` with an image extension, by name only (no stat per file: ImageNet has 1.28M)."""
    found = []
    for directory, _, names in os.walk(folder):  # links to folders are not followed: no loops
        found.extend(os.path.join(directory, name) for name in names if readable(name))
    return found


def round_to_multiple(side: int, multiple: int) -> int:
    """``side`` rounded to the nearest multiple of ``multiple``, at least one multiple, at most MAX_AUTO_SIZE."""
    multiple = max(1, int(multiple))
    rounded = max(multiple, multiple * round(side / multiple))
    if rounded > MAX_AUTO_SIZE:
        rounded = max(multiple, multiple * (MAX_AUTO_SIZE // multiple))
    return rounded


def model_stride(model_name: str, model_kwargs: dict[str, Any] | None = None) -> int:
    """The output stride of a timm model (its last feature's reduction), built on the meta device; 32 if unknown."""
    import timm
    import torch

    import linvit  # noqa: F401  (registers linvit's models)

    kwargs = {k: v for k, v in dict(model_kwargs or {}).items() if k != "img_size"}
    try:
        with torch.device("meta"):
            model = timm.create_model(model_name, pretrained=False, **kwargs)
        return int(model.feature_info[-1]["reduction"])
    except Exception as error:  # noqa: BLE001 - a model without feature_info (or not buildable here): the default
        _log.info("stride of %s unknown (%s): rounding data.img_size=auto to %d", model_name, error, DEFAULT_MULTIPLE)
        return DEFAULT_MULTIPLE
