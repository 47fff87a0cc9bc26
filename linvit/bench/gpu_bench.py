"""Timing on one device for the GPU target table (linvit/bench/gpu.py): CUDA-event medians, the allocator's peak,
a wall-clock budget, measurements remembered by key, and linvit's backend switch around a measurement."""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from linvit.bench.measure import autocast_context
from linvit.bench.models import backbone_callable, create_model, training_callable
from linvit.bench.operators import Unavailable, build_operator, operator_callable


@dataclass(frozen=True)
class Sizes:
    """What the table measures at: the issue's setup, or tiny sizes for a CPU smoke test."""

    maps: tuple[int, int, int]  # operator maps, small to large (56², 128², 256² tokens)
    batch: int
    heads: int
    head_dim: int
    model_size: int  # whole models: 1024² at batch 8 ...
    model_batch: int
    large_size: int  # ... 2048² at batch 2 ...
    large_batch: int
    small_size: int  # ... and 224² at batch 64 (inference and training)
    small_batch: int


FULL = Sizes((56, 128, 256), 8, 4, 32, 1024, 8, 2048, 2, 224, 64)
QUICK = Sizes((8, 12, 16), 2, 2, 16, 32, 1, 48, 1, 32, 2)


class Budget:
    """Wall-clock seconds left for the run; a measurement starts only when its estimate still fits."""

    def __init__(self, seconds: float, reserve: float = 0.0, start: float | None = None):
        self.start = time.monotonic() if start is None else start
        self.seconds = seconds
        self.reserve = reserve  # kept back for the last row (torch.compile)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, with_reserve: bool = True) -> float:
        return self.seconds - self.elapsed() - (self.reserve if with_reserve else 0.0)


def _ops():
    """linvit.ops, or None in a checkout without it (the eager column then reads n/a)."""
    try:
        import linvit.ops as ops
    except ImportError:
        return None
    return ops


