"""Compile the rows kernels (`triton_rows.py`, `triton_rows_backward.py`) for sm_90, without a GPU, at every head
count and head dim they stream (16-bit, head dims up to 32) and DWC sizes 3, 5 and 7, as the plans launch them at a
256² map of 8 images, and print one JSON line: the compiled launches and each one's spill, and each failure.

Run as a script in a process of its own (`test_gpu_tier_compiles.py`): the test session runs Triton's interpreter,
under which nothing compiles.
"""

from __future__ import annotations

import json
import os

os.environ.pop("TRITON_INTERPRET", None)

from linvit.bench.kernel_cost import kernel_cost  # noqa: E402
from linvit.bench.kernel_resources import Shape, plans  # noqa: E402

ROWS = ("output_rows", "value_conv_rows", "dwc_weight_rows")
HEADS = (1, 2, 3, 4, 8)
HEAD_DIMS = (16, 32)
KERNEL_SIZES = (3, 5, 7)

compiled, failures = [], []
for heads in HEADS:
    for head_dim in HEAD_DIMS:
        for kernel_size in KERNEL_SIZES:
            shape = Shape(f"{heads}x{head_dim} k{kernel_size}", 8, heads, head_dim, (256, 256), kernel_size=kernel_size)
            forward, backward = plans(shape)
            for launch in forward + backward:
                if launch.name not in ROWS:
                    continue
                where = f"{shape.name} {launch.name}"
                try:
                    cost = kernel_cost(launch.kernel, dict(launch.args), dict(launch.constants), launch.grid,
                                       launch.loops(0), launch.num_warps)  # fmt: skip
                except Exception as error:  # noqa: BLE001 - every compile error is a finding
                    failures.append(f"{where}: {type(error).__name__}: {str(error)[-300:]}")
                    continue
                compiled.append({"case": where, "kernel_size": kernel_size, "spill": cost.spill_bytes})
print(json.dumps({"compiled": compiled, "failures": failures}))
