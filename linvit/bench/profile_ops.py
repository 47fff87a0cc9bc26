"""Where the time goes: torch.profiler over one operator or one backbone, grouped into kinds of work.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 python -m benchmarks.profile_ops --op linvit_focused --map 56 --heads 3x32
    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 python -m benchmarks.profile_ops --model linvit_tiny --size 1024

Prints the share of self CPU time per kind (matmul, convolution, copies/layout, elementwise, reductions/norms,
softmax/SDPA, other) and the top aten ops. Set the environment before Python starts (torch reads it at import).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

KINDS = (
    ("matmul", ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "einsum")),
    ("sdpa/softmax", ("scaled_dot_product", "flash_attention", "softmax", "_safe_softmax")),
    ("convolution", ("conv", "mkldnn_convolution", "_convolution")),
    ("copy/layout", ("copy_", "contiguous", "clone", "cat", "pad", "constant_pad", "roll", "index", "_to_copy")),
    ("norm/reduction", ("norm", "sum", "mean", "layer_norm", "native_layer_norm", "linalg_vector_norm", "var")),
    (
        "elementwise",
        (
            "add",
            "mul",
            "div",
            "pow",
            "relu",
            "gelu",
            "softplus",
            "sub",
            "reciprocal",
            "clamp",
            "exp",
            "sqrt",
            "rsqrt",
            "where",
            "fill_",
            "zero_",
            "threshold",
            "silu",
            "hardswish",
            "sigmoid",
            "neg",
            "abs",
        ),
    ),
)


def kind_of(op_name: str) -> str:
    name = op_name.split("::")[-1].lower()
    for kind, markers in KINDS:
        if any(name == m or name.startswith(m) or name.endswith(m) or f"_{m}" in name for m in markers):
            return kind
    return "other"


def profile(fn, steps: int = 3):
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()
    fn()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    events = prof.key_averages()
    # Leaf-level view: self time of aten ops (composite ops add little self time on top of their kernels).
    rows = [
        (e.key, e.self_cpu_time_total / steps / 1e3, e.count // steps) for e in events if e.key.startswith("aten::")
    ]
    total = sum(r[1] for r in rows) or 1.0
    by_kind: dict[str, float] = defaultdict(float)
    for name, ms, _ in rows:
        by_kind[kind_of(name)] += ms
    del torch
    return total, dict(by_kind), sorted(rows, key=lambda r: -r[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", help="operator name (linvit.bench.cases.OPERATORS)")
    parser.add_argument("--map", type=int, default=56)
    parser.add_argument("--heads", default="3x32")
    parser.add_argument("--mode", choices=("fwd", "fwdbwd"), default="fwd")
    parser.add_argument("--model", help="backbone name (instead of --op)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: set OMP_WAIT_POLICY=PASSIVE before Python starts for representative timings", file=sys.stderr)

    import torch

    from linvit.bench.cases import parse_heads

    device = torch.device("cpu")
    if args.model:
        from linvit.bench.models import backbone_callable

        case = {"suite": "backbones", "model": args.model, "height": args.size, "width": args.size, "batch": args.batch}
        fn, _ = backbone_callable(case, device, "fp32")
        what = f"{args.model} at {args.size}², batch {args.batch}"
    elif args.op:
        from linvit.bench.operators import operator_callable

        heads, head_dim = parse_heads(args.heads)[0]
        case = {"op": args.op, "map": args.map, "heads": heads, "head_dim": head_dim, "mode": args.mode, "batch": 1}
        fn, _ = operator_callable(case, device, "fp32")
        what = f"{args.op} at {args.map}², {heads}×{head_dim} heads, {args.mode}"
    else:
        parser.error("give --op or --model")
    total, by_kind, rows = profile(fn, args.steps)
    print(f"{what}: {total:.2f} ms of aten self time per call ({torch.get_num_threads()} threads)")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<15} {ms:9.2f} ms  {100 * ms / total:5.1f}%")
    print("top ops (self ms per call, calls per call):")
    for name, ms, count in rows[: args.rows]:
        print(f"  {name:<45} {ms:9.2f} ms  {100 * ms / total:5.1f}%  x{count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
