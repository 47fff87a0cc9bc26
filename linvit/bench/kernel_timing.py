"""On a GPU: every kernel the focused linear attention launches, timed, beside the cost figure's prediction.

    python -m benchmarks.kernel_timing --out DIR     # CUDA only; about a minute on an H200

At the cost figure's benchmark shape (`kernel_resources.SHAPES[0]`: B=8, 4×32 heads, 256², bf16, 5×5 DWC, a
positional table), FocusedLinearAttention's computation between its projections (`torch_launches.focused_module`'s
call) runs forward and backward on the triton backend. Its first call autotunes (the spill-free space of
`triton_precompile.spill_free`); its gradients are compared with the torch backend's, the case issue 35 found wrong
on a GPU. Then torch.profiler records the CUDA kernels of ``--iterations`` forward and forward+backward calls: the
device time per call of each kernel (torch's kernels included), and per autotuned kernel the configuration chosen and
the ones it measured. The window attention that timm's Swin runs (`torch_launches.window_module`'s call, flash SDPA)
is timed the same way. Writes ``kernel-timing.json`` and ``kernel-timing.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

FORWARD_KERNELS = ("state_kernel", "output_kernel", "output_rows_kernel", "token_norms_kernel")


def _focused_call(shape, device):
    from linvit.ops.linear_attention.attend import focused_linear_attention

    channels = shape.heads * shape.head_dim
    generator = torch.Generator(device="cpu").manual_seed(0)

    def tensor(*size, scale=1.0, dtype=torch.float32):
        return (torch.randn(*size, generator=generator) * scale).to(device, dtype).requires_grad_()

    inputs = {
        "x": tensor(shape.batch, shape.tokens, 3 * channels, dtype=torch.bfloat16),
        "scale": tensor(1, 1, channels, scale=0.1),
        "position_table": tensor(1, shape.tokens, channels, scale=0.02),
        "dwc_weight": tensor(shape.head_dim, 1, shape.kernel_size, shape.kernel_size, scale=0.1),
        "dwc_bias": tensor(shape.head_dim, scale=0.1),
    }

    def call(backend: str = "triton"):
        return focused_linear_attention(hw=shape.hw, num_heads=shape.heads, position_table_size=shape.hw,
                                        backend=backend, **inputs)  # fmt: skip

    return call, inputs


def _window_call(shape, device):
    from timm.models.swin_transformer import SwinTransformerBlock

    from linvit.bench.kernel_resources import WINDOW_SIZE

    channels = shape.heads * shape.head_dim
    block = SwinTransformerBlock(channels, shape.hw, num_heads=shape.heads, window_size=WINDOW_SIZE, shift_size=0)
    block = block.to(device, torch.bfloat16).train()
    block.attn.fused_attn = True
    x = torch.randn(shape.batch, shape.hw[0], shape.hw[1], channels, device=device, dtype=torch.bfloat16)
    x.requires_grad_()
    return lambda: block._attn(x), {"x": x}


def _gradients(call, inputs, backend: str) -> dict[str, torch.Tensor]:
    for tensor in inputs.values():
        tensor.grad = None
    out = call(backend)
    out.float().square().mean().backward()
    return {name: tensor.grad.float().clone() for name, tensor in inputs.items()}


def first_call_agreement(call, inputs) -> dict[str, float]:
    """Per input, the largest difference between the triton backend's gradient on its first (autotuning) call and
    the torch backend's, relative to the largest torch gradient."""
    triton_grads = _gradients(call, inputs, "triton")
    torch_grads = _gradients(call, inputs, "torch")
    errors = {}
    for name in inputs:
        largest = torch_grads[name].abs().max().clamp_min(1e-30)
        errors[name] = float((triton_grads[name] - torch_grads[name]).abs().max() / largest)
    return errors


