"""Measured peak memory of the same workload, run once for real in a fresh Python process.

CPU: the process's peak resident set size (the kernel's high-water mark, reset just before the model is built)
above its resident size at that moment. By default the child runs with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc
then serves every block of 64 KiB or more with its own mapping and returns it when freed, so the resident size
follows the live tensors, which is what the prediction counts. With ``default_malloc=True`` the child keeps the
C library's defaults; glibc then keeps freed blocks below its adaptive threshold (up to 32 MiB) for reuse, and
the peak resident size runs above the live tensors (docs/memory.md has measured examples).

CUDA (untested: the project's machines have no GPU): ``torch.cuda.max_memory_allocated`` above the allocation
before the model is built, so the CUDA context and the caching allocator's reserve are not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from linvit.memory.estimate import check_input

__all__ = ["Measurement", "measure_memory", "measure_runs"]

_MMAP_THRESHOLD = 64 * 1024


@dataclass(frozen=True)
class Measurement:
    """What one real run used: ``peak_bytes`` above the baseline, how it was measured (``kind``), and the seconds
    its warm-up and measured run took."""

    peak_bytes: int
    baseline_bytes: int
    kind: str
    seconds: float


def measure_memory(
    model: str,
    height: int,
    width: int,
    batch: int = 1,
    *,
    default_malloc: bool = False,
    timeout: float | None = None,
    **options: Any,
) -> Measurement:
    """Run :func:`linvit.memory.workload.run_workload` for real in a fresh process and measure its peak memory.

    The arguments are those of :func:`linvit.memory.estimate_memory` (``options``: ``train``, ``dtype``, ``device``,
    ``model_kwargs``, as :func:`measure_runs` takes them), plus ``default_malloc`` and ``timeout``. Raises
    RuntimeError with the child's error when the run fails (out of memory included).
    """
    run = {"model": model, "height": height, "width": width, "batch": batch, **options}
    return measure_runs([run], default_malloc=default_malloc, timeout=timeout)[0]


def measure_runs(
    runs: Sequence[Mapping[str, Any]], *, default_malloc: bool = False, timeout: float | None = None
) -> list[Measurement]:
    """Measure several runs one after the other in one fresh process (it imports PyTorch once).

    Each run is a mapping of :func:`measure_memory`'s arguments (``model``, ``height``, ``width``, and optionally
    ``batch``, ``train``, ``dtype``, ``device``, ``model_kwargs``); each is warmed up and measured from its own
    baseline, after the previous run's model is gone.
    """
    specs = []
    for run in runs:
        unknown = set(run) - {"model", "height", "width", "batch", "train", "dtype", "device", "model_kwargs"}
        if unknown:
            raise ValueError(f"Unknown run options {sorted(unknown)}; see measure_memory's arguments.")
        spec = {"batch": 1, "train": False, "dtype": "fp32", "device": "cpu", "model_kwargs": {}, **run}
        spec["model_kwargs"] = dict(spec["model_kwargs"] or {})
        check_input(spec["batch"], spec["height"], spec["width"])
        specs.append(spec)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if not default_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = str(_MMAP_THRESHOLD)
    result = subprocess.run(
        [sys.executable, "-m", "linvit.memory.measure", json.dumps(specs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"measuring {[spec['model'] for spec in specs]} failed:\n{result.stderr[-3000:]}")
    reports = json.loads(result.stdout.strip().splitlines()[-1])
    measurements = []
    for spec, report in zip(specs, reports):
        kind = report["kind"]
        if spec["device"] == "cpu":
            kind += ", glibc defaults" if default_malloc else ", malloc returns freed blocks"
        measurements.append(Measurement(report["peak_bytes"], report["baseline_bytes"], kind, report["seconds"]))
    return measurements


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _build(spec: dict, device, height: int, width: int, batch: int):
    import timm
    import torch

    model = timm.create_model(spec["model"], **spec["model_kwargs"]).to(device)
    in_chans = int(getattr(model, "in_chans", 0) or model.pretrained_cfg.get("input_size", (3,))[0])
    return model, torch.randn(batch, in_chans, height, width, device=device)


def _warm_up(spec: dict, device) -> None:
    """Run the workload once with a model of its own, so that what PyTorch keeps after a first run of these shapes
    (library code paged in, oneDNN's kernels generated for them, thread pools: a few MiB) is in the baseline rather
    than counted as the model's. linvit's size caches it builds are dropped (the measured run builds its own)."""
    import contextlib
    import ctypes
    import gc

    from linvit.memory.workload import fresh_size_caches, run_workload

    with fresh_size_caches():
        model, images = _build(spec, device, spec["height"], spec["width"], spec["batch"])
        run_workload(model, images, train=spec["train"], dtype=spec["dtype"], calls=1)
        del model, images
    gc.collect()
    if device.type == "cpu":
        # hand the freed heap back to the system (glibc), as the measured run's own frees are
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def _run(spec: dict) -> dict:
    import torch

    import linvit.models  # noqa: F401  (registers the families)
    from linvit.memory.workload import fresh_size_caches, run_workload

    start = time.perf_counter()
    device = torch.device(spec["device"])
    torch.manual_seed(0)
    _warm_up(spec, device)
    if device.type == "cuda":
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        kind = "CUDA max_memory_allocated (untested)"
    else:
        # reset the kernel's high-water mark to the resident size now (Linux >= 4.0), then take it as the baseline
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        baseline = _status_bytes("VmRSS")
        kind = "peak RSS"
    with fresh_size_caches():  # built by this run, as in a fresh process, and dropped after it
        model, images = _build(spec, device, spec["height"], spec["width"], spec["batch"])
        run_workload(model, images, train=spec["train"], dtype=spec["dtype"])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
        else:
            peak = _status_bytes("VmHWM")
        del model, images
    return {
        "peak_bytes": peak - baseline,
        "baseline_bytes": baseline,
        "kind": kind,
        "seconds": time.perf_counter() - start,
    }


if __name__ == "__main__":
    print(json.dumps([_run(spec) for spec in json.loads(sys.argv[1])]))
