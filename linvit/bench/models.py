"""Backbone, training-step and ``torch.compile`` suites: whole timm models (linvit's and timm's own)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linvit.bench.measure import autocast_context
from linvit.bench.operators import Unavailable
from linvit.ops.onednn import bf16_native

LINVIT_PREFIXES = ("linvit_", "flatten_")


def _model_kwargs(name: str, hw: tuple[int, int]) -> dict:
    """How each family is asked to run at a resolution other than its pretraining one, keeping its design."""
    if name.startswith("swin_"):
        return {"img_size": hw}  # keeps 7×7 windows (set_input_size alone would scale the windows up)
    if name.startswith(("deit_", "vit_")):
        return {"dynamic_img_size": True}
    return {}


def create_model(name: str, hw: tuple[int, int], device=None) -> nn.Module:
    import timm

    if name.startswith(LINVIT_PREFIXES):
        try:
            import linvit.models  # noqa: F401  (registers linvit's families with timm)
        except ImportError as error:
            raise Unavailable(f"linvit.models does not import: {error}") from error
    if not timm.is_model(name):
        raise Unavailable(f"{name} is not registered with timm in this checkout")
    model = timm.create_model(name, pretrained=False, **_model_kwargs(name, hw))
    return model if device is None else model.to(device)


def count_model_macs(name: str, hw: tuple[int, int], model: nn.Module | None = None) -> tuple[int | None, str]:
    """MACs per image of one forward and how they were counted.

    First on the meta device (no real compute); a model that cannot build or run there is counted with one real
    forward of ``model`` (on its device) instead.
    """
    from linvit.utils import count_macs

    try:
        with torch.device("meta"):
            meta_model = create_model(name, hw)
        return int(count_macs(meta_model, (3, *hw))), "meta"
    except Unavailable:
        raise
    except Exception as error:  # noqa: BLE001 - some models cannot build or run on meta
        reason = f"{type(error).__name__} on meta"
    if model is None:
        return None, reason
    try:
        return int(count_macs(model, (3, *hw))), f"real forward ({reason})"
    except Exception as error:  # noqa: BLE001
        return None, f"{reason}; {type(error).__name__} on {next(model.parameters()).device}"


def backbone_callable(case: dict, device: torch.device, dtype: str):
    hw = (case["height"], case["width"])
    torch.manual_seed(0)
    model = create_model(case["model"], hw, device=device).eval()
    x = torch.randn(case["batch"], 3, *hw, device=device)

    def run():
        with torch.no_grad(), autocast_context(device, dtype):
            return model(x)

    info = {"pixels": hw[0] * hw[1], "params": sum(p.numel() for p in model.parameters())}
    run.model = model  # for the MAC count's fallback
    return run, info


def training_callable(case: dict, device: torch.device, dtype: str):
    """One optimizer step (forward, backward, AdamW); grads stay allocated between steps."""
    size = case["size"]
    torch.manual_seed(0)
    model = create_model(case["model"], (size, size), device=device).train()
    if case["checkpointing"]:
        try:
            model.set_grad_checkpointing(True)
        except (AttributeError, NotImplementedError, AssertionError) as error:
            raise Unavailable(f"{case['model']} has no gradient checkpointing: {error}") from error
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    x = torch.randn(case["batch"], 3, size, size, device=device)
    target = torch.randint(0, 1000, (case["batch"],), device=device)

    def step():
        optimizer.zero_grad(set_to_none=False)
        with autocast_context(device, dtype):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()

    return step, {"params": sum(p.numel() for p in model.parameters())}


def _break_in_attention(reason) -> bool:
    frames = getattr(reason, "user_stack", None) or []
    text = " ".join(f"{getattr(f, 'filename', '')}:{getattr(f, 'name', '')}" for f in frames)
    text += " " + str(getattr(reason, "reason", ""))
    return "attention" in text.lower() or "attn" in text.lower()


def compile_report(case: dict, device: torch.device, dtype: str, budget_s: float, repeats: int) -> dict:
    """Graph breaks under ``torch._dynamo.explain`` and the compiled-over-eager latency at one size."""
    import time

    import torch._dynamo

    from linvit.bench.measure import synchronize, time_call

    hw = (case["size"], case["size"])
    torch.manual_seed(0)
    model = create_model(case["model"], hw, device=device).eval()
    x = torch.randn(1, 3, *hw, device=device)
    result: dict = {}
    with torch.no_grad():
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(model)(x)
        reasons = list(explanation.break_reasons)
        result["graphs"] = explanation.graph_count
        result["graph_breaks"] = explanation.graph_break_count
        result["attention_breaks"] = sum(_break_in_attention(r) for r in reasons)
        result["break_reasons"] = sorted({str(getattr(r, "reason", r)).splitlines()[0][:160] for r in reasons})[:5]
        torch._dynamo.reset()

    def eager():
        with torch.no_grad(), autocast_context(device, dtype):
            return model(x)

    result["eager_ms"] = time_call(eager, device, repeats=repeats, budget_s=budget_s)["latency_ms"]
    compiled_model = torch.compile(model)

    def compiled():
        with torch.no_grad(), autocast_context(device, dtype):
            return compiled_model(x)

    start = time.perf_counter()
    compiled()
    synchronize(device)
    result["compile_s"] = time.perf_counter() - start
    result["compiled_ms"] = time_call(compiled, device, repeats=repeats, budget_s=budget_s)["latency_ms"]
    result["gain"] = result["eager_ms"] / result["compiled_ms"]
    return result


_ONNX_FILES: dict[str, str] = {}  # model (and size, for a static file) -> its exported file, once per worker process


def onnx_file(model: nn.Module, name: str, size: int) -> str:
    """The fp32 ONNX file of ``model``: one with dynamic height and width per model, as ``linvit export`` writes it;
    a model that does not export with them (timm's Swin, built for one size) gets one static file per size."""
    import tempfile

    from linvit.utils.deploy import export_onnx

    for key in (name, f"{name}@{size}"):
        if key in _ONNX_FILES:
            return _ONNX_FILES[key]
    folder = tempfile.mkdtemp(prefix="linvit-bench-onnx-")
    try:
        _ONNX_FILES[name] = str(export_onnx(model, f"{folder}/{name}.onnx", size=(size, size)))
        return _ONNX_FILES[name]
    except Exception:  # noqa: BLE001 - any failure of the dynamic trace: the static export below
        pass
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        program = torch.export.export(model.eval(), (x,))
    key = f"{name}@{size}"
    _ONNX_FILES[key] = str(export_onnx(model, f"{folder}/{name}_{size}.onnx", size=(size, size), program=program))
    return _ONNX_FILES[key]


def int8_file(fp32: str, size: int) -> str:
    """The int8 file of ``fp32`` (once per worker process): static QDQ as ``linvit export --quantize int8`` writes
    it, calibrated on 4 seeded random images (the ranges set which values clip, not what a node costs) at 224², or
    at the file's own size where it is static."""
    import numpy as np
    import onnx

    from linvit.utils.quantize import int8_path, quantize_static_int8

    key = f"{fp32}.int8"
    if key not in _ONNX_FILES:
        dims = onnx.load(fp32, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
        static = all(dim.HasField("dim_value") for dim in dims[2:])
        side = size if static else 224
        calibration = [np.random.default_rng(seed).standard_normal((1, 3, side, side), np.float32) for seed in range(4)]
        _ONNX_FILES[key] = str(quantize_static_int8(fp32, int8_path(fp32), calibration))
    return _ONNX_FILES[key]


def deploy_callable(case: dict, device: torch.device, dtype: str):
    """One forward of ``case["model"]`` at ``case["size"]``² on the CPU in one runtime (:data:`cases.RUNTIMES`).

    The ONNX file is exported once per model with dynamic batch/height/width (`linvit.utils.deploy.export_onnx`, the
    same file `linvit export --format onnx` writes) and serves every size (:func:`onnx_file`); ONNX Runtime runs as
    many intra-op threads as torch. ``torch_compile`` compiles before it returns, so the timing starts compiled.
    """
    if device.type != "cpu" or dtype != "fp32":
        raise Unavailable("the deploy suite compares CPU runtimes in fp32 (--device cpu --dtype fp32)")
    bf16 = case["runtime"] == "torch_eager_bf16"
    if bf16 and not cpu_has_bf16():
        raise Unavailable("this CPU has no bf16 instructions (AVX512-BF16 or AMX): bf16 would be emulated")
    size = case["size"]
    torch.manual_seed(0)
    model = create_model(case["model"], (size, size)).eval()
    x = torch.randn(case["batch"], 3, size, size)
    info = {"pixels": size * size, "params": sum(p.numel() for p in model.parameters())}
    if case["runtime"] in ("torch_eager", "torch_eager_bf16", "torch_compile"):
        forward = model
        if case["runtime"] == "torch_compile":
            forward = _compiled(model, x)
            info["compile_s"] = forward.compile_s

        def run():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                return forward(x)

        return run, info
    try:
        import onnxruntime
    except ImportError as error:
        raise Unavailable("onnxruntime is not installed (pip install 'linvit[onnx]')") from error

    path = onnx_file(model, case["model"], size)
    if case["runtime"] == "onnxruntime_int8":
        path = int8_file(path, size)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {"image": x.numpy()}

    def run_onnx():
        return session.run(None, feed)

    return run_onnx, info


def cpu_has_bf16() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (`linvit.ops.onednn.bf16_native`)."""
    return bf16_native()


def _compiled(model: nn.Module, x: torch.Tensor):
    """``torch.compile(model)`` run once on ``x`` (the compile is not timed); Unavailable without a C++ compiler."""
    import shutil
    import time

    if not any(shutil.which(compiler) for compiler in ("c++", "g++", "clang++")):
        raise Unavailable("torch.compile on the CPU needs a C++ compiler (c++, g++ or clang++ on PATH)")
    compiled = torch.compile(model)
    start = time.perf_counter()
    with torch.no_grad():
        compiled(x)
    compiled.compile_s = time.perf_counter() - start
    return compiled
