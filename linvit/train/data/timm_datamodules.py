"""DataModules with timm's transforms (RandAugment, random erasing, ...): ImageFolder and CIFAR.

- :class:`ImageFolderDataModule`: ImageNet layout (``root/train/<class>/*``, ``root/val/<class>/*``, optional
  ``root/test``), every image format PIL reads. Without a test folder a seeded, stratified share of ``train`` is
  held out as the test split and listed in the run directory. ``img_size="auto"`` picks the input size from the
  images; ``num_workers="auto"`` one worker per core.
- :class:`CIFARDataModule`: torchvision's CIFAR-10/100 (``download`` is the user's choice, off by default).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset, Subset

from linvit.train.data.augment import guard_transform
from linvit.train.data.auto_size import DEFAULT_MULTIPLE, MAX_AUTO_SIZE, auto_img_size
from linvit.train.data.datamodule_base import ClassificationDataModule
from linvit.train.data.datasets import DataUnavailableError, held_out_per_class
from linvit.train.data.folder_auto import FolderAutoValues, take_auto_options
from linvit.train.data.folder_scan import FolderLayoutError
from linvit.train.data.hparams import make_hparams_plain
from linvit.train.data.image_folder import (
    BAD_FILE_MODES,
    PilLoader,
    ReadableByPil,
    TolerantImageFolder,
    data_image_limits,
)
from linvit.train.data.options import AUTO, fraction, whole_number

_log = logging.getLogger(__name__)

TEST_SPLIT_FILE = "test_split.txt"


class TimmTransformDataModule(ClassificationDataModule):
    """A :class:`ClassificationDataModule` whose train/eval pipelines are timm's ``create_transform``.

    The subclasses (:class:`ImageFolderDataModule`, :class:`CIFARDataModule`) take these options besides their own
    and record both as hyper-parameters, defaults included (Lightning reads the arguments of every ``__init__`` of
    the chain: a subclass saves none itself).

    Args:
        auto_augment: timm auto-augment string, e.g. ``rand-m9-mstd0.5-inc1`` (RandAugment); empty for none.
        re_prob, re_mode: random erasing probability and fill mode.
        hflip, color_jitter, scale: timm training-transform options.
        crop_pct, interpolation: evaluation resize/crop.
        kwargs: the options of :class:`ClassificationDataModule`.
    """

    def __init__(
        self,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        re_mode: str = "pixel",
        hflip: float = 0.5,
        color_jitter: float | None = 0.4,
        scale: Sequence[float] | None = (0.08, 1.0),
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.save_hyperparameters()
        make_hparams_plain(self)
        self.auto_augment, self.re_prob, self.re_mode = auto_augment, float(re_prob), re_mode
        self.hflip, self.color_jitter, self.scale = float(hflip), color_jitter, scale
        self.crop_pct, self.interpolation = float(crop_pct), interpolation

    def _timm_transform(self, train: bool):
        from timm.data import create_transform

        options = {
            "input_size": (self.in_chans, self.img_size, self.img_size),
            "interpolation": self.interpolation,
            "mean": self.data_config()["mean"],
            "std": self.data_config()["std"],
            "crop_pct": self.crop_pct,
        }
        if train:
            options.update(
                is_training=True,
                auto_augment=self.auto_augment or None,
                re_prob=self.re_prob,
                re_mode=self.re_mode,
                hflip=self.hflip,
                color_jitter=self.color_jitter,
                scale=tuple(self.scale) if self.scale is not None else None,
            )
        return guard_transform(create_transform(**options))  # posterize safe on Pillow 13; failures named

    def data_config(self) -> dict[str, Any]:
        config = super().data_config()
        config.update(interpolation=self.interpolation, crop_pct=self.crop_pct)
        return config


class ImageFolderDataModule(FolderAutoValues, TimmTransformDataModule):
    """ImageNet layout: ``root/train/<class>/<image>`` and ``root/val/<class>/<image>`` (``root/test`` if present).

    Any format PIL reads; RGBA/palette images composited on white, greyscale converted to ``in_chans``.

    Args:
        root: dataset folder.
        num_classes: the number of classes, or ``"auto"``: the class folders of ``root/train`` (a number given must
            match them).
        img_size: input side in pixels, or ``"auto"``: the median shorter side of (up to 256 of) the training
            images, rounded to a multiple of ``size_multiple`` and at most 224 (the training entry passes the
            model's stride; see :mod:`linvit.train.data.auto_size`).
        test_fraction: without a ``root/test`` folder, the share of each class of ``train`` held out (seeded by
            ``split_seed``) as the test split, which then never trains and never chooses a checkpoint; the held-out
            files are listed in ``<run directory>/test_split.txt``. ``0`` tests on ``val`` (which also chose the
            best checkpoint: optimistic), with a warning saying so.
        split_seed: seed of that hold-out.
        bad_files: what an unreadable image file (not an image, truncated, or any error of its decoder) does:
            ``skip`` (default; another image stands in, and one warning at the end of each pass over the data counts
            and names the files) or ``error`` (raise naming the file). Files that are not images by extension are
            always ignored. Symlink loops are refused; links out of a class folder are followed with a warning.
            FIFOs, sockets and devices named like images are never opened (skipped as unreadable), nor are float
            images holding NaN/Inf used.
        max_pixels, max_aspect: the largest image decoded, in pixels (default PIL's 89,478,485) and as long side /
            short side (default 100), read from the header: a larger one is an unreadable file (``bad_files``).
        check: run :func:`~linvit.train.data.check.check_image_folder` (``linvit check-data``) in ``setup`` and log
            its report: counts, unreadable files, duplicates across splits, sizes and modes (decodes every image
            once; off by default). The images per split and class are logged either way.
        kwargs: timm's transform options (:class:`TimmTransformDataModule`: ``auto_augment``, ``re_prob``,
            ``scale`` ...) and those of :class:`ClassificationDataModule`. ``batch_size``, ``drop_last``,
            ``auto_augment``, ``scale`` and ``re_prob`` also take ``"auto"``: sized to the training images
            (:mod:`linvit.train.data.auto_recipe`; the training entry chooses them before building the model, else
            :meth:`setup` does).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        num_classes: int | str,
        img_size: int | str = 224,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        bad_files: str = "skip",
        check: bool = False,
        max_pixels: int | None = None,
        max_aspect: float | None = None,
        **kwargs: Any,
    ):
        auto = img_size == AUTO
        options = {**kwargs, "num_classes": num_classes}  # kwargs itself stays as given: the hyper-parameters
        auto_options = take_auto_options(options)
        options.setdefault("num_classes", 2)  # until choose_num_classes() has counted the class folders
        super().__init__(img_size=1 if auto else img_size, **options)
        self.auto_options = auto_options  # the options still "auto" (folder_auto.py resolves them)
        self._training_images: int | None = None
        if bad_files not in BAD_FILE_MODES:
            raise ValueError(f"data.bad_files must be one of {BAD_FILE_MODES}, got {bad_files!r}.")
        if self.num_classes < 2:  # torchmetrics would fail deep inside the model's construction
            raise FolderLayoutError(
                f"data.num_classes={self.num_classes}: classification needs at least two classes, one folder each "
                f"under {root}/train. Add a folder per class and set data.num_classes to their number."
            )
        self.img_size_is_auto = auto  # until choose_img_size() has run
        self.bad_files = bad_files
        self.image_limits = data_image_limits(max_pixels, max_aspect)
        self.check = bool(check)
        self.root = Path(root)
        self.test_fraction = 0.0 if test_fraction == 0 else fraction(test_fraction, "data.test_fraction")
        self.split_seed = int(split_seed)
        self.test_split_record: dict[str, Any] | None = None  # how the test split was held out, if it was

    def choose_img_size(self, size_multiple: int = DEFAULT_MULTIPLE) -> int:
        """``img_size="auto"``: the size the training images suggest (:mod:`linvit.train.data.auto_size`); else as
        set."""
        if self.img_size_is_auto:
            folder = self._split_folder("train")
            self.img_size, median = auto_img_size(folder, size_multiple, limits=self.image_limits)
            self.img_size_is_auto = False
            _log.info(
                "data.img_size=auto: %d px (median shorter side of the training images %d px, rounded to a multiple "
                "of %d, at most %d)",
                self.img_size,
                median,
                size_multiple,
                MAX_AUTO_SIZE,
            )
        return self.img_size

    def _split_folder(self, split: str) -> Path:
        folder = self.root / split
        if not folder.is_dir():
            raise DataUnavailableError(
                f"{folder} is not a folder: ImageFolder data needs {self.root}/train/<class>/<images> and "
                f"{self.root}/val/<class>/<images> (ImageNet layout); set data.root."
            )
        return folder

    def _folder(self, split: str, train: bool) -> TolerantImageFolder:
        return TolerantImageFolder(
            str(self._split_folder(split)),
            bad_files=self.bad_files,
            transform=self._timm_transform(train),
            loader=PilLoader("L" if self.in_chans == 1 else "RGB", self.image_limits),
            is_valid_file=ReadableByPil(),
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.choose_img_size()
        self.choose_auto_values()
        if self.check and (self.trainer is None or self.trainer.is_global_zero):
            self._log_data_check()
        train = self._folder("train", train=True)
        if len(train.classes) < 2:
            raise FolderLayoutError(
                f"{train.root} holds one class folder ({', '.join(train.classes)}): classification needs at least two "
                "classes, one folder each. Add a folder per class."
            )
        self._check_num_classes(len(train.classes), f"{self.root}/train")
        self.class_names = list(train.classes)
        self.val_set = self._folder("val", train=False)
        if self.val_set.classes != train.classes:
            raise ValueError(
                f"{self.root}/val has classes {self.val_set.classes[:5]}... but train has "
                f"{train.classes[:5]}...: both splits need the same class folders."
            )
        self.train_set = train
        if (self.root / "test").is_dir():
            self.test_set = self._folder("test", train=False)
        elif self.test_fraction > 0:
            self.train_set, self.test_set = self._hold_out_test_split(train)
        else:
            self.test_set = self.val_set
            _log.warning(
                "no %s/test folder and data.test_fraction=0: the test metrics are measured on val, which also chose "
                "the best checkpoint, so they are optimistic. Add a test folder or set data.test_fraction (e.g. 0.1).",
                self.root,
            )
        _log.info("%s: %s", self.root, _count_summary(self.train_set, self.val_set, self.test_set))

    def _hold_out_test_split(self, train: TolerantImageFolder) -> tuple[FolderSubset, FolderSubset]:
        """``test_fraction`` of each class of ``train`` as the test split (eval transform), seeded; recorded."""
        rest, held_out = held_out_per_class(train.targets, self.test_fraction, self.split_seed)
        evaluated = copy.copy(train)  # the same files and bad-file log, with the evaluation transform
        evaluated.transform = self._timm_transform(False)
        files = [os.path.relpath(train.samples[i][0], self.root) for i in held_out]
        digest = hashlib.sha256("\n".join(files).encode()).hexdigest()
        self.test_split_record = {
            "source": "train",
            "fraction": self.test_fraction,
            "split_seed": self.split_seed,
            "images": len(files),
            "sha256": digest,
        }
        location = self._write_test_split(files)
        _log.warning(
            "no %s/test folder: the test split is %d images held out of train (%.0f%% of each class, "
            "data.split_seed=%d), used for neither training nor choosing the checkpoint%s. Add a test folder, or "
            "set data.test_fraction=0 to test on val.",
            self.root,
            len(files),
            100 * self.test_fraction,
            self.split_seed,
            f"; listed in {location}" if location else "",
        )
        return FolderSubset(train, rest), FolderSubset(evaluated, held_out)

    def _write_test_split(self, files: list[str]) -> Path | None:
        """``test_split.txt`` in the run directory (the trainer's ``default_root_dir``), by the first process."""
        trainer = self.trainer
        if trainer is None or not trainer.is_global_zero or not getattr(trainer, "default_root_dir", None):
            return None
        path = Path(trainer.default_root_dir) / TEST_SPLIT_FILE
        header = (
            f"# test split of {self.root}: held out of train, {self.test_fraction:g} of each class, "
            f"split_seed {self.split_seed}; {len(files)} files, relative to {self.root}\n"
        )
        from linvit.io.destination import write_text

        # the run's own file (an older linvit wrote it without a record): force
        return write_text(path, header + "".join(f"{name}\n" for name in files), "test-split", force=True)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.test_split_record is not None:
            state["test_split"] = dict(self.test_split_record)
        return state

    def _log_data_check(self) -> None:
        from linvit.train.data.check import check_image_folder

        report = check_image_folder(self.root, workers=max(1, self.num_workers), limits=self.image_limits)
        _log.info("data check (data.check=true):\n%s", report.format())
        if report.problems():
            _log.warning("data check of %s: %s", self.root, "; ".join(report.problems()))


class FolderSubset(Subset):
    """Some samples of a :class:`TolerantImageFolder`, which keeps reporting skipped files and naming its classes."""

    @property
    def targets(self) -> list[int]:
        return [self.dataset.targets[i] for i in self.indices]

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "indices") or name.startswith("__"):  # not set yet (unpickling), or a dunder name
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _count_summary(train: Dataset, val: Dataset, test: Dataset) -> str:
    """Images per split and the smallest and largest class, for the log (``linvit check-data`` tells more)."""
    parts = []
    for name, split in (("train", train), ("val", val), ("test", test)):
        if name == "test" and split is val:
            continue  # no test split: val serves as test
        counts = Counter(split.targets)
        fewest, most = min(counts, key=counts.get), max(counts, key=counts.get)
        parts.append(
            f"{name} {len(split)} images ({split.classes[fewest]!r} fewest: {counts[fewest]}, "
            f"{split.classes[most]!r} most: {counts[most]})"
        )
    return f"{len(train.classes)} classes; " + "; ".join(parts)


