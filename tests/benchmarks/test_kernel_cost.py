"""The GPU-free cost figure (linvit.bench.kernel_cost): the SASS counter on listings and kernels counted by hand.

Compiling for sm_90 needs Triton's ptxas/nvdisasm (shipped in its wheel), not a GPU; it runs in a child process
because the test session runs Triton's interpreter, under which kernels cannot be compiled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from linvit.bench.kernel_cost import (
    Loop,
    _global_loads,
    dynamic_count,
    find_loops,
    match_unrolling,
    parse_sass,
    ptx_loop_loads,
    resident_programs,
)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

# A listing in nvdisasm -c's format: 3 instructions, a loop of 4 (the branch back included), 2 more, EXIT, and the
# trap loop after EXIT with its padding, which never runs.
LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0030*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0040*/                   FADD R3, R3, R2 ;
        /*0050*/                   ISETP.GE.AND P1, PT, R5, R6, PT ;
        /*0060*/              @!P1 BRA `(.L_x_1) ;
.L_x_0:
        /*0070*/                   STG.E desc[UR4][R4.64], R3 ;
        /*0080*/                   MOV R7, R8 ;
        /*0090*/                   EXIT ;
.L_x_2:
        /*00a0*/                   BRA `(.L_x_2);
        /*00b0*/                   NOP;
"""


def test_counter_weights_a_loop_by_its_trip_count():
    instructions, labels = parse_sass(LISTING)
    loops = find_loops(instructions, labels)
    assert [(loop.start, loop.end) for loop in loops] == [(3, 6)]  # the trap loop after EXIT is one too: excluded
    total, by_opcode = dynamic_count(instructions, loops, (10,))
    # by hand: 3 before + 10 × 4 in the loop + 3 after (STG, MOV, EXIT); the trap branch is a loop of its own
    assert by_opcode["LDG"] == 10 and by_opcode["FADD"] == 10 and by_opcode["STG"] == 1
    assert total == 3 + 10 * 4 + 3 + 1  # + the trap BRA, weighted once (it is never issued; a 1-instruction bias)
    with pytest.raises(ValueError, match="loops but the plan gives"):
        dynamic_count(instructions, loops, (10, 2))


def test_counter_divides_an_unrolled_body_by_its_unroll_factor():
    instructions, labels = parse_sass(LISTING)
    loops = find_loops(instructions, labels)
    loops[0].unroll = 2
    total, by_opcode = dynamic_count(instructions, loops, (10,))
    assert by_opcode["LDG"] == 5


# A software-pipelined PTX loop (num_stages > 1): one plain global load and two asynchronous copies (SASS LDG and
# 2 LDGSTS), plus the copies' bookkeeping, which loads nothing.
PIPELINED_PTX = """
$L__BB0_2:
	ld.global.b32 	{ %r5 }, [ %rd4 + 0 ];
	cp.async.cg.shared.global [ %r6 + 0 ], [ %rd5 + 0 ], 0x10, %r7;
	cp.async.ca.shared.global [ %r8 + 0 ], [ %rd6 + 0 ], 0x8, %r7;
	cp.async.commit_group;
	cp.async.wait_group 	1;
	add.s32 	%r1, %r1, 1;
	setp.lt.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
"""


def test_ptx_loads_count_the_asynchronous_copies_of_a_pipelined_loop():
    """The unrolling check compares a SASS loop's LDG + LDGSTS with its PTX loop's loads: counting only ld.global
    there read a pipelined loop (1 against 3) as unrolled 3 times and weighted its body by a third."""
    assert ptx_loop_loads(PIPELINED_PTX) == [3]


