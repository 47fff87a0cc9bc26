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
the resident capacity, and a predicted time at 50% of the H200's issue rate. Exits with status 1 when a chosen
configuration spills.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU even where tests run the interpreter

import torch  # noqa: E402

from linvit.bench.kernel_cost import (  # noqa: E402
    H200_ISSUE_RATE,
    H200_MULTIPROCESSORS,
    KernelCost,
    best,
    kernel_cost,
    unlaunchable,
)
from linvit.ops.linear_attention import triton_geometry, triton_launch  # noqa: E402
from linvit.ops.linear_attention.triton_tiles import ELU, FOCUSED, RELU  # noqa: E402

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
    options = triton_geometry.KernelOptions(
        shape.hw[0], shape.hw[1], shape.heads, _MAPS[shape.feature_map], 3.0, 0, 1e-6, 1e-6, *(shape.window or (0, 0))
    )
    forward, out, partials = triton_launch.forward_plan(
        qkv, inverse, position, weight, bias, None, options, False, multiprocessors=H200_MULTIPROCESSORS
    )
    backward, _, _ = triton_launch.backward_plan(
        out, qkv, partials, inverse, position, weight, None, options, multiprocessors=H200_MULTIPROCESSORS
    )
    return forward, backward


# torch ops the custom ops launch beside their kernels for this call (FocusedLinearAttention in training): the
# backward sums the positional table's gradient over the batch (one reduction); the forward launches none.
TORCH_LAUNCHES = {"forward": 0, "backward": 1}


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


def cost_figure(shapes=SHAPES, arch: int = 90) -> dict:
    """The cost figure of every shape: per kernel the chosen config and its counts; per pass the totals."""
    figure = {"arch": arch, "shapes": [], "unlaunchable": []}
    for shape in shapes:
        tokens = shape.batch * shape.tokens
        entry = {"shape": dataclasses.asdict(shape), "kernels": [], "passes": {}}
        for pass_name, launches in zip(("forward", "backward"), plans(shape)):
            total = 0.0
            for launch in launches:
                costs = launch_costs(launch, arch)
                figure["unlaunchable"] += unlaunchable(f"{shape.name}: {launch.name}", costs)
                config, cost = best(costs)
                total += cost.instructions
                entry["kernels"].append(
                    {
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
                    }
                )
            entry["passes"][pass_name] = {
                "instructions_per_token": total / tokens,
                "launches": len(launches) + TORCH_LAUNCHES[pass_name],
                "predicted_ms_at_half_issue_rate": total / (0.5 * H200_ISSUE_RATE) * 1e3,
            }
        figure["shapes"].append(entry)
    return figure


SPILL_CASES = ((4, 16), (4, 32), (2, 64), (1, 64), (3, 64), (4, 64), (5, 64), (6, 32))


def spill_bytes(cases=SPILL_CASES, arch: int = 90) -> tuple[dict[str, int], list[str]]:
    """Per heads × head_dim (head_dim ≤ 64, benchmark map size): the largest spill among the kernels' chosen
    configurations; and the configurations there that cannot launch (:func:`unlaunchable`)."""
    spills, too_large = {}, []
    for heads, head_dim in cases:
        shape = Shape(f"{heads}×{head_dim}", 8, heads, head_dim, (256, 256))
        worst = 0
        for launches in plans(shape):
            for launch in launches:
                costs = launch_costs(launch, arch)
                too_large += unlaunchable(f"{shape.name}: {launch.name}", costs)
                worst = max(worst, best(costs)[1].spill_bytes)
        spills[f"{heads}x{head_dim}"] = worst
    return spills, too_large


def summary(figure: dict, spills: dict[str, int], too_large: list[str]) -> dict:
    """The headline numbers (the first shape is the benchmark shape)."""
    passes = figure["shapes"][0]["passes"]
    return {
        "forward_instructions_per_token": round(passes["forward"]["instructions_per_token"], 1),
        "backward_instructions_per_token": round(passes["backward"]["instructions_per_token"], 1),
        "forward_launches": passes["forward"]["launches"],
        "backward_launches": passes["backward"]["launches"],
        "max_spill_bytes_head_dim_le_64": max(spills.values()),
        "spill_bytes_by_heads_x_head_dim": spills,
        "unlaunchable_configurations": figure["unlaunchable"] + list(too_large),
        "forward_predicted_ms": round(passes["forward"]["predicted_ms_at_half_issue_rate"], 3),
        "backward_predicted_ms": round(passes["backward"]["predicted_ms_at_half_issue_rate"], 3),
    }


