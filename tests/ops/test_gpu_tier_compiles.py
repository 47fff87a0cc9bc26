"""The GPU test tier's kernels compile for sm_90 in the tile configurations it pins, and the rows kernels at every
head count and DWC size they stream, checked without a GPU.

A GPU is lent rarely and briefly; a kernel that fails to compile there for one dtype or head size, or a pinned
configuration that asks more shared memory than a program may have, would cost that time. Triton ships ptxas, so the
compile runs here (`_gpu_tier_compiles.py`, `_rows_kernels_compile.py`, each in a process of its own: this session
runs the interpreter).
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


def _compiled_in_a_process_of_its_own(script: str) -> dict:
    """The JSON line that a compile script of this folder prints last, run where no interpreter is set."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script))],
        capture_output=True,
        text=True,
        env=environment,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@needs_triton
def test_every_kernel_of_the_gpu_tier_compiles_for_sm90_in_its_pinned_configuration():
    result = _compiled_in_a_process_of_its_own("_gpu_tier_compiles.py")
    assert result["failures"] == []
    assert result["compiled"] >= 60  # the small cases' forward and backward kernels in bf16, fp16 and fp32


@pytest.mark.slow
@needs_triton
def test_the_rows_kernels_compile_for_sm90_at_every_head_count_and_dwc_size():
    """The rows kernels (`_rows_kernels_compile.py`) at every head count, head dim and DWC size they stream. Triton
    3.8 fails to compile (an assertion in a pass, a RuntimeError at the first launch) a gather from a tile smaller
    than the program's threads: the rows kernels' halo of one head of 16 or 32 channels at DWC 3 (one of 16 at 5)
    was one, which only a compile shows."""
    result = _compiled_in_a_process_of_its_own("_rows_kernels_compile.py")
    assert result["failures"] == []
    assert len(result["compiled"]) == 5 * 2 * 3 * 3  # heads × head dims × DWC sizes × the three rows kernels
    # none spills up to DWC 5; at 7 (a ring of 7 accumulators) the conv kernels do (80-472 B by the cost figure on
    # 2026-12-05), the weight's gradient at most 32 B
    assert [case for case in result["compiled"] if case["kernel_size"] <= 5 and case["spill"]] == []
    weight = [case for case in result["compiled"] if "dwc_weight_rows" in case["case"]]
    assert all(case["spill"] <= 32 for case in weight)
