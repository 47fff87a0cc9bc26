"""A roofline that predicts the time of every launch on an H200, from what the compiled code does.

A Triton launch takes the largest of three times: issue (its dynamic warp-instructions at one per scheduler and
cycle, 132 SMs × 4 schedulers × 1.98 GHz), HBM (every byte its global and local loads and stores move, counted from
the SASS with no credit for L1 or L2 reuse, at 4.8 TB/s) and tensor cores (its MMA instructions' FLOPs at 989
TFLOP/s for 16-bit operands, 494 for TF32). A torch op is its bytes at 4.8 TB/s (an attention core also its FLOPs at
the 16-bit peak). Launch latency and the waves' tails are not counted: the prediction is a lower bound for small
launches.
"""

from __future__ import annotations

import dataclasses

from linvit.bench.kernel_cost import H200_ISSUE_RATE, KernelCost
from linvit.bench.torch_launches import TracedOp

H200_HBM_BANDWIDTH = 4.8e12  # bytes per second
H200_TENSOR_PEAK = {"16bit": 989e12, "tf32": 494e12}  # dense FLOP/s


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The three times of a launch, in milliseconds; it takes the largest."""

    issue_ms: float = 0.0
    hbm_ms: float = 0.0
    tensor_ms: float = 0.0

    @property
    def ms(self) -> float:
        return max(self.issue_ms, self.hbm_ms, self.tensor_ms)

    @property
    def bound(self) -> str:
        """What limits the launch: "issue", "hbm" or "tensor"."""
        times = {"issue": self.issue_ms, "hbm": self.hbm_ms, "tensor": self.tensor_ms}
        return max(times, key=times.__getitem__)

    def as_dict(self) -> dict:
        return {"ms": self.ms, "bound": self.bound, **dataclasses.asdict(self)}


def predict_kernel(cost: KernelCost) -> Prediction:
    """A compiled launch's time (:class:`KernelCost` with its instructions, bytes and FLOPs)."""
    traffic = cost.traffic
    tensor = traffic.flops_16bit / H200_TENSOR_PEAK["16bit"] + traffic.flops_tf32 / H200_TENSOR_PEAK["tf32"]
    return Prediction(
        issue_ms=cost.instructions / H200_ISSUE_RATE * 1e3,
        hbm_ms=traffic.memory_bytes / H200_HBM_BANDWIDTH * 1e3,
        tensor_ms=tensor * 1e3,
    )


def predict_op(op: TracedOp) -> Prediction:
    """A traced torch op's (or attention core's) time: bytes at HBM bandwidth, FLOPs at the 16-bit peak."""
    return Prediction(hbm_ms=op.bytes / H200_HBM_BANDWIDTH * 1e3, tensor_ms=op.flops / H200_TENSOR_PEAK["16bit"] * 1e3)


Costs = list[tuple[tuple[int, int, int], KernelCost]]


def fastest(costs: Costs) -> tuple[tuple[int, int, int], KernelCost]:
    """The configuration predicted fastest among those that launch and do not spill (the least spilling, if every one
    does): what autotune should find."""
    launchable = [item for item in costs if item[1].launchable] or costs
    clean = [item for item in launchable if item[1].spill_bytes == 0]
    if not clean:
        return min(launchable, key=lambda item: (item[1].spill_bytes, predict_kernel(item[1]).ms))
    return min(clean, key=lambda item: predict_kernel(item[1]).ms)


def autotune_space(costs: Costs) -> Costs:
    """The configurations autotune may launch: those that launch, less the ones that spill more than the least
    spilling of them (as `triton_precompile.spill_free` prunes the space at run time)."""
    launchable = [item for item in costs if item[1].launchable] or costs
    least = min(item[1].spill_bytes for item in launchable)
    return [item for item in launchable if item[1].spill_bytes <= least]


def slowest(costs: Costs) -> tuple[tuple[int, int, int], KernelCost]:
    """The configuration predicted slowest in the autotune space: autotune may launch any of them (it measures,
    with noise, and the model is not what it measures)."""
    return max(autotune_space(costs), key=lambda item: predict_kernel(item[1]).ms)


def ops_ms(ops: list[TracedOp]) -> float:
    """The predicted time of traced launches that the cost figure does not count from the SASS."""
    return sum(predict_op(op).ms for op in ops if op.kind != "fused")


def op_launches(ops: list[TracedOp]) -> int:
    """CUDA launches of traced ops, the fused ops' kernels not included (the plans count them)."""
    return sum(op.launches for op in ops if op.kind != "fused")
