"""The lower rooms import only the rooms below them: ops <- attention <- layers <- models (README, Architecture)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "linvit"

# each room and the linvit rooms its modules may import (itself included)
ALLOWED = {
    "ops": {"ops"},
    "attention": {"attention", "ops"},
    "layers": {"layers", "attention", "ops"},
    "models": {"models", "layers", "attention", "ops"},
}
# what no room below training may import
TRAINING_ONLY = ("lightning", "hydra", "omegaconf")


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names), anywhere in it (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_rooms_import_only_the_rooms_below(room):
    wrong = []
    for path in sorted((PACKAGE / room).rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "linvit" and (len(parts) < 2 or parts[1] not in ALLOWED[room]):
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
            if parts[0] in TRAINING_ONLY:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == []
