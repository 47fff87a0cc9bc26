"""Compile every tile configuration of a plan's autotuned kernels at once, on a thread each, before autotuning.

`triton.autotune` compiles a new shape's configurations one after another as it times them: 36 compiles for one
shape of linvit_tiny, 35 s on one core of this project's CPU machine (Triton 3.6), and every distinct shape of a model
pays it again on a cold cache. Triton's compiler releases the GIL (the same 36 took 18 s on two threads), and its
``AsyncCompileMode`` hands the compiles of ``warmup`` calls to an executor, so a plan's kernels are warmed in parallel
for each configuration of ``TILE_CONFIGS``; the autotuner then finds them compiled. A speed-up only: where the
executor or warmup is missing or fails, autotuning compiles them itself, as before.

The autotune space is then pruned to the configurations whose compiled code does not spill (:func:`spill_free`):
a spilling configuration reads and writes its spilled registers in local memory on every tile, and ptxas's choice
depends on the shape, so whether one spills is read from the compiled kernel itself, once per autotune key. By the
cost figure at head_dim ≤ 64 (Triton 3.8, sm_90), 64-token tiles spill in query_grad and key_value_grad at every
shape and 32-token ones at 4×32 (up to 1,640 B), and were predicted up to 5.7× slower than the kernel's best.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

from torch import Tensor
from torch._guards import detect_fake_mode

from linvit.ops.linear_attention import triton_geometry

try:  # Triton >= 3.4
    from triton.runtime._async_compile import AsyncCompileMode
except ImportError:  # pragma: no cover - older Triton: the autotuner compiles in turn
    AsyncCompileMode = None

__all__ = ["precompile", "spill_free"]

_warmed: set[tuple] = set()  # the autotune keys (kernel, N bucket, sizes, dtypes) already compiled


def autotune_key(launch: triton_geometry.Launch) -> tuple:
    """What `triton.autotune` keys a launch on (its N bucket and sizes, the dtypes of its tensors), and the kernel."""
    sizes = tuple(launch.constants.get(name) for name in triton_geometry.AUTOTUNE_SIZES)
    dtypes = tuple(str(value.dtype) for value in launch.args.values() if isinstance(value, Tensor))
    return launch.name, triton_geometry.n_bucket(launch), sizes, dtypes


def precompile(launches: list[triton_geometry.Launch]) -> None:
    """Warm every configuration of the tuned ``launches`` whose autotune key is new, all on one thread pool."""
    tensors = tuple(value for launch in launches for value in launch.args.values() if isinstance(value, Tensor))
    if AsyncCompileMode is None or detect_fake_mode(tensors) is not None:  # torch.compile traces: inductor compiles
        return
    jobs = []
    for launch in launches:
        key = autotune_key(launch) if launch.tuned else None
        if key is not None and key not in _warmed:
            _warmed.add(key)
            jobs += [(launch, config) for config in triton_geometry.TILE_CONFIGS]
    if not jobs:
        return
    try:
        # a configuration that fails to compile is left out (ignore_errors): the autotuner meets the failure as before
        with (
            ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool,
            AsyncCompileMode(pool, ignore_errors=True),
        ):
            for launch, (block, warps, stages) in jobs:
                launch.kernel.warmup(
                    **launch.args, **launch.constants, N_BUCKET=triton_geometry.n_bucket(launch), BLOCK_N=block,
                    num_warps=warps, num_stages=stages, grid=launch.grid,
                )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - only a speed-up: autotuning compiles what this did not
        warnings.warn(f"linvit: compiling the tile configurations in parallel failed ({error!r}); autotuning "
                      "compiles them one after another", RuntimeWarning, stacklevel=2)  # fmt: skip


def spill_free(kernel):
    """A pruning of ``kernel``'s (a @triton.jit function's) autotune space, with the signature of `triton.autotune`'s
    ``early_config_prune`` (the backend applies it before making the autotuner, `triton._tuned`): the configurations
    whose compiled code spills no registers, or, if every one spills, those that spill least. A configuration whose
    spills cannot be read (it does not compile or load: the autotuner reports that itself) is kept, and so is every
    one while torch.compile traces the op on fake tensors (inductor then tunes the whole space)."""

    def prune(configs, named_args, **kwargs):
        arguments = {name: value for name, value in {**named_args, **kwargs}.items() if name not in _LAUNCH_KEYWORDS}
        tensors = tuple(value for value in arguments.values() if isinstance(value, Tensor))
        if detect_fake_mode(tensors) is not None:
            return list(configs)
        spills = {config: _spilled_registers(kernel, config, arguments) for config in configs}
        least = min((count for count in spills.values() if count is not None), default=0)
        return [config for config in configs if spills[config] is None or spills[config] <= least]

    return prune


_LAUNCH_KEYWORDS = ("grid", "warmup")  # what the autotuner passes on besides the kernel's own arguments


def _spilled_registers(kernel, config, arguments: dict) -> int | None:
    """The registers that ``kernel`` compiled with ``config`` spills (None where that cannot be read)."""
    try:
        compiled = kernel.warmup(
            **arguments, **config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages, grid=(1,)
        )
        compiled._init_handles()  # loads the binary; the driver reports its registers and spills
        return int(compiled.n_spills)
    except Exception:  # noqa: BLE001 - out of resources, an older Triton: the autotuner meets it as before
        return None
