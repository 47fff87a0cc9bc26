"""The README's `linvit.ops` snippet runs as written (the process-wide backend is restored afterwards)."""

from __future__ import annotations

import re
from pathlib import Path

import linvit.ops

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_backend_snippet_runs_as_written():
    code = _python_block_after("### Fused kernels and backends")
    namespace: dict = {}
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        linvit.ops.set_backend("auto")
    assert namespace["y"].shape == (2, 63, 96)
    assert namespace["slow"].backend == "naive" and namespace["attention"].backend == "auto"
    assert linvit.ops.get_backend() == "auto"
