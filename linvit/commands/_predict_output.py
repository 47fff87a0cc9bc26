"""What ``linvit predict`` writes: the top-k of each image as text, CSV or JSON, and its progress on stderr."""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Any, TextIO

# (class index, probability, label or None), best first
Ranking = list[tuple[int, float, Any]]
FORMATS = ("text", "csv", "json")


def ranking_lines(results: Ranking, indent: str = "") -> list[str]:
    """``1.  45.00%  class 3  cat`` per class, best first (the label when known)."""
    width = max(len(str(index)) for index, _, _ in results)
    lines = []
    for rank, (index, probability, label) in enumerate(results, 1):
        text = f"{indent}{rank}. {probability * 100:6.2f}%  class {index:>{width}d}"
        lines.append(f"{text}  {label}" if label else text)
    return lines


def render(rows: list[tuple[str, Ranking]], form: str, single: bool) -> str:
    """The predictions of ``rows`` (path, ranking) as ``form``: text (one image: its ranking alone, as ever; several:
    each path followed by its ranking), CSV (a header, then one row per image: path, then class, label and
    probability of each rank) or JSON (a list of one record per image, each on its own line)."""
    if form == "text":
        if single:
            return "\n".join(ranking_lines(rows[0][1])) + "\n"
        return "".join(f"{path}\n" + "\n".join(ranking_lines(results, "  ")) + "\n" for path, results in rows)
    if form == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        ranks = max((len(results) for _, results in rows), default=0)
        header = ["path"]
        for rank in range(1, ranks + 1):
            header += [f"class_{rank}", f"label_{rank}", f"probability_{rank}"]
        writer.writerow(header)
        for path, results in rows:
            cells: list[Any] = [path]
            for index, probability, label in results:
                cells += [index, "" if label is None else label, repr(probability)]
            writer.writerow(cells)
        return buffer.getvalue()
    if form == "json":
        records = [
            json.dumps(
                {
                    "path": path,
                    "top": [{"class": index, "label": label, "probability": p} for index, p, label in results],
                }
            )
            for path, results in rows
        ]
        return "[\n" + ",\n".join(f"  {record}" for record in records) + ("\n" if records else "") + "]\n"
    raise ValueError(f"unknown format {form!r}: one of {', '.join(FORMATS)}")


class Progress:
    """Images done out of ``total`` on stderr: a tqdm bar on a terminal, else a line at each tenth (no output when
    ``enabled`` is false)."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None):
        self.total, self.done, self.enabled = total, 0, enabled
        self.stream = stream or sys.stderr
        self.bar = None
        self.next_line = 0
        if enabled and self.stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm comes with timm's hub client; without it, lines
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, unit="image", file=self.stream, desc="predict")

    def update(self, count: int) -> None:
        self.done += count
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(count)
        elif self.done >= self.next_line or self.done == self.total:
            self.stream.write(f"predict: {self.done:,}/{self.total:,} images ({100 * self.done // self.total}%)\n")
            self.stream.flush()
            self.next_line = self.done + max(1, self.total // 10)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
