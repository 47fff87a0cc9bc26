"""Compile for sm_90, without a GPU, every kernel launch of the GPU test tier's small cases and whole models
(`test_linear_attention_cuda`: the naive-reference cases and the models on the Triton backend) in the tile
configuration each test pins, and print one JSON line: how many kernels compiled, and each failure (a compile error,
or shared memory beyond the 227 KiB a program may have, which fails at launch).

Run as a script in a process of its own (`test_gpu_tier_compiles.py`): the test session runs Triton's interpreter,
under which nothing compiles. The cases run on CPU tensors through the real Triton ops with three stand-ins: the
backend accepts CPU tensors, the plans are made for an H200's 132 SMs, and each launch is compiled instead of run (its
outputs stay uninitialised; only the compiled code matters here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from test_linear_attention import CASES, _cast, _inputs, off_a_word  # noqa: E402
from test_linear_attention_cuda import DTYPE_CASES, MODEL_NAMES, OFF_A_WORD_CASE, _pinned_config  # noqa: E402

import linvit.ops._backend as backend  # noqa: E402
from linvit.bench.kernel_cost import SHARED_PER_PROGRAM, compile_launch, launch_signature  # noqa: E402
from linvit.ops import linear_attention_qkv  # noqa: E402
from linvit.ops.linear_attention import triton as fused  # noqa: E402
from linvit.ops.linear_attention import triton_geometry  # noqa: E402

compiled: dict[tuple, int] = {}
failures: list[str] = []
pinned: list[tuple[int, int, int]] = []


def compile_launches(launches: list[triton_geometry.Launch]) -> None:
    for launch in launches:
        constants, args = dict(launch.constants), dict(launch.args)
        block, warps, stages = pinned[-1] if launch.tuned else (0, launch.num_warps, 1)
        if launch.tuned:
            constants["BLOCK_N"], args["N_BUCKET"] = block, 0  # as `pinned_tiles` launches them
        signature, constexprs, attrs = launch_signature(launch.kernel, args, constants)
        key = (launch.name, repr(sorted(signature.items())), repr(sorted(constexprs.items(), key=repr)), repr(attrs),
               warps, stages)  # fmt: skip
        if key in compiled:
            continue
        where = f"{launch.name} {block}x{warps}x{stages} {sorted(constexprs.items(), key=repr)}"
        try:
            kernel = compile_launch(launch.kernel, args, constants, warps, stages)
        except Exception as error:  # noqa: BLE001 - every compile error is a finding
            compiled[key] = -1
            failures.append(f"{where}: {type(error).__name__}: {str(error)[-400:]}")
            continue
        compiled[key] = kernel.metadata.shared
        if kernel.metadata.shared > SHARED_PER_PROGRAM:
            failures.append(f"{where}: {kernel.metadata.shared} B of shared memory")


backend.triton_available = lambda device: True
triton_geometry.device_multiprocessors = lambda device: 132
fused._run = compile_launches

# the small cases of test_compiled_kernels_equal_naive, and its bf16 case off a word
SMALL_CASES = [(name, dtype, False) for name, dtype in DTYPE_CASES] + [(OFF_A_WORD_CASE, torch.bfloat16, True)]
for name, dtype, shift in SMALL_CASES:
    qkv, kwargs = _inputs(CASES[name], batch=3)
    qkv, kwargs = _cast(qkv, kwargs, dtype, torch.device("cpu"))
    qkv = off_a_word(qkv) if shift else qkv
    pinned.append(_pinned_config("off-a-word" if shift else f"{name}-{dtype}"))
    leaves = [qkv] + [value for value in kwargs.values() if isinstance(value, torch.Tensor) and value.requires_grad]
    out = linear_attention_qkv(qkv, backend="triton", **kwargs)
    torch.autograd.grad(out, leaves, torch.ones_like(out))
    pinned.pop()

import timm  # noqa: E402

import linvit  # noqa: E402, F401 - registers the models
from linvit.ops import use_backend  # noqa: E402

for model_name in MODEL_NAMES:  # bf16 under autocast, as the GPU test runs them (at 224: the tests' size)
    model = timm.create_model(model_name, num_classes=10).train()
    pinned.append(_pinned_config(model_name))
    with use_backend("triton"), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 3, 224, 224))
    out.float().sum().backward()
    pinned.pop()
print(json.dumps({"compiled": len(compiled), "failures": failures}))
