"""Predicted peak memory of a model at a given input, from a dry run on fake tensors (no real memory, no compute).

The model is built on the meta device and given fake parameters of the target device (``FakeTensorMode``), so every
op dispatches as it would there (the CPU's fused attention kernel, CUDA's) while :class:`AllocationTracker` counts
the storages they create and free. The workload is :func:`run_workload`'s: the peak over two inference passes or two
AdamW steps. Forward hooks on the stages (``feature_info``) give the breakdown per stage.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import timm
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import linvit.models  # noqa: F401  (registers linvit's families with timm)
from linvit.memory.fake import EagerViewStrides
from linvit.memory.stages import attention_label, stage_modules
from linvit.memory.tracker import AllocationTracker, Scope
from linvit.memory.workload import DTYPES, fresh_size_caches, make_optimizer, run_workload
from linvit.memory.workspace import cpu_workspace_bytes
from linvit.ops import use_backend

__all__ = ["MemoryEstimate", "StageMemory", "estimate_memory", "check_input"]


@dataclass(frozen=True)
class StageMemory:
    """One stage of the last call: its token grid, attention, and the live bytes while it runs.

    ``peak_bytes``: everything live at the stage's peak (model, optimizer state, activations). ``kept_bytes``: what
    the stage adds and leaves behind (its output; in training also the activations it saves for backward).
    """

    name: str
    grid: tuple[int, int] | None
    tokens: int
    attention: str
    peak_bytes: int
    kept_bytes: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of :func:`run_workload` for one model and input; bytes throughout."""

    model: str
    batch: int
    height: int
    width: int
    train: bool
    dtype: str
    device: str
    parameter_bytes: int
    buffer_bytes: int
    input_bytes: int
    optimizer_bytes: int
    peak_bytes: int
    peak_at: str
    stages: tuple[StageMemory, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def state_bytes(self) -> int:
        """What lives through the whole loop: parameters, buffers, the input batch and the optimizer's state."""
        return self.parameter_bytes + self.buffer_bytes + self.input_bytes + self.optimizer_bytes

    @property
    def activation_bytes(self) -> int:
        """The rest of the peak: activations, gradients and temporaries at that moment."""
        return self.peak_bytes - self.state_bytes

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "stages"}
        data["stages"] = [stage.__dict__.copy() for stage in self.stages]
        data["state_bytes"], data["activation_bytes"] = self.state_bytes, self.activation_bytes
        return data


