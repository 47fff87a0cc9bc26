"""Lightning DataModules for image classification.

Every DataModule exposes ``num_classes``, ``in_chans``, ``img_size`` (what the model is built for),
``class_names`` and :meth:`~ClassificationDataModule.data_config` (the timm ``pretrained_cfg`` fields that
describe its preprocessing, written next to exported weights).

- :class:`DigitsDataModule` (the default): scikit-learn's digits, stratified train/val/test split.
- :class:`FashionMNISTDataModule`: Debian's ``dataset-fashion-mnist`` (60k train, of which ``val_size`` held out
  for validation, 10k test).
- :class:`ImageFolderDataModule` (:mod:`linvit.train.data.timm_datamodules`): ImageNet layout (``root/train/<class>/*``,
  ``root/val/<class>/*``), timm's train/eval transforms (RandAugment, random erasing), every image format PIL reads.
- :class:`CIFARDataModule` (:mod:`linvit.train.data.timm_datamodules`): torchvision's CIFAR-10/100 (``download`` is the
  user's choice, off by default).

The configs name them all here (``linvit.train.data.datamodules.<Class>``), the shared base included.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from linvit.train.data.datamodule_base import IMAGENET_MEAN, IMAGENET_STD, ClassificationDataModule
from linvit.train.data.datasets import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    ArrayImageDataset,
    load_digits_arrays,
    load_fashion_mnist_arrays,
    stratified_split,
)
from linvit.train.data.hparams import make_hparams_plain
from linvit.train.data.options import fraction, whole_number
from linvit.train.data.timm_datamodules import CIFARDataModule, ImageFolderDataModule

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CIFARDataModule",
    "ClassificationDataModule",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
]


class DigitsDataModule(ClassificationDataModule):
    """scikit-learn's 1,797 8x8 digits, resized to ``img_size``; stratified train/val/test split.

    Args:
        val_fraction, test_fraction: shares of the data held out for validation and test.
        split_seed: seed of the split (fixed, so that test numbers compare across runs).
        augment: small random affine transform on training images.
    """

    def __init__(
        self,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        augment: bool = True,
        num_classes: int = 10,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        **kwargs: Any,
    ):
        super().__init__(num_classes=num_classes, mean=mean, std=std, **kwargs)
        self.save_hyperparameters()
        make_hparams_plain(self)
        self.val_fraction = fraction(val_fraction, "data.val_fraction")
        self.test_fraction = fraction(test_fraction, "data.test_fraction")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"data.val_fraction={val_fraction!r} and data.test_fraction={test_fraction!r} hold out all the data "
                "(their sum must be below 1): lower one of them."
            )
        self.split_seed = int(split_seed)
        self.augment = bool(augment)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = load_digits_arrays()
        self._check_num_classes(int(labels.max()) + 1, "scikit-learn digits")
        rest, test = stratified_split(labels, self.test_fraction, self.split_seed)
        train, val = stratified_split(labels[rest], self.val_fraction / (1.0 - self.test_fraction), self.split_seed)
        train, val = rest[train], rest[val]
        common = {"img_size": self.img_size, "in_chans": self.in_chans, "mean": self.mean, "std": self.std}
        self.train_set = ArrayImageDataset(images[train], labels[train], augment=self.augment, **common)
        self.val_set = ArrayImageDataset(images[val], labels[val], **common)
        self.test_set = ArrayImageDataset(images[test], labels[test], **common)


class FashionMNISTDataModule(ClassificationDataModule):
    """Fashion-MNIST from the IDX files of Debian's ``dataset-fashion-mnist`` (read directly, no download).

    Args:
        root: folder holding the IDX files (``*-ubyte.gz`` or unzipped, also under ``FashionMNIST/raw``).
        val_size: training images held out (stratified) for validation; the 10k test images stay untouched.
        augment: small random affine transform on training images.
        hflip: probability of a horizontal flip of a training image.
    """

    def __init__(
        self,
        root: str | os.PathLike = FASHION_MNIST_DIR,
        val_size: int = 5000,
        split_seed: int = 0,
        augment: bool = True,
        hflip: float = 0.5,
        num_classes: int = 10,
        mean: Sequence[float] = (0.286,),
        std: Sequence[float] = (0.353,),
        **kwargs: Any,
    ):
        super().__init__(num_classes=num_classes, mean=mean, std=std, **kwargs)
        self.save_hyperparameters()
        make_hparams_plain(self)
        self.root = str(root)
        self.val_size = whole_number(val_size, "data.val_size", minimum=1)
        self.split_seed = int(split_seed)
        self.augment = bool(augment)
        self.hflip = float(hflip)
        self.class_names = list(FASHION_MNIST_CLASSES)

    def prepare_data(self) -> None:
        load_fashion_mnist_arrays(self.root, "test")  # fail early, with the one-line install hint

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = load_fashion_mnist_arrays(self.root, "train")
        test_images, test_labels = load_fashion_mnist_arrays(self.root, "test")
        self._check_num_classes(int(labels.max()) + 1, "Fashion-MNIST")
        if self.val_size >= len(labels):
            raise ValueError(
                f"data.val_size={self.val_size} holds out all {len(labels)} Fashion-MNIST training images: "
                f"set it below {len(labels)} (e.g. 5000)."
            )
        train, val = stratified_split(labels, self.val_size / len(labels), self.split_seed)
        common = {"img_size": self.img_size, "in_chans": self.in_chans, "mean": self.mean, "std": self.std}
        augment = {"augment": self.augment, "hflip": self.hflip}
        self.train_set = ArrayImageDataset(images[train], labels[train], **augment, **common)
        self.val_set = ArrayImageDataset(images[val], labels[val], **common)
        self.test_set = ArrayImageDataset(test_images, test_labels, **common)
