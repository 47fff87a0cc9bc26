"""The errors of checkpoint I/O: a file that cannot be read, and one that reading safely refuses."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "UntrustedCheckpointError",
    "UntrustedConfigError",
    "OneLineError",
    "one_line",
    "short_message",
]


def one_line(text: str) -> str:
    """``text`` as one printable line: each character that is not printable (a line or record separator, a control
    character: what a key or a file name from a hostile file may hold) written as its escape, ``\\x1e``."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


class OneLineError(ValueError):
    """An error whose message names what a file holds: printed as one line whatever the file's keys hold."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class CheckpointError(OneLineError):
    """A checkpoint file is missing, truncated, corrupt, or holds no recognisable state dict."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint names Python objects that loading it safely cannot rebuild (it would have to run code)."""


class UntrustedConfigError(OneLineError):
    """A saved config asks to build or set something outside linvit's allow-lists (nothing from it was run)."""


def short_message(error: BaseException, limit: int = 160) -> str:
    """A loader's own message, short: its first sentence or line (PyTorch's zip errors run to a paragraph)."""
    line = str(error).strip().split("\n")[0].split(". ")[0]
    return line if len(line) <= limit else line[:limit] + "..."
