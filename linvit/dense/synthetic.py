"""A small generated semantic segmentation task: coloured shapes on textured backgrounds.

Classes: 0 background, 1 disc, 2 square, 3 triangle (``num_classes`` ≤ 4 uses the first ones). Each shape class
has its own hue (jittered) and texture; the background is smooth coloured noise. A one-pixel band around every
shape is marked 255 (ignored), as in real datasets whose boundaries are uncertain. Written as PNGs in the folder
layout :class:`linvit.dense.seg_folder.SegmentationFolder` reads: ``root/{train,val,test}/{images,masks}/<stem>.png``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from linvit.dense.seg_folder import IGNORE_INDEX

__all__ = ["SYNTHETIC_CLASS_NAMES", "generate_synthetic_segmentation", "render_synthetic_sample"]

SYNTHETIC_CLASS_NAMES = ("background", "disc", "square", "triangle")
_HUES = {1: (0.9, 0.25, 0.2), 2: (0.2, 0.75, 0.3), 3: (0.25, 0.35, 0.95)}


def _smooth_noise(rng: np.random.Generator, height: int, width: int, cell: int) -> np.ndarray:
    coarse = rng.random((height // cell + 2, width // cell + 2))
    rows = np.linspace(0, coarse.shape[0] - 1.001, height)
    cols = np.linspace(0, coarse.shape[1] - 1.001, width)
    r0, c0 = rows.astype(int), cols.astype(int)
    fr, fc = (rows - r0)[:, None], (cols - c0)[None, :]
    top = coarse[r0][:, c0] * (1 - fc) + coarse[r0][:, c0 + 1] * fc
    bottom = coarse[r0 + 1][:, c0] * (1 - fc) + coarse[r0 + 1][:, c0 + 1] * fc
    return top * (1 - fr) + bottom * fr


def _shape_mask(kind: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    size = rng.uniform(0.12, 0.25) * min(height, width)
    cy, cx = rng.uniform(size, height - size), rng.uniform(size, width - size)
    if kind == 1:
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= size**2
    if kind == 2:
        return (np.abs(yy - cy) <= size) & (np.abs(xx - cx) <= size)
    # upward triangle: inside the band below the apex and between the two edges
    top, bottom = cy - size, cy + size
    half_width = (yy - top) / (2 * size) * size
    return (yy >= top) & (yy <= bottom) & (np.abs(xx - cx) <= half_width)


def render_synthetic_sample(
    rng: np.random.Generator, size: tuple[int, int] = (96, 128), num_classes: int = 4, max_shapes: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """One (image uint8 HxWx3, mask uint8 HxW) pair; later shapes occlude earlier ones."""
    if not 2 <= num_classes <= 4:
        raise ValueError(f"The synthetic task has 2 to 4 classes (background + up to 3 shapes); got {num_classes}.")
    height, width = size
    background = np.stack([_smooth_noise(rng, height, width, 16) for _ in range(3)], axis=-1)
    image = 0.25 + 0.35 * background
    mask = np.zeros((height, width), dtype=np.uint8)
    for _ in range(rng.integers(1, max_shapes + 1)):
        kind = int(rng.integers(1, num_classes))
        inside = _shape_mask(kind, height, width, rng)
        texture = _smooth_noise(rng, height, width, 4)[..., None]
        colour = np.clip(np.array(_HUES[kind]) + rng.normal(0, 0.07, 3), 0, 1)
        image = np.where(inside[..., None], colour * (0.75 + 0.25 * texture), image)
        mask[inside] = kind
    # one-pixel ignore band on every class boundary
    edges = np.zeros_like(mask, dtype=bool)
    edges[:-1] |= mask[:-1] != mask[1:]
    edges[:, :-1] |= mask[:, :-1] != mask[:, 1:]
    mask[edges] = IGNORE_INDEX
    image = np.clip(image + rng.normal(0, 0.02, image.shape), 0, 1)
    return (image * 255).round().astype(np.uint8), mask


def generate_synthetic_segmentation(
    root: str | os.PathLike,
    num_train: int = 64,
    num_val: int = 16,
    num_test: int = 0,
    size: tuple[int, int] = (96, 128),
    num_classes: int = 4,
    seed: int = 0,
) -> Path:
    """Write ``num_train`` / ``num_val`` / ``num_test`` pairs under ``root/{train,val,test}/{images,masks}``.

    Returns ``root``; a split with no images is not created.

    Deterministic for a given ``seed``. Existing files are overwritten.
    """
    from PIL import Image

    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, count in (("train", num_train), ("val", num_val), ("test", num_test)):
        if count == 0:
            continue
        (root / split / "images").mkdir(parents=True, exist_ok=True)
        (root / split / "masks").mkdir(parents=True, exist_ok=True)
        for index in range(count):
            image, mask = render_synthetic_sample(rng, tuple(size), num_classes)
            stem = f"{split}_{index:05d}"
            Image.fromarray(image).save(root / split / "images" / f"{stem}.png")
            Image.fromarray(mask).save(root / split / "masks" / f"{stem}.png")
    return root