def check_input(batch: int, height: int, width: int) -> None:
    for name, value in (("batch", batch), ("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _storage_bytes(tensors) -> int:
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def _grid_and_tokens(output: Any, channels: int | None) -> tuple[tuple[int, int] | None, int]:
    """((h, w), h·w) of a stage's (B, C, H, W) or (B, H, W, C) output (told apart by the stage's channel count);
    (None, N) for tokens (B, N, C)."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if not isinstance(output, torch.Tensor) or output.dim() not in (3, 4):
        return None, 0
    if output.dim() == 3:
        return None, int(output.shape[1])
    last_is_channels = output.shape[-1] == channels and output.shape[1] != channels
    height, width = output.shape[1:3] if last_is_channels else output.shape[2:]
    return (int(height), int(width)), int(height * width)


@contextlib.contextmanager
def _stage_scopes(model, tracker: AllocationTracker, shapes: dict[str, Any]) -> Iterator[None]:
    """Open a tracker scope while each stage runs and remember its output's shape."""
    handles = []
    channels = {info.get("module"): info.get("num_chs") for info in getattr(model, "feature_info", None) or []}
    for name, module in stage_modules(model):
        opened: list[Scope] = []

        def pre_hook(_module, _args, name=name, opened=opened):
            opened.append(tracker.open_scope(name))

        def hook(_module, _args, output, name=name, opened=opened):
            tracker.close_scope(opened.pop())
            shapes[name] = _grid_and_tokens(output, channels.get(name))

        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def estimate_memory(
    model: str,
    height: int,
    width: int,
    batch: int = 1,
    *,
    train: bool = False,
    dtype: str = "fp32",
    device: str = "cpu",
    model_kwargs: Mapping[str, Any] | None = None,
) -> MemoryEstimate:
    """Predict the peak memory of ``model`` (a timm name) on ``batch`` images of ``height`` × ``width``.

    ``train``: AdamW steps instead of inference. ``dtype``: "fp32", or "bf16"/"fp16" autocast. ``device``: "cpu" or
    "cuda". CUDA without a GPU here is simulated: the dry run dispatches CPU kernels but counts CUDA's 512-byte
    allocation blocks and runs AdamW's multi-tensor step, and linvit's attention runs its eager backend (the fused
    kernels plan their launches from the GPU's properties); the estimate's notes say so.
    """
    check_input(batch, height, width)
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}.")
    target = torch.device(device)
    if target.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}.")
    notes = []
    run_on, backend = target, contextlib.nullcontext()
    if target.type == "cuda" and not torch.cuda.is_available():
        # fake CUDA tensors need a GPU for the backward pass (autograd's device threads) and for the fused kernels
        run_on, backend = torch.device("cpu"), use_backend("torch")
        notes.append(
            "no GPU here: simulated with CPU kernels, CUDA's 512-byte blocks and AdamW's multi-tensor step; "
            "linvit's attention with its eager backend, not the fused CUDA kernels"
        )

    meta_model = timm.create_model(model, device="meta", **dict(model_kwargs or {}))
    in_chans = int(getattr(meta_model, "in_chans", 0) or meta_model.pretrained_cfg.get("input_size", (3,))[0])
    labels = {name: attention_label(module) for name, module in stage_modules(meta_model)}
    tracker = AllocationTracker(
        workspace=cpu_workspace_bytes if target.type == "cpu" else None,
        block_bytes=512 if target.type == "cuda" else 1,  # CUDA's caching allocator rounds to 512 bytes
    )
    shapes: dict[str, Any] = {}
    with FakeTensorMode(allow_non_fake_inputs=True), EagerViewStrides(), backend, fresh_size_caches():
        fake_model = meta_model.to_empty(device=run_on)
        images = torch.empty(batch, in_chans, height, width, device=run_on)
        optimizer = make_optimizer(fake_model, foreach=target.type == "cuda") if train else None
        params, buffers = list(fake_model.parameters()), list(fake_model.buffers())
        with tracker, _stage_scopes(fake_model, tracker, shapes):
            tracker.adopt([*params, *buffers, images])
            phase = functools.partial(tracker.scope, peak=False)
            run_workload(fake_model, images, train=train, dtype=dtype, optimizer=optimizer, phase=phase)
        optimizer_bytes = 0
        if optimizer is not None:
            optimizer_bytes = _storage_bytes(
                value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)
            )

    last_call = {scope.label: scope for scope in tracker.scopes}  # the last call's scope of each label wins
    stages = []
    for name, label in labels.items():
        scope = last_call.get(name)
        grid, tokens = shapes.get(name, (None, 0))
        stages.append(
            StageMemory(
                name=name,
                grid=grid,
                tokens=tokens,
                attention=label,
                peak_bytes=scope.peak_bytes if scope else 0,
                kept_bytes=(scope.end_bytes - scope.start_bytes) if scope else 0,
            )
        )
    return MemoryEstimate(
        model=model,
        batch=batch,
        height=height,
        width=width,
        train=train,
        dtype=dtype,
        device=target.type,
        parameter_bytes=_storage_bytes(params),
        buffer_bytes=_storage_bytes(buffers),
        input_bytes=_storage_bytes([images]),
        optimizer_bytes=optimizer_bytes,
        peak_bytes=tracker.peak_bytes,
        peak_at=tracker.peak_label,
        stages=tuple(stages),
        notes=tuple(notes),
    )