def test_a_pipelined_loop_is_not_read_as_unrolled():
    """Its SASS body: the copies (LDGSTS) each followed by a dependency barrier (LDGDEPBAR), which loads nothing:
    counted as loads, they made a loop of 2 copies look unrolled twice against its PTX (and halved its weight)."""
    body = ["LDG.E.128", "LDGSTS.E.BYPASS.128", "LDGDEPBAR", "LDGSTS.E.BYPASS.128", "LDGDEPBAR", "LDS.128", "BRA"]
    assert _global_loads(body) == 3
    loop = Loop(0, len(body) - 1)
    match_unrolling([loop], [_global_loads(body)], ptx_loop_loads(PIPELINED_PTX))
    assert loop.unroll == 1


def test_resident_programs_follow_registers_warps_and_shared_memory():
    assert resident_programs(32, 4, 0) == 16  # 64 warps per SM
    assert resident_programs(128, 4, 0) == 4  # 128 regs × 32 lanes × 4 warps = 16k of 64k registers
    assert resident_programs(168, 4, 0) == 3  # rounded up to 176 per thread
    assert resident_programs(64, 4, 100 * 1024) == 2  # 228 KiB of shared memory


_COMPILED = textwrap.dedent(
    """
    import json, os, sys
    os.environ.pop("TRITON_INTERPRET", None)
    import triton, triton.language as tl
    from linvit.bench.kernel_cost import kernel_cost

    @triton.jit
    def add_rows(x_ptr, y_ptr, rows, width, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        for row in tl.range(0, rows):
            acc += tl.load(x_ptr + row * width + cols)
        tl.store(y_ptr + cols, acc)

    class Pointer:  # what kernel_cost reads of a tensor argument: its dtype
        dtype = "torch.float32"

    results = {}
    for trips in (100, 300):
        args = {"x_ptr": Pointer(), "y_ptr": Pointer(), "rows": trips, "width": 512}
        cost = kernel_cost(add_rows, args, {"BLOCK": 512}, (3,), (trips,), num_warps=4)
        results[trips] = {"total": cost.instructions, "loads": cost.by_opcode["LDG"], "spill": cost.spill_bytes}
    print(json.dumps(results))
    """
)


@needs_triton
def test_counter_on_a_compiled_kernel_counts_each_iterations_loads_once(tmp_path):
    """A loop of known trip count: one 16-byte load per thread and iteration (512 fp32 over 128 threads), so each
    further iteration issues exactly 4 warps × 3 programs global loads, whatever ptxas unrolled. The straight-line
    tails ptxas adds for the iterations an unrolled body leaves over count once each (an upper bound of at most a
    few iterations), so the totals sit just above trips × 12."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    script = tmp_path / "count_add_rows.py"  # @triton.jit reads its function's source file
    script.write_text(_COMPILED)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    assert results[300]["loads"] - results[100]["loads"] == pytest.approx(200 * 4 * 3)
    for trips, result in results.items():
        assert trips * 4 * 3 <= result["loads"] <= (trips + 8) * 4 * 3
        assert result["spill"] == 0
    per_iteration = (results[300]["total"] - results[100]["total"]) / (200 * 4 * 3)
    assert 2 <= per_iteration <= 20  # a load, an add and the loop's own few instructions per warp and iteration


def test_the_chosen_configuration_can_launch_and_does_not_spill():
    """The cost figure keeps the fewest instructions among configurations that launch (shared memory within the 227 KiB
    a program may have) and do not spill, and names the ones that cannot launch: a launch pinned to one fails."""
    from linvit.bench.kernel_cost import KernelCost, best, unlaunchable

    def cost(instructions, spill=0, shared=0):
        return KernelCost(128, spill, shared, 256, 4, 2, instructions, {})

    costs = [((32, 4, 2), cost(100, shared=540 * 1024)), ((32, 4, 1), cost(200, shared=32 * 1024)),
             ((64, 4, 1), cost(150, spill=8)), ((16, 4, 1), cost(250))]  # fmt: skip
    assert best(costs)[0] == (32, 4, 1)
    assert best([costs[2], ((16, 8, 1), cost(300, spill=4))])[0] == (16, 8, 1)  # every one spills: the least
    assert unlaunchable("output", costs) == [f"output 32x4x2: {540 * 1024} B"]
