"""Datasets that install without the internet, and the samplers and transforms the DataModules share.

- :func:`load_digits_arrays`: scikit-learn's 8x8 digits (inside the scikit-learn wheel).
- :func:`load_fashion_mnist_arrays`: Fashion-MNIST from Debian's ``dataset-fashion-mnist`` IDX files.
- :class:`ArrayImageDataset`: uint8 (N, H, W) grey images resized on the fly to the model's input.
- :class:`EpochSeededSampler`: a shuffling sampler whose order depends only on (seed, epoch), and that can skip
  the samples a resumed run already trained on, so that a resumed run sees the same batches as an uninterrupted one;
  it hands out (index, seed) keys.
- :class:`DataUnavailableError`: a data set that is not where the config says (or cannot be downloaded); the
  training entry prints its message as one line.
- :func:`held_out_per_class`: a seeded, stratified hold-out that also works for classes of one or two images.
- :class:`SeededSamples`: serves those keys, each sample with its random state seeded from its key, so that the
  augmentation of a sample does not depend on what the process (or a data worker) drew before it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "t-shirt/top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)
_FASHION_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


class DataUnavailableError(FileNotFoundError):
    """The data is not there (or cannot be fetched); the message says where it was looked for and how to get it."""


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 images (1797, 8, 8) in [0, 255] and int64 labels (1797,)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    # The raw values are counts 0..16 of set pixels in 4x4 blocks of the original 32x32 bitmaps.
    images = np.round(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def _read_idx(path: Path, offset: int) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset).copy()  # writable, owns its memory


def _find_idx_file(root: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        for folder in (root, root / "FashionMNIST" / "raw"):
            if (folder / name).is_file():
                return folder / name
    return None


def load_fashion_mnist_arrays(root: str | os.PathLike = FASHION_MNIST_DIR, split: str = "train"):
    """Fashion-MNIST ``split`` ("train": 60k, "test": 10k) as uint8 (N, 28, 28) images and int64 labels.

    Reads the IDX files (gzip or not) in ``root`` or ``root/FashionMNIST/raw``; Debian's recompressed gzip files
    are read directly, with no checksum.
    """
    if split not in _FASHION_FILES:
        raise ValueError(f"Fashion-MNIST split must be one of {sorted(_FASHION_FILES)}, got {split!r}.")
    root = Path(root)
    image_stem, label_stem = _FASHION_FILES[split]
    image_file, label_file = _find_idx_file(root, image_stem), _find_idx_file(root, label_stem)
    if image_file is None or label_file is None:
        raise DataUnavailableError(
            f"Fashion-MNIST not found in {root}: install it with "
            "`apt-get install -y --no-install-recommends dataset-fashion-mnist` or set data.root to its folder."
        )
    images = _read_idx(image_file, offset=16).reshape(-1, 28, 28)
    labels = _read_idx(label_file, offset=8).astype(np.int64)
    if len(images) != len(labels):
        raise ValueError(f"Fashion-MNIST {split}: {len(images)} images but {len(labels)} labels in {root}.")
    return images, labels


class ArrayImageDataset(Dataset):
    """Grey uint8 images (N, H, W) served as normalised float tensors (in_chans, img_size, img_size).

    The image is resized (bilinear, antialiased) to ``img_size``, optionally augmented with a small random
    affine transform (``augment``) and horizontal flips with probability ``hflip`` (right for garments, wrong for
    digits),
    replicated to ``in_chans`` channels and normalised with ``mean``/``std`` (one value per channel, or one for all).
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        img_size: int,
        in_chans: int = 3,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        augment: bool = False,
        hflip: float = 0.0,
    ):
        if images.ndim != 3 or images.dtype != np.uint8:
            raise ValueError(f"expected uint8 images of shape (N, H, W), got {images.dtype} {images.shape}.")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels.")
        self.images = torch.from_numpy(np.ascontiguousarray(images))
        self.labels = torch.from_numpy(np.ascontiguousarray(labels)).long()
        self.img_size = int(img_size)
        self.in_chans = int(in_chans)
        self.mean = torch.tensor(_per_channel(mean, in_chans, "mean")).view(-1, 1, 1)
        self.std = torch.tensor(_per_channel(std, in_chans, "std")).view(-1, 1, 1)
        self.augment = augment
        self.hflip = float(hflip)
        self._affine = None
        if augment:
            from torchvision.transforms import v2

            self._affine = v2.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].float().div_(255.0)[None, None]
        image = F.interpolate(image, size=(self.img_size, self.img_size), mode="bilinear", antialias=True)[0]
        if self._affine is not None:
            image = self._affine(image)
        if self.hflip > 0 and torch.rand(()) < self.hflip:
            image = image.flip(-1)
        image = image.expand(self.in_chans, -1, -1)
        return (image - self.mean) / self.std, self.labels[index]


