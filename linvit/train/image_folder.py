"""ImageNet-layout folders (``<root>/<split>/<class>/<image>``) that survive the odd bad file.

- :class:`PilLoader`: any image PIL reads as RGB or L; transparency composited on white, 16-bit greyscale
  rescaled to 8 bits (a bare ``convert`` clips it at 255: nearly all white).
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
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

_log = logging.getLogger(__name__)

BAD_FILE_MODES = ("skip", "error")
# What PIL raises for a file it cannot decode: UnidentifiedImageError and "image file is truncated" are OSErrors;
# some decoders raise ValueError or SyntaxError on corrupt headers.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError)
_MAX_NAMED = 10


class ReadableByPil:
    """``is_valid_file`` for ImageFolder: any extension PIL registers (a class, so that it pickles for workers)."""

    def __init__(self):
        from PIL import Image

        self.extensions = tuple(sorted(ext.lower() for ext in Image.registered_extensions()))

    def __call__(self, path: str) -> bool:
        return path.lower().endswith(self.extensions)


def _to_8_bit(image: Any) -> Any:
    """16/32-bit integer greyscale (modes I;16*, I) as 8-bit L: 0..65535 maps to 0..255."""
    from PIL import Image

    pixels = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(pixels / 257.0), 0, 255).astype(np.uint8), "L")


class PilLoader:
    """Open an image with PIL as ``mode`` (RGB or L); transparency composited on white (a class: pickles)."""

    def __init__(self, mode: str):
        self.mode = mode

    def __call__(self, path: str):
        from PIL import Image

        with Image.open(path) as image:
            if image.mode.startswith("I;16") or image.mode == "I":
                return _to_8_bit(image).convert(self.mode)
            if self.mode == "RGB" and (image.mode in ("RGBA", "LA") or "transparency" in image.info):
                # Composite on white instead of the black that a bare convert() gives transparent pixels.
                rgba = image.convert("RGBA")
                background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                return Image.alpha_composite(background, rgba).convert("RGB")
            return image.convert(self.mode)


def empty_class_folders(folder: Path, is_valid_file: Any) -> list[Path]:
    """The class sub-folders of ``folder`` without a single file that ``is_valid_file`` accepts."""
    empty = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.is_dir():
            continue
        has_image = any(
            is_valid_file(os.path.join(base, name))
            for base, _, names in os.walk(entry.path, followlinks=True)
            for name in names
        )
        if not has_image:
            empty.append(folder / entry.name)
    return empty


class TolerantImageFolder(ImageFolder):
    """``ImageFolder`` with a ``bad_files`` policy for files PIL cannot read (``"skip"`` or ``"error"``).

    Skipped files are recorded in a small log file (workers run in other processes) that
    :meth:`report_bad_files` reads, warns about once and clears.
    """

    def __init__(self, root: str, bad_files: str = "skip", **kwargs: Any):
        if bad_files not in BAD_FILE_MODES:
            raise ValueError(f"bad_files must be one of {BAD_FILE_MODES}, got {bad_files!r} (data.bad_files).")
        try:
            super().__init__(root, **kwargs)
        except FileNotFoundError as error:
            empty = empty_class_folders(Path(root), kwargs.get("is_valid_file") or ReadableByPil())
            if not empty:
                raise
            raise FileNotFoundError(
                f"empty class folder(s): {', '.join(str(p) for p in empty)}. Every folder under {root} is a class "
                "of the label set: add images or remove the folder."
            ) from error
        self.bad_files = bad_files
        self._log_dir = tempfile.mkdtemp(prefix="linvit_bad_files_")
        self._log_path = os.path.join(self._log_dir, "skipped.txt")
        weakref.finalize(self, shutil.rmtree, self._log_dir, True)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        for _ in range(min(len(self.samples), 100)):
            path, target = self.samples[index]
            try:
                sample = self.loader(path)
            except _DECODE_ERRORS as error:
                if self.bad_files == "error":
                    raise OSError(
                        f"cannot read image {path}: {error}. Remove or replace the file, or set data.bad_files=skip "
                        "to skip unreadable files with a warning."
                    ) from error
                self._record(path)
                index = (index + 1) % len(self.samples)  # the next file stands in; the label set is unchanged
                continue
            if self.transform is not None:
                sample = self.transform(sample)
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
            named = ", ".join(paths[:_MAX_NAMED]) + (
                f" and {len(paths) - _MAX_NAMED} more" if len(paths) > _MAX_NAMED else ""
            )
            _log.warning(
                "skipped %d unreadable image file(s) in %s this pass (another image stood in for each): %s. "
                "Set data.bad_files=error to stop on them instead.",
                len(paths),
                self.root,
                named,
            )
        return paths


class ReportingDataLoader(DataLoader):
    """A ``DataLoader`` that, when a pass over the data ends, lets the dataset report skipped files."""

    def __iter__(self):
        report = getattr(self.dataset, "report_bad_files", None)
        if report is not None:
            report()  # a pass cut short (limit_*_batches) reports at the start of the next one
        yield from super().__iter__()
        if report is not None:
            report()
