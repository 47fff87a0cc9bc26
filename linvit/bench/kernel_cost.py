"""What a Triton kernel issues on an sm_90 GPU, counted without a GPU: registers, spills and dynamic warp-instructions.

A kernel is compiled ahead of time exactly as a launch at a given shape specializes it (each pointer and each integer
argument divisible by 16 carries the ``tt.divisibility`` attribute the launcher would give it, integers equal to 1
become constants), and its cubin is disassembled with the ``nvdisasm`` that ships in Triton's wheel. The dynamic
count weights each SASS instruction by the trip counts of the loops around it: a loop is a branch back to an earlier
label, its trip counts come from the launch plan (per program, in program order), and where ptxas unrolled a loop
(its body then holds U iterations' worth of global loads against one in the PTX loop) the body is weighted by
trips / U. Each instruction is issued once per warp, so a program issues its weighted count × warps. The same
weights count the bytes and tensor-core FLOPs of the launch (`kernel_traffic.py`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile

from linvit.bench.kernel_traffic import Traffic, count_traffic

# the H200 (sm_90): 132 SMs, 4 schedulers each issuing one warp-instruction per cycle at ~1.98 GHz
H200_MULTIPROCESSORS = 132
H200_ISSUE_RATE = 132 * 4 * 1.98e9  # warp-instructions per second, ~1.05e12
_REGISTERS_PER_SM = 65536
_WARPS_PER_SM = 64
_PROGRAMS_PER_SM = 32
_SHARED_PER_SM = 228 * 1024
SHARED_PER_PROGRAM = 227 * 1024  # the most one program may allocate on sm_90: a launch asking more fails

# an opcode is upper case with dotted modifiers, of which wgmma's shape has a lower-case x (HGMMA.64x32x16.F32.BF16)
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)(.*?);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_PTX_LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
_PTX_LOAD = re.compile(r"\bld\.global|\bcp\.async\.c[ag]\b")
_PTX_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);")


@dataclasses.dataclass
class Instruction:
    address: int
    opcode: str  # e.g. "LDG.E.128"
    target: str | None  # the label a branch goes to


@dataclasses.dataclass
class Loop:
    start: int  # index of the first instruction of the body
    end: int  # index of the back-edge branch
    unroll: int = 1  # source iterations per pass through the body
    remainder_of: int | None = None  # for the remainder loop ptxas adds after an unrolled one: that loop's index


def parse_sass(text: str) -> tuple[list[Instruction], dict[str, int]]:
    """Instructions of an ``nvdisasm -c`` listing and the index each label points at."""
    instructions: list[Instruction] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        match = _INSTRUCTION.search(line)
        if match:
            target = _TARGET.search(match.group(4))
            instructions.append(Instruction(int(match.group(1), 16), match.group(3), target and target.group(1)))
    return instructions, labels


def find_loops(instructions: list[Instruction], labels: dict[str, int]) -> list[Loop]:
    """Loops as back-edges (a branch to a label at or before it), in the order of their first instruction. The
    trap loop after EXIT (a branch to itself) is not one."""
    loops = []
    for index, instruction in enumerate(instructions):
        if instruction.opcode.startswith("BRA") and instruction.target in labels:
            start = labels[instruction.target]
            if start < index:
                loops.append(Loop(start, index))
    return sorted(loops, key=lambda loop: loop.start)


def _global_loads(opcodes: list[str]) -> int:
    """LDG and LDGSTS (asynchronous copies), not LDGDEPBAR (their dependency barrier, which loads nothing)."""
    return sum(opcode.split(".")[0] in ("LDG", "LDGSTS") for opcode in opcodes)


def ptx_loop_loads(ptx: str) -> list[int]:
    """Global loads in the body of each PTX loop (back-edge), in order: ``ld.global`` and the asynchronous copies
    (``cp.async.ca``/``cp.async.cg``) that software pipelining turns them into, as SASS's LDG and LDGSTS."""
    lines = ptx.splitlines()
    labels = {}
    for index, line in enumerate(lines):
        match = _PTX_LABEL.match(line.strip())
        if match:
            labels[match.group(1)] = index
    loads = []
    for index, line in enumerate(lines):
        match = _PTX_BRANCH.search(line)
        if match and labels.get(match.group(1), index + 1) < index:
            body = lines[labels[match.group(1)] : index]
            loads.append((labels[match.group(1)], sum(_PTX_LOAD.search(body_line) is not None for body_line in body)))
    return [count for _, count in sorted(loads)]


