"""Real and synthetic image sets written as ImageNet-layout folders (``root/{train,val,test}/<class>/<n>.png``).

What a new user brings to ``linvit train data=imagefolder data.root=DIR``: a few classes, tens to thousands of
images each. Every set here installs offline (``/work/shared/datasets.md``):

- ``digits``: scikit-learn's 8x8 digits, upsampled to 32 px (bicubic); 1,797 images, 10 classes;
- ``fashion_mnist``: Debian's ``dataset-fashion-mnist``, 28 px; 70k images, 10 classes;
- ``shapes``: synthetic 48-px circles, squares and triangles of random size, position and colour on noise;
- ``wallpapers``: 64-px crops of Debian's KDE wallpapers (``plasma-workspace-wallpapers``), 11 real 2560x1600 photos,
  one class each: which photo is a crop from? Train, val and test crops come from separate vertical strips of each
  photo (the left 60%, the next 20%, the last 20%), so a test crop shows a part of the scene no training crop
  overlaps. The one real-photo set of at least 64 px: the medium augmentation tier and the centre-crop evaluation.

``classes`` and ``per_class`` pick a small set out of a larger one: the first ``classes`` classes, the first
``per_class`` images of each for ``train`` (then ``val_per_class`` for ``val``, then up to ``test_per_class`` for
``test``), in the data's own order: no choice of easy images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SETS = ("digits", "fashion_mnist", "shapes", "wallpapers")
WALLPAPERS = "/usr/share/wallpapers/{}/contents/images/2560x1600.jpg"
# the photographs among the wallpapers (the others are drawings); /work/shared/datasets.md
WALLPAPER_PHOTOS = (
    "BytheWater",
    "ColdRipple",
    "ColorfulCups",
    "DarkestHour",
    "EveningGlow",
    "FallenLeaf",
    "Grey",
    "Kite",
    "OneStandsOut",
    "Path",
    "summer_1am",
)
STRIPS = (0.0, 0.6, 0.8, 1.0)  # train, val, test: left edges of the photos' strips, as a share of their width


def _arrays(name: str, seed: int, counts: tuple[int, int, int] = (0, 0, 0)) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, H, W) or (N, H, W, 3), labels int64 (N,)) of the set ``name``; ``counts``: the images per
    class of (train, val, test), for a set generated split by split (``wallpapers``)."""
    if name == "digits":
        from linvit.train.data.datasets import load_digits_arrays

        images, labels = load_digits_arrays()
        return np.stack([_resize(image, 32) for image in images]), labels
    if name == "fashion_mnist":
        from linvit.train.data.datasets import load_fashion_mnist_arrays

        train_images, train_labels = load_fashion_mnist_arrays(split="train")
        test_images, test_labels = load_fashion_mnist_arrays(split="test")
        return np.concatenate([train_images, test_images]), np.concatenate([train_labels, test_labels])
    if name == "shapes":
        return _shapes(3000, 48, seed)
    if name == "wallpapers":
        return _wallpaper_crops(counts, 64, seed)
    raise ValueError(f"unknown set {name!r}: one of {SETS}.")


def _resize(image: np.ndarray, side: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((side, side), Image.Resampling.BICUBIC))


def _shapes(count: int, side: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images of one of three shapes (label 0 circle, 1 square, 2 triangle), drawn with PIL."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    images, labels = [], rng.integers(0, 3, count)
    for label in labels:
        background = rng.integers(0, 90, (side, side, 3), dtype=np.uint8)
        canvas = Image.fromarray(background)
        draw = ImageDraw.Draw(canvas)
        radius = rng.uniform(0.18, 0.4) * side
        cx, cy = rng.uniform(radius, side - radius, 2)
        colour = tuple(int(c) for c in rng.integers(120, 256, 3))
        if label == 0:
            draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
        elif label == 1:
            draw.rectangle([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
        else:
            draw.polygon([(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], fill=colour)
        images.append(np.asarray(canvas))
    return np.stack(images), labels.astype(np.int64)


def _wallpaper_crops(counts: tuple[int, int, int], side: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Square crops of 128-384 px at random places of each photo's strip of each split, resized to ``side``; per
    class the train crops, then the val crops, then the test crops (the order :func:`write_folder` splits in)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, photo in enumerate(WALLPAPER_PHOTOS):
        path = Path(WALLPAPERS.format(photo))
        if not path.is_file():
            package = "apt-get install -y --no-install-recommends plasma-workspace-wallpapers"
            raise FileNotFoundError(f"{path}: the wallpapers set needs {package}")
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        width, height = image.size
        for split, count in enumerate(counts):
            left, right = int(STRIPS[split] * width), int(STRIPS[split + 1] * width)
            for _ in range(count):
                size = int(rng.integers(128, min(385, right - left + 1)))
                x, y = int(rng.integers(left, right - size + 1)), int(rng.integers(0, height - size + 1))
                crop = image.crop((x, y, x + size, y + size)).resize((side, side), Image.Resampling.BICUBIC)
                images.append(np.asarray(crop))
                labels.append(label)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def write_folder(
    name: str,
    root: str | Path,
    classes: int | None = None,
    per_class: int | None = None,
    val_per_class: int = 10,
    test_per_class: int = 100,
    seed: int = 0,
) -> Path:
    """Write the set ``name`` as ``root/{train,val,test}/<class>/<index>.png``; returns ``root``.

    ``per_class=None``: every image not taken by val and test trains (the whole set, split per class).
    """
    from PIL import Image

    if name == "wallpapers" and per_class is None:
        raise ValueError("the wallpapers set is generated: give per_class.")
    images, labels = _arrays(name, seed, (per_class or 0, val_per_class, test_per_class))
    root = Path(root)
    kept = sorted(set(labels.tolist()))[: classes or None]
    for label in kept:
        members = np.flatnonzero(labels == label)
        if per_class is None:
            train_count = len(members) - val_per_class - test_per_class
        else:
            train_count = min(per_class, len(members) - val_per_class - 1)
        splits = {
            "train": members[:train_count],
            "val": members[train_count : train_count + val_per_class],
            "test": members[train_count + val_per_class : train_count + val_per_class + test_per_class],
        }
        for split, indices in splits.items():
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for index in indices:
                Image.fromarray(images[index]).save(folder / f"{index}.png")
    return root


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write an image set as an ImageNet-layout folder.")
    parser.add_argument("name", choices=SETS)
    parser.add_argument("root", type=Path)
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--per-class", type=int, default=None)
    args = parser.parse_args()
    print(write_folder(args.name, args.root, args.classes, args.per_class))