class CIFARDataModule(TimmTransformDataModule):
    """CIFAR-10 or CIFAR-100 through torchvision: ``val_size`` training images held out for validation, 10k test.

    Args:
        root: where torchvision finds (or, with ``download=True``, puts) ``cifar-10-batches-py``.
        variant: ``cifar10`` or ``cifar100``.
        download: fetch the archive if missing (needs the internet; without it: one-line error).
        val_size: training images held out to validate and choose the checkpoint (the same share of each class,
            drawn with ``split_seed``), so that the 10k test images only test; ``0`` validates on the test images
            (optimistic test metrics).
        scale, crop_pct: as for :class:`TimmTransformDataModule`, with CIFAR's defaults (32-px images).
        kwargs: timm's other transform options and those of :class:`ClassificationDataModule`.
    """

    def __init__(
        self,
        root: str | os.PathLike = "data",
        variant: str = "cifar10",
        download: bool = False,
        num_classes: int = 10,
        val_size: int = 5000,
        split_seed: int = 0,
        scale: Sequence[float] | None = (0.6, 1.0),
        crop_pct: float = 1.0,
        mean: Sequence[float] = (0.4914, 0.4822, 0.4465),
        std: Sequence[float] = (0.2470, 0.2435, 0.2616),
        **kwargs: Any,
    ):
        if variant not in ("cifar10", "cifar100"):
            raise ValueError(f"variant must be 'cifar10' or 'cifar100', got {variant!r}.")
        super().__init__(num_classes=num_classes, scale=scale, crop_pct=crop_pct, mean=mean, std=std, **kwargs)
        self.root, self.variant, self.download = str(root), variant, bool(download)
        self.val_size = whole_number(val_size, "data.val_size", minimum=0)
        self.split_seed = int(split_seed)

    def _dataset(self, train: bool, transform=None):
        from torchvision import datasets

        cls = datasets.CIFAR10 if self.variant == "cifar10" else datasets.CIFAR100
        try:
            return cls(self.root, train=train, transform=transform, download=self.download)
        except (RuntimeError, OSError) as error:  # not found / corrupted, or the download failed (URLError is one)
            if self.download:
                raise DataUnavailableError(
                    f"{self.variant} could not be downloaded into {self.root} ({type(error).__name__}: "
                    f"{_first_line(error)}): check the internet connection, or put the extracted torchvision archive "
                    "there and set data.download=false."
                ) from None
            raise DataUnavailableError(
                f"{self.variant} not found in {self.root}: set data.download=true (needs the internet) "
                "or data.root to a folder holding the torchvision archive's extracted files."
            ) from None

    def prepare_data(self) -> None:
        self._dataset(train=True)
        self._dataset(train=False)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.in_chans == 1:
            raise ValueError("CIFAR images are colour: use data.in_chans=3.")
        train = self._dataset(train=True, transform=self._timm_transform(True))
        self._check_num_classes(len(train.classes), self.variant)
        self.class_names = list(train.classes)
        self.test_set = self._dataset(train=False, transform=self._timm_transform(False))
        if self.val_size == 0:
            self.train_set, self.val_set = train, self.test_set
            _log.warning(
                "data.val_size=0: the %s test images also validate and choose the best checkpoint, so the test "
                "metrics are optimistic; hold out training images instead with data.val_size (e.g. 5000).",
                self.variant,
            )
            return
        if self.val_size >= len(train):
            raise ValueError(
                f"data.val_size={self.val_size} holds out all {len(train)} {self.variant} training images: "
                "set it below that (e.g. 5000)."
            )
        rest, held_out = held_out_per_class(train.targets, self.val_size / len(train), self.split_seed)
        evaluated = copy.copy(train)  # the same arrays, with the evaluation transform
        evaluated.transform = self._timm_transform(False)
        self.train_set, self.val_set = Subset(train, rest.tolist()), Subset(evaluated, held_out.tolist())


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")