def _per_channel(values: Sequence[float], in_chans: int, name: str) -> list[float]:
    values = [float(v) for v in values]
    if len(values) == 1:
        return values * in_chans
    if len(values) != in_chans:
        raise ValueError(f"{name} has {len(values)} values but in_chans={in_chans}: give one value or {in_chans}.")
    return values


class EpochSeededSampler(Sampler[tuple[int, int]]):
    """Random permutation of ``range(num_samples)`` drawn from ``(seed, epoch)`` only, as (index, sample seed) keys.

    Lightning calls :meth:`set_epoch` at the start of every epoch (as for ``DistributedSampler``), so the order of
    an epoch does not depend on what the process did before it. Each index comes with a seed drawn from
    ``(seed, epoch, index)`` for :class:`SeededSamples`. A run resumed in the middle of an epoch starts the sampler
    at that epoch with the samples already trained on skipped (``resume_epoch``, ``resume_skip``): it then hands out
    exactly the keys that the uninterrupted run had left.
    """

    def __init__(
        self, num_samples: int, seed: int = 0, shuffle: bool = True, resume_epoch: int = 0, resume_skip: int = 0
    ):
        self.num_samples = int(num_samples)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = int(resume_epoch)
        self._skip_epoch = int(resume_epoch)
        self._skip = int(resume_skip)  # used once, by the first pass over `resume_epoch`

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[tuple[int, int]]:
        skip = self._skip if self.epoch == self._skip_epoch else 0
        self._skip = 0
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        epoch_seed = (self.seed * 1_000_003 + self.epoch * 7_919) % (2**31)
        return iter([(index, (epoch_seed + index * 104_729) % (2**31)) for index in order[skip:]])


@contextlib.contextmanager
def seeded_random_state(seed: int) -> Iterator[None]:
    """torch (CPU), numpy and random seeded with ``seed`` inside the block, and their states restored after it."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


class SeededSamples(Dataset):
    """A dataset served by (index, seed) keys (from :class:`EpochSeededSampler`): ``dataset[index]`` with torch,
    numpy and random seeded from ``seed`` and restored afterwards.

    A sample's augmentation is then a function of its key alone: the same in a data worker or in the main process,
    after a resume as in the uninterrupted run, and without disturbing the random state of the training step.
    Plain integer indices are served unseeded. Other attributes are the wrapped dataset's.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key):
        if isinstance(key, tuple):
            index, seed = key
            with seeded_random_state(seed):
                return self.dataset[index]
        return self.dataset[key]

    def __getattr__(self, name: str):
        # "dataset" is not set yet while unpickling (no recursion); dunder names such as a Subset's __getitems__ would
        # serve the keys unseeded (the DataLoader asks for them with hasattr)
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (rest, held_out) with ``fraction`` of every class held out, reproducible from ``seed``."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}.")
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(labels))
    rest, held_out = train_test_split(indices, test_size=fraction, stratify=labels, random_state=seed)
    return np.sort(rest), np.sort(held_out)


def held_out_per_class(labels: Sequence[int], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (rest, held_out): ``round(fraction * n)`` of each class's ``n`` samples, drawn with ``seed``.

    A class with a single sample keeps it in ``rest``; otherwise at least one and at most ``n - 1`` are held out,
    so every class is in both parts. The same labels, fraction and seed give the same indices.
    """
    labels = np.asarray(labels)
    generator = np.random.default_rng(seed)
    held_out = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        if len(members) < 2:
            continue
        count = min(len(members) - 1, max(1, round(fraction * len(members))))
        held_out.append(generator.permutation(members)[:count])
    held = np.sort(np.concatenate(held_out)) if held_out else np.zeros(0, dtype=np.int64)
    rest = np.setdiff1d(np.arange(len(labels)), held)
    return rest, held
