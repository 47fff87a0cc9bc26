"""Will it fit? Peak memory of a model at an input size, predicted by a dry run on fake tensors, and measured."""

from linvit.memory.estimate import MemoryEstimate, StageMemory, estimate_memory
from linvit.memory.tracker import AllocationTracker

__all__ = ["AllocationTracker", "MemoryEstimate", "StageMemory", "estimate_memory"]
