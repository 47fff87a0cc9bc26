"""A look at an ImageNet-layout dataset before training on it (``linvit check-data ROOT``).

:func:`check_image_folder` lists the splits (``train``, ``val``, ``test``; a root without them is one split) the
way :class:`~linvit.train.data.image_folder.TolerantImageFolder` does, decodes every image the way training does,
and reports:

- images per class and split, and classes missing from a split;
- files training would skip (``data.bad_files=skip``) or stop on (``error``), with the reason: not decodable, not a
  regular file (a FIFO is never opened), over the size limits (``--max-pixels``, ``--max-aspect``), float pixels that
  are NaN/Inf (all read by :mod:`linvit.io.images`, as training reads them);
- a split of a single class (training needs two);
- a split whose largest class has more than ``max_imbalance`` (10) times the images of its smallest: a model trained
  on it sees the large class that much more often and learns to favour it;
- the same bytes in more than one split (a test image also trained on) or under more than one class;
- symlinks followed out of their class folder, and trees training refuses (symlink loops);
- sizes (width, height) and PIL modes and formats per split.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from linvit.io.images import ImageInputError, ImageLimits, image_sha256
from linvit.train.data.folder_scan import FolderLayoutError, scan_split
from linvit.train.data.image_folder import PilLoader, ReadableByPil

SPLITS = ("train", "val", "test")
_MAX_LISTED = 20
_CHUNK = 1024  # files decoded per batch of thread-pool work (bounded memory on large datasets)
DEFAULT_MAX_IMBALANCE = 10.0  # the largest class over the smallest of a split, past which check-data flags it


@dataclass
class ImageFacts:
    """One file as training reads it: content digest, PIL format, mode and size, or why it cannot be read."""

    path: str
    digest: str | None = None
    format: str | None = None
    mode: str | None = None
    size: tuple[int, int] | None = None
    error: str | None = None


def inspect_image(path: str, loader: PilLoader | None = None) -> ImageFacts:
    """``path``'s SHA-256, then the file decoded as training does (its limits: ``loader.limits``); any exception
    makes it unreadable."""
    loader = loader or PilLoader("RGB")
    facts = ImageFacts(path)

    def convert(image):  # the facts of the header, then the conversion training does
        facts.format, facts.mode, facts.size = image.format, image.mode, image.size
        return loader.convert(image)

    try:
        facts.digest = image_sha256(path)
        loader.decode(path, convert)
    except ImageInputError as error:  # names the file and what to do
        return ImageFacts(path, error=str(error))
    except Exception as error:  # noqa: BLE001 - whatever the decoder raises, training would skip or stop on it
        return ImageFacts(path, error=f"{type(error).__name__}: {error}")
    return facts


@dataclass
class SplitCheck:
    """What one split holds; ``layout_error`` when training refuses to list it (then nothing else is filled)."""

    name: str
    folder: str
    counts: dict[str, int] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # path -> class
    links_out: list[tuple[str, str]] = field(default_factory=list)
    images: list[ImageFacts] = field(default_factory=list)
    layout_error: str | None = None

    @property
    def unreadable(self) -> list[ImageFacts]:
        return [facts for facts in self.images if facts.error is not None]


@dataclass
class DataCheck:
    """The report of :func:`check_image_folder`; :meth:`problems` is empty for data fit to train on."""

    root: str
    splits: list[SplitCheck]
    max_imbalance: float = DEFAULT_MAX_IMBALANCE

    def _groups(self) -> list[list[tuple[SplitCheck, str]]]:
        """(split, path) of every content digest found more than once."""
        by_digest: dict[str, list[tuple[SplitCheck, str]]] = defaultdict(list)
        for split in self.splits:
            for facts in split.images:
                if facts.digest is not None:
                    by_digest[facts.digest].append((split, facts.path))
        return [group for group in by_digest.values() if len(group) > 1]

    def duplicates_across_splits(self) -> list[list[str]]:
        """Paths of each image whose bytes are in more than one split."""
        return [[path for _, path in group] for group in self._groups() if len({s.name for s, _ in group}) > 1]

    def duplicates_across_classes(self) -> list[list[str]]:
        """Paths of each image whose bytes are under more than one class of one split (two labels)."""
        found = []
        for group in self._groups():
            by_split: dict[str, list[tuple[SplitCheck, str]]] = defaultdict(list)
            for split, path in group:
                by_split[split.name].append((split, path))
            for members in by_split.values():
                if len({split.labels[path] for split, path in members}) > 1:
                    found.append([path for _, path in members])
        return found

    def missing_classes(self) -> dict[str, list[str]]:
        """Per split, the classes other splits have and it lacks (training refuses such splits)."""
        listed = [split for split in self.splits if split.layout_error is None]
        every = set().union(*(split.counts for split in listed)) if listed else set()
        return {split.name: sorted(every - set(split.counts)) for split in listed if every - set(split.counts)}

    def class_imbalance(self) -> dict[str, tuple[float, tuple[str, int], tuple[str, int]]]:
        """Per split whose largest class has more than ``max_imbalance`` times the images of its smallest (empty
        classes aside: they are a problem of their own): (ratio, (largest class, images), (smallest, images))."""
        found = {}
        for split in self.splits:
            counted = [(count, name) for name, count in split.counts.items() if count > 0]
            if len(counted) < 2:
                continue
            (small, small_name), (large, large_name) = min(counted), max(counted)
            if large > self.max_imbalance * small:
                found[split.name] = (large / small, (large_name, large), (small_name, small))
        return found

    def problems(self) -> list[str]:
        """One line per kind of problem that makes training refuse the data, skip files or mislead."""
        problems = [f"{split.name}: {split.layout_error}" for split in self.splits if split.layout_error]
        problems += [f"{name} lacks the class(es) {', '.join(names)}" for name, names in self.missing_classes().items()]
        for split in self.splits:
            empty = [name for name, count in split.counts.items() if count == 0]
            if empty:
                problems.append(f"{split.name}: empty class folder(s) {', '.join(empty)}")
        for split in self.splits:
            if split.layout_error is None and len(split.counts) == 1:
                problems.append(
                    f"{split.name}: one class folder ({next(iter(split.counts))}), training needs two or more"
                )
        for name, (ratio, (large, _), (small, _)) in self.class_imbalance().items():
            problems.append(f"{name}: classes out of balance {ratio:.3g}:1 ({large} over {small})")
        unreadable = sum(len(split.unreadable) for split in self.splits)
        if unreadable:
            problems.append(f"{unreadable} unreadable file(s)")
        if self.duplicates_across_splits():
            problems.append(f"{len(self.duplicates_across_splits())} image(s) in more than one split")
        if self.duplicates_across_classes():
            problems.append(f"{len(self.duplicates_across_classes())} image(s) under more than one class")
        return problems

    def format(self) -> str:
        """The report as text for the console (paths relative to the root)."""
        return "\n".join(_format(self))


def _class_folders(folder: str) -> list[str]:
    """The class folders of a split, as torchvision's ImageFolder finds them (every sub-folder, sorted)."""
    from torchvision.datasets.folder import find_classes

    return find_classes(folder)[0]


def _splits(root: str) -> list[tuple[str, str]]:
    named = [(name, os.path.join(root, name)) for name in SPLITS if os.path.isdir(os.path.join(root, name))]
    return named or [("all", root)]


def check_image_folder(
    root: str | os.PathLike,
    workers: int = 1,
    progress: Callable[[Iterable[ImageFacts], int], Iterable[ImageFacts]] | None = None,
    limits: ImageLimits | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
) -> DataCheck:
    """Check an ImageNet-layout dataset at ``root``; ``workers`` threads decode images (PIL releases the GIL).

    ``progress(iterable, total)`` wraps the stream of decoded images (e.g. ``tqdm``); ``limits`` bound the images
    decoded (default: training's, :func:`~linvit.train.data.image_folder.data_image_limits`); a split whose
    largest class has more than ``max_imbalance`` times the images of its smallest is a problem.
    """
    root = str(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} is not a folder: give the dataset root (holding train/<class>/<images>).")
    report = DataCheck(root, [], max_imbalance)
    is_image = ReadableByPil()
    for name, folder in _splits(root):
        split = SplitCheck(name, folder)
        report.splits.append(split)
        try:
            scan = scan_split(folder, _class_folders(folder), is_image)
        except (FolderLayoutError, FileNotFoundError) as error:
            split.layout_error = str(error)
            continue
        split.counts, split.links_out = scan.counts(), scan.links_out
        split.labels = {path: scan.classes[index] for path, index in scan.samples}
    paths = [path for split in report.splits for path in split.labels]
    inspect = partial(inspect_image, loader=PilLoader("RGB", limits))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        stream = (
            facts
            for start in range(0, len(paths), _CHUNK)
            for facts in pool.map(inspect, paths[start : start + _CHUNK])
        )
        facts_by_path = {facts.path: facts for facts in (progress(stream, len(paths)) if progress else stream)}
    for split in report.splits:
        split.images = [facts_by_path[path] for path in split.labels]
    return report


