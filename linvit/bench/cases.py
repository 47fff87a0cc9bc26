"""What each suite measures: plain lists of cases (dicts), built without importing torch.

A case names one measurement; the worker that runs it (:mod:`linvit.bench.worker`) turns it into a callable. A case's
key (every field, sorted) identifies its row when results of several runs are merged.
"""

from __future__ import annotations

SUITES = ("operators", "backbones", "training", "compile", "deploy")

# name -> what it is (the table's legend).
OPERATORS = {
    "linvit_focused": "linvit FocusedLinearAttention (focused p=3, DWC 5×5, learnable positional encoding)",
    "authors_focused": "FLatten authors' formulation, restated (linvit/bench/baselines.py): the baseline to beat",
    "linvit_linear": "linvit plain ReLU linear attention (`create_attention('linear')`)",
    "linvit_window": "linvit WindowAttention 7×7 softmax",
    "linvit_nystrom": "linvit NystromAttention (Nyströmformer: 8×8 landmarks, 6 pseudo-inverse steps, 5×5 skip)",
    "linvit_linformer": "linvit LinformerAttention (Linformer: keys and values pooled to 16×16 cells)",
    "timm_window_sdpa": "timm Swin WindowAttention 7×7 through SDPA (+ pad/partition)",
    "timm_window_eager": "timm Swin WindowAttention 7×7, timm's default eager path (+ pad/partition)",
    "sdpa_global": "global softmax through `F.scaled_dot_product_attention` (O(N²))",
}
HEAD_CONFIGS = ((3, 32), (4, 32), (8, 64))
OPERATOR_MAPS = (32, 56, 64, 128, 256)
GLOBAL_SOFTMAX_MAX_TOKENS = 128 * 128  # O(N²): 256² at 8×64 heads would take minutes per call on 2 cores

BACKBONES = (
    "linvit_nano",
    "linvit_tiny",
    "flatten_swin_tiny_patch4_224",
    "flatten_pvt_v2_b1",
    "swin_tiny_patch4_window7_224",
    "deit_small_patch16_224",
    "pvt_v2_b1",
    "efficientvit_b1",
    "convnext_tiny",
    "resnet50",
)
BACKBONE_SIZES = ((224, 224), (512, 512), (1024, 1024), (2048, 2048), (1600, 2560))  # (H, W)
TRAINING_MODELS = (
    "linvit_nano",
    "linvit_tiny",
    "flatten_swin_tiny_patch4_224",
    "flatten_pvt_v2_b1",
    "swin_tiny_patch4_window7_224",
    "convnext_tiny",
)


def case_key(case: dict) -> str:
    return "|".join(f"{k}={case[k]}" for k in sorted(case))


def parse_heads(text: str) -> list[tuple[int, int]]:
    """``"3x32,4x32"`` -> [(3, 32), (4, 32)]."""
    configs = []
    for item in text.split(","):
        heads, _, head_dim = item.strip().lower().partition("x")
        if not head_dim:
            raise ValueError(f"--heads expects HEADSxDIM items like 3x32,4x32; got {item!r}")
        configs.append((int(heads), int(head_dim)))
    return configs


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"224,2560x1600"`` -> [(224, 224), (1600, 2560)] (W×H as written on screens, stored as (H, W))."""
    sizes = []
    for item in text.split(","):
        width, _, height = item.strip().lower().partition("x")
        sizes.append((int(height or width), int(width)))
    return sizes


def operator_cases(
    maps: list[int], heads: list[tuple[int, int]], ops: list[str], batch: int = 1, modes=("fwd", "fwdbwd")
) -> list[dict]:
    cases = []
    for num_heads, head_dim in heads:
        for size in maps:
            for mode in modes:
                for op in ops:
                    if op == "sdpa_global" and size * size > GLOBAL_SOFTMAX_MAX_TOKENS:
                        continue
                    cases.append(
                        {
                            "suite": "operators",
                            "op": op,
                            "map": size,
                            "heads": num_heads,
                            "head_dim": head_dim,
                            "mode": mode,
                            "batch": batch,
                        }
                    )
    return cases


def backbone_cases(models: list[str], sizes: list[tuple[int, int]], batch_for) -> list[dict]:
    return [
        {"suite": "backbones", "model": model, "height": h, "width": w, "batch": batch_for(h, w)}
        for (h, w) in sizes
        for model in models
    ]


def training_cases(models: list[str], size: int, batch: int) -> list[dict]:
    return [
        {"suite": "training", "model": model, "size": size, "batch": batch, "checkpointing": ckpt}
        for model in models
        for ckpt in (False, True)
    ]


def compile_cases(models: list[str], sizes: list[int]) -> list[dict]:
    return [{"suite": "compile", "model": model, "size": size} for model in models for size in sizes]


# The deploy suite: each model in every runtime a user would deploy it with on a CPU, at high resolutions (issue 37):
# linvit's two families beside Swin-T, ConvNeXt-T and timm's EfficientViT (MIT, also linear attention).
DEPLOY_MODELS = (
    "linvit_tiny",
    "flatten_swin_tiny_patch4_224",
    "swin_tiny_patch4_window7_224",
    "convnext_tiny",
    "efficientvit_b2",
)
DEPLOY_SIZES = (512, 1024, 2048)
RUNTIMES = {
    "torch_eager": "eager PyTorch (the torch backend on the CPU)",
    "torch_eager_bf16": "eager PyTorch under bf16 autocast, where the CPU has bf16 instructions (AVX512-BF16, AMX)",
    "torch_compile": "torch.compile (inductor, CPU; needs a C++ compiler), compiled once per size before timing",
    "onnxruntime_cpu": "ONNX Runtime, CPUExecutionProvider, the file of `linvit export --format onnx` (dynamic "
    "height and width; a model that does not export with them, at its size)",
    "onnxruntime_int8": "ONNX Runtime, CPUExecutionProvider, that file quantized to int8 as `--quantize int8` does "
    "(static QDQ, per-channel weights; calibrated on seeded random images, which sets the speed, not the accuracy)",
}


def deploy_cases(models: list[str], sizes: list[int], runtimes=RUNTIMES) -> list[dict]:
    return [
        {"suite": "deploy", "model": model, "size": size, "runtime": runtime, "batch": 1}
        for model in models
        for size in sizes
        for runtime in runtimes
    ]
