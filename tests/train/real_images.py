"""Folders of real images for training tests: photos (scikit-image) and handwritten digits (scikit-learn) in many
sizes, PIL modes and file formats, laid out as linvit's DataModules read them.

- :func:`write_image_folder`: ImageNet layout ``root/{train,val}/<class>/<file>``.
- :func:`write_segmentation_folder`: ``root/{train,val}/{images,masks}/<stem>`` with masks of class indices.
- :func:`write_cifar_archive`: torchvision's ``cifar-10-batches-py`` / ``cifar-100-python`` layout from the same
  images at 32x32 (the real archives need the internet; torchvision's checksums then need to be skipped).
"""

from __future__ import annotations

import pickle
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

# (PIL mode, file extension): every mode a user's folder may hold, in the formats that store it
MODES_AND_FORMATS = [
    ("RGB", "jpg"),
    ("L", "png"),
    ("RGBA", "png"),
    ("P", "gif"),
    ("CMYK", "jpg"),
    ("I;16", "png"),
    ("1", "bmp"),
    ("LA", "png"),
    ("RGB", "webp"),
    ("RGB", "tiff"),
]
PHOTOS = ("astronaut", "chelsea", "coffee", "camera", "rocket", "coins", "logo", "colorwheel", "page", "clock")


@cache
def photos() -> tuple[np.ndarray, ...]:
    """scikit-image's sample photos as uint8 RGB arrays (grey ones replicated, alpha dropped)."""
    import skimage.data

    images = []
    for name in PHOTOS:
        pixels = getattr(skimage.data, name)()
        if pixels.ndim == 2:
            pixels = np.repeat(pixels[..., None], 3, axis=2)
        images.append(np.ascontiguousarray(pixels[..., :3]).astype(np.uint8))
    return tuple(images)


@cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 handwritten digits as uint8 grey images (0..255) and their labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images * (255.0 / 16.0)).round().astype(np.uint8), data.target


def _crop(pixels: np.ndarray, rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """A random crop of ``pixels`` resized to ``size`` (W, H)."""
    height, width = pixels.shape[:2]
    crop_h, crop_w = rng.integers(height // 3, height + 1), rng.integers(width // 3, width + 1)
    top, left = rng.integers(0, height - crop_h + 1), rng.integers(0, width - crop_w + 1)
    image = Image.fromarray(pixels[top : top + crop_h, left : left + crop_w])
    return image.resize(size, Image.BICUBIC)


def _save(image: Image.Image, path_without_suffix: Path, mode: str, extension: str) -> Path:
    """``image`` in ``mode`` (alpha from the image's brightness for RGBA/LA, 16-bit values for I;16)."""
    path = path_without_suffix.with_suffix(f".{extension}")
    if mode == "I;16":
        grey = np.asarray(image.convert("L"), dtype=np.uint16) * 257
        Image.fromarray(grey).save(path)  # uint16: mode I;16
    elif mode in ("RGBA", "LA"):
        converted = image.convert(mode)
        converted.putalpha(image.convert("L").point(lambda value: 64 + value * 3 // 4))
        converted.save(path)
    elif mode == "P":
        image.convert("RGB").quantize(colors=64).save(path)
    else:
        image.convert(mode).save(path)
    return path


def _sample_image(index: int, rng: np.random.Generator) -> Image.Image:
    """Even indices: a photo crop of 24..120 px a side; odd ones: a digit of 8..48 px."""
    if index % 2 == 0:
        pixels = photos()[rng.integers(len(photos()))]
        return _crop(pixels, rng, (int(rng.integers(24, 121)), int(rng.integers(24, 121))))
    images, _ = digits()
    side = int(rng.choice([8, 16, 28, 48]))
    digit = images[(index * 389) % len(images)]  # a different digit for every index (no duplicate files)
    return Image.fromarray(digit, "L").resize((side, side), Image.NEAREST)


def write_image_folder(
    root: str | Path, classes: int | list[str] = 3, per_class: int = 4, splits=("train", "val"), seed: int = 0
) -> Path:
    """ImageNet layout of real images in every mode and format of :data:`MODES_AND_FORMATS`."""
    root = Path(root)
    names = [f"class_{i:02d}" for i in range(classes)] if isinstance(classes, int) else list(classes)
    rng = np.random.default_rng(seed)
    count = 0
    for split in splits:
        for name in names:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_class):
                mode, extension = MODES_AND_FORMATS[count % len(MODES_AND_FORMATS)]
                _save(_sample_image(count, rng), folder / f"{index:03d}", mode, extension)
                count += 1
    return root


def write_segmentation_folder(
    root: str | Path, num_classes: int = 3, per_split: dict[str, int] | None = None, seed: int = 0
) -> Path:
    """Photo crops of different sizes and modes with masks of brightness bands (class indices, 255 at the edges)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    image_modes = [("RGB", "jpg"), ("L", "png"), ("RGBA", "png"), ("P", "png"), ("RGB", "tiff")]
    count = 0
    for split, number in (per_split or {"train": 6, "val": 2}).items():
        (root / split / "images").mkdir(parents=True, exist_ok=True)
        (root / split / "masks").mkdir(parents=True, exist_ok=True)
        for index in range(number):
            pixels = photos()[count % len(photos())]
            image = _crop(pixels, rng, (int(rng.integers(40, 100)), int(rng.integers(40, 100))))
            grey = np.asarray(image.convert("L"), dtype=np.int64)
            mask = np.minimum(grey * num_classes // 256, num_classes - 1).astype(np.uint8)
            mask[0, :] = 255  # an ignored border row
            mode, extension = image_modes[count % len(image_modes)]
            _save(image, root / split / "images" / f"{index:03d}", mode, extension)
            mask_image = Image.fromarray(mask, "L")
            if count % 2:  # palette masks as well as grey ones
                mask_image = mask_image.convert("P")
            mask_image.save(root / split / "masks" / f"{index:03d}.png")
            count += 1
    return root


def write_cifar_archive(root: str | Path, variant: str = "cifar10", per_batch: int = 20, seed: int = 0) -> Path:
    """torchvision's CIFAR files (pickled uint8 rows) holding 32x32 photo crops and digits (not CIFAR's images)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    num_classes = 10 if variant == "cifar10" else 100

    def batch(number: int, start: int) -> dict:
        rows = [np.asarray(_sample_image(start + i, rng).convert("RGB").resize((32, 32))) for i in range(number)]
        data = np.stack(rows).transpose(0, 3, 1, 2).reshape(number, -1)
        labels = [int(v) for v in rng.integers(0, num_classes, number)]
        key = "labels" if variant == "cifar10" else "fine_labels"
        return {"data": data, key: labels}

    if variant == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        for number, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
            (folder / name).write_bytes(pickle.dumps(batch(per_batch, number * per_batch)))
        meta = {"label_names": [f"class_{i}" for i in range(10)]}
        (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "train").write_bytes(pickle.dumps(batch(5 * per_batch, 0)))
        (folder / "test").write_bytes(pickle.dumps(batch(per_batch, 5 * per_batch)))
        meta = {"fine_label_names": [f"class_{i}" for i in range(100)]}
        (folder / "meta").write_bytes(pickle.dumps(meta))
    return root