def kernel_times(step, iterations: int) -> dict[str, dict]:
    """Device time per call of every CUDA kernel ``step`` launches: {name: {"us": ..., "launches": ...}}."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            step()
        torch.cuda.synchronize()
    times: dict[str, dict] = defaultdict(lambda: {"us": 0.0, "launches": 0})
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = times[event.name]
            entry["us"] += event.device_time / iterations
            entry["launches"] += 1
    for entry in times.values():
        entry["launches"] = round(entry["launches"] / iterations, 2)
    return dict(times)


def _backward_step(call, inputs):
    def step():
        for tensor in inputs.values():
            tensor.grad = None
        call().float().square().mean().backward()

    return step


def chosen_configurations() -> dict[str, dict]:
    """Per autotuned kernel: the configuration chosen per autotune key and the ones measured (the pruned space)."""
    from linvit.ops.linear_attention import triton as triton_backend

    chosen = {}
    for key, tuner in triton_backend._tuned_kernels.items():
        name = " ".join(str(part) for part in key)  # kernel, N bucket, sizes, dtypes, traced
        measured = getattr(tuner, "configs_timings", None) or {}
        chosen[name] = {
            "chosen": [str(config) for config in tuner.cache.values()],
            "measured_ms": {
                str(config): float(ms[0] if isinstance(ms, list | tuple) else ms) for config, ms in measured.items()
            },  # fmt: skip
        }
    return chosen


def _recording_spills(record: list):
    """Wrap `triton_precompile._spilled_registers`, which the autotune pruning calls, to record what it reads."""
    from linvit.ops.linear_attention import triton_precompile

    read = triton_precompile._spilled_registers

    def recorded(kernel, config, arguments):
        spills = read(kernel, config, arguments)
        record.append({"kernel": getattr(kernel, "__name__", str(kernel)), "config": str(config), "spills": spills})
        return spills

    triton_precompile._spilled_registers = recorded


def measure(iterations: int = 20, save=lambda result: None) -> dict:
    """The measurements, step by step; ``save(result)`` after each one, so that a run stopped at its time limit
    leaves what it measured."""
    # imported here: kernel_resources clears TRITON_INTERPRET (it compiles for the GPU), which CPU tests rely on
    from linvit.bench.kernel_resources import SHAPES

    started = time.monotonic()

    def saved(step: str) -> None:  # the seconds each step ended at, in the result and on stderr as it goes
        result.setdefault("step_seconds", {})[step] = round(time.monotonic() - started, 1)
        print(f"kernel_timing: {step} done at {result['step_seconds'][step]} s", file=sys.stderr, flush=True)
        save(result)

    device = torch.device("cuda")
    shape = SHAPES[0]
    call, inputs = _focused_call(shape, device)
    result = {"shape": shape.name, "iterations": iterations, "gpu": torch.cuda.get_device_name(), "spills": []}
    _recording_spills(result["spills"])
    result["first_call_gradient_error"] = first_call_agreement(call, inputs)
    result["configurations"] = chosen_configurations()
    saved("first call (compile, autotune, gradients)")
    with torch.no_grad():
        result["focused_forward"] = kernel_times(lambda: call(), iterations)
    saved("focused forward")
    result["focused_forward_backward"] = kernel_times(_backward_step(call, inputs), iterations)
    saved("focused forward+backward")
    window, window_inputs = _window_call(shape, device)
    with torch.no_grad():
        result["window_forward"] = kernel_times(window, iterations)
    result["window_forward_backward"] = kernel_times(_backward_step(window, window_inputs), iterations)
    saved("window")
    return result


def total_ms(times: dict[str, dict]) -> float:
    return sum(entry["us"] for entry in times.values()) / 1e3


def report(result: dict) -> str:
    lines = [f"# Kernel timing on {result['gpu']}", "", f"Shape: {result['shape']}; {result['iterations']} calls.", ""]
    errors = ", ".join(f"{name} {value:.2e}" for name, value in result.get("first_call_gradient_error", {}).items())
    lines += [f"First (autotuning) call's gradients against the torch backend, max |diff| / max |torch|: {errors}.", ""]
    steps = ", ".join(f"{step} {seconds} s" for step, seconds in result.get("step_seconds", {}).items())
    lines += [f"Steps ended at: {steps or '-'}.", ""]
    sections = (
        ("focused, forward", "focused_forward"),
        ("focused, forward+backward", "focused_forward_backward"),
        ("window (timm Swin, flash SDPA), forward", "window_forward"),
        ("window, forward+backward", "window_forward_backward"),
    )
    for title, key in sections:
        if key not in result:  # the run stopped before it
            lines += [f"## {title}: not measured", ""]
            continue
        times = result[key]
        lines += [f"## {title}: {total_ms(times):.3f} ms of kernels per call", ""]
        lines += ["| kernel | µs per call | launches |", "|---|---:|---:|"]
        for name, entry in sorted(times.items(), key=lambda item: -item[1]["us"]):
            lines.append(f"| `{name[:90]}` | {entry['us']:.1f} | {entry['launches']} |")
        lines.append("")
    lines += ["## Autotune: spills read by the pruning (registers spilled; None: not read)", ""]
    lines += [f"- {entry['kernel']} {entry['config']}: {entry['spills']}" for entry in result.get("spills", [])]
    lines += ["", "## Autotune: chosen and measured configurations", ""]
    for name, entry in result.get("configurations", {}).items():
        measured = ", ".join(f"{config} {ms:.3f} ms" for config, ms in entry["measured_ms"].items())
        lines.append(f"- {name}: chosen {'; '.join(entry['chosen'])}; measured {measured or '-'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results/cuda"))
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--force", action="store_true", help="replace files in --out that linvit did not write")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: kernel timing needs a CUDA GPU", file=sys.stderr)
        return 1
    from linvit.io.destination import DestinationError, check_destination, write_text

    files = {"json": args.out / "kernel-timing.json", "md": args.out / "kernel-timing.md"}
    try:  # before the minutes on the GPU: a file there that linvit did not write is refused (--force replaces it)
        for name, path in files.items():
            check_destination(path, "bench-results" if name == "json" else "bench-report", force=args.force)
    except DestinationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    def save(result: dict) -> None:  # after each step (linvit's own file from the first: the next save replaces it)
        write_text(files["json"], json.dumps(result, indent=1), "bench-results", force=args.force)
        write_text(files["md"], report(result), "bench-report", force=args.force)

    print(report(measure(args.iterations, save)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