# -- the text report ---------------------------------------------------------------------------------------------
def _format(report: DataCheck) -> Iterable[str]:
    def short(path: str) -> str:
        return os.path.relpath(path, report.root)

    listed = [split for split in report.splits if split.layout_error is None]
    yield f"dataset {report.root}"
    if listed:
        classes = sorted(set().union(*(split.counts for split in listed)))
        width = max(len("class"), len("total"), *(len(name) for name in classes))
        yield ""
        yield "images per class and split:"
        yield "  " + "class".ljust(width) + "".join(f"{split.name:>9}" for split in listed)
        for name in classes:
            yield "  " + name.ljust(width) + "".join(f"{split.counts.get(name, '-'):>9}" for split in listed)
        yield "  " + "total".ljust(width) + "".join(f"{sum(split.counts.values()):>9}" for split in listed)
    yield ""
    for split in report.splits:
        yield from _split_lines(split)
    yield from _listed(
        "unreadable files, skipped in training (data.bad_files=error stops on them)",
        [f"{short(f.path)}: {f.error}" for s in report.splits for f in s.unreadable],
    )
    yield from _listed(
        "the same image in more than one split",
        [" = ".join(short(p) for p in group) for group in report.duplicates_across_splits()],
    )
    yield from _listed(
        "the same image under more than one class",
        [" = ".join(short(p) for p in group) for group in report.duplicates_across_classes()],
    )
    yield from _listed(
        f"classes out of balance (largest over smallest past {report.max_imbalance:g}:1): training sees the large "
        "class that many times as often and learns to favour it; add images of the small class(es), or sample the "
        "classes evenly (e.g. a class-balanced sampler)",
        [
            f"{name}: {ratio:.3g}:1, {large} {large_count} images, {small} {small_count}"
            for name, (ratio, (large, large_count), (small, small_count)) in report.class_imbalance().items()
        ],
    )
    yield from _listed(
        "symlinks followed out of their class folder (their images take that folder's label)",
        [f"{short(link)} -> {target}" for s in report.splits for link, target in s.links_out],
    )
    problems = report.problems()
    yield ""
    yield ("problems: " + "; ".join(problems)) if problems else "no problems found"


def _split_lines(split: SplitCheck) -> Iterable[str]:
    if split.layout_error:
        yield f"{split.name}: cannot be listed: {split.layout_error}"
        return
    readable = [facts for facts in split.images if facts.error is None]
    line = f"{split.name}: {len(split.images)} images in {len(split.counts)} classes"
    if readable:
        widths = [facts.size[0] for facts in readable]
        heights = [facts.size[1] for facts in readable]
        line += (
            f"; width {min(widths)}-{max(widths)} (median {statistics.median(widths):g}),"
            f" height {min(heights)}-{max(heights)} (median {statistics.median(heights):g})"
        )
        line += "; modes " + _counted(facts.mode for facts in readable)
        line += "; formats " + _counted(facts.format for facts in readable)
    yield line


def _counted(values: Iterable[str | None]) -> str:
    return ", ".join(f"{value} {count}" for value, count in Counter(values).most_common())


def _listed(title: str, lines: list[str]) -> Iterable[str]:
    if not lines:
        return
    yield ""
    yield f"{title} ({len(lines)}):"
    yield from (f"  {line}" for line in lines[:_MAX_LISTED])
    if len(lines) > _MAX_LISTED:
        yield f"  ... and {len(lines) - _MAX_LISTED} more"
