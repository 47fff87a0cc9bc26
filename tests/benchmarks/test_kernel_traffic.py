"""The bytes and tensor-core FLOPs of the cost figure (linvit.bench.kernel_traffic, cost_model): the rules on SASS
opcodes and listings, and kernels compiled for sm_90 whose traffic is known by hand (a copy, a tl.dot).

Compiling needs Triton's ptxas/nvdisasm (in its wheel), not a GPU; it runs in a child process because the test session
runs Triton's interpreter, under which kernels cannot be compiled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from linvit.bench.cost_model import Prediction, autotune_space, fastest, predict_kernel, slowest
from linvit.bench.kernel_cost import KernelCost, find_loops, instruction_weights, parse_sass
from linvit.bench.kernel_traffic import Traffic, count_traffic, memory_bytes, mma_flops

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


@pytest.mark.parametrize(
    ("opcode", "kind", "size"),
    [
        ("LDG.E.128", "global", 32 * 16),
        ("LDG.E", "global", 32 * 4),
        ("LDG.E.64.CONSTANT", "global", 32 * 8),
        ("STG.E.U16", "global", 32 * 2),
        ("LDG.E.S8", "global", 32 * 1),
        ("LDGSTS.E.BYPASS.LTC128B.128", "global", 32 * 16),  # LTC128B is an L2 hint, not a width
        ("RED.E.ADD.F32.FTZ.RN.STRONG.GPU", "global", 2 * 32 * 4),  # read and written at L2
        ("STL.64", "local", 32 * 8),
        ("LDL.LU", "local", 32 * 4),
        ("UTMALDG.2D", "unsized", 0),
        ("LDGDEPBAR", "", 0),
        ("LDS.128", "", 0),
        ("LDSM.16.MT88.4", "", 0),
        ("LDC.64", "", 0),
        ("STS.128", "", 0),
    ],
)
def test_memory_bytes_follow_the_opcode_width(opcode, kind, size):
    assert memory_bytes(opcode) == (kind, size)


@pytest.mark.parametrize(
    ("opcode", "precision", "flops"),
    [
        ("HMMA.16816.F32.BF16", "16bit", 2 * 16 * 8 * 16),
        ("HMMA.16816.F32", "16bit", 2 * 16 * 8 * 16),
        ("HMMA.1688.F32.TF32", "tf32", 2 * 16 * 8 * 8),
        ("HGMMA.64x32x16.F32.BF16", "16bit", 2 * 64 * 32 * 16 / 4),  # one warpgroup's product, issued by its 4 warps
        ("HGMMA.64x64x8.F32.TF32", "tf32", 2 * 64 * 64 * 8 / 4),
        ("FFMA", "", 0),
        ("WARPGROUP.ARRIVE", "", 0),
    ],
)
def test_mma_flops_follow_the_instruction_shape(opcode, precision, flops):
    assert mma_flops(opcode) == (precision, flops)


LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0030*/              @!P1 BRA `(.L_x_1) ;
        /*0040*/              @P0 STG.E.U16 desc[UR4][R6.64], R3 ;
        /*0050*/                   EXIT ;
"""


def test_a_listing_s_traffic_is_weighted_by_its_loops():
    """A loop of 10 trips holding one 16-byte load and one wgmma; a 2-byte store after it (predicated: every lane
    counts)."""
    instructions, labels = parse_sass(LISTING)
    assert [i.opcode for i in instructions][2] == "HGMMA.64x32x16.F32.BF16"  # the lower-case x belongs to the opcode
    loops = find_loops(instructions, labels)
    traffic = count_traffic([i.opcode for i in instructions], instruction_weights(instructions, loops, (10,)))
    assert traffic.global_bytes == 10 * 32 * 16 + 32 * 2
    assert traffic.flops_16bit == 10 * 2 * 64 * 32 * 16 / 4
    assert traffic.flops_tf32 == 0 and traffic.local_bytes == 0


def _cost(instructions=0.0, spill=0, shared=0, traffic=None):
    return KernelCost(128, spill, shared, 256, 4, 2, instructions, {}, traffic or Traffic())


