"""Progress of the long commands (``linvit models``, ``export``, ``convert``, ``bench``, ``memory --measure``).

Progress goes to stderr, never stdout (a command's stdout is its result, its ``--json`` the data alone): a tqdm bar
over items when stderr is a terminal, one plain line per step or item otherwise (a log file, a CI job), each with the
seconds since the command started; nothing at all when disabled (the commands' ``--no-progress``). A progress line
starts with ``[linvit COMMAND`` (:func:`is_progress_line`), so that it never reads as a command's one ``error:`` line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["Progress", "is_progress_line"]

Item = TypeVar("Item")
MARK = "[linvit "


def is_progress_line(line: str) -> bool:
    """Whether ``line`` of a command's stderr is a progress line (``[linvit models 3/40] linvit_tiny (12 s)``)."""
    return line.startswith(MARK)


class Progress:
    """The progress of the command ``linvit COMMAND``, as ``[linvit COMMAND i/n] message (N s)`` lines on stderr.

    ``enabled=False`` reports nothing; ``bar`` (default: whether stderr is a terminal) shows :meth:`items` as a tqdm
    bar instead of one line per item.
    """

    def __init__(self, command: str, enabled: bool = True, bar: bool | None = None):
        self.command = command
        self.enabled = enabled
        self.bar = bar
        self._started = time.monotonic()

    def step(self, message: str, position: tuple[int, int | None] | None = None) -> None:
        """Say what starts now (before the work, so that a step of minutes is named while it runs); ``position``:
        (i, n) for step i of n."""
        if self.enabled:
            where = f" {position[0]}/{'?' if position[1] is None else position[1]}" if position else ""
            elapsed = time.monotonic() - self._started
            sys.stderr.write(f"{MARK}{self.command}{where}] {message} ({elapsed:.0f} s)\n")
            sys.stderr.flush()

    def items(
        self, items: Iterable[Item], total: int | None = None, describe: Callable[[Item], str] = str
    ) -> Iterator[Item]:
        """Each of ``items``, announced before its work as step i of ``total`` (a bar on a terminal)."""
        if total is None and hasattr(items, "__len__"):
            total = len(items)
        if not self.enabled:
            yield from items
            return
        if self.bar if self.bar is not None else sys.stderr.isatty():
            from tqdm import tqdm

            with tqdm(items, total=total, desc=f"linvit {self.command}", file=sys.stderr, leave=False) as bar:
                for item in bar:
                    bar.set_postfix_str(describe(item), refresh=True)
                    yield item
            return
        for index, item in enumerate(items, start=1):
            self.step(describe(item), (index, total))
            yield item
