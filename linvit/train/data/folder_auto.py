"""``auto`` values of an ImageFolder DataModule, chosen from the folder before the model and trainer are built.

``data.num_classes=auto`` is the number of class folders of ``train``; ``data.batch_size``, ``data.drop_last`` and
the augmentation (``data.auto_augment``, ``data.scale``, ``data.re_prob``; the evaluation's ``data.crop_pct``) follow
the number of training images (the test share held out of ``train`` already taken away) and their size by the rules
of :mod:`linvit.train.data.auto_recipe`.
The training entry writes the chosen numbers into the run's config (its saved ``config.yaml`` holds them); each
choice is logged with its reason.
"""

from __future__ import annotations

import logging
from typing import Any

from linvit.train.data.auto_recipe import Choice, auto_augmentation, auto_batch_size, auto_drop_last
from linvit.train.data.options import AUTO

_log = logging.getLogger("linvit.train.data.auto")

AUTO_KEYS = ("num_classes", "batch_size", "drop_last", "auto_augment", "scale", "re_prob", "crop_pct")
"""The options of :class:`~linvit.train.data.timm_datamodules.ImageFolderDataModule` that take ``auto``."""


def take_auto_options(options: dict[str, Any]) -> set[str]:
    """The keys of ``options`` set to ``auto`` (removed from ``options``, so that the defaults stand in meanwhile)."""
    found = {key for key in AUTO_KEYS if isinstance(options.get(key), str) and options[key] == AUTO}
    for key in found:
        del options[key]
    return found


def log_choice(key: str, choice: Choice) -> None:
    """One log line: the option, the value chosen (as a config writes it) and why."""
    value = str(choice.value).lower() if isinstance(choice.value, bool) else choice.value
    _log.info("data.%s=auto: %s (%s)", key, value, choice.reason)


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


