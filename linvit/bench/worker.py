"""A benchmark worker process: runs a list of cases and appends one JSON line per case to ``--out``.

Started by :mod:`linvit.bench.run` (which sets ``OMP_WAIT_POLICY`` and the thread count before torch is imported
here). ``--kind latency`` times every case in this process; ``--kind memory`` is started once per case, so the
peak it reads belongs to that case alone. Before each case it writes a ``start`` line, so the runner can tell
which case was running if the process dies or runs out of time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def _write(out, record: dict) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def _callable_for(case: dict, device, dtype: str):
    if case["suite"] == "operators":
        from linvit.bench.operators import operator_callable

        return operator_callable(case, device, dtype)
    if case["suite"] == "backbones":
        from linvit.bench.models import backbone_callable

        return backbone_callable(case, device, dtype)
    if case["suite"] == "training":
        from linvit.bench.models import training_callable

        return training_callable(case, device, dtype)
    if case["suite"] == "deploy":
        from linvit.bench.models import deploy_callable

        return deploy_callable(case, device, dtype)
    raise ValueError(f"no callable for suite {case['suite']!r}")


def run_case(case: dict, kind: str, device, args) -> dict:
    import torch

    from linvit.bench import measure

    if case["suite"] == "machine":
        info = measure.machine_info(device)
        size = case.get("gemm_size", 2048)
        info["gemm_size"] = size
        peak = measure.gemm_peak(device, "fp32", size=size)
        info["gemm_peak_gflops"], info["gemm_gflop_per_cpu_s"] = peak["gflops"], peak["gflop_per_cpu_s"]
        if args.dtype != "fp32":
            peak = measure.gemm_peak(device, args.dtype, size=size)
            info[f"gemm_peak_gflops_{args.dtype}"] = peak["gflops"]
            info[f"gemm_gflop_per_cpu_s_{args.dtype}"] = peak["gflop_per_cpu_s"]
        return info
    if case["suite"] == "compile":
        from linvit.bench.models import compile_report

        return compile_report(case, device, args.dtype, args.budget, args.repeats)
    if kind == "memory":
        fn, info = _callable_for(case, device, args.dtype)
        if case["suite"] == "training":
            fn()  # grads and optimizer state exist from the first step on; the peak above them is activations
            import gc

            gc.collect()
        info.update(measure.measure_peak_memory(fn, device))
        return info
    fn, info = _callable_for(case, device, args.dtype)
    info.update(measure.time_call(fn, device, warmup=args.warmup, repeats=args.repeats, budget_s=args.budget))
    if case["suite"] == "backbones":
        from linvit.bench.models import count_model_macs

        info["macs"], info["macs_counted"] = count_model_macs(
            case["model"], (case["height"], case["width"]), getattr(fn, "model", None)
        )
    del fn
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("latency", "memory"), required=True)
    parser.add_argument("--cases", required=True, help="JSON file with a list of cases")
    parser.add_argument("--out", required=True, help="JSON-lines file to append results to")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds of timed calls per case (at least one)")
    args = parser.parse_args(argv)

    import torch

    from linvit.bench.cases import case_key
    from linvit.bench.operators import Unavailable

    device = torch.device(args.device)
    with open(args.cases) as f:
        cases = json.load(f)
    with open(args.out, "a") as out:
        for case in cases:
            key = case_key(case)
            _write(out, {"event": "start", "key": key, "kind": args.kind, "time": time.time()})
            record = {"event": "result", "key": key, "kind": args.kind, "case": case}
            try:
                record.update(run_case(case, args.kind, device, args))
                record["status"] = "ok"
            except Unavailable as note:
                record.update(status="skipped", note=str(note))
            except Exception as error:  # noqa: BLE001 - one failing case must not stop the suite
                last = traceback.extract_tb(error.__traceback__)[-1]
                where = f"{last.filename.rsplit('/', 2)[-1]}:{last.lineno}"
                record.update(status="error", note=f"{type(error).__name__}: {str(error)[:300]} ({where})")
                if isinstance(error, torch.OutOfMemoryError) and device.type == "cuda":
                    torch.cuda.empty_cache()
            _write(out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
