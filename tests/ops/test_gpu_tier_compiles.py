"""The GPU test tier's kernels compile for sm_90 in the tile configurations it pins, checked without a GPU.

A GPU is lent rarely and briefly; a kernel that fails to compile there for one dtype or head size, or a pinned
configuration that asks more shared memory than a program may have, would cost that time. Triton ships ptxas, so the
compile runs here (`_gpu_tier_compiles.py`, in a process of its own: this session runs the interpreter).
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
def test_every_kernel_of_the_gpu_tier_compiles_for_sm90_in_its_pinned_configuration():
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_gpu_tier_compiles.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=840, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failures"] == []
    assert result["compiled"] >= 60  # the small cases' forward and backward kernels in bf16, fp16 and fp32
