"""The creation arguments every family shares, checked once when a model is created.

A model created with ``in_chans=0`` fails later inside a convolution, ``drop_path_rate=1.5`` only in a training
forward, and ``features_only=True, out_indices=(-9,)`` deep in timm with an index the user never wrote. These raise
a ValueError at creation instead, naming the argument, the value as given and what it may be.
:func:`check_creation_arguments` is called by every family's builder (``linvit.models._family.create_family_model``)
and by the backbone frame; :func:`take_feature_indices` by the frame's feature taps.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from timm.models._features import feature_take_indices

__all__ = ["DROP_RATES", "check_creation_arguments", "take_feature_indices"]

DROP_RATES = ("drop_rate", "proj_drop_rate", "attn_drop_rate", "pos_drop_rate", "drop_path_rate")
"""Dropout probabilities and the stochastic-depth rate: each in [0, 1)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive_size(value: Any) -> bool:
    if value is None or (_is_int(value) and value > 0):
        return True
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) and v > 0 for v in value)


# argument -> (is the value fine, what it must be)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "in_chans": (lambda v: _is_int(v) and v >= 1, "a positive integer (the input's channels: 3 for RGB, 1 for grey)"),
    "num_classes": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: no classifier, pooled features)"),
    "img_size": (_positive_size, "a positive integer or an (H, W) pair of them"),
    "mlp_ratio": (lambda v: _is_real(v) and v > 0, "a positive number (the MLP's hidden width per channel)"),
    **{rate: (lambda v: _is_real(v) and 0 <= v < 1, "a number in [0, 1)") for rate in DROP_RATES},
}


def check_creation_arguments(model_name: str, **arguments: Any) -> None:
    """Raise ValueError naming the first of ``arguments`` (a model's creation keyword arguments; those without a
    rule are not looked at) whose value it cannot take, with the value as given and what it may be."""
    for name, value in arguments.items():
        rule = _RULES.get(name)
        if rule is not None and not rule[0](value):
            raise ValueError(f"{model_name}: {name}={value!r} is not valid: it must be {rule[1]}.")


def take_feature_indices(
    num_taps: int, indices: Any, model_name: str, argument: str = "indices"
) -> tuple[list[int], int]:
    """timm's ``feature_take_indices`` (the absolute indices and the largest), after checking ``indices`` as given
    (``argument``: its name for the caller, ``out_indices`` for ``features_only``): None (every tap), an int ``n`` in
    [1, num_taps] (the last n), or a non-empty sequence of ints in [-num_taps, num_taps)."""
    valid = f"indices 0..{num_taps - 1} or -{num_taps}..-1, or an int n in 1..{num_taps} for the last n taps"
    if indices is None:
        return feature_take_indices(num_taps, indices)
    if _is_int(indices):
        if not 1 <= indices <= num_taps:
            raise ValueError(
                f"{model_name}: {argument}={indices!r} asks for the last {indices} of its {num_taps} feature taps: "
                f"use {valid}."
            )
        return feature_take_indices(num_taps, int(indices))
    if not isinstance(indices, (list, tuple)) or not all(_is_int(i) for i in indices):
        raise ValueError(
            f"{model_name}: {argument}={indices!r} is not valid: it has {num_taps} feature taps, use {valid}."
        )
    if not indices:
        raise ValueError(
            f"{model_name}: {argument}={indices!r} is empty: name at least one of its {num_taps} feature "
            f"taps ({valid})."
        )
    outside = [i for i in indices if not -num_taps <= i < num_taps]
    if outside:
        raise ValueError(
            f"{model_name}: {argument}={indices!r} names feature tap(s) {outside} that it does not have (it has "
            f"{num_taps}): use {valid}."
        )
    return feature_take_indices(num_taps, [int(i) for i in indices])
