"""Listing the images of an ImageNet-layout split (``<split>/<class>/**/<image>``) without trusting its symlinks.

torchvision's ``ImageFolder`` walks class folders with ``os.walk(followlinks=True)``: a link to the folder itself
or to a parent (``cat/loop -> .``, ``dog/up -> ..``) makes the walk go round until the path is too long, and
every round adds the same images again, many of them under the wrong label. :func:`scan_split` walks the same
way and in the same order, but

- refuses a symlink loop (a link to a folder the walk is already inside, or links that point at each other and
  never reach anything: ``ELOOP``), naming the link;
- refuses a link into another class folder of the split (its images would carry two labels), and class folders
  that are the same folder or inside one another;
- follows any other link out of the class folder, and lists it in :attr:`SplitScan.links_out` so that the
  caller says so.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from linvit.io.errors import OneLineError


class FolderLayoutError(OneLineError):
    """The folder tree cannot be read as one label per class folder (a symlink loop, a class reached twice), or holds
    fewer than the two classes a classifier needs."""


@dataclass
class SplitScan:
    """What :func:`scan_split` found: ``samples`` as (path, class index) in torchvision's order."""

    classes: list[str]
    samples: list[tuple[str, int]] = field(default_factory=list)
    links_out: list[tuple[str, str]] = field(default_factory=list)  # (link, the real path it leads to)

    def counts(self) -> dict[str, int]:
        """Images per class, every class listed (0 for an empty one)."""
        counts = dict.fromkeys(self.classes, 0)
        for _, index in self.samples:
            counts[self.classes[index]] += 1
        return counts


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it (both real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def scan_split(split_dir: str, classes: list[str], is_valid_file: Callable[[str], bool]) -> SplitScan:
    """The files ``is_valid_file`` accepts under each ``split_dir/<class>`` (class index = position in ``classes``).

    Raises :class:`FolderLayoutError` for symlink loops, links into another class folder, and class folders that
    are the same folder (or one inside another).
    """
    class_dirs = [os.path.join(split_dir, name) for name in classes]
    real_dirs = [os.path.realpath(path) for path in class_dirs]
    for i, (path, real) in enumerate(zip(class_dirs, real_dirs)):
        for other_path, other_real in zip(class_dirs[i + 1 :], real_dirs[i + 1 :]):
            if _inside(real, other_real) or _inside(other_real, real):
                raise FolderLayoutError(
                    f"class folders {path} and {other_path} are the same folder or one holds the other "
                    f"({real}, {other_real}): their images would carry two labels. Give every class its own folder."
                )
    scan = SplitScan(classes=list(classes))
    for index, (class_dir, real_dir) in enumerate(zip(class_dirs, real_dirs)):
        other_classes = [(name, real) for name, real in zip(classes, real_dirs) if real != real_dir]
        files = _class_files(class_dir, real_dir, other_classes, is_valid_file, scan.links_out)
        scan.samples += [(path, index) for path in files]
    return scan


def _class_files(
    class_dir: str,
    class_real: str,
    other_classes: list[tuple[str, str]],
    is_valid_file: Callable[[str], bool],
    links_out: list[tuple[str, str]],
) -> list[str]:
    """The valid files below ``class_dir`` (sorted as torchvision sorts them); links out appended to ``links_out``."""
    found: list[tuple[str, str]] = []  # (folder, name): torchvision sorts os.walk's (folder, files) by folder

    def walk(folder: str, chain: list[str]) -> None:  # chain: the real folders walked into so far
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        for entry in entries:
            if entry.is_symlink():
                _check_link(entry, chain, class_real, other_classes, links_out)
            if _is_dir(entry):  # follows links, like os.walk(followlinks=True)
                walk(entry.path, [*chain, os.path.realpath(entry.path)])
            elif is_valid_file(entry.path):
                found.append((folder, entry.name))

    walk(class_dir, [class_real])
    return [os.path.join(folder, name) for folder, name in sorted(found)]


def _is_dir(entry: os.DirEntry) -> bool:
    """``entry.is_dir()`` (links followed); a link that never ends (ELOOP: links pointing at each other) refused."""
    try:
        return entry.is_dir()
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FolderLayoutError(
                f"symlink loop: {entry.path} -> {os.readlink(entry.path)} never reaches a file or folder (links that "
                "point at each other). Remove the link."
            ) from None
        return False  # not a folder the walk can enter; as a file, the image loader names what is wrong with it


def _check_link(
    entry: os.DirEntry,
    chain: list[str],
    class_real: str,
    other_classes: list[tuple[str, str]],
    links_out: list[tuple[str, str]],
) -> None:
    """Refuse a link that loops or leads into another class folder; note one that leads out of its class folder."""
    target = os.path.realpath(entry.path)
    if _is_dir(entry) and any(_inside(walked, target) for walked in chain):
        raise FolderLayoutError(
            f"symlink loop: {entry.path} -> {os.readlink(entry.path)} leads back to {target}, a folder the walk is "
            "already inside, so its images would be listed again and again. Remove the link."
        )
    for name, other in other_classes:
        if _inside(target, other):
            raise FolderLayoutError(
                f"{entry.path} links into the class folder {name!r} ({target}): its images would carry two labels. "
                "Remove the link or move the images into one class folder."
            )
    if not _inside(target, class_real):
        links_out.append((entry.path, target))
