"""What the GPU compiler makes of linvit's Triton kernels, without a GPU: registers, spills, shared memory, and (with
``--cost``) the warp-instructions each launch issues per token, as a real launch at a given shape would run them.

Every kernel of `linvit.ops.linear_attention` is compiled ahead of time for sm_90 (Triton ships ptxas and nvdisasm,
so no GPU or CUDA toolkit is needed) from the same launch plans the custom ops run (`triton_launch.py`), for every
tile configuration of the autotune space, with the divisibility attributes a launch gives its arguments.

    python -m benchmarks.kernel_resources                  # registers and spills, every config, usual head dims
    python -m benchmarks.kernel_resources --cost           # the cost figure; writes kernel_cost_sm90.md
    python -m benchmarks.kernel_resources --cost --json    # ... and prints it as one JSON object

The cost figure counts, per kernel and for the configuration with the fewest instructions that does not spill
(what autotune is expected to pick; on a GPU it measures), the dynamic warp-instructions per token (each SASS
instruction weighted by the trip counts of its loops at the shape, × warps × programs, / B·N), programs, waves at
the resident capacity, and a predicted time at 50% of the H200's issue rate. Beside it, every configuration's
predicted time on an H200 (`cost_model.py`: the largest of issue, HBM and tensor-core time, from the instructions,
bytes and MMA FLOPs counted in the SASS, `kernel_traffic.py`), the best and the worst per kernel, the torch ops
traced around the fused ops (`torch_launches.py`), and timm's Swin window attention under the same model; the
headline keys are issue 35's (`forward_ms`, `backward_ms`, `..._worst`, `window_..._ms`, `hbm_floor_..._ms`,
launches, `max_spill_bytes_autotune_space`). Exits with status 1 when a chosen configuration spills.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU even where tests run the interpreter

import torch  # noqa: E402

from linvit.bench import kernel_cost_report, torch_launches  # noqa: E402
from linvit.bench.cost_model import (  # noqa: E402
    autotune_space,
    fastest,
    op_launches,
    ops_ms,
    predict_kernel,
    predict_op,
    slowest,
)
from linvit.bench.kernel_cost import (  # noqa: E402
    H200_ISSUE_RATE,
    H200_MULTIPROCESSORS,
    KernelCost,
    best,
    kernel_cost,
    unlaunchable,
)
from linvit.ops.linear_attention import triton_geometry, triton_launch, triton_launch_backward  # noqa: E402
from linvit.ops.linear_attention.triton_feature_maps import ELU, FOCUSED, RELU  # noqa: E402

_MAPS = {"focused": FOCUSED, "relu": RELU, "elu": ELU}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention call: batch, heads × head dim, map, input dtype, DWC size, feature map, window (None: global)."""

    name: str
    batch: int
    heads: int
    head_dim: int
    hw: tuple[int, int]
    dtype: str = "bf16"
    kernel_size: int = 5
    feature_map: str = "focused"
    window: tuple[int, int] | None = None

    @property
    def tokens(self) -> int:
        return self.hw[0] * self.hw[1]


SHAPES = (
    Shape("benchmark (B=8, C=128, 4×32 heads, 256², bf16, 5×5 DWC)", 8, 4, 32, (256, 256)),
    Shape("linvit_tiny stage 1 (B=8, C=64, 2×32 heads, 256², bf16, 5×5 DWC)", 8, 2, 32, (256, 256)),
    Shape(
        "flatten_swin_tiny stage 1 at 1120² (B=8, C=96, 3×32 heads, 280² in 56² windows read in place, bf16, 5×5 DWC)",
        8,
        3,
        32,
        (280, 280),
        window=(56, 56),
    ),
    Shape(
        "flatten_pvt_v2_b1 stage 2 at 1024² (B=8, C=128, 2×64 heads in two head groups, 128², bf16, 5×5 DWC)",
        8,
        2,
        64,
        (128, 128),
    ),
)


