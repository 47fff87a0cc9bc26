"""Weights that hold NaN or Inf: found by name when a file is loaded, instead of a model that silently computes NaN.

A model loaded from such a file predicts ``nan%`` and evaluates to a ``NaN`` loss without a word. Every linvit loader
of weights checks them with :func:`check_finite_weights` and raises :class:`NonFiniteWeightsError` naming the
tensors. The opt-out, for those who want the file anyway (to inspect or repair it): ``allow_non_finite=True``
(``timm.create_model(..., allow_non_finite=True)`` for linvit's families, the ``allow_non_finite_weights()``
context for any loading inside it, ``--allow-non-finite`` for the commands); the tensors are then named in a
warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from linvit.io.errors import CheckpointError

__all__ = [
    "NonFiniteWeightsError",
    "allow_non_finite_weights",
    "check_finite_weights",
    "non_finite_allowed",
    "non_finite_tensors",
]

_DEFAULT_OPT_OUT = "allow_non_finite=True"
# (allowed, the opt-out as the caller's user writes it)
_ALLOWED: contextvars.ContextVar[tuple[bool, str]] = contextvars.ContextVar(
    "linvit_allow_non_finite", default=(False, _DEFAULT_OPT_OUT)
)
_NAMED = 5  # tensors named in a message; the rest are counted


class NonFiniteWeightsError(CheckpointError):
    """A weight file holds tensors with NaN or Inf values (the message names them)."""


@contextlib.contextmanager
def allow_non_finite_weights(allow: bool = True, opt_out: str = _DEFAULT_OPT_OUT) -> Iterator[None]:
    """Within this context, weights with NaN/Inf load with a warning naming them instead of an error (``allow``);
    ``opt_out``: how the user allows them, named in the error otherwise (e.g. a command's ``--allow-non-finite``)."""
    token = _ALLOWED.set((bool(allow), opt_out))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def non_finite_allowed() -> bool:
    """Whether the caller asked to load weights with NaN/Inf (:func:`allow_non_finite_weights`)."""
    return _ALLOWED.get()[0]


def non_finite_tensors(tensors: Mapping[str, Any]) -> list[str]:
    """``name (k NaN, m Inf of n)`` for every floating-point tensor of ``tensors`` that holds NaN or Inf."""
    found = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor) or not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        if tensor.device.type == "meta" or bool(torch.isfinite(tensor).all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        inf = int(torch.isinf(tensor).sum())
        counts = ", ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if part)
        found.append(f"{name} ({counts} of {tensor.numel()})")
    return found


def check_finite_weights(
    tensors: Mapping[str, Any], source: str, *, allow: bool | None = None, opt_out: str | None = None
) -> None:
    """Raise :class:`NonFiniteWeightsError` naming the tensors of ``tensors`` (weights read from ``source``) that
    hold NaN or Inf; with ``allow`` (default: :func:`non_finite_allowed`) warn instead. ``opt_out``: how the caller
    allows them, named in the error (default: the context's, else ``allow_non_finite=True``)."""
    bad = non_finite_tensors(tensors)
    if not bad:
        return
    named = ", ".join(bad[:_NAMED]) + (f" and {len(bad) - _NAMED} more" if len(bad) > _NAMED else "")
    what = f"'{source}' holds NaN/Inf values in {len(bad)} tensor(s): {named}"
    if non_finite_allowed() if allow is None else allow:
        warnings.warn(f"{what}; loaded anyway (a model with them computes NaN).", stacklevel=2)
        return
    raise NonFiniteWeightsError(
        f"{what}. A model with these weights computes NaN: use an earlier checkpoint or export the weights again. "
        f"To load them anyway (to inspect or repair them), pass {opt_out or _ALLOWED.get()[1]}."
    )
