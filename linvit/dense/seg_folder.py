"""Semantic segmentation data without Lightning: a folder of image/mask pairs and the paired transforms.

Layout (same stems; masks are single-channel PNGs of class indices, 255 = ignore)::

    root/train/images/<stem>.{png,jpg,...}    root/train/masks/<stem>.png
    root/val/images/...                       root/val/masks/...
    root/test/images/...                      root/test/masks/...     (optional; default: val)

:class:`linvit.train.data.segmentation.SegmentationDataModule` serves these as Lightning loaders; any training loop
can use :class:`SegmentationFolder` directly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from linvit.io.images import ImageLimits, decode_image

__all__ = ["IGNORE_INDEX", "IMAGE_EXTENSIONS", "IMAGENET_MEAN", "IMAGENET_STD", "PairedTransform", "SegmentationFolder"]

IGNORE_INDEX = 255
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _find_pairs(image_dir: Path, mask_dir: Path) -> list[tuple[Path, Path]]:
    if not image_dir.is_dir() or not mask_dir.is_dir():
        raise FileNotFoundError(
            f"Expected a folder of images at '{image_dir}' and of masks at '{mask_dir}' (same stems, masks as PNG "
            "class indices). Generate a small example with linvit.dense.synthetic.generate_synthetic_segmentation."
        )
    masks = {p.stem: p for p in mask_dir.iterdir() if p.suffix.lower() == ".png"}
    images = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
    pairs = [(p, masks[p.stem]) for p in images if p.stem in masks]
    missing = [p.name for p in images if p.stem not in masks]
    if missing:
        raise ValueError(f"{len(missing)} image(s) in '{image_dir}' have no mask in '{mask_dir}', e.g. {missing[:3]}.")
    if not pairs:
        raise ValueError(f"No image/mask pairs found in '{image_dir}' and '{mask_dir}'.")
    return pairs


class PairedTransform:
    """Applies the same geometry to an image (float (3, H, W) in [0, 1]) and its mask (int64 (H, W)).

    Training: random scale in ``scale_range``, random crop to ``crop_size`` (padding with 0 / ignore), horizontal
    flip. Evaluation (``train=False``): resize to ``crop_size`` when given (bilinear image, nearest mask), otherwise
    keep the native size. Then normalisation by ``mean``/``std``.
    """

    def __init__(
        self,
        crop_size: Sequence[int] | None,
        train: bool,
        scale_range: tuple[float, float] = (0.5, 2.0),
        hflip: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        self.crop_size = tuple(crop_size) if crop_size is not None else None
        self.train = train
        self.scale_range = scale_range
        self.hflip = hflip
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    @staticmethod
    def _resize(image: Tensor, mask: Tensor, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        image = F.interpolate(image[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
        mask = F.interpolate(mask[None, None].float(), size=size, mode="nearest")[0, 0].long()
        return image, mask

    def __call__(self, image: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        if self.train and self.crop_size is not None:
            scale = random.uniform(*self.scale_range)
            height, width = image.shape[-2:]
            image, mask = self._resize(image, mask, (max(1, round(height * scale)), max(1, round(width * scale))))
            crop_h, crop_w = self.crop_size
            pad_h, pad_w = max(0, crop_h - image.shape[-2]), max(0, crop_w - image.shape[-1])
            if pad_h or pad_w:
                image = F.pad(image, (0, pad_w, 0, pad_h), value=0.0)
                mask = F.pad(mask, (0, pad_w, 0, pad_h), value=IGNORE_INDEX)
            top = random.randint(0, image.shape[-2] - crop_h)
            left = random.randint(0, image.shape[-1] - crop_w)
            image = image[:, top : top + crop_h, left : left + crop_w]
            mask = mask[top : top + crop_h, left : left + crop_w]
            if self.hflip and random.random() < 0.5:
                image, mask = image.flip(-1), mask.flip(-1)
        elif self.crop_size is not None and tuple(image.shape[-2:]) != self.crop_size:
            image, mask = self._resize(image, mask, self.crop_size)
        image = (image - self.mean) / self.std
        return image.contiguous(), mask.contiguous()


class SegmentationFolder(Dataset):
    """Image/mask pairs from ``image_dir`` and ``mask_dir``; items are (image (3, H, W) float, mask (H, W) int64)."""

    def __init__(
        self,
        image_dir: str | os.PathLike,
        mask_dir: str | os.PathLike,
        transform: PairedTransform | None = None,
        num_classes: int | None = None,
        limits: ImageLimits | None = None,
    ) -> None:
        self.pairs = _find_pairs(Path(image_dir), Path(mask_dir))
        self.transform = transform
        self.num_classes = num_classes
        # the largest image or mask decoded (checked from the header); named as the DataModule's options
        self.limits = limits or ImageLimits(pixels_option="data.max_pixels", aspect_option="data.max_aspect")

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image_path, mask_path = self.pairs[index]
        # linvit's image loader: regular files only (a FIFO is never opened), sizes bounded before decoding, one line
        # naming the file for anything wrong (linvit.io.images)
        image = np.asarray(decode_image(image_path, self.limits, convert=lambda opened: opened.convert("RGB")))
        mask_image = decode_image(mask_path, self.limits)
        if mask_image.mode not in ("L", "P", "I", "I;16"):
            raise ValueError(f"Mask '{mask_path}' has mode {mask_image.mode}; expected one channel of class indices.")
        mask = np.asarray(mask_image).astype(np.int64)
        if mask.shape != image.shape[:2]:
            raise ValueError(f"Mask '{mask_path}' is {mask.shape}, its image is {image.shape[:2]}: sizes must match.")
        if self.num_classes is not None:
            bad = (mask >= self.num_classes) & (mask != IGNORE_INDEX)
            if bad.any():
                raise ValueError(
                    f"Mask '{mask_path}' holds class {int(mask[bad].max())} but num_classes={self.num_classes} "
                    f"(ignore index {IGNORE_INDEX})."
                )
        image_tensor = torch.from_numpy(image.copy()).permute(2, 0, 1).float() / 255.0
        mask_tensor = torch.from_numpy(mask)
        if self.transform is not None:
            image_tensor, mask_tensor = self.transform(image_tensor, mask_tensor)
        return image_tensor, mask_tensor
