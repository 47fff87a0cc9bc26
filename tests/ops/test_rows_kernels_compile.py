"""The rows kernels compile for sm_90 at every head count, head dim and DWC size they stream, checked without a GPU.

Triton 3.8 fails to compile (an assertion in a pass, a RuntimeError at the first launch) a gather from a tile smaller
than the program's threads: the rows kernels' halo of one head of 16 or 32 channels at DWC 3 (one of 16 at 5) was
one, which only a compile shows (the interpreter never compiles). The compile runs in a process of its own
(`_rows_kernels_compile.py`), where no interpreter is set.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


@pytest.mark.slow
@needs_triton
def test_the_rows_kernels_compile_for_sm90_at_every_head_count_and_dwc_size():
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_rows_kernels_compile.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=840, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failures"] == []
    assert len(result["compiled"]) == 5 * 2 * 3 * 3  # heads × head dims × DWC sizes × the three rows kernels
    # none spills up to DWC 5; at 7 (a ring of 7 accumulators) the conv kernels do (80-472 B by the cost figure on
    # 2026-12-05), the weight's gradient at most 32 B
    assert [case for case in result["compiled"] if case["kernel_size"] <= 5 and case["spill"]] == []
    weight = [case for case in result["compiled"] if "dwc_weight_rows" in case["case"]]
    assert all(case["spill"] <= 32 for case in weight)