class Bench:
    """Times callables on one device and remembers each measurement (rows share them)."""

    def __init__(
        self,
        device: torch.device,
        dtype: str,
        sizes: Sizes,
        budget: Budget,
        seconds_per_case: float,
        warmup: int = 2,
        min_calls: int = 3,
    ):
        self.device = device
        self.dtype = dtype
        self.sizes = sizes
        self.budget = budget
        self.seconds_per_case = seconds_per_case
        self.warmup = warmup  # calls after the first (which compiles kernels and fills caches)
        self.min_calls = min_calls
        self.results: dict[str, dict] = {}
        ops = _ops()
        # where "auto" already means eager (no GPU, or no Triton), the eager column repeats the fused measurement
        self.auto_is_torch = ops is not None and ops.resolve_backend("auto", device) == "torch"

    # -- timing ---------------------------------------------------------------------------------------------------
    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_ms(self, fn: Callable[[], object]) -> dict:
        """Median milliseconds per call: warm-up, then as many calls as fit in seconds_per_case (min_calls to 50)."""
        self._synchronize()
        start = time.perf_counter()
        fn()
        self._synchronize()
        first = time.perf_counter() - start
        for _ in range(self.warmup if first < 0.5 else 0):
            fn()
        self._synchronize()
        count = int(min(50, max(self.min_calls, self.seconds_per_case / max(first, 1e-4))))
        times = []
        if self.device.type == "cuda":
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)
            ]
            for begin, end in events:
                begin.record()
                fn()
                end.record()
            torch.cuda.synchronize(self.device)
            times = [begin.elapsed_time(end) for begin, end in events]
        else:
            for _ in range(count):
                start = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - start))
        return {"ms": statistics.median(times), "min_ms": min(times), "calls": count, "first_ms": 1e3 * first}

    def peak_mib(self, fn: Callable[[], object]) -> dict:
        """The CUDA allocator's peak during one call, above what was allocated before it (activations, grads)."""
        if self.device.type != "cuda":
            raise Unavailable("peak memory is read from the CUDA allocator")
        fn()  # warm: lazily built state (kernels, workspaces, caches) is not the call's own memory
        self._synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        fn()
        self._synchronize()
        return {"mib": (torch.cuda.max_memory_allocated(self.device) - before) / 2**20}

    # -- measurements, remembered by key ----------------------------------------------------------------------------
    def measure(
        self, key: str, estimate_s: float, run: Callable[[], dict], backend: str | None = None, switch: bool = True
    ) -> dict:
        """Run `run` once for `key` (inside `use_backend(backend)` when `switch`); skipped when the budget is short.

        Keys end with the backend, so a "torch" measurement reuses the "auto" one where "auto" means "torch" here.
        """
        if key in self.results:
            return self.results[key]
        if backend == "torch" and self.auto_is_torch:
            same = self.results.get(key[: -len("torch")] + "auto")
            if same is not None:
                self.results[key] = same
                return same
        if self.budget.left() < estimate_s:
            result = {"status": "skipped", "why": f"time budget ({self.budget.seconds:.0f} s) spent"}
        else:
            started = time.perf_counter()
            try:
                with _backend_context(backend if switch else None):
                    result = {"status": "ok", **run()}
            except Unavailable as error:
                result = {"status": "n/a", "why": str(error)}
            except Exception as error:  # noqa: BLE001 - one failing row must not end the run
                result = {"status": "error", "why": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            result["seconds"] = time.perf_counter() - started
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.results[key] = result
        return result

    def operator(self, op: str, size: int, mode: str, backend: str | None = None, memory: bool = False) -> dict:
        s = self.sizes
        case = {"op": op, "map": size, "heads": s.heads, "head_dim": s.head_dim, "batch": s.batch, "mode": mode}

        def run() -> dict:
            fn, _ = operator_callable(case, self.device, self.dtype)
            return self.peak_mib(fn) if memory else self.time_ms(fn)

        kind = "memory" if memory else "time"
        return self.measure(f"{kind}|{op}|{size}|{mode}|{backend}", 3.0 if size >= 128 else 1.5, run, backend)

    def core(self, size: int, backend: str) -> dict:
        """The focused attention core alone (qkv output in, attention output out) through linvit.ops."""
        s = self.sizes
        hw = (size, size)

        def run() -> dict:
            ops = _ops()
            if ops is None or not hasattr(ops, "linear_attention_qkv"):
                raise Unavailable("linvit.ops.linear_attention_qkv is not in this checkout")
            torch.manual_seed(0)
            module = build_operator("linvit_focused", s.heads * s.head_dim, s.heads, hw, device=self.device).eval()
            x = torch.randn(s.batch, size * size, s.heads * s.head_dim, device=self.device)
            with torch.no_grad(), autocast_context(self.device, self.dtype):
                qkv = module.qkv(x)
            inverse_temperature = 1.0 / torch.nn.functional.softplus(module.scale.float().view(-1))
            arguments = {
                "hw": hw,
                "num_heads": s.heads,
                "feature_map": "focused",
                "inverse_temperature": inverse_temperature,
                "focusing_factor": module.focusing_factor,
                "key_position": module.positional_encoding[0],
                "dwc_weight": module.dwc.weight,
                "dwc_bias": module.dwc.bias,
                "backend": backend,
            }

            def call():
                with torch.no_grad(), autocast_context(self.device, self.dtype):
                    return ops.linear_attention_qkv(qkv, **arguments)

            timing = self.time_ms(call)
            elements = qkv.numel() + qkv.numel() // 3  # read q|k|v, write o
            timing["bytes"] = elements * qkv.element_size()
            timing["gbps"] = timing["bytes"] / (timing["ms"] * 1e-3) / 1e9
            return timing

        return self.measure(f"core|{size}|{backend}", 3.0, run, backend, switch=False)

    def model(self, name: str, size: int, batch: int, backend: str | None = None) -> dict:
        def run() -> dict:
            fn, _ = backbone_callable(
                {"model": name, "height": size, "width": size, "batch": batch}, self.device, self.dtype
            )
            return self.time_ms(fn)

        return self.measure(f"model|{name}|{size}|{batch}|{backend}", 10.0 if size >= 1024 else 6.0, run, backend)

    def training(self, name: str, size: int, batch: int, backend: str | None = None) -> dict:
        def run() -> dict:
            case = {"model": name, "size": size, "batch": batch, "checkpointing": False}
            fn, _ = training_callable(case, self.device, self.dtype)
            timing = self.time_ms(fn)
            timing["images_per_s"] = batch / (timing["ms"] * 1e-3)
            return timing

        return self.measure(f"train|{name}|{size}|{batch}|{backend}", 10.0, run, backend)

    def copy_gbps(self) -> dict:
        """Achieved device-memory bandwidth of a large copy (read + write), a measured stand-in for the HBM peak."""

        def run() -> dict:
            elements = (1 << 28) if self.device.type == "cuda" else (1 << 22)  # 1 GiB / 16 MiB of fp32
            source = torch.empty(elements, device=self.device)
            target = torch.empty_like(source)
            timing = self.time_ms(lambda: target.copy_(source))
            timing["mib"] = source.numel() * source.element_size() / 2**20
            timing["gbps"] = 2 * timing["mib"] * 2**20 / (timing["ms"] * 1e-3) / 1e9  # read and written
            return timing

        return self.measure("copy", 2.0, run)


@contextlib.contextmanager
def _backend_context(backend: str | None):
    if backend is None:
        yield
        return
    ops = _ops()
    if ops is None or not hasattr(ops, "use_backend"):
        raise Unavailable("linvit.ops.use_backend is not in this checkout")
    with ops.use_backend(backend):
        yield


def compile_measurement(model: str, size: int, batch: int, device: torch.device, dtype: str, backend: str) -> dict:
    """Seconds to the first compiled call (the compile), and eager vs compiled latency (medians)."""
    torch.manual_seed(0)
    network = create_model(model, (size, size), device=device).eval()
    x = torch.randn(batch, 3, size, size, device=device)

    def call(module) -> None:
        with torch.no_grad(), autocast_context(device, dtype):
            module(x)

    bench = Bench(device, dtype, QUICK, Budget(float("inf")), seconds_per_case=1.0)
    eager = bench.time_ms(lambda: call(network))
    compiled = torch.compile(network, backend=backend)
    bench._synchronize()
    start = time.perf_counter()
    call(compiled)
    bench._synchronize()
    compile_s = time.perf_counter() - start
    return {"compile_s": compile_s, "eager_ms": eager["ms"], "compiled_ms": bench.time_ms(lambda: call(compiled))["ms"]}


def machine(device: torch.device) -> dict:
    import importlib.metadata as metadata

    versions = {}
    for package in ("torch", "triton", "timm", "linvit"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    info = {"device": str(device), "versions": versions, "python": sys.version.split()[0]}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    ops = _ops()
    info["auto_backend"] = ops.resolve_backend("auto", device) if ops is not None else "n/a (no linvit.ops)"
    return info
