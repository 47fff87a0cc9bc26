"""ImageNet-layout folders (``<root>/<split>/<class>/<image>``) that survive the odd bad file.

- :class:`PilLoader`: any image PIL reads as RGB or L; transparency composited on white, 16-bit greyscale
  rescaled to 8 bits (a bare ``convert`` clips it at 255: nearly all white). Files are opened by
  :func:`linvit.io.images.decode_image`: FIFOs and devices never opened, sizes over ``data.max_pixels`` /
  ``data.max_aspect`` refused from the header, NaN/Inf float pixels refused (so skipped and counted like any
  unreadable file).
- :class:`TolerantImageFolder`: torchvision's ``ImageFolder`` whose ``bad_files`` option decides what an unreadable
  file does: ``"skip"`` (the next readable sample stands in; the files are named in one warning per pass over the
  data) or ``"error"`` (raise naming the file). The label set (the class folders) never changes.
- :class:`ReportingDataLoader`: a ``DataLoader`` that emits that warning when a pass ends.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import has_file_allowed_extension

from linvit.io.images import ImageInputError, ImageLimits, as_mode, decode_image
from linvit.train.data.augment import AugmentationError
from linvit.train.data.folder_scan import scan_split
from linvit.train.data.worker_signals import SigtermSafeDataLoader

_log = logging.getLogger(__name__)

BAD_FILE_MODES = ("skip", "error")
_MAX_NAMED = 10


class ReadableByPil:
    """``is_valid_file`` for ImageFolder: any extension PIL registers (a class, so that it pickles for workers)."""

    def __init__(self):
        from PIL import Image

        self.extensions = tuple(sorted(ext.lower() for ext in Image.registered_extensions()))

    def __call__(self, path: str) -> bool:
        return path.lower().endswith(self.extensions)


def data_image_limits(max_pixels: int | None = None, max_aspect: float | None = None) -> ImageLimits:
    """The image size limits of training data, named as the ``data.*`` options that raise them."""
    defaults = ImageLimits()
    return ImageLimits(
        max_pixels=defaults.max_pixels if max_pixels is None else max_pixels,
        max_aspect=defaults.max_aspect if max_aspect is None else max_aspect,
        pixels_option="data.max_pixels",
        aspect_option="data.max_aspect",
    )


class PilLoader:
    """Open an image with PIL as ``mode`` (RGB or L); transparency composited on white (a class: pickles).

    ``limits`` bound the size decoded (default: :func:`data_image_limits`); every refusal or decoder error is an
    :class:`~linvit.io.images.ImageInputError` naming the file.
    """

    def __init__(self, mode: str, limits: ImageLimits | None = None):
        self.mode = mode
        self.limits = limits or data_image_limits()

    def __call__(self, path: str):
        return decode_image(path, self.limits, self.convert)

    def decode(self, path: str, convert: Callable[[Any], Any]) -> Any:
        """``path`` decoded within this loader's limits, through ``convert`` (e.g. one that also notes the mode)."""
        return decode_image(path, self.limits, convert)

    def convert(self, image: Any) -> Any:
        """``image`` (opened, not yet decoded) decoded as ``mode`` (:func:`linvit.io.images.as_mode`)."""
        return as_mode(image, self.mode)