def plans(shape: Shape) -> tuple[list[triton_geometry.Launch], list[triton_geometry.Launch]]:
    """The forward and backward launches of one shape, planned on meta tensors (nothing is allocated): a positional
    table shared by the batch, a DWC with bias, no key mask: what FocusedLinearAttention runs."""
    meta = {"device": "meta"}
    channels = shape.heads * shape.head_dim
    qkv = torch.empty(shape.batch, shape.tokens, 3 * channels, dtype=_DTYPES[shape.dtype], **meta)
    inverse = torch.empty(channels, **meta)
    positions = shape.tokens if shape.window is None else shape.window[0] * shape.window[1]
    position = torch.empty(1, positions, channels, **meta)
    weight = torch.empty(shape.head_dim, 1, shape.kernel_size, shape.kernel_size, **meta)
    bias = torch.empty(shape.head_dim, **meta)
    # the temperature as its parameter (temperature_scale), as FocusedLinearAttention passes it
    options = triton_geometry.KernelOptions(
        shape.hw[0],
        shape.hw[1],
        shape.heads,
        _MAPS[shape.feature_map],
        3.0,
        0,
        1e-6,
        1e-6,
        *(shape.window or (0, 0)),
        int(shape.feature_map == "focused"),
    )
    forward, out, partials = triton_launch.forward_plan(
        qkv, inverse, position, weight, bias, None, options, False, multiprocessors=H200_MULTIPROCESSORS
    )
    backward, *_ = triton_launch_backward.backward_plan(
        out, qkv, partials, inverse, position, weight, None, options, H200_MULTIPROCESSORS, position_grad=True
    )
    return forward, backward


def traced(shape: Shape) -> torch_launches.Trace:
    """The torch ops FocusedLinearAttention's computation launches around the fused ops at this shape (traced)."""
    return torch_launches.focused_module(
        shape.batch,
        shape.heads,
        shape.head_dim,
        shape.hw,
        shape.window,
        shape.kernel_size,
        _DTYPES[shape.dtype],
        H200_MULTIPROCESSORS,
    )


WINDOW_SIZE = 7  # timm's Swin


def window_figure(shape: Shape) -> dict:
    """The same model for timm's Swin window attention at the shape's batch, heads and map: its traced torch ops and
    its flash attention core, per pass."""
    trace = torch_launches.window_module(shape.batch, shape.heads, shape.head_dim, shape.hw, WINDOW_SIZE,
                                         _DTYPES[shape.dtype])  # fmt: skip
    passes = {}
    for name, ops in (("forward", trace.forward), ("backward", trace.backward)):
        passes[name] = {"ms": ops_ms(ops), "launches": op_launches(ops), "ops": [_op_entry(op) for op in ops]}
    return passes


def _op_entry(op: torch_launches.TracedOp) -> dict:
    return {"op": op.name, "kind": op.kind, "launches": op.launches, "bytes": op.bytes, "flops": op.flops,
            "ms": predict_op(op).ms}  # fmt: skip


def _configs(launch: triton_geometry.Launch) -> list[tuple[int, int, int]]:
    return list(triton_geometry.TILE_CONFIGS) if launch.tuned else [(0, launch.num_warps, 1)]


def launch_costs(launch: triton_geometry.Launch, arch: int) -> list[tuple[tuple[int, int, int], KernelCost]]:
    """(config, cost) of a launch for every configuration of its autotune space."""
    results = []
    for block, warps, stages in _configs(launch):
        constants, args = dict(launch.constants), dict(launch.args)
        if launch.tuned:
            constants["BLOCK_N"] = block
            args["N_BUCKET"] = triton_geometry.n_bucket(launch)
        cost = kernel_cost(launch.kernel, args, constants, launch.grid, launch.loops(block), warps, stages, arch)
        results.append(((block, warps, stages), cost))
    return results


def _config_entry(config: tuple[int, int, int], cost: KernelCost, tokens: int) -> dict:
    return {
        "config": "x".join(map(str, config)),
        "spill_bytes": cost.spill_bytes,
        "launchable": cost.launchable,
        "instructions_per_token": cost.instructions / tokens,
        "bytes_per_token": cost.traffic.memory_bytes / tokens,
        "tensor_flops_per_token": (cost.traffic.flops_16bit + cost.traffic.flops_tf32) / tokens,
        **{f"predicted_{key}": value for key, value in predict_kernel(cost).as_dict().items()},
    }


