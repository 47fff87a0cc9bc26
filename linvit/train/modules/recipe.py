"""Recipe pieces that every LightningModule of linvit shares: option groups merged over their defaults, and the
per-step warm-up + cosine learning-rate factor."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["WarmupCosine", "merge_options"]


def merge_options(defaults: dict[str, Any], given: dict[str, Any] | None, what: str) -> dict[str, Any]:
    """``given`` over ``defaults``; a key the defaults do not have is a TypeError naming it (a typo in a config)."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise TypeError(f"unknown {what} option(s) {unknown}; expected some of {sorted(defaults)}.")
    return {**defaults, **given}


class WarmupCosine:
    """lr factor at optimizer step ``t``: linear warm-up from ``warmup_factor`` to 1, then cosine to ``min_factor``
    (or constant 1 with ``cosine=False``).

    A class (not a lambda) so that the scheduler pickles for ``ddp_spawn`` and checkpoints (``LambdaLR`` saves the
    object's attributes, not its class).
    """

    def __init__(self, total_steps: int, warmup_steps: int, warmup_factor: float, min_factor: float, cosine: bool):
        self.total_steps, self.warmup_steps = total_steps, warmup_steps
        self.warmup_factor, self.min_factor, self.cosine = warmup_factor, min(min_factor, 1.0), cosine

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_factor + (1.0 - self.warmup_factor) * step / self.warmup_steps
        if not self.cosine:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_factor + (1.0 - self.min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