def markdown(figure: dict, headline: dict) -> str:
    """The cost figure as the markdown of benchmarks/results/cuda/kernel_cost_sm90.md."""
    import triton

    lines = [
        f"# Triton kernel cost on sm_{figure['arch']}, counted without a GPU",
        "",
        f"{datetime.date.today().isoformat()}, Triton {triton.__version__}, torch {torch.__version__}. Command: "
        "`python -m benchmarks.kernel_resources --cost`. Dynamic warp-instructions per token: each SASS instruction "
        "weighted by its loops' trip counts at the shape, × warps × programs, / B·N. Per kernel, the tile config "
        "with the fewest instructions that does not spill (autotune decides on a GPU). Predicted time: the "
        "instructions at 50% of the H200's issue rate (1.05e12 warp-instructions/s).",
        "",
        f"Headline (benchmark shape): forward {headline['forward_instructions_per_token']} / backward "
        f"{headline['backward_instructions_per_token']} warp-instructions per token (targets ≤ 500 / ≤ 1,500; the "
        f"first kernel set: 1,950 / 7,449), launches {headline['forward_launches']} / "
        f"{headline['backward_launches']} (targets ≤ 3 / ≤ 5), largest spill at head_dim ≤ 64: "
        f"{headline['max_spill_bytes_head_dim_le_64']} B. Configurations of the autotune space that ask more shared "
        f"memory than a program may have (227 KiB): {', '.join(headline['unlaunchable_configurations']) or 'none'}.",
        "",
        "Spill bytes of the chosen configurations by heads × head_dim (8 × 256², bf16): "
        + ", ".join(f"{case}: {value}" for case, value in headline["spill_bytes_by_heads_x_head_dim"].items())
        + ". A program holds every head of its tokens while their d × d states fit (4 × 32² fp32): its state "
        "products are one batched 3-D tensor-core product per tile, or for a single head a 2-D one whose state the "
        "compiler keeps in shared memory. Beyond that (head_dim 64 from two heads on, more than four heads of 32) the "
        "grid has an axis over head groups: a program holds one group's heads, the focused map's per-token norms over "
        "all C channels come from a pass of their own (token_norms, a third forward launch), and the part of dq and dk "
        "that couples the heads is added after the gradient kernels (cross_head_grad, a fifth backward kernel). "
        "Before the groups, 4×64 spilled 680 B (query_grad's states and dS accumulators in registers); per-head 2-D "
        "products over tuples of per-head tiles were counted too: no spill-free configuration at 4×64 and 1.3–3.2× "
        "the instructions at 4×32.",
    ]
    for entry in figure["shapes"]:
        lines += ["", f"## {entry['shape']['name']}", ""]
        lines.append(
            "| pass | kernel | BLOCK_N × warps × stages | registers | spill B | shared B | programs | "
            "resident/SM | waves | warp-instr/token |"
        )
        lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for kernel in entry["kernels"]:
            config = f"{kernel['block_n'] or '-'} × {kernel['num_warps']} × {kernel['num_stages']}"
            lines.append(
                f"| {kernel['pass']} | {kernel['kernel']} | {config} | {kernel['registers']} | "
                f"{kernel['spill_bytes']} | {kernel['shared_bytes']} | {kernel['programs']} | "
                f"{kernel['resident_per_sm']} | {kernel['waves']:.2f} | {kernel['instructions_per_token']:.0f} |"
            )
        for name, totals in entry["passes"].items():
            lines.append(
                f"| **{name}** | {totals['launches']} launches | | | | | | | "
                f"{totals['predicted_ms_at_half_issue_rate']:.3f} ms predicted | "
                f"**{totals['instructions_per_token']:.0f}** |"
            )
    return "\n".join(lines) + "\n"


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
        write_text(args.output, markdown(figure, headline), "bench-report", force=True)
    if args.json:
        print(json.dumps({**headline, "figure": figure}, indent=1))
    else:
        print(markdown(figure, headline))
    spilled = any(kernel["spill_bytes"] for entry in figure["shapes"] for kernel in entry["kernels"])
    return 1 if spilled or headline["max_spill_bytes_head_dim_le_64"] or headline["unlaunchable_configurations"] else 0


if __name__ == "__main__":
    sys.exit(main())