def match_unrolling(loops: list[Loop], sass_loads: list[int], ptx_loads: list[int]) -> None:
    """Mark what ptxas did to the PTX loops: a SASS loop with k times the global loads of its PTX loop is unrolled
    k times, and where SASS has more loops than PTX, a loop with the PTX loop's loads right after an unrolled one is
    its remainder loop (run for the iterations the unrolled body left over)."""
    extra = len(loops) - len(ptx_loads)
    source = -1
    for index, (loop, loads) in enumerate(zip(loops, sass_loads)):
        previous = loops[index - 1] if index else None
        if extra > 0 and previous is not None and previous.unroll > 1 and loads == ptx_loads[source]:
            loop.remainder_of = index - 1
            extra -= 1
            continue
        source += 1
        known = source < len(ptx_loads) and ptx_loads[source]
        if known and loads > ptx_loads[source] and loads % ptx_loads[source] == 0:
            loop.unroll = loads // ptx_loads[source]


def instruction_weights(instructions: list[Instruction], loops: list[Loop], trips: tuple[float, ...]) -> list[float]:
    """How many times a program issues each instruction: the product of (trips / unroll) of the loops around it.
    ``trips`` gives one count per loop, in the order of `find_loops`, or one per source loop (a remainder loop then
    takes its unrolled loop's count)."""
    source_loops = [loop for loop in loops if loop.remainder_of is None]
    if len(trips) == len(source_loops) and len(source_loops) < len(loops):  # one trip count per source loop
        expanded, next_trip = [], iter(trips)
        for loop in loops:
            expanded.append(next(next_trip) if loop.remainder_of is None else expanded[loop.remainder_of])
        trips = tuple(expanded)
    if len(trips) != len(loops):
        raise ValueError(
            f"the kernel has {len(loops)} loops but the plan gives {len(trips)} trip counts: the compiled structure "
            "is not the one the plan describes"
        )
    weights = [1.0] * len(instructions)
    for loop, count in zip(loops, trips):
        if loop.remainder_of is not None:  # the source iterations the unrolled body left over
            unroll = loops[loop.remainder_of].unroll
            passes = count - unroll * (count // unroll)
        elif any(other.remainder_of is not None and loops[other.remainder_of] is loop for other in loops):
            passes = count // loop.unroll
        else:
            passes = count / loop.unroll
        for index in range(loop.start, loop.end + 1):
            weights[index] *= passes
    return weights


def dynamic_count(
    instructions: list[Instruction], loops: list[Loop], trips: tuple[float, ...]
) -> tuple[float, dict[str, float]]:
    """Σ over instructions of :func:`instruction_weights`, and the same per opcode family (the opcode before its
    first dot)."""
    total = 0.0
    by_opcode: dict[str, float] = {}
    for instruction, weight in zip(instructions, instruction_weights(instructions, loops, trips)):
        if instruction.opcode == "NOP":
            continue
        total += weight
        family = instruction.opcode.split(".")[0]
        by_opcode[family] = by_opcode.get(family, 0.0) + weight
    return total, by_opcode


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _disassemble(cubin: bytes) -> tuple[str, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        sass = subprocess.run([_tool("nvdisasm"), "-c", file.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    return sass, usage


_TRITON_TYPES = {
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.float32": "fp32",
    "torch.float64": "fp64",
    "torch.uint8": "u8",
    "torch.bool": "i1",
    "torch.int32": "i32",
    "torch.int64": "i64",
}


def launch_signature(fn, args: dict, constants: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of a launch as Triton's launcher specializes it: pointers and integers divisible
    by 16 carry ``tt.divisibility``; integers equal to 1 become constants."""
    names = [parameter.name for parameter in fn.params]
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(names):
        if name in constants:
            signature[name] = "constexpr"
            constexprs[(index,)] = constants[name]
            continue
        value = args[name]
        if hasattr(value, "dtype"):
            signature[name] = "*" + _TRITON_TYPES[str(value.dtype)]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1:
            signature[name] = "constexpr"
            constexprs[(index,)] = 1
        else:
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


@dataclasses.dataclass
class KernelCost:
    """What one launch issues."""

    registers: int
    spill_bytes: int
    shared_bytes: int
    programs: int
    num_warps: int
    resident_per_sm: int
    instructions: float  # dynamic warp-instructions of the whole launch
    by_opcode: dict[str, float]
    traffic: Traffic = dataclasses.field(default_factory=Traffic)  # bytes and MMA FLOPs of the whole launch

    @property
    def launchable(self) -> bool:
        return self.shared_bytes <= SHARED_PER_PROGRAM

    def waves(self, multiprocessors: int = H200_MULTIPROCESSORS) -> float:
        return self.programs / (self.resident_per_sm * multiprocessors)


def resident_programs(registers: int, num_warps: int, shared_bytes: int) -> int:
    """Programs of a kernel resident on one sm_90 SM at once (registers are allocated per warp in units of 256)."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = _REGISTERS_PER_SM // (per_warp * num_warps)
    by_warps = _WARPS_PER_SM // num_warps
    by_shared = _SHARED_PER_SM // shared_bytes if shared_bytes else _PROGRAMS_PER_SM
    return max(0, min(by_registers, by_warps, by_shared, _PROGRAMS_PER_SM))


def compile_launch(fn, args: dict, constants: dict, num_warps: int, num_stages: int = 1, arch: int = 90):
    """``fn`` compiled for ``arch`` (no GPU needed) as a launch with these arguments specializes it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs, attrs = launch_signature(fn, args, constants)
    return triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def kernel_cost(
    fn, args: dict, constants: dict, grid: tuple[int, ...], trips: tuple[float, ...], num_warps: int,
    num_stages: int = 1, arch: int = 90,
) -> KernelCost:  # fmt: skip
    """Compile ``fn`` for ``arch`` as a launch with these arguments specializes it and count what it issues."""
    compiled = compile_launch(fn, args, constants, num_warps, num_stages, arch)
    sass, usage = _disassemble(compiled.asm["cubin"])
    instructions, labels = parse_sass(sass)
    loops = find_loops(instructions, labels)
    match_unrolling(loops, [_global_loads([i.opcode for i in instructions[x.start : x.end + 1]]) for x in loops],
                    ptx_loop_loads(compiled.asm["ptx"]))  # fmt: skip
    per_program, by_opcode = dynamic_count(instructions, loops, trips)
    traffic = count_traffic([i.opcode for i in instructions], instruction_weights(instructions, loops, trips))
    fields = dict(item.split(":") for item in next(line for line in usage.splitlines() if "REG:" in line).split())
    registers, shared = int(fields["REG"]), compiled.metadata.shared
    programs = 1
    for size in grid:
        programs *= size
    scale = num_warps * programs
    return KernelCost(
        registers=registers,
        spill_bytes=int(fields["STACK"]),
        shared_bytes=shared,
        programs=programs,
        num_warps=num_warps,
        resident_per_sm=resident_programs(registers, num_warps, shared),
        instructions=per_program * scale,
        by_opcode={key: value * scale for key, value in by_opcode.items()},
        traffic=traffic.scaled(scale),
    )


def best(costs: list[tuple[tuple[int, int, int], KernelCost]]) -> tuple[tuple[int, int, int], KernelCost]:
    """The configuration with the fewest instructions among the launchable ones that do not spill (the least
    spilling one, if every one does)."""
    launchable = [item for item in costs if item[1].launchable] or costs
    clean = [item for item in launchable if item[1].spill_bytes == 0]
    if not clean:
        return min(launchable, key=lambda item: (item[1].spill_bytes, item[1].instructions))
    return min(clean, key=lambda item: item[1].instructions)


def unlaunchable(name: str, costs: list[tuple[tuple[int, int, int], KernelCost]]) -> list[str]:
    """The configurations of a launch's autotune space that ask more shared memory than a program may have: autotuning
    skips them, but a launch pinned to one (`pinned_tiles`, the GPU test tier) fails."""
    return [
        f"{name} {'x'.join(map(str, config))}: {cost.shared_bytes} B" for config, cost in costs if not cost.launchable
    ]
