"""The largest input, or batch, whose predicted peak fits a memory budget.

Found by bisection over dry runs (:func:`estimate_memory`), assuming the peak grows with the input. The search
starts from a linear fit: these models' memory is close to linear in pixels and in the batch (a constant for the
weights plus a slope), so two dry runs place the answer within a step or two, and the bisection then settles it
exactly. Sizes keep the aspect ratio asked for and are multiples of ``multiple``: by default the smallest side at
which no stage pads its map (:func:`padding_free_multiple`), where memory grows steadily with the size; between
those sizes, padding to windows makes it step up and down (FLatten-Swin at 2560×1920 needs more than at
2688×2016), and a bisection could stop at any of the steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import timm

from linvit.memory.estimate import MemoryEstimate, estimate_memory
from linvit.memory.stages import padding_free_multiple

__all__ = ["Fit", "largest_batch", "largest_size"]

_LARGEST = 1 << 16  # steps of the search: at most 65536 times the multiple, or 65536 images


@dataclass(frozen=True)
class Fit:
    """The largest ``height`` × ``width`` (or ``batch``) that fits, its prediction, and how many dry runs it took.

    ``estimate`` is None when not even the smallest input fits. ``capped``: the search stopped at its limit
    (65536 steps), so larger inputs may fit too.
    """

    estimate: MemoryEstimate | None
    dry_runs: int
    capped: bool = False


def _last_at_most(value: Callable[[int], float], target: float) -> int:
    """The largest n in [1, _LARGEST] with value(n) <= target (value increasing), 1 when none; no dry run."""
    low, high = 1, _LARGEST + 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if value(middle) <= target else (low, middle)
    return low


def _largest_step(
    peak: Callable[[int], int], budget: int, units: Callable[[int], float], anchor: int
) -> tuple[int, int, bool]:
    """(the largest n >= 1 with peak(n) <= budget, 0 if none; dry runs made; whether the search hit its cap).

    ``units(n)``: what the peak is close to linear in (pixels, images); ``anchor``: the second point of the fit.
    """
    known: dict[int, int] = {}
    low, high = 0, None  # invariant: low fits (or is 0), high does not (or is None)

    def narrow(n: int) -> None:
        nonlocal low, high
        if low < n and (high is None or n < high):
            if n not in known:
                known[n] = peak(n)
            low, high = (n, high) if known[n] <= budget else (low, n)

    narrow(1)
    if low == 0:
        return 0, len(known), False
    anchor = min(max(anchor, 2), _LARGEST)
    narrow(anchor)
    if anchor in known and known[anchor] > known[1]:
        slope = (known[anchor] - known[1]) / (units(anchor) - units(1))
        guess = _last_at_most(units, units(1) + (budget - known[1]) / slope)
        narrow(guess)
        narrow(min(guess + 1, _LARGEST))
    while high is None:  # double until it no longer fits
        if low >= _LARGEST:
            return low, len(known), True
        narrow(min(2 * low, _LARGEST))
    while high - low > 1:
        narrow((low + high) // 2)
    return low, len(known), False


def largest_size(
    model: str,
    budget_bytes: int,
    aspect: tuple[int, int] = (1, 1),
    batch: int = 1,
    *,
    multiple: int | None = None,
    **options,
) -> Fit:
    """The largest input of ``aspect`` (height, width) proportions, sides multiples of ``multiple``, that fits.

    ``aspect`` may be the size asked about: the search's linear fit then runs through it. ``multiple``: the grid
    of sides (default :func:`padding_free_multiple`). ``options`` go to :func:`estimate_memory` (train, dtype,
    device, model_kwargs).
    """
    if multiple is None:
        meta_model = timm.create_model(model, device="meta", **dict(options.get("model_kwargs") or {}))
        multiple = padding_free_multiple(meta_model)
    if multiple < 1 or min(aspect) < 1:
        raise ValueError(f"multiple and aspect must be positive, got multiple={multiple}, aspect={aspect}.")
    ratio = aspect[1] / aspect[0]

    def shape(n: int) -> tuple[int, int]:
        return multiple * n, multiple * max(1, round(n * ratio))

    estimates: dict[int, MemoryEstimate] = {}

    def peak(n: int) -> int:
        estimates[n] = estimate_memory(model, *shape(n), batch, **options)
        return estimates[n].peak_bytes

    anchor = max(2, aspect[0] // multiple)
    step, runs, capped = _largest_step(peak, budget_bytes, lambda n: math.prod(shape(n)), anchor)
    return Fit(estimates.get(step), runs, capped)


def largest_batch(model: str, budget_bytes: int, height: int, width: int, **options) -> Fit:
    """The largest batch of ``height`` × ``width`` images that fits (``options`` as for :func:`largest_size`)."""
    estimates: dict[int, MemoryEstimate] = {}

    def peak(n: int) -> int:
        estimates[n] = estimate_memory(model, height, width, n, **options)
        return estimates[n].peak_bytes

    batch, runs, capped = _largest_step(peak, budget_bytes, float, anchor=2)
    return Fit(estimates.get(batch), runs, capped)