class FolderAutoValues:
    """Methods that resolve the ``auto`` options of an ImageFolder DataModule (``self.auto_options``: those left).

    The host class provides ``root``, ``test_fraction``, ``split_seed``, ``_split_folder`` and the options.
    """

    auto_options: set[str]

    def _resolved(self, key: str, value: Any) -> None:
        """``key`` is no longer ``auto``: recorded in the hyper-parameters too (checkpoints, loggers, which Lightning
        checks against the model's: the class count must agree)."""
        self.auto_options.discard(key)
        # the initial copy is what Lightning logs and compares with the model's
        for hparams in (getattr(self, "hparams", None), getattr(self, "_hparams_initial", None)):
            if hparams is not None and key in hparams:
                hparams[key] = value

    def class_folders(self) -> list[str]:
        """The class folders of the training split (torchvision's rule: the sub-folders, sorted)."""
        from torchvision.datasets.folder import find_classes

        from linvit.train.data.folder_scan import FolderLayoutError

        folder = self._split_folder("train")
        try:
            return find_classes(str(folder))[0]
        except FileNotFoundError:
            raise FolderLayoutError(
                f"{folder} holds no class folders: ImageFolder data needs {folder}/<class>/<images>, one folder per "
                "class (at least two)."
            ) from None

    def training_images(self) -> int:
        """The images that train: those of ``train``, less the test share held out of it (counted, not decoded)."""
        if getattr(self, "_training_images", None) is None:
            from linvit.train.data.folder_scan import scan_split
            from linvit.train.data.image_folder import ReadableByPil

            counts = scan_split(str(self._split_folder("train")), self.class_folders(), ReadableByPil()).counts()
            held_out = 0
            if not (self.root / "test").is_dir() and self.test_fraction > 0:
                held_out = sum(min(n - 1, max(1, round(self.test_fraction * n))) for n in counts.values() if n >= 2)
            self._training_images = sum(counts.values()) - held_out
        return self._training_images

    def choose_num_classes(self) -> int:
        """``num_classes="auto"``: the number of class folders; a number given is checked against it."""
        from linvit.train.data.folder_scan import FolderLayoutError

        folders = self.class_folders()
        found = len(folders)
        if found < 2:  # first: no class count fixes it
            raise FolderLayoutError(
                f"{self.root}/train holds one class folder ({', '.join(folders)}): classification needs at least two "
                "classes, one folder each. Add a folder per class."
            )
        if "num_classes" not in self.auto_options:
            if found != self.num_classes:
                raise ValueError(
                    f"data.num_classes={self.num_classes} but {self.root}/train has {found} class folders: set "
                    f"data.num_classes={found}, or data.num_classes=auto to count them."
                )
            return self.num_classes
        self.num_classes, self.class_names = found, [str(i) for i in range(found)]
        self._resolved("num_classes", found)
        log_choice("num_classes", Choice(found, f"the class folders of {self.root}/train"))
        return found

    def choose_batch_size(self, processes: int = 1, even_batches: bool = False) -> tuple[int, bool]:
        """``batch_size`` and ``drop_last`` (each where ``auto``) for the training images; both returned."""
        if "batch_size" in self.auto_options:
            choice = auto_batch_size(self.training_images(), processes)
            self.batch_size = choice.value
            self._resolved("batch_size", choice.value)
            log_choice("batch_size", choice)
        if "drop_last" in self.auto_options:
            choice = auto_drop_last(self.training_images(), self.batch_size * max(1, processes), even_batches)
            self.drop_last = choice.value
            self._resolved("drop_last", choice.value)
            log_choice("drop_last", choice)
        return self.batch_size, self.drop_last

    def choose_augmentation(self) -> dict[str, Any]:
        """``auto_augment``, ``scale``, ``re_prob`` and the evaluation's ``crop_pct`` (each where ``auto``) for the
        image size and count."""
        keys = [key for key in ("auto_augment", "scale", "re_prob", "crop_pct") if key in self.auto_options]
        if not keys:
            return {}
        choice = auto_augmentation(self.img_size, self.training_images())
        chosen = {key: choice.value[key] for key in keys}
        self.auto_augment = chosen.get("auto_augment", self.auto_augment)
        self.scale = chosen.get("scale", self.scale)
        self.re_prob = float(chosen.get("re_prob", self.re_prob))
        self.crop_pct = float(chosen.get("crop_pct", self.crop_pct))
        for key, value in chosen.items():
            self._resolved(key, value)
        _log.info(
            "data augmentation=auto: %s (%s)", ", ".join(f"data.{k}={v}" for k, v in chosen.items()), choice.reason
        )
        return chosen

    def take_chosen_values(self, chosen: dict[str, Any], why: str) -> dict[str, Any]:
        """The values of ``chosen`` (a resumed run's saved config: what it chose before) for the options still
        ``auto``, checked like given ones; returns those taken. A resumed run trains on as it began, even if the
        folder has changed since."""
        from linvit.train.data.options import whole_number

        checks = {
            "num_classes": lambda v: whole_number(v, "data.num_classes", minimum=2),
            "batch_size": lambda v: whole_number(v, "data.batch_size", minimum=1),
            "drop_last": lambda v: v if isinstance(v, bool) else None,
            "auto_augment": lambda v: v if isinstance(v, str) and v != AUTO else None,
            "scale": lambda v: [float(x) for x in v] if isinstance(v, list) and len(v) == 2 else None,
            "re_prob": lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None,
            "crop_pct": lambda v: float(v) if _positive_number(v) else None,
        }
        taken = {}
        for key in sorted(self.auto_options & set(chosen)):
            value = checks[key](chosen[key])
            if value is None:
                continue  # not a value this option takes: chosen again
            setattr(self, key, value)
            self._resolved(key, value)
            taken[key] = value
            log_choice(key, Choice(value, why))
        if "num_classes" in taken:
            self.class_names = [str(i) for i in range(self.num_classes)]
        return taken

    def choose_auto_values(self) -> None:
        """Every ``auto`` option still open, with their defaults (one process, no mixup): for use without the
        training entry, which chooses them first with what it knows of the trainer and the model. (A class count
        given is checked by ``setup``, after the scan that names an empty or looping folder.)"""
        if "num_classes" in self.auto_options:
            self.choose_num_classes()
        self.choose_batch_size()
        self.choose_augmentation()
