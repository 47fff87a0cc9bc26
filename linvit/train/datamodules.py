"""Lightning DataModules for image classification.

Every DataModule exposes ``num_classes``, ``in_chans``, ``img_size`` (what the model is built for),
``class_names`` and :meth:`~ClassificationDataModule.data_config` (the timm ``pretrained_cfg`` fields that
describe its preprocessing, written next to exported weights).

- :class:`DigitsDataModule` (the default): scikit-learn's digits, stratified train/val/test split.
- :class:`FashionMNISTDataModule`: Debian's ``dataset-fashion-mnist`` (60k train, of which ``val_size`` held out
  for validation, 10k test).
- :class:`ImageFolderDataModule`: ImageNet layout (``root/train/<class>/*``, ``root/val/<class>/*``), timm's
  train/eval transforms (RandAugment, random erasing), every image format PIL reads.
- :class:`CIFARDataModule`: torchvision's CIFAR-10/100 (``download`` is the user's choice, off by default).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from linvit.train._hparams import make_hparams_plain
from linvit.train.data_options import capped_workers, fraction, whole_number
from linvit.train.datasets import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    ArrayImageDataset,
    EpochSeededSampler,
    SeededSamples,
    load_digits_arrays,
    load_fashion_mnist_arrays,
    stratified_split,
)
from linvit.train.image_folder import (
    BAD_FILE_MODES,
    PilLoader,
    ReadableByPil,
    ReportingDataLoader,
    TolerantImageFolder,
)

_log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ClassificationDataModule(LightningDataModule):
    """Shared loaders: epoch-seeded shuffling, worker count, pinned memory and persistent workers.

    Args:
        num_classes: number of classes; checked against the data found on disk.
        img_size: square side the images are resized/cropped to (the model's input).
        in_chans: channels the model takes (grey images are replicated; colour images converted to grey for 1).
        batch_size: images per device per step (the effective batch is this x devices x nodes x accumulation).
        eval_batch_size: validation/test batch size (default: ``batch_size``).
        num_workers, pin_memory, persistent_workers: ``DataLoader`` options (persistence only with workers).
        drop_last: drop the last incomplete training batch (mixup/cutmix need an even batch).
        seed: seed of the per-epoch shuffling order.
        mean, std: normalisation, one value per channel or one for all.
    """

    def __init__(
        self,
        num_classes: int,
        img_size: int = 32,
        in_chans: int = 3,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        drop_last: bool = True,
        seed: int = 0,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ):
        super().__init__()
        self.num_classes = whole_number(num_classes, "data.num_classes", minimum=1)
        self.img_size = whole_number(img_size, "data.img_size", minimum=1)
        self.in_chans = whole_number(in_chans, "data.in_chans", minimum=1)
        self.batch_size = whole_number(batch_size, "data.batch_size", minimum=1)
        self.eval_batch_size = whole_number(
            batch_size if eval_batch_size is None else eval_batch_size, "data.eval_batch_size", minimum=1
        )
        self.num_workers = capped_workers(num_workers)
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers) and self.num_workers > 0
        self.drop_last = bool(drop_last)
        self.seed = int(seed)
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        self.class_names: list[str] = [str(i) for i in range(self.num_classes)]
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._train_sampler: EpochSeededSampler | None = None
        self._resume: dict[str, int] | None = None  # from a mid-epoch checkpoint, for the next train loader

    # -- what the model and the exported weights need to know ------------------------------------------------
    def data_config(self) -> dict[str, Any]:
        """timm ``pretrained_cfg`` fields describing this preprocessing (for ``config.json`` of an export)."""
        channels = self.in_chans
        mean = self.mean * channels if len(self.mean) == 1 else self.mean
        std = self.std * channels if len(self.std) == 1 else self.std
        return {
            "input_size": (channels, self.img_size, self.img_size),
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": tuple(mean),
            "std": tuple(std),
            "num_classes": self.num_classes,
        }

    def state_dict(self) -> dict[str, Any]:
        # Saved in every checkpoint, so that an export knows the preprocessing and the class names, and so that a
        # run resumed from a mid-epoch checkpoint (SIGTERM, every_n_train_steps) goes on with the unseen samples.
        state: dict[str, Any] = {"data_config": self.data_config(), "class_names": list(self.class_names)}
        resume = self._mid_epoch_position()
        if resume is not None:
            state["resume"] = resume
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("class_names"):
            self.class_names = list(state_dict["class_names"])
        self._resume = state_dict.get("resume")
        if self._resume:
            _log.info(
                "resuming in the middle of epoch %d: the first %d samples of its order were already trained on and "
                "are skipped",
                self._resume["epoch"],
                self._resume["samples"],
            )
            # Lightning's generic warning assumes the loader restarts the epoch; this DataModule resumes it exactly
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")

    def _mid_epoch_position(self) -> dict[str, int] | None:
        """The epoch and the samples of it already trained on (all ranks), when saved in the middle of an epoch."""
        trainer, sampler = self.trainer, self._train_sampler
        if trainer is None or sampler is None or trainer.state.fn != "fit":
            return None
        # `processed` counts the batch whose on_train_batch_end is saving the checkpoint (`completed` does not yet)
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if batches <= 0 or batches >= trainer.num_training_batches:
            return None  # at an epoch boundary: the next epoch starts from its beginning anyway
        return {"epoch": sampler.epoch, "samples": batches * self.batch_size * trainer.world_size}

    def skipped_files(self) -> list[str]:
        """Every image file skipped as unreadable so far (``data.bad_files=skip``), over all splits."""
        skipped: set[str] = set()
        for dataset in (self.train_set, self.val_set, self.test_set):
            skipped.update(getattr(dataset, "skipped_files", ()))
        return sorted(skipped)

    def teardown(self, stage: str) -> None:
        # a pass cut short (limit_*_batches, fast_dev_run, the sanity check) has not reported its skipped files yet
        for dataset in {id(d): d for d in (self.train_set, self.val_set, self.test_set)}.values():
            report = getattr(dataset, "report_bad_files", None)
            if report is not None:
                report()

    def _check_num_classes(self, found: int, where: str) -> None:
        if found != self.num_classes:
            raise ValueError(
                f"{where} has {found} classes but data.num_classes={self.num_classes}: set data.num_classes={found}."
            )

    # -- loaders ---------------------------------------------------------------------------------------------
    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not created this split; call setup() first.")
        # a dataset that skips unreadable files reports them once per pass over the data
        loader_class = ReportingDataLoader if hasattr(dataset, "report_bad_files") else DataLoader
        sampler = None
        if train:
            resume, self._resume = self._resume or {}, None  # a resume point serves the first loader only
            sampler = EpochSeededSampler(
                len(dataset), seed=self.seed, resume_epoch=resume.get("epoch", 0), resume_skip=resume.get("samples", 0)
            )
            self._train_sampler = sampler
            dataset = SeededSamples(dataset)  # each sample's augmentation seeded from its (index, seed) key
        return loader_class(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            sampler=sampler,
            shuffle=False if train else None,
            drop_last=self.drop_last and train and len(dataset) >= self.batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)


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


class _TimmTransformMixin:
    """timm's ``create_transform`` train/eval pipelines, configured by the DataModule's arguments."""

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
        return create_transform(**options)

    def data_config(self) -> dict[str, Any]:
        config = ClassificationDataModule.data_config(self)
        config.update(interpolation=self.interpolation, crop_pct=self.crop_pct)
        return config


class ImageFolderDataModule(_TimmTransformMixin, ClassificationDataModule):
    """ImageNet layout: ``root/train/<class>/<image>`` and ``root/val/<class>/<image>`` (``root/test`` if present).

    Any format PIL reads; RGBA/palette images composited on white, greyscale converted to ``in_chans``.

    Args:
        root: dataset folder.
        auto_augment: timm auto-augment string, e.g. ``rand-m9-mstd0.5-inc1`` (RandAugment); empty for none.
        re_prob, re_mode: random erasing probability and fill mode.
        hflip, color_jitter, scale: timm training-transform options.
        crop_pct, interpolation: evaluation resize/crop.
        bad_files: what an unreadable image file (not an image, truncated, or any error of its decoder) does:
            ``skip`` (default; another image stands in, and one warning at the end of each pass over the data counts
            and names the files) or ``error`` (raise naming the file). Files that are not images by extension are
            always ignored. Symlink loops are refused; links out of a class folder are followed with a warning.
        check: run :func:`~linvit.train.data_check.check_image_folder` (``linvit check-data``) in ``setup`` and log
            its report: counts, unreadable files, duplicates across splits, sizes and modes (decodes every image
            once; off by default). The images per split and class are logged either way.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        num_classes: int,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        re_mode: str = "pixel",
        hflip: float = 0.5,
        color_jitter: float | None = 0.4,
        scale: Sequence[float] | None = (0.08, 1.0),
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        img_size: int = 224,
        bad_files: str = "skip",
        check: bool = False,
        **kwargs: Any,
    ):
        super().__init__(num_classes=num_classes, img_size=img_size, **kwargs)
        self.save_hyperparameters()
        make_hparams_plain(self)
        if bad_files not in BAD_FILE_MODES:
            raise ValueError(f"data.bad_files must be one of {BAD_FILE_MODES}, got {bad_files!r}.")
        self.bad_files = bad_files
        self.check = bool(check)
        self.root = Path(root)
        self.auto_augment, self.re_prob, self.re_mode = auto_augment, float(re_prob), re_mode
        self.hflip, self.color_jitter, self.scale = float(hflip), color_jitter, scale
        self.crop_pct, self.interpolation = float(crop_pct), interpolation

    def _folder(self, split: str, train: bool) -> TolerantImageFolder:
        folder = self.root / split
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{folder} is not a folder: ImageFolder data needs {self.root}/train/<class>/<images> and "
                f"{self.root}/val/<class>/<images> (ImageNet layout); set data.root."
            )
        return TolerantImageFolder(
            str(folder),
            bad_files=self.bad_files,
            transform=self._timm_transform(train),
            loader=PilLoader("L" if self.in_chans == 1 else "RGB"),
            is_valid_file=ReadableByPil(),
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.check and (self.trainer is None or self.trainer.is_global_zero):
            self._log_data_check()
        self.train_set = self._folder("train", train=True)
        self._check_num_classes(len(self.train_set.classes), f"{self.root}/train")
        self.class_names = list(self.train_set.classes)
        self.val_set = self._folder("val", train=False)
        if self.val_set.classes != self.train_set.classes:
            raise ValueError(
                f"{self.root}/val has classes {self.val_set.classes[:5]}... but train has "
                f"{self.train_set.classes[:5]}...: both splits need the same class folders."
            )
        self.test_set = self._folder("test", train=False) if (self.root / "test").is_dir() else self.val_set
        _log.info("%s: %s", self.root, _count_summary(self.train_set, self.val_set, self.test_set))

    def _log_data_check(self) -> None:
        from linvit.train.data_check import check_image_folder

        report = check_image_folder(self.root, workers=max(1, self.num_workers))
        _log.info("data check (data.check=true):\n%s", report.format())
        if report.problems():
            _log.warning("data check of %s: %s", self.root, "; ".join(report.problems()))


def _count_summary(*splits: TolerantImageFolder) -> str:
    """Images per split and the smallest and largest class, for the log (``linvit check-data`` tells more)."""
    parts = []
    for name, split in zip(("train", "val", "test"), splits):
        if name == "test" and split is splits[1]:
            continue  # no test folder: val serves as test
        counts = Counter(split.targets)
        fewest, most = min(counts, key=counts.get), max(counts, key=counts.get)
        parts.append(
            f"{name} {len(split)} images ({split.classes[fewest]!r} fewest: {counts[fewest]}, "
            f"{split.classes[most]!r} most: {counts[most]})"
        )
    return f"{len(splits[0].classes)} classes; " + "; ".join(parts)


class CIFARDataModule(_TimmTransformMixin, ClassificationDataModule):
    """CIFAR-10 or CIFAR-100 through torchvision; the 10k test images serve as validation and test.

    Args:
        root: where torchvision finds (or, with ``download=True``, puts) ``cifar-10-batches-py``.
        variant: ``cifar10`` or ``cifar100``.
        download: fetch the archive if missing (off: these machines have no internet).
    """

    def __init__(
        self,
        root: str | os.PathLike = "data",
        variant: str = "cifar10",
        download: bool = False,
        num_classes: int = 10,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        re_mode: str = "pixel",
        hflip: float = 0.5,
        color_jitter: float | None = 0.4,
        scale: Sequence[float] | None = (0.6, 1.0),
        crop_pct: float = 1.0,
        interpolation: str = "bicubic",
        mean: Sequence[float] = (0.4914, 0.4822, 0.4465),
        std: Sequence[float] = (0.2470, 0.2435, 0.2616),
        **kwargs: Any,
    ):
        if variant not in ("cifar10", "cifar100"):
            raise ValueError(f"variant must be 'cifar10' or 'cifar100', got {variant!r}.")
        super().__init__(num_classes=num_classes, mean=mean, std=std, **kwargs)
        self.save_hyperparameters()
        make_hparams_plain(self)
        self.root, self.variant, self.download = str(root), variant, bool(download)
        self.auto_augment, self.re_prob, self.re_mode = auto_augment, float(re_prob), re_mode
        self.hflip, self.color_jitter, self.scale = float(hflip), color_jitter, scale
        self.crop_pct, self.interpolation = float(crop_pct), interpolation

    def _dataset(self, train: bool, transform=None):
        from torchvision import datasets

        cls = datasets.CIFAR10 if self.variant == "cifar10" else datasets.CIFAR100
        try:
            return cls(self.root, train=train, transform=transform, download=self.download)
        except RuntimeError as error:
            raise FileNotFoundError(
                f"{self.variant} not found in {self.root}: set data.download=true (needs the internet) "
                "or data.root to a folder holding the torchvision archive's extracted files."
            ) from error

    def prepare_data(self) -> None:
        self._dataset(train=True)
        self._dataset(train=False)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.in_chans == 1:
            raise ValueError("CIFAR images are colour: use data.in_chans=3.")
        self.train_set = self._dataset(train=True, transform=self._timm_transform(True))
        self._check_num_classes(len(self.train_set.classes), self.variant)
        self.class_names = list(self.train_set.classes)
        self.val_set = self.test_set = self._dataset(train=False, transform=self._timm_transform(False))
