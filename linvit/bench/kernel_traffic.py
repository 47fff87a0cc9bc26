"""What a compiled kernel moves and multiplies, counted from its SASS: bytes of global (and local) memory, and the
FLOPs of its tensor-core (MMA) instructions.

The counting rules, per dynamic warp-instruction (an instruction weighted by its loops' trip counts, as
`kernel_cost.instruction_weights` gives it):

- bytes: every lane of the warp moves the instruction's width (LDG/STG/LD/ST/LDGSTS/LDL/STL: ``.128`` 16 B, ``.64``
  8 B, ``.U16``/``.S16`` 2 B, ``.U8``/``.S8`` 1 B, else 4 B), so 32 × width. Lanes a predicate or a mask turns off
  and lanes that read the same address as another count too, and nothing is credited to L1 or L2: an upper bound
  on DRAM traffic that counts a tile's halo re-read once per tap and a scalar broadcast to 32 lanes as 32 loads.
  Atomics and reductions at L2 (RED, ATOM, ATOMG) count twice (the line is read and written). Local memory (LDL,
  STL: spills) is counted apart. TMA copies (UTMALDG, UTMASTG, UBLKCP, ...) carry their size in a descriptor, not
  in the opcode: they are counted as unsized, so that a figure can refuse to pretend it saw them.
- FLOPs: an HMMA.MNK (mma.sync, one warp) does 2·M·N·K; an HGMMA.MxNxK (wgmma) is issued by each of the 4 warps of
  its warpgroup and does 2·M·N·K for the group, so 2·M·N·K / 4 per warp-instruction. The input type picks the peak:
  TF32 operands run at half the 16-bit rate.
"""

from __future__ import annotations

import dataclasses
import re

LANES = 32
WARPS_PER_WARPGROUP = 4
_GLOBAL = ("LDG", "STG", "LD", "ST", "LDGSTS")
_LOCAL = ("LDL", "STL")
_ATOMIC = ("RED", "ATOM", "ATOMG", "REDG")
_TMA = ("UTMALDG", "UTMASTG", "UTMAREDG", "UTMAPF", "UBLKCP", "UBLKRED", "UBLKPF")
_WIDTHS = {"128": 16, "64": 8, "F64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}
_MMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "884": (8, 8, 4), "1684": (16, 8, 4), "168": (16, 8, 8)}
_HGMMA_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")


def access_width(opcode: str) -> int:
    """Bytes one lane moves: the width modifier of a memory opcode (``LDG.E.128`` 16, ``STG.E.U16`` 2), 4 without one.
    Modifiers such as ``LTC128B`` (an L2 prefetch hint) are not widths."""
    for modifier in opcode.split(".")[1:]:
        if modifier in _WIDTHS:
            return _WIDTHS[modifier]
    return 4


def memory_bytes(opcode: str) -> tuple[str, int]:
    """(kind, bytes per warp-instruction) of an opcode: kind is "global", "local", "unsized" (TMA) or "" (not a
    memory access of DRAM: shared memory, constants, barriers such as LDGDEPBAR)."""
    family = opcode.split(".")[0]
    if family in _GLOBAL:
        return "global", LANES * access_width(opcode)
    if family in _ATOMIC:
        return "global", 2 * LANES * access_width(opcode)
    if family in _LOCAL:
        return "local", LANES * access_width(opcode)
    if family in _TMA:
        return "unsized", 0
    return "", 0


def mma_flops(opcode: str) -> tuple[str, float]:
    """(precision, FLOPs per warp-instruction) of a tensor-core opcode: precision "tf32" or "16bit" (bf16/fp16);
    ("", 0) for anything else."""
    parts = opcode.split(".")
    precision = "tf32" if "TF32" in parts else "16bit"
    if parts[0] == "HMMA" and len(parts) > 1 and parts[1] in _MMA_SHAPES:
        m, n, k = _MMA_SHAPES[parts[1]]
        return precision, 2.0 * m * n * k
    if parts[0] == "HGMMA" and len(parts) > 1:
        shape = _HGMMA_SHAPE.match(parts[1])
        if shape:
            m, n, k = (int(size) for size in shape.groups())
            return precision, 2.0 * m * n * k / WARPS_PER_WARPGROUP
    return "", 0.0


@dataclasses.dataclass
class Traffic:
    """What one warp, or after :meth:`scaled` a whole launch, moves and multiplies."""

    global_bytes: float = 0.0
    local_bytes: float = 0.0
    flops_16bit: float = 0.0
    flops_tf32: float = 0.0
    unsized: float = 0.0  # dynamic count of memory instructions whose size the SASS does not say (TMA)

    def scaled(self, factor: float) -> Traffic:
        return Traffic(*(value * factor for value in dataclasses.astuple(self)))

    @property
    def memory_bytes(self) -> float:
        """Every byte counted against DRAM: global and local (spill) traffic."""
        return self.global_bytes + self.local_bytes


def count_traffic(opcodes: list[str], weights: list[float]) -> Traffic:
    """The traffic of one warp running a program: each opcode's bytes and FLOPs × how often it issues."""
    traffic = Traffic()
    for opcode, weight in zip(opcodes, weights):
        kind, size = memory_bytes(opcode)
        if kind == "global":
            traffic.global_bytes += weight * size
        elif kind == "local":
            traffic.local_bytes += weight * size
        elif kind == "unsized":
            traffic.unsized += weight
        precision, flops = mma_flops(opcode)
        if precision == "tf32":
            traffic.flops_tf32 += weight * flops
        elif precision:
            traffic.flops_16bit += weight * flops
    return traffic
