"""Which implementation of an operator runs: "naive", "torch" or "triton", or "auto" to let the device decide.

Every operator in :mod:`linvit.ops` has the same three implementations behind one keyword-only signature:

- ``naive``: the obviously correct reference (the published steps, the N×N matrix materialised where that is
  clearer); slow, for tests and checks;
- ``torch``: eager PyTorch, memory-frugal; the CPU default, and what TorchScript runs;
- ``triton``: fused kernels registered as torch custom ops (autograd and ``torch.compile`` see them); CUDA tensors,
  or CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is imported), which is how the
  kernels are tested without a GPU.

"auto" picks ``triton`` for CUDA tensors when Triton imports and ``torch`` otherwise. The choice is made per call:
a module's ``backend=`` argument wins unless it is "auto", then the process-wide default (:func:`set_backend`,
:func:`use_backend`, or the ``LINVIT_BACKEND`` environment variable), like timm's ``fused_attn`` switch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import torch

__all__ = ["BACKENDS", "get_backend", "resolve_backend", "set_backend", "triton_available", "use_backend"]

BACKENDS: tuple[str, ...] = ("auto", "torch", "triton", "naive")


def _checked(name: str, what: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"Unknown {what} {name!r}; valid backends are {', '.join(BACKENDS)}.")
    return name


_default = _checked(os.environ.get("LINVIT_BACKEND", "auto"), "LINVIT_BACKEND")


def set_backend(name: str) -> None:
    """Set the process-wide backend that modules with ``backend="auto"`` use ("auto" restores the device rule)."""
    global _default
    _default = _checked(name, "backend")


def get_backend() -> str:
    """The process-wide backend ("auto" unless :func:`set_backend` / ``LINVIT_BACKEND`` chose another)."""
    return _default


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """``with use_backend("torch"): ...``: the process-wide backend for the block, restored afterwards."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


# Whether Triton is installed, found without importing it (importing costs time, and compiled code should not
# re-check a fact of the installation).
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available(device: torch.device) -> bool:
    """Whether the Triton backend can run on tensors of ``device``: CUDA with Triton, or its CPU interpreter."""
    if not _TRITON_INSTALLED:
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreting())


def resolve_backend(requested: str, device: torch.device) -> str:
    """The backend that runs: ``requested`` unless it is "auto", then the process-wide one, then the device rule.

    An explicit "triton" on a device Triton cannot serve is an error that says what to do.
    """
    name = _checked(requested, "backend")
    if name == "auto":
        name = _default
    if name == "auto":
        return "triton" if device.type == "cuda" and triton_available(device) else "torch"
    if name == "triton" and not triton_available(device):
        raise ValueError(
            f"backend='triton' needs CUDA tensors and Triton (or TRITON_INTERPRET=1 for CPU tensors, slow); got "
            f"tensors on {device} with Triton {'installed' if _TRITON_INSTALLED else 'not installed'}. Use "
            f"backend='torch' (or 'auto') here."
        )
    return name