class TolerantImageFolder(ImageFolder):
    """``ImageFolder`` with a ``bad_files`` policy for files PIL cannot read (``"skip"`` or ``"error"``).

    The class folders are walked by :func:`~linvit.train.data.folder_scan.scan_split`: symlink loops and links into
    another class folder are refused, links out of the class folder followed with a warning naming them.
    Skipped files are recorded in a small log file (workers run in other processes) that
    :meth:`report_bad_files` reads, warns about once and clears; :attr:`skipped_files` keeps them all.
    """

    def __init__(self, root: str, bad_files: str = "skip", **kwargs: Any):
        if bad_files not in BAD_FILE_MODES:
            raise ValueError(f"bad_files must be one of {BAD_FILE_MODES}, got {bad_files!r} (data.bad_files).")
        self.links_out: list[tuple[str, str]] = []
        super().__init__(root, **kwargs)
        if self.links_out:
            _log.warning(
                "followed %d link(s) out of their class folder in %s (their images take the label of the folder "
                "holding the link): %s",
                len(self.links_out),
                self.root,
                _name_some(f"{link} -> {target}" for link, target in self.links_out),
            )
        self.bad_files = bad_files
        self.skipped_files: set[str] = set()  # every file skipped so far, as reported (main process)
        self._log_dir = tempfile.mkdtemp(prefix="linvit_bad_files_")
        self._log_path = os.path.join(self._log_dir, "skipped.txt")
        weakref.finalize(self, shutil.rmtree, self._log_dir, True)

    def make_dataset(
        self,
        directory: str,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """torchvision's listing (same samples, same order) without following symlink loops."""
        classes = sorted(class_to_idx, key=class_to_idx.__getitem__)
        if is_valid_file is None:
            is_valid_file = partial(has_file_allowed_extension, extensions=extensions)
        scan = scan_split(str(directory), classes, is_valid_file)
        empty = [os.path.join(directory, name) for name, count in scan.counts().items() if count == 0]
        if empty and not allow_empty:
            raise FileNotFoundError(
                f"empty class folder(s): {', '.join(empty)}. Every folder under {directory} is a class "
                "of the label set: add images or remove the folder."
            )
        self.links_out = scan.links_out
        return scan.samples

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        for _ in range(min(len(self.samples), 100)):
            path, target = self.samples[index]
            try:
                sample = self.loader(path)
            except Exception as error:  # noqa: BLE001 - whatever a decoder raises, it is this file's problem
                if self.bad_files == "error":
                    # the loader's refusals already name the file; any other error gets it here
                    reason = str(error) if isinstance(error, ImageInputError) else f"{type(error).__name__}: {error}"
                    raise OSError(
                        f"cannot read image {path}: {reason}. Remove or replace the file, or set data.bad_files=skip "
                        "to skip unreadable files with a warning."
                    ) from error
                self._record(path)
                index = (index + 1) % len(self.samples)  # the next file stands in; the label set is unchanged
                continue
            if self.transform is not None:
                try:
                    sample = self.transform(sample)
                except Exception as error:  # noqa: BLE001 - name the file; guard_transform names the step
                    detail = error if isinstance(error, AugmentationError) else f"{type(error).__name__}: {error}"
                    raise AugmentationError(f"data transform failed on {path}: {detail}") from error
            if self.target_transform is not None:
                target = self.target_transform(target)
            return sample, target
        raise OSError(f"100 unreadable images in a row in {self.root} (the last: {path}): is the data corrupt?")

    def _record(self, path: str) -> None:
        try:
            with open(self._log_path, "a", encoding="utf-8") as log:
                log.write(path + "\n")
        except OSError:  # the log is best effort; the sample is skipped either way
            pass

    def report_bad_files(self) -> list[str]:
        """Warn once about the files skipped since the last report (then forget them); returns their paths."""
        try:
            with open(self._log_path, encoding="utf-8") as log:
                paths = sorted(set(log.read().split("\n")) - {""})
            os.remove(self._log_path)
        except OSError:
            return []
        if paths:
            self.skipped_files.update(paths)
            _log.warning(
                "skipped %d unreadable image file(s) in %s this pass (another image stood in for each): %s. "
                "Set data.bad_files=error to stop on them instead.",
                len(paths),
                self.root,
                _name_some(paths),
            )
        return paths


def _name_some(items: Iterable[str]) -> str:
    """The first few of ``items``, comma-separated, and how many more there are."""
    items = list(items)
    more = f" and {len(items) - _MAX_NAMED} more" if len(items) > _MAX_NAMED else ""
    return ", ".join(items[:_MAX_NAMED]) + more


class ReportingDataLoader(SigtermSafeDataLoader):
    """A ``DataLoader`` that, when a pass over the data ends, lets the dataset report skipped files.

    Lightning stops asking for batches after ``len(loader)`` of them without exhausting the iterator, so the
    report comes as soon as the last batch is loaded (all samples of the pass are then decoded, in workers too),
    before that batch is handed out; a pass cut short (``limit_*_batches``, the sanity check) reports at the start
    of the next pass or at :meth:`~linvit.train.data.datamodules.ClassificationDataModule.teardown`.
    """

    def __iter__(self):
        report = getattr(self.dataset, "report_bad_files", None)
        if report is None:
            yield from super().__iter__()
            return
        report()
        last = len(self)
        for count, batch in enumerate(super().__iter__(), start=1):
            if count == last:
                report()
            yield batch
        report()
