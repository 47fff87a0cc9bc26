"""Stopwatch, memory and machine helpers used inside benchmark worker processes (they import torch)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast_context(device: torch.device, dtype: str):
    """Autocast for reduced precision (weights stay fp32, as in mixed-precision training); nothing for fp32."""
    if dtype == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int = 2,
    repeats: int = 10,
    budget_s: float = 20.0,
) -> dict:
    """Median wall time of ``fn`` after warm-up.

    Warm-up runs ``warmup`` calls (one only when a call is slow); the number of timed calls is then fitted into
    ``budget_s`` (at least one, at most ``repeats``), so slow cases stay bounded and fast ones get many samples.
    """
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        if first * warmup > budget_s / 2:
            break
        fn()
    synchronize(device)
    count = max(1, min(repeats, int(budget_s / max(first, 1e-6))))
    times, cpu_times = [], []
    for _ in range(count):
        cpu_start = time.process_time()
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return {
        "latency_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "first_ms": 1e3 * first,
        "repeats": len(times),
        # CPU time of this process (all its threads) per call: the work done, much less sensitive than wall time
        # to other processes on a shared machine (time spent waiting for a core is not counted).
        "cpu_ms": 1e3 * statistics.median(cpu_times),
    }


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ≥ 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def current_rss_mib() -> float:
    kib = _status_kib("VmRSS")
    if kib is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return kib / 1024


def peak_rss_mib() -> float:
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return kib / 1024


def measure_peak_memory(fn: Callable[[], object], device: torch.device) -> dict:
    """Peak memory of one call of ``fn``, run once in a fresh process.

    CPU: peak resident set size (total, and above the resident size just before the call: the activations and
    workspaces of the call). CUDA: the caching allocator's peak above the allocation before the call.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return {"peak_mib": peak / 2**20, "activation_mib": (peak - before) / 2**20, "memory_kind": "cuda allocated"}
    reset = reset_peak_rss()
    before = current_rss_mib()
    fn()
    peak = peak_rss_mib()
    return {
        "peak_mib": peak,
        "activation_mib": peak - before,
        "memory_kind": "peak RSS" if reset else "peak RSS (not reset after imports)",
    }


def gemm_peak(device: torch.device, dtype: str = "fp32", size: int = 2048, repeats: int = 7) -> dict:
    """Measured dense matmul throughput (size³), the denominator of model-FLOP utilisation.

    ``gflops``: per wall-clock second (best call). ``gflop_per_cpu_s``: per second of this process's CPU time
    (median call), which a shared machine disturbs much less; MFU from CPU times divides by it.
    """
    torch_dtype = torch.float32 if dtype == "fp32" else DTYPES[dtype]
    a = torch.randn(size, size, device=device, dtype=torch_dtype)
    b = torch.randn(size, size, device=device, dtype=torch_dtype)
    stats = time_call(lambda: torch.mm(a, b), device, warmup=2, repeats=repeats, budget_s=10.0)
    flop = 2 * size**3
    return {"gflops": flop / (stats["min_ms"] / 1e3) / 1e9, "gflop_per_cpu_s": flop / (stats["cpu_ms"] / 1e3) / 1e9}


def gemm_peak_gflops(device: torch.device, dtype: str = "fp32", size: int = 2048, repeats: int = 7) -> float:
    return gemm_peak(device, dtype, size, repeats)["gflops"]


def machine_info(device: torch.device) -> dict:
    import importlib.metadata as metadata

    versions = {}
    for package in ("torch", "torchvision", "timm", "numpy", "linvit"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    cpu_model = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "env": {k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")},
    }
    try:
        with open("/proc/meminfo") as meminfo:
            info["memory_gib"] = round(int(meminfo.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
