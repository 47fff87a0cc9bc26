"""The images a command is given: files, folders (walked recursively) and globs that linvit expands itself.

- A file named on the command line is taken as it is, whatever its name; the image loader
  (:mod:`linvit.io.images`) then refuses it in one line if it is not a readable image.
- A folder is walked in sorted order (its entries by name, depth first), taking the files with an extension Pillow
  registers (as training's image folders do); hidden entries (``.name``, e.g. linvit's own ``.linvit-written.json``)
  are passed over, other files are skipped with one warning per folder. A link to a folder is followed unless it
  leads back to a folder the walk is inside (a loop) or to one already walked: skipped with a warning, so the walk
  ends. At most :data:`MAX_DEPTH` folders deep.
- A quoted glob (``'imgs/*.png'``: the shell did not expand it) is expanded in sorted order, one level per pattern
  part (``**`` is ``*``: name a folder to walk it all); a folder it matches is walked, a file that is not an image
  skipped with a warning.

At most ``max_images`` are listed (ValueError naming the option beyond that): a mistaken ``/`` ends at once.
"""

from __future__ import annotations

import glob
import itertools
import os
from dataclasses import dataclass, field

MAX_DEPTH = 64
_NAMED = 3  # files named in a warning about skipped ones; the rest are counted


@dataclass
class ImageInputs:
    """The image paths found (in order, each once), the warnings to print, and whether the arguments were a single
    file (then its refusal is the command's error, not a warning)."""

    paths: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    single_file: bool = False


def image_extensions() -> tuple[str, ...]:
    """Every file extension Pillow registers a format for (lower case, with the dot)."""
    from PIL import Image

    return tuple(sorted(ext.lower() for ext in Image.registered_extensions()))


class _Collector:
    def __init__(self, max_images: int, option: str):
        self.inputs = ImageInputs()
        self.seen: set[str] = set()
        self.walked: set[str] = set()  # real paths of the folders walked
        self.max_images = max_images
        self.option = option
        self.extensions = image_extensions()

    def add(self, path: str) -> None:
        key = os.path.normpath(path)
        if key in self.seen:
            return
        if len(self.inputs.paths) >= self.max_images:
            raise ValueError(f"more than {self.max_images:,} images given: pass {self.option} N to take more")
        self.seen.add(key)
        self.inputs.paths.append(path)

    def is_image_name(self, path: str) -> bool:
        return path.lower().endswith(self.extensions)

    def warn(self, message: str) -> None:
        self.inputs.warnings.append(message)

    def warn_skipped(self, where: str, skipped: list[str]) -> None:
        if skipped:
            named = ", ".join(f"'{path}'" for path in skipped[:_NAMED])
            more = f" and {len(skipped) - _NAMED} more" if len(skipped) > _NAMED else ""
            self.warn(f"skipped {len(skipped)} file(s) in '{where}' that are not images (by extension): {named}{more}")

    def walk(self, folder: str, chain: tuple[str, ...], skipped: list[str]) -> None:
        """Add the images below ``folder``; ``chain``: the real folders the walk is inside (``folder``'s included)."""
        if len(chain) > MAX_DEPTH:
            self.warn(f"'{folder}' is more than {MAX_DEPTH} folders deep: not listed")
            return
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            self.warn(f"cannot list folder '{folder}': {error.strerror or error}: skipped")
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if _is_dir(entry):
                real = os.path.realpath(entry.path)
                if real in chain:
                    self.warn(f"'{entry.path}' links back to '{real}', a folder being listed (a loop): not followed")
                elif real in self.walked:
                    self.warn(f"'{entry.path}' leads to '{real}', a folder already listed: not listed again")
                else:
                    self.walked.add(real)
                    self.walk(entry.path, (*chain, real), skipped)
            elif self.is_image_name(entry.name):
                self.add(entry.path)
            else:
                skipped.append(entry.path)

    def take_folder(self, folder: str) -> None:
        real = os.path.realpath(folder)
        if real in self.walked:
            return
        self.walked.add(real)
        skipped: list[str] = []
        self.walk(folder, (real,), skipped)
        self.warn_skipped(folder, skipped)


def _is_dir(entry: os.DirEntry) -> bool:
    """``entry.is_dir()``, links followed; a link that never ends (ELOOP) is not a folder (the loader names it)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def expand_images(arguments: list[str], max_images: int = 100_000, option: str = "--max-images") -> ImageInputs:
    """The image paths of ``arguments`` (files, folders, globs; see the module), in order, each once.

    ValueError when none is found (naming the arguments), or more than ``max_images`` (naming ``option``)."""
    collector = _Collector(max_images, option)
    literal_files = 0
    for argument in arguments:
        if os.path.lexists(argument) or not glob.has_magic(argument):
            if os.path.isdir(argument):
                collector.take_folder(argument)
            else:
                collector.add(argument)  # named by the user: taken as is (a missing one is named when read)
                literal_files += 1
            continue
        matches = sorted(itertools.islice(glob.iglob(argument), max_images + 1))
        if not matches:
            collector.warn(f"'{argument}' matches no file")
        skipped = []
        for path in matches:
            if os.path.isdir(path):
                collector.take_folder(path)
            elif collector.is_image_name(path):
                collector.add(path)
            else:
                skipped.append(path)
        collector.warn_skipped(argument, skipped)
    inputs = collector.inputs
    if not inputs.paths:
        given = ", ".join(f"'{argument}'" for argument in arguments[:_NAMED])
        why = f" ({'; '.join(inputs.warnings[:_NAMED])})" if inputs.warnings else ""
        raise ValueError(
            f"no images in {given}{' ...' if len(arguments) > _NAMED else ''}{why}: give image files, folders holding "
            "images, or quoted globs such as 'imgs/*.png'"
        )
    inputs.single_file = len(arguments) == 1 and literal_files == 1
    return inputs
