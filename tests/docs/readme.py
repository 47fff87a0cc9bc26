"""The README as data for the tests: its code blocks, the commands in them, inline commands, and its tables."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"\s+#.*$")
_INLINE = re.compile(r"`((?:python train\.py|linvit) [^`]*)`")


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # where it starts in README.md (1-based), for messages


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def code_blocks(language: str, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``language`` (``bash``, ``python``, ``text``)."""
    text = readme_text() if text is None else text
    return [
        Block(match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1)
        for match in _FENCE.finditer(text)
        if match.group(1) == language
    ]


def shell_commands(text: str | None = None) -> list[str]:
    """Every command of the bash blocks, as written: continuation lines joined, trailing comments dropped."""
    commands = []
    for block in code_blocks("bash", text):
        joined = re.sub(r"\\\n\s*", "", block.text)
        for line in joined.splitlines():
            command = _COMMENT.sub("", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def inline_commands(text: str | None = None) -> list[str]:
    """``python train.py ...`` and ``linvit ...`` written inline in the prose (outside code blocks)."""
    text = readme_text() if text is None else text
    prose = _FENCE.sub("", text)
    return sorted({match.group(1).strip() for match in _INLINE.finditer(prose)})


def markdown_table(header_start: str, text: str | None = None) -> list[list[str]]:
    """The rows (cells stripped) of the table whose header line starts with ``header_start``; header first."""
    lines = (readme_text() if text is None else text).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if re.fullmatch(r"\|[-:| ]+\|", line.strip()):
            continue  # the alignment row
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows
