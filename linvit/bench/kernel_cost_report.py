"""The cost figure (`kernel_resources.cost_figure`) as the markdown of benchmarks/results/cuda/kernel_cost_sm90.md:
the headline against issue 35's targets, per shape the kernels' instructions, bytes, FLOPs and predicted times, the
torch ops traced around the fused ops, and timm's window attention under the same model."""

from __future__ import annotations

import datetime

_PREAMBLE = (
    "Dynamic warp-instructions per token: each SASS instruction weighted by its loops' trip counts at the shape, × "
    "warps × programs, / B·N; per kernel, the tile config with the fewest instructions that does not spill. "
    "Predicted time (linvit/bench/cost_model.py): per kernel and configuration the largest of issue time "
    "(warp-instructions / (132 SMs × 4 schedulers × 1.98 GHz)), HBM time (the bytes of every global and local load "
    "and store the SASS executes, 32 lanes × width × trip counts, no credit for L1 or L2, / 4.8 TB/s) and "
    "tensor-core time (HMMA/HGMMA FLOPs from their shapes / 989 TFLOP/s bf16, 494 tf32); every torch op traced "
    "around the fused ops (fake tensors under a TorchDispatchMode) is its bytes / 4.8 TB/s, one launch each (a "
    "slice_backward two). *best*: per kernel the spill-free configuration predicted fastest; *worst*: the slowest "
    "configuration autotune may launch (it measures and may pick any of them): those that launch, less the ones that "
    "spill more than the least spilling (the run-time pruning, `triton_precompile.spill_free`). Launch latency is not "
    "counted."
)


def _targets(headline: dict) -> list[str]:
    forward, backward = headline["forward_ms"], headline["backward_ms"]
    worst = (headline["forward_ms_worst"] / forward, headline["backward_ms_worst"] / backward)
    ratio = (headline["focused_over_window_forward"], headline["focused_over_window_forward_backward"])
    launches = (headline["forward_launches"], headline["backward_launches"])
    spill = headline["max_spill_bytes_autotune_space"]
    rows = [
        ("predicted forward / backward, best configuration", f"{forward:.3f} / {backward:.3f} ms",
         "≤ 0.22 / ≤ 0.50 ms", forward <= 0.22 and backward <= 0.50),
        ("worst configuration autotune may launch (predicted time)", f"{worst[0]:.2f}× / {worst[1]:.2f}× the best",
         "≤ 1.5× the best", max(worst) <= 1.5),
        ("predicted focused / window module, forward and forward+backward", f"{ratio[0]:.2f} / {ratio[1]:.2f}",
         "≤ 0.5 / ≤ 0.7", ratio[0] <= 0.5 and ratio[1] <= 0.7),
        ("launches forward / backward, torch ops included", f"{launches[0]} / {launches[1]}", "≤ 2 / ≤ 5",
         launches[0] <= 2 and launches[1] <= 5),
        ("spills in the autotune space at head_dim ≤ 64", f"up to {spill:,} B", "0", spill == 0),
    ]  # fmt: skip
    lines = ["| | today | target | met |", "|---|---:|---:|---|"]
    lines += [f"| {label} | {value} | {target} | {'yes' if met else 'no'} |" for label, value, target, met in rows]
    return lines


def _ops_table(ops: list[dict]) -> list[str]:
    lines = ["| op | launches | MB | GFLOP | predicted ms |", "|---|---:|---:|---:|---:|"]
    for op in ops:
        lines.append(
            f"| {op['op']} | {op['launches']} | {op['bytes'] / 1e6:.2f} | {op['flops'] / 1e9:.1f} | {op['ms']:.4f} |"
        )
    return lines


def _shape_tables(entry: dict) -> list[str]:
    lines = [
        "| pass | kernel | fewest instr.: BLOCK_N × warps × stages | registers | spill B | programs | waves | "
        "warp-instr/token | best: config, B/token, tensor FLOP/token, ms (bound) | worst: config, spill B, ms |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for kernel in entry["kernels"]:
        config = f"{kernel['block_n'] or '-'} × {kernel['num_warps']} × {kernel['num_stages']}"
        quick, slow = kernel["fastest"], kernel["slowest"]
        lines.append(
            f"| {kernel['pass']} | {kernel['kernel']} | {config} | {kernel['registers']} | {kernel['spill_bytes']} | "
            f"{kernel['programs']} | {kernel['waves']:.2f} | {kernel['instructions_per_token']:.0f} | "
            f"{quick['config']}: {quick['bytes_per_token']:,.0f} B, {quick['tensor_flops_per_token']:,.0f}, "
            f"{quick['predicted_ms']:.3f} ({quick['predicted_bound']}) | "
            f"{slow['config']}: {slow['spill_bytes']} B, {slow['predicted_ms']:.3f} |"
        )
    for name, totals in entry["passes"].items():
        lines.append(
            f"| **{name}** | {totals['launches']} launches ({totals['kernel_launches']} kernels) | | | | | | "
            f"**{totals['instructions_per_token']:.0f}** | **{totals['predicted_ms']:.3f} ms** (torch ops "
            f"{totals['torch_ops_ms']:.3f}; HBM floor {totals['hbm_floor_ms']:.3f}) | "
            f"{totals['predicted_ms_worst']:.3f} ms |"
        )
    for name, totals in entry["passes"].items():
        ops = ", ".join(f"{op['op']} ({op['bytes'] / 1e6:.2f} MB)" for op in totals["torch_ops"]) or "none"
        lines += ["", f"Torch ops traced around the fused {name} op: {ops}."]
    return lines


def markdown(figure: dict, headline: dict) -> str:
    """The whole results file."""
    import torch
    import triton

    lines = [
        f"# Triton kernel cost on sm_{figure['arch']}, counted without a GPU",
        "",
        f"{datetime.date.today().isoformat()}, Triton {triton.__version__}, torch {torch.__version__}. Command: "
        f"`python -m benchmarks.kernel_resources --cost`. {_PREAMBLE}",
        "",
        f"Headline (benchmark shape): forward {headline['forward_ms']:.3f} ms / backward "
        f"{headline['backward_ms']:.3f} ms predicted (worst configuration {headline['forward_ms_worst']:.3f} / "
        f"{headline['backward_ms_worst']:.3f}; HBM floors {headline['hbm_floor_forward_ms']:.3f} / "
        f"{headline['hbm_floor_backward_ms']:.3f}); timm's window attention {headline['window_forward_ms']:.3f} / "
        f"{headline['window_backward_ms']:.3f} ms; {headline['forward_instructions_per_token']} / "
        f"{headline['backward_instructions_per_token']} warp-instructions per token; launches "
        f"{headline['forward_launches']} / {headline['backward_launches']}; largest spill of the chosen "
        f"configurations at head_dim ≤ 64 {headline['max_spill_bytes_head_dim_le_64']} B, of any configuration "
        f"autotune may launch {headline['max_spill_bytes_autotune_space']} B ("
        + ", ".join(
            f"{case}: {value}" for case, value in headline["spill_bytes_autotune_space_by_heads_x_head_dim"].items()
        )
        + "). Configurations that ask more shared memory than a program may have (227 KiB): "
        f"{', '.join(headline['unlaunchable_configurations']) or 'none'}.",
        "",
        "Issue 35's targets (benchmark shape: B=8, 4×32 heads, 256², bf16, 5×5 DWC, positional table; the idempotence "
        "of every launch is a test, tests/ops, not part of this figure):",
        "",
        *_targets(headline),
    ]
    for entry in figure["shapes"]:
        lines += ["", f"## {entry['shape']['name']}", "", *_shape_tables(entry)]
        window = entry.get("window_module")
        if window:
            lines += [
                "",
                f"### timm's Swin window attention at the same shape ({window['forward']['ms']:.3f} / "
                f"{window['backward']['ms']:.3f} ms, {window['forward']['launches']} / {window['backward']['launches']}"
                " launches)",
                "",
                "An unshifted block's `_attn` between its projections (7×7 windows, the map padded to whole windows): "
                "the torch ops traced, and `scaled_dot_product_attention` as a flash kernel (q, k, v in, out and "
                "log-sum-exp out; 4·L²·d FLOPs per head and window forward, 2.5× that backward; timm passes the "
                "relative position bias as attn_mask, which on a GPU selects the memory-efficient kernel and reads "
                "the bias too: not counted).",
            ]
            for name in ("forward", "backward"):
                lines += ["", f"{name}:", "", *_ops_table(window[name]["ops"])]
    return "\n".join(lines) + "\n"
