"""The base of linvit's classification DataModules: loaders, epoch-seeded shuffling, exact mid-epoch resume.

Every DataModule exposes ``num_classes``, ``in_chans``, ``img_size`` (what the model is built for),
``class_names`` and :meth:`~ClassificationDataModule.data_config` (the timm ``pretrained_cfg`` fields that
describe its preprocessing, written next to exported weights).
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Sequence
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from linvit.train.data.datasets import EpochSeededSampler, SeededSamples
from linvit.train.data.image_folder import ReportingDataLoader
from linvit.train.data.options import capped_workers, whole_number
from linvit.train.data.worker_signals import SigtermSafeDataLoader

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
        seed: int | None = 0,
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
        # seed=null: an unseeded run, so a fresh seed for the data order (the run's log and config record it)
        self.seed = int(seed) if seed is not None else random.SystemRandom().randrange(2**31)
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
        loader_class = ReportingDataLoader if hasattr(dataset, "report_bad_files") else SigtermSafeDataLoader
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
