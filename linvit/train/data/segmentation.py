"""The Lightning DataModule of semantic segmentation: a folder of image/mask pairs as train/val/test loaders.

The folder layout and the dataset are :mod:`linvit.dense.seg_folder`'s. A root with ``images/`` and ``masks/``
directly (no splits) is split by ``val_fraction``. Class names for the logs: ``data.class_names``, or
``root/classes.txt`` (one per line).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from linvit.dense.seg_folder import IMAGENET_MEAN, IMAGENET_STD, PairedTransform, SegmentationFolder
from linvit.io.images import DEFAULT_MAX_ASPECT, DEFAULT_MAX_PIXELS, ImageLimits
from linvit.train.data.options import capped_workers, fraction, whole_number
from linvit.train.data.worker_signals import SigtermSafeDataLoader

__all__ = ["SegmentationDataModule"]

CLASSES_FILE = "classes.txt"


class SegmentationDataModule(LightningDataModule):
    """A folder of image/mask pairs as train/val loaders (see the module docstring for the layout).

    Args:
        data_dir: the dataset root.
        num_classes: classes of the task (masks are checked against it).
        in_chans: image channels (3: images are read as RGB); declared for the model config (``${data.in_chans}``).
        img_size: (H, W) or one int: size of training crops and of the evaluation resize; ``None`` evaluates at
            native size (then use ``eval_batch_size=1`` unless all images share one size).
        batch_size, eval_batch_size, num_workers: loader options.
        scale_range, hflip: training augmentation.
        val_fraction: share held out for validation when ``data_dir`` has no ``train``/``val`` split.
        synthetic: when set and ``data_dir`` has no data, generate the synthetic shapes task there first with these
            options (``num_train``, ``num_val``, ``size``, ``seed``); see :mod:`linvit.dense.synthetic`.
        class_names: a name per class, for the per-class IoU the module logs (``test/IoU_<name>``); default: the
            synthetic task's names when ``synthetic`` is set, else ``data_dir/classes.txt`` (one name per line) if
            present, else the class indices.
        mean, std: normalisation.
        max_pixels, max_aspect: the largest image or mask decoded, in pixels and as long side / short side, checked
            from the header before decoding (:mod:`linvit.io.images`; defaults: PIL's 89,478,485 and 100).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        num_classes: int,
        in_chans: int = 3,
        img_size: int | Sequence[int] | None = (96, 128),
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        scale_range: Sequence[float] = (0.5, 2.0),
        hflip: bool = True,
        val_fraction: float = 0.1,
        synthetic: dict[str, Any] | None = None,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        seed: int = 0,
        class_names: Sequence[str] | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_aspect: float = DEFAULT_MAX_ASPECT,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.data_dir = Path(data_dir)
        self.num_classes = whole_number(num_classes, "data.num_classes", minimum=1)
        self._given_class_names = list(class_names) if class_names else None
        if self._given_class_names is not None and len(self._given_class_names) != num_classes:
            raise ValueError(
                f"data.class_names has {len(self._given_class_names)} names but data.num_classes={num_classes}: "
                "give one name per class."
            )
        if in_chans != 3:
            raise ValueError(f"SegmentationDataModule reads RGB images: in_chans must be 3, got {in_chans}.")
        if img_size is not None and not isinstance(img_size, Sequence):
            img_size = (img_size, img_size)
        if img_size is not None and len(img_size) != 2:
            raise ValueError(f"data.img_size must be one side or [height, width], got {list(img_size)}.")
        sides = img_size or ()
        self.crop_size = tuple(whole_number(side, "data.img_size", minimum=1) for side in sides) or None
        self.batch_size = whole_number(batch_size, "data.batch_size", minimum=1)
        self.eval_batch_size = whole_number(
            batch_size if eval_batch_size is None else eval_batch_size, "data.eval_batch_size", minimum=1
        )
        self.num_workers = capped_workers(num_workers)
        self.val_fraction = fraction(val_fraction, "data.val_fraction")
        self.synthetic = dict(synthetic) if synthetic else None
        self.image_limits = ImageLimits(max_pixels, max_aspect, "data.max_pixels", "data.max_aspect")
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    @property
    def class_names(self) -> list[str]:
        """The name of each class (see ``class_names`` above): the module labels its per-class IoU with these."""
        if self._given_class_names is not None:
            return list(self._given_class_names)
        if self.synthetic is not None:
            from linvit.dense.synthetic import SYNTHETIC_CLASS_NAMES

            return list(SYNTHETIC_CLASS_NAMES[: self.num_classes])
        listed = self.data_dir / CLASSES_FILE
        if listed.is_file():
            names = [line.strip() for line in listed.read_text(encoding="utf-8").splitlines() if line.strip()]
            if len(names) != self.num_classes:
                raise ValueError(
                    f"{listed} names {len(names)} classes but data.num_classes={self.num_classes}: one name per line, "
                    "one line per class."
                )
            return names
        return [str(index) for index in range(self.num_classes)]

    def prepare_data(self) -> None:
        if self.synthetic is not None and not (self.data_dir / "train" / "images").is_dir():
            from linvit.dense.synthetic import generate_synthetic_segmentation

            generate_synthetic_segmentation(self.data_dir, num_classes=self.num_classes, **self.synthetic)

    def _transforms(self, train: bool) -> PairedTransform:
        return PairedTransform(
            self.crop_size,
            train=train,
            scale_range=tuple(self.hparams.scale_range),
            hflip=self.hparams.hflip,
            mean=self.hparams.mean,
            std=self.hparams.std,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        root = self.data_dir
        if (root / "train").is_dir():
            self.train_set = SegmentationFolder(
                root / "train" / "images",
                root / "train" / "masks",
                self._transforms(True),
                self.num_classes,
                self.image_limits,
            )
            val_root = root / "val" if (root / "val").is_dir() else root / "train"
            self.val_set = SegmentationFolder(
                val_root / "images", val_root / "masks", self._transforms(False), self.num_classes, self.image_limits
            )
            test_root = root / "test" if (root / "test").is_dir() else val_root
            self.test_set = SegmentationFolder(
                test_root / "images", test_root / "masks", self._transforms(False), self.num_classes, self.image_limits
            )
            return
        train_full = SegmentationFolder(
            root / "images", root / "masks", self._transforms(True), self.num_classes, self.image_limits
        )
        val_full = SegmentationFolder(
            root / "images", root / "masks", self._transforms(False), self.num_classes, self.image_limits
        )
        order = list(range(len(train_full)))
        random.Random(self.hparams.seed).shuffle(order)
        num_val = max(1, math.floor(len(order) * self.val_fraction))
        self.train_set = torch.utils.data.Subset(train_full, order[num_val:])
        self.val_set = torch.utils.data.Subset(val_full, order[:num_val])
        self.test_set = self.val_set

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.hparams.seed)
        return SigtermSafeDataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            drop_last=len(self.train_set) > self.batch_size,
            num_workers=self.num_workers,
            generator=generator,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        """The ``test`` split when the folder has one, else the validation split."""
        return self._eval_loader(self.test_set)

    def _eval_loader(self, dataset: Dataset | None) -> DataLoader:
        return SigtermSafeDataLoader(
            dataset,
            batch_size=self.eval_batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )
