"""Where the time goes: torch.profiler over one operator or one backbone, grouped into kinds of work.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 python -m benchmarks.profile_ops --op linvit_focused --map 56 --heads 3x32
    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 python -m benchmarks.profile_ops --model linvit_tiny --size 1024
    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 python -m benchmarks.profile_ops --model linvit_tiny --size 1024 \
        --runtime onnxruntime_cpu      # or onnxruntime_int8: ONNX Runtime's own profiler, per node

Prints the share of self CPU time per kind (matmul, convolution, copies/layout, elementwise, reductions/norms,
softmax/SDPA, quantize, other) and the top ops (aten ops; for ONNX Runtime, its node op types). Set the environment
before Python starts (torch reads it at import).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

KINDS = (  # aten op names and ONNX Runtime op types; the first kind with a marker wins (DequantizeLinear: quantize)
    ("quantize", ("quantizelinear", "dequantizelinear", "dynamicquantizelinear")),
    ("matmul", ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "einsum", "gemm", "matmulinteger")),
    ("sdpa/softmax", ("scaled_dot_product", "flash_attention", "softmax", "_safe_softmax")),
    ("convolution", ("conv", "mkldnn_convolution", "_convolution")),
    (
        "copy/layout",
        ("copy_", "contiguous", "clone", "cat", "pad", "constant_pad", "roll", "index", "_to_copy")
        + ("transpose", "reshape", "gather", "concat", "slice", "expand", "scatterelements", "tile"),
    ),
    (
        "norm/reduction",
        ("norm", "sum", "mean", "layer_norm", "native_layer_norm", "linalg_vector_norm", "var", "normalization")
        + ("reducesum", "reducemean", "reducel2"),
    ),
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


LEAF_NAMESPACES = ("aten::", "mkldnn::", "mkl::")


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
    # Leaf-level view: self time of aten ops (composite ops add little self time on top of their kernels) and of the
    # oneDNN / MKL ops that CPU inference calls directly (linvit.ops.onednn's fused linear layers and convolutions)
    rows = [
        (e.key, e.self_cpu_time_total / steps / 1e3, e.count // steps)
        for e in events
        if e.key.startswith(LEAF_NAMESPACES)
    ]
    total = sum(r[1] for r in rows) or 1.0
    by_kind: dict[str, float] = defaultdict(float)
    for name, ms, _ in rows:
        by_kind[kind_of(name)] += ms
    del torch
    return total, dict(by_kind), sorted(rows, key=lambda r: -r[1])


def profile_onnxruntime(path: str, feed: dict, steps: int = 3, threads: int = 2):
    """ONNX Runtime's profiler over ``steps`` runs of the file at ``path`` (after two unprofiled ones): total node
    time per run in ms, ms per kind, and (op type, ms per run, nodes per run) sorted by time, like :func:`profile`."""
    import json
    import tempfile

    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="linvit-ort-profile-") as folder:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = f"{folder}/ort"
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        runs = 2 + steps
        for _ in range(runs):
            session.run(None, feed)
        with open(session.end_profiling()) as file:
            events = json.load(file)
    node_events = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    # the profile starts at session creation: keep each node's last `steps` runs, the ones after the warm-up
    per_node: dict[str, list] = defaultdict(list)
    for event in node_events:
        per_node[event["name"]].append(event)
    ms_by_op: dict[str, float] = defaultdict(float)
    nodes_by_op: dict[str, int] = defaultdict(int)
    for runs_of_node in per_node.values():
        op_type = runs_of_node[0]["args"]["op_name"]
        ms_by_op[op_type] += sum(e["dur"] for e in runs_of_node[-steps:]) / steps / 1e3
        nodes_by_op[op_type] += 1
    rows = sorted(((op, ms, nodes_by_op[op]) for op, ms in ms_by_op.items()), key=lambda r: -r[1])
    by_kind: dict[str, float] = defaultdict(float)
    for name, ms, _ in rows:
        by_kind[kind_of(name)] += ms
    return sum(ms_by_op.values()), dict(by_kind), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", help="operator name (linvit.bench.cases.OPERATORS)")
    parser.add_argument("--map", type=int, default=56)
    parser.add_argument("--heads", default="3x32")
    parser.add_argument("--mode", choices=("fwd", "fwdbwd"), default="fwd")
    parser.add_argument("--model", help="backbone name (instead of --op)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument(
        "--runtime",
        choices=("torch_eager", "onnxruntime_cpu", "onnxruntime_int8"),
        default="torch_eager",
        help="with --model: eager PyTorch (torch.profiler) or the deploy suite's ONNX file (ONNX Runtime's profiler)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: set OMP_WAIT_POLICY=PASSIVE before Python starts for representative timings", file=sys.stderr)

    import torch

    from linvit.bench.cases import parse_heads

    device = torch.device("cpu")
    if args.model and args.runtime != "torch_eager":
        from linvit.bench import models

        model = models.create_model(args.model, (args.size, args.size)).eval()
        path = models.onnx_file(model, args.model, args.size)
        if args.runtime == "onnxruntime_int8":
            path = models.int8_file(path, args.size)
        feed = {"image": torch.randn(args.batch, 3, args.size, args.size).numpy()}
        total, by_kind, rows = profile_onnxruntime(path, feed, args.steps, torch.get_num_threads())
        _print_profile(f"{args.model} at {args.size}², batch {args.batch}, {args.runtime}", total, by_kind, rows, args)
        return 0
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
    _print_profile(what, total, by_kind, rows, args)
    return 0


def _print_profile(what: str, total: float, by_kind: dict, rows: list, args) -> None:
    import torch

    print(f"{what}: {total:.2f} ms of op self time per call ({torch.get_num_threads()} threads)")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<15} {ms:9.2f} ms  {100 * ms / max(total, 1e-9):5.1f}%")
    print("top ops (self ms per call, calls or nodes per call):")
    for name, ms, count in rows[: args.rows]:
        print(f"  {name:<45} {ms:9.2f} ms  {100 * ms / max(total, 1e-9):5.1f}%  x{count}")


if __name__ == "__main__":
    sys.exit(main())
