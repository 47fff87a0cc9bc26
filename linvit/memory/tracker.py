"""Live tensor memory, op by op: what an allocator that frees a block when its last reference dies holds.

:class:`AllocationTracker` is a ``TorchDispatchMode``. Every storage an op creates counts from that op until the
last tensor viewing it dies (a weak reference to the storage tells); views and in-place results share their input's
storage and count nothing. Under fake tensors (``FakeTensorMode``) nothing is allocated, so a model at any size
runs in seconds and the tracker sees the allocations a real run would make: the peak is what CUDA's
``max_memory_allocated`` reports, and what a CPU process holds when its ``malloc`` returns freed blocks.

Not seen: memory that kernels allocate inside one op and free before it returns (workspaces; a ``workspace``
function may estimate it per op, see :mod:`linvit.memory.workspace`), and allocations of the runtime itself
(Python objects, oneDNN's code and caches, the CUDA context).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["AllocationTracker", "Scope"]


@dataclass
class Scope:
    """A stretch of the run (a stage, the backward pass): live bytes at its start and end, and its peak.

    A scope opened with ``peak=False`` only names the stretch (for ``peak_label``); its ``peak_bytes`` stays at
    the start's, and the tracker sweeps less often for it.
    """

    label: str
    start_bytes: int
    peak_bytes: int
    end_bytes: int | None = None
    tracks_peak: bool = True


class AllocationTracker(TorchDispatchMode):
    """Counts live tensor storage bytes and their peak while active (``with AllocationTracker() as tracker:``).

    ``adopt(tensors)`` counts tensors made before the tracker started (parameters, the input) as live too.
    ``scope(label)`` records the peak within a stretch of the run; ``peak_label`` names the innermost scope that
    was open at the overall peak. ``workspace(func, args, kwargs, out)``, when given, returns the bytes an op's
    kernel holds besides its inputs and outputs while it runs; they count towards the peaks, not the live bytes.
    ``block_bytes``: the allocator's granularity, each storage rounded up to a multiple of it (CUDA's caching
    allocator: 512; the CPU allocator allocates what is asked: 1).
    """

    def __init__(self, workspace: Callable[[Any, tuple, dict, Any], int] | None = None, block_bytes: int = 1) -> None:
        super().__init__()
        self._workspace = workspace
        self._block = block_bytes
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}  # storage id -> (weak ref, bytes)
        # the sum over _live, counting storages that died since the last sweep: an upper bound of the live bytes,
        # exact right after _sweep(); sweeping only when this bound could set a new peak keeps the cost per op low
        self._upper = 0
        self.peak_bytes = 0
        self.peak_label = ""
        self._open: list[Scope] = []
        self.scopes: list[Scope] = []

    # -- counting ------------------------------------------------------------------------------------------------
    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count already existing tensors (parameters, buffers, inputs) as live from now on."""
        for tensor in tensors:
            self._count(tensor)
        self._observe()

    @property
    def live_bytes(self) -> int:
        """The bytes held by storages alive now."""
        self._sweep()
        return self._upper

    def _size(self, storage: torch.UntypedStorage) -> int:
        return -(-storage.nbytes() // self._block) * self._block

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        known = self._live.get(key)
        if known is not None and not known[0].expired():
            return
        if known is not None:  # a dead storage's id reused by a new one
            self._upper -= known[1]
        size = self._size(storage)
        self._live[key] = (StorageWeakRef(storage), size)
        self._upper += size

    def _sweep(self) -> None:
        dead = [key for key, (ref, _) in self._live.items() if ref.expired()]
        for key in dead:
            self._upper -= self._live.pop(key)[1]

    def _observe(self, workspace: int = 0) -> None:
        """Update the peaks with the live bytes now plus an op's workspace (sweeping only when that could be a new
        peak)."""
        lowest = min([self.peak_bytes, *(scope.peak_bytes for scope in self._open if scope.tracks_peak)])
        if self._upper + workspace <= lowest:
            return
        self._sweep()
        live = self._upper + workspace
        for scope in self._open:
            if scope.tracks_peak:
                scope.peak_bytes = max(scope.peak_bytes, live)
        if live > self.peak_bytes:
            self.peak_bytes = live
            self.peak_label = self._open[-1].label if self._open else ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            # views and in-place results share an input's storage: no new memory
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage()._cdata not in inputs:
                self._count(tensor)
        self._observe(self._workspace(func, args, kwargs, out) if self._workspace else 0)
        return out

    # -- scopes --------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, label: str, peak: bool = True) -> Iterator[Scope]:
        """Record the live bytes between entering and leaving, and their peak unless ``peak=False`` (scopes nest)."""
        scope = self.open_scope(label, peak)
        try:
            yield scope
        finally:
            self.close_scope(scope)

    def open_scope(self, label: str, peak: bool = True) -> Scope:
        """Like :meth:`scope`, for callers that open and close in separate places (module hooks)."""
        live = self.live_bytes
        scope = Scope(label, start_bytes=live, peak_bytes=live, tracks_peak=peak)
        self._open.append(scope)
        return scope

    def close_scope(self, scope: Scope) -> None:
        self._open.remove(scope)
        scope.end_bytes = self.live_bytes
        self.scopes.append(scope)