def _kernel_entry(pass_name: str, launch, costs, tokens: int) -> dict:
    """A kernel's row: the configuration with the fewest instructions (the instruction figure), the one predicted
    fastest and the one predicted slowest that autotune may launch, and every configuration's prediction."""
    config, cost = best(costs)
    quick, slow = fastest(costs), slowest(costs)
    return {
        "pass": pass_name,
        "kernel": launch.name,
        "block_n": config[0],
        "num_warps": config[1],
        "num_stages": config[2],
        "registers": cost.registers,
        "spill_bytes": cost.spill_bytes,
        "shared_bytes": cost.shared_bytes,
        "programs": cost.programs,
        "resident_per_sm": cost.resident_per_sm,
        "waves": cost.waves(),
        "instructions_per_token": cost.instructions / tokens,
        "fastest": _config_entry(*quick, tokens),
        "slowest": _config_entry(*slow, tokens),
        "configs": [_config_entry(*item, tokens) for item in costs],
    }


def cost_figure(shapes=SHAPES, arch: int = 90) -> dict:
    """The cost figure of every shape: per kernel the chosen configs and their counts and predicted times; per pass
    the totals, the traced torch ops and the launches; for the benchmark shape (the first) the window-softmax module
    under the same model."""
    figure = {"arch": arch, "shapes": [], "unlaunchable": []}
    for shape in shapes:
        tokens = shape.batch * shape.tokens
        entry = {"shape": dataclasses.asdict(shape), "kernels": [], "passes": {}}
        trace = traced(shape)
        for pass_name, launches, ops in zip(("forward", "backward"), plans(shape), (trace.forward, trace.backward)):
            total = 0.0
            kernels = []
            for launch in launches:
                costs = launch_costs(launch, arch)
                figure["unlaunchable"] += unlaunchable(f"{shape.name}: {launch.name}", costs)
                kernels.append(_kernel_entry(pass_name, launch, costs, tokens))
                total += kernels[-1]["instructions_per_token"] * tokens
            entry["kernels"] += kernels
            torch_ms = ops_ms(ops)
            entry["passes"][pass_name] = {
                "instructions_per_token": total / tokens,
                "launches": len(launches) + op_launches(ops),
                "kernel_launches": len(launches),
                "predicted_ms_at_half_issue_rate": total / (0.5 * H200_ISSUE_RATE) * 1e3,
                "predicted_ms": sum(kernel["fastest"]["predicted_ms"] for kernel in kernels) + torch_ms,
                "predicted_ms_worst": sum(kernel["slowest"]["predicted_ms"] for kernel in kernels) + torch_ms,
                "torch_ops_ms": torch_ms,
                "torch_ops": [_op_entry(op) for op in ops if op.kind != "fused"],
                "hbm_floor_ms": (trace.floor_forward_bytes if pass_name == "forward" else trace.floor_backward_bytes)
                / 4.8e12
                * 1e3,
            }
        if not figure["shapes"]:
            entry["window_module"] = window_figure(shape)
        figure["shapes"].append(entry)
    return figure


SPILL_CASES = ((4, 16), (4, 32), (2, 64), (1, 64), (3, 64), (4, 64), (5, 64), (6, 32))


def spill_bytes(cases=SPILL_CASES, arch: int = 90) -> tuple[dict[str, int], list[str], dict[str, int]]:
    """Per heads × head_dim (head_dim ≤ 64, benchmark map size): the largest spill among the kernels' chosen
    configurations; the configurations there that cannot launch (:func:`unlaunchable`); and the largest spill among
    every configuration autotune may launch (`cost_model.autotune_space`: launchable, the least spilling)."""
    spills, too_large, space = {}, [], {}
    for heads, head_dim in cases:
        shape = Shape(f"{heads}×{head_dim}", 8, heads, head_dim, (256, 256))
        worst = worst_space = 0
        for launches in plans(shape):
            for launch in launches:
                costs = launch_costs(launch, arch)
                too_large += unlaunchable(f"{shape.name}: {launch.name}", costs)
                worst = max(worst, best(costs)[1].spill_bytes)
                worst_space = max([worst_space] + [cost.spill_bytes for _, cost in autotune_space(costs)])
        spills[f"{heads}x{head_dim}"] = worst
        space[f"{heads}x{head_dim}"] = worst_space
    return spills, too_large, space


