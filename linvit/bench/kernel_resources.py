"""What the GPU compiler says about linvit's Triton kernels, without a GPU: registers, spills, shared memory.

Compiles every kernel of `linvit.ops.linear_attention` ahead of time for a CUDA target (Triton ships ptxas, so no
GPU or CUDA toolkit is needed) with the launch configurations `linvit.ops.linear_attention.triton` uses, and reads the
resource usage of the resulting cubin. Spilled registers (a non-zero stack) turn register traffic into local-memory
traffic, which is what an IO-bound kernel cannot afford; this is the check to run after changing a kernel.

    python -m benchmarks.kernel_resources                      # sm_90 (H100/H200), the usual shapes
    python -m benchmarks.kernel_resources --arch 80 --head-dims 32,64 --heads 3,4 --maps focused

Prints a markdown table; exits with status 1 when any kernel spills.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU even where tests run the interpreter

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from linvit.ops.linear_attention import triton as fused  # noqa: E402
from linvit.ops.linear_attention import triton_backward, triton_forward  # noqa: E402
from linvit.ops.linear_attention.triton_tiles import ELU, FOCUSED, RELU  # noqa: E402

_FLOAT_ARGUMENTS = ("eps", "feature_eps")
_MAPS = {"focused": FOCUSED, "relu": RELU, "elu": ELU}


def _signature(fn, constants: dict, pointer_types: dict) -> tuple[dict, dict]:
    names = [parameter.name for parameter in fn.params]
    signature = {}
    for name in names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointer_types.get(name, "*fp32")
        elif name in _FLOAT_ARGUMENTS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature, {(names.index(name),): value for name, value in constants.items()}


def _usage(fn, constants: dict, pointer_types: dict, num_warps: int, arch: int) -> dict:
    signature, constexprs = _signature(fn, constants, pointer_types)
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps},
    )
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        report = subprocess.run([tool, "-res-usage", cubin.name], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split(":") for item in next(line for line in report.splitlines() if "REG:" in line).split())
    return {"registers": int(fields["REG"]), "stack": int(fields["STACK"]), "shared": compiled.metadata.shared}


def kernel_cases(head_dim: int, heads: int, feature_map: str, dtype: str) -> list[tuple[str, object, dict, dict, int]]:
    """(name, kernel, compile-time constants, pointer types, warps) of every kernel for one shape, as launched."""
    channels = heads * head_dim
    sizes = fused.kernel_sizes(channels, head_dim, dtype != "fp32")
    dims = fused.compile_time_sizes(sizes)
    data = {"qkv_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "do_ptr": f"*{dtype}", "dqkv_ptr": f"*{dtype}"}
    data["mask_ptr"] = "*u8"
    flags = {"MAP": _MAPS[feature_map], "POWER": 3.0}
    cases = []
    for name, kernel in (
        ("state", triton_forward.state_kernel),
        ("output", triton_forward.output_kernel),
        ("state_grad", triton_backward.state_grad_kernel),
        ("query_grad", triton_backward.query_grad_kernel),
        ("key_value_grad", triton_backward.key_value_grad_kernel),
    ):
        block, warps = fused.launch_config(name, sizes["D_PAD"])
        constants = {**dims, **flags, "BLOCK_N": block}
        if name in ("state", "output"):
            constants["PRESCALED"] = False
        if name in ("state", "key_value_grad"):
            constants["HAS_POS"] = True
        if name in ("state", "output", "key_value_grad"):
            constants["HAS_MASK"] = True
        if name in ("output", "key_value_grad"):
            constants.update(K=5, HAS_DWC=True)
        if name == "output":
            constants["HAS_BIAS"] = True
        if name == "key_value_grad":
            constants["KK_PAD"] = 32
        if name in ("query_grad", "key_value_grad"):
            constants["H_PAD"] = triton.next_power_of_2(heads)
        cases.append((name, kernel, constants, data, warps))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: H100/H200)")
    parser.add_argument("--head-dims", default="16,32,64,128")
    parser.add_argument("--heads", default="3,4,8")
    parser.add_argument("--maps", default="focused,relu")
    parser.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 inputs")
    args = parser.parse_args(argv)
    print("| map | heads × d | kernel | BLOCK_N | warps | registers | spilled (stack bytes) | shared bytes |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    spills = 0
    for feature_map in args.maps.split(","):
        for heads in (int(h) for h in args.heads.split(",")):
            for head_dim in (int(d) for d in args.head_dims.split(",")):
                for name, kernel, constants, pointers, warps in kernel_cases(head_dim, heads, feature_map, args.dtype):
                    usage = _usage(kernel, constants, pointers, warps, args.arch)
                    spills += usage["stack"] > 0
                    print(
                        f"| {feature_map} | {heads} × {head_dim} | {name} | {constants['BLOCK_N']} | {warps} | "
                        f"{usage['registers']} | {usage['stack']} | {usage['shared']} |",
                        flush=True,
                    )
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