def test_a_launch_takes_the_largest_of_issue_hbm_and_tensor_time():
    one_ms_of_issue = 132 * 4 * 1.98e9 * 1e-3  # warp-instructions: 132 SMs × 4 schedulers × 1.98 GHz for 1 ms
    issue_bound = predict_kernel(_cost(one_ms_of_issue, traffic=Traffic(global_bytes=1e6)))
    assert issue_bound.bound == "issue" and issue_bound.ms == pytest.approx(1.0)
    hbm_bound = predict_kernel(_cost(1.0, traffic=Traffic(global_bytes=4.8e9, local_bytes=4.8e9)))
    assert hbm_bound.bound == "hbm" and hbm_bound.ms == pytest.approx(2.0)  # spills count against HBM
    tensor = predict_kernel(_cost(1.0, traffic=Traffic(flops_16bit=989e9, flops_tf32=494e9)))
    assert tensor.bound == "tensor" and tensor.ms == pytest.approx(2.0)  # tf32 at half the rate
    assert Prediction(1.0, 2.0, 3.0).as_dict()["ms"] == 3.0


def test_best_and_worst_configurations_by_predicted_time():
    """The best: the fastest spill-free one that launches; the worst: the slowest in the autotune space, which the
    run-time pruning (`triton_precompile.spill_free`) leaves without the spilling ones where any does not spill."""
    costs = [
        ((16, 4, 1), _cost(3e9)),
        ((32, 4, 1), _cost(1e9, spill=64)),
        ((64, 4, 1), _cost(2e9)),
        ((32, 4, 2), _cost(9e9, shared=540 * 1024)),  # cannot launch
        ((16, 8, 1), _cost(1e9, spill=8, traffic=Traffic(local_bytes=4.8e10))),  # 10 ms of spills' traffic: pruned
    ]
    assert fastest(costs)[0] == (64, 4, 1)
    assert [config for config, _ in autotune_space(costs)] == [(16, 4, 1), (64, 4, 1)]
    assert slowest(costs)[0] == (16, 4, 1)
    every_one_spills = [((16, 4, 1), _cost(3e9, spill=16)), ((32, 4, 1), _cost(1e9, spill=64))]
    assert [config for config, _ in autotune_space(every_one_spills)] == [(16, 4, 1)]  # the least spilling


_COMPILED = textwrap.dedent(
    """
    import json, os
    os.environ.pop("TRITON_INTERPRET", None)
    import triton, triton.language as tl
    from linvit.bench.kernel_cost import kernel_cost

    @triton.jit
    def copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets))

    @triton.jit
    def matmul(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, PRECISION: tl.constexpr):
        rows, cols, inner = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        a = tl.load(a_ptr + rows[:, None] * K + inner[None, :])
        b = tl.load(b_ptr + inner[:, None] * N + cols[None, :])
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.dot(a, b, input_precision=PRECISION))

    class Pointer:
        def __init__(self, dtype):
            self.dtype = dtype

    results = {}
    f32, bf16 = Pointer("torch.float32"), Pointer("torch.bfloat16")
    cost = kernel_cost(copy, {"x_ptr": f32, "y_ptr": f32}, {"BLOCK": 1024}, (64,), (), num_warps=4)
    results["copy"] = cost.traffic.__dict__
    for name, operand in (("bf16", bf16), ("tf32", f32)):
        args = {"a_ptr": operand, "b_ptr": operand, "c_ptr": f32}
        constants = {"M": 64, "N": 64, "K": 64, "PRECISION": "tf32" if name == "tf32" else "ieee"}
        results[name] = kernel_cost(matmul, args, constants, (1,), (), num_warps=4).traffic.__dict__
    print(json.dumps(results))
    """
)


@pytest.mark.slow  # three compiles for sm_90 in a child process: 10-40 s on shared cores
@needs_triton
def test_compiled_kernels_move_and_multiply_what_they_should(tmp_path):
    """A copy of 64 × 1024 fp32 reads and writes each element once: 2 × N × 4 bytes. A 64×64×64 tl.dot does 2·M·N·K
    FLOPs on bf16 operands (16-bit peak) or fp32 ones in tf32, and moves its operands and its fp32 result once."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    script = tmp_path / "count_traffic.py"  # @triton.jit reads its function's source file
    script.write_text(_COMPILED)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["copy"]["global_bytes"] == 2 * 64 * 1024 * 4
    assert results["copy"]["local_bytes"] == 0 and results["copy"]["flops_16bit"] == 0
    assert results["bf16"]["flops_16bit"] == 2 * 64 * 64 * 64 and results["bf16"]["flops_tf32"] == 0
    assert results["bf16"]["global_bytes"] == 2 * 64 * 64 * 2 + 64 * 64 * 4
    assert results["tf32"]["flops_tf32"] == 2 * 64 * 64 * 64 and results["tf32"]["flops_16bit"] == 0
    assert results["tf32"]["global_bytes"] == 3 * 64 * 64 * 4
