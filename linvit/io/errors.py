"""The errors of checkpoint I/O: a file that cannot be read, and one that reading safely refuses."""

from __future__ import annotations

__all__ = ["CheckpointError", "UntrustedCheckpointError", "UntrustedConfigError", "short_message"]


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, or holds no recognisable state dict."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint names Python objects that loading it safely cannot rebuild (it would have to run code)."""


class UntrustedConfigError(ValueError):
    """A saved config asks to build or set something outside linvit's allow-lists (nothing from it was run)."""


def short_message(error: BaseException, limit: int = 160) -> str:
    """A loader's own message, short: its first sentence or line (PyTorch's zip errors run to a paragraph)."""
    line = str(error).strip().split("\n")[0].split(". ")[0]
    return line if len(line) <= limit else line[:limit] + "..."