def summary(figure: dict, spills: dict[str, int], too_large: list[str], space: dict[str, int]) -> dict:
    """The headline numbers (the first shape is the benchmark shape): the issue's keys first."""
    first = figure["shapes"][0]
    passes, window = first["passes"], first["window_module"]
    forward, backward = passes["forward"]["predicted_ms"], passes["backward"]["predicted_ms"]
    return {
        "forward_ms": round(forward, 4),
        "backward_ms": round(backward, 4),
        "forward_ms_worst": round(passes["forward"]["predicted_ms_worst"], 4),
        "backward_ms_worst": round(passes["backward"]["predicted_ms_worst"], 4),
        "window_forward_ms": round(window["forward"]["ms"], 4),
        "window_backward_ms": round(window["backward"]["ms"], 4),
        "focused_over_window_forward": round(forward / window["forward"]["ms"], 3),
        "focused_over_window_forward_backward": round(
            (forward + backward) / (window["forward"]["ms"] + window["backward"]["ms"]), 3
        ),
        "hbm_floor_forward_ms": round(passes["forward"]["hbm_floor_ms"], 4),
        "hbm_floor_backward_ms": round(passes["backward"]["hbm_floor_ms"], 4),
        "forward_launches": passes["forward"]["launches"],
        "backward_launches": passes["backward"]["launches"],
        "window_forward_launches": window["forward"]["launches"],
        "window_backward_launches": window["backward"]["launches"],
        "max_spill_bytes_autotune_space": max(space.values()),
        "spill_bytes_autotune_space_by_heads_x_head_dim": space,
        "forward_instructions_per_token": round(passes["forward"]["instructions_per_token"], 1),
        "backward_instructions_per_token": round(passes["backward"]["instructions_per_token"], 1),
        "max_spill_bytes_head_dim_le_64": max(spills.values()),
        "spill_bytes_by_heads_x_head_dim": spills,
        "unlaunchable_configurations": figure["unlaunchable"] + list(too_large),
        "forward_predicted_ms_at_half_issue_rate": round(passes["forward"]["predicted_ms_at_half_issue_rate"], 3),
        "backward_predicted_ms_at_half_issue_rate": round(passes["backward"]["predicted_ms_at_half_issue_rate"], 3),
    }


def _resource_table(args) -> int:
    print("| map | heads × d | kernel | BLOCK_N × warps × stages | registers | spilled (stack bytes) | shared bytes |")
    print("|---|---|---|---|---:|---:|---:|")
    spills = 0
    for feature_map in args.maps.split(","):
        for heads in (int(h) for h in args.heads.split(",")):
            for head_dim in (int(d) for d in args.head_dims.split(",")):
                shape = Shape("", 2, heads, head_dim, (64, 64), args.dtype, feature_map=feature_map)
                for launches in plans(shape):
                    for launch in launches:
                        for config, usage in launch_costs(launch, args.arch):
                            spills += usage.spill_bytes > 0
                            print(
                                f"| {feature_map} | {heads} × {head_dim} | {launch.name} | "
                                f"{' × '.join(map(str, config))} | {usage.registers} | {usage.spill_bytes} | "
                                f"{usage.shared_bytes} |",
                                flush=True,
                            )
    return 1 if spills else 0


def main(argv: list[str] | None = None, default_output: Path | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: H100/H200)")
    parser.add_argument("--cost", action="store_true", help="the cost figure at the benchmark shapes")
    parser.add_argument("--json", action="store_true", help="with --cost: print the figure as one JSON object")
    parser.add_argument("--output", type=Path, default=default_output, help="with --cost: the markdown file")
    parser.add_argument("--head-dims", default="16,32,64,128")
    parser.add_argument("--heads", default="3,4,8")
    parser.add_argument("--maps", default="focused,relu")
    parser.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 inputs")
    args = parser.parse_args(argv)
    if not args.cost:
        return _resource_table(args)
    figure = cost_figure(arch=args.arch)
    headline = summary(figure, *spill_bytes(arch=args.arch))
    if args.output is not None:
        from linvit.io.destination import write_text

        # a maintainer's tool that rewrites its own table in the checkout: replaced as asked
        write_text(args.output, kernel_cost_report.markdown(figure, headline), "bench-report", force=True)
    if args.json:
        print(json.dumps({**headline, "figure": figure}, indent=1))
    else:
        print(kernel_cost_report.markdown(figure, headline))
    spilled = any(kernel["spill_bytes"] for entry in figure["shapes"] for kernel in entry["kernels"])
    return 1 if spilled or headline["max_spill_bytes_head_dim_le_64"] or headline["unlaunchable_configurations"] else 0


if __name__ == "__main__":
    sys.exit(main())
