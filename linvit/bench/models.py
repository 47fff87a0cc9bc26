"""Backbone, training-step and ``torch.compile`` suites: whole timm models (linvit's and timm's own)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linvit.bench.measure import autocast_context
from linvit.bench.operators import Unavailable

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


_ONNX_FILES: dict[str, str] = {}  # model name -> its exported file, once per worker process (one export per model)


def _int8_file(fp32: str, model_name: str) -> str:
    """The int8 file of ``fp32`` (once per worker process): static QDQ as ``linvit export --quantize int8`` writes
    it, calibrated on 4 seeded random images at 224² (the ranges set which values clip, not what a node costs)."""
    import numpy as np

    from linvit.utils.quantize import int8_path, quantize_static_int8

    key = f"{model_name}.int8"
    if key not in _ONNX_FILES:
        calibration = [np.random.default_rng(seed).standard_normal((1, 3, 224, 224), np.float32) for seed in range(4)]
        _ONNX_FILES[key] = str(quantize_static_int8(fp32, int8_path(fp32), calibration))
    return _ONNX_FILES[key]


def deploy_callable(case: dict, device: torch.device, dtype: str):
    """One forward of ``case["model"]`` at ``case["size"]``² in eager PyTorch or in ONNX Runtime on the CPU.

    The ONNX file is exported once per model with dynamic batch/height/width (`linvit.utils.deploy.export_onnx`, the
    same file `linvit export --format onnx` writes) and serves every size; ONNX Runtime runs as many intra-op threads
    as torch.
    """
    import tempfile

    if device.type != "cpu" or dtype != "fp32":
        raise Unavailable("the deploy suite compares CPU runtimes in fp32 (--device cpu --dtype fp32)")
    size = case["size"]
    torch.manual_seed(0)
    model = create_model(case["model"], (size, size)).eval()
    x = torch.randn(case["batch"], 3, size, size)
    info = {"pixels": size * size, "params": sum(p.numel() for p in model.parameters())}
    if case["runtime"] == "torch_eager":

        def run():
            with torch.no_grad():
                return model(x)

        return run, info
    try:
        import onnxruntime
    except ImportError as error:
        raise Unavailable("onnxruntime is not installed (pip install 'linvit[onnx]')") from error
    from linvit.utils.deploy import export_onnx

    path = _ONNX_FILES.get(case["model"])
    if path is None:
        folder = tempfile.mkdtemp(prefix="linvit-bench-onnx-")
        path = _ONNX_FILES[case["model"]] = str(export_onnx(model, f"{folder}/{case['model']}.onnx"))
    if case["runtime"] == "onnxruntime_int8":
        path = _int8_file(path, case["model"])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {"image": x.numpy()}

    def run_onnx():
        return session.run(None, feed)

    return run_onnx, info
