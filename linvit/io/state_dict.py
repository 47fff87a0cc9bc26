"""The weights inside a checkpoint dict, and how a state dict differs from a model's: key filters and comparisons
that every loader shares (training-checkpoint entries, EMA weights, wrapper prefixes, missing/unexpected keys)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from linvit.io.errors import CheckpointError

__all__ = ["describe_mismatch", "extract_model_state_dict", "state_dict_mismatch", "strip_wrapper_prefixes"]

_logger = logging.getLogger(__name__)

# Keys under which training scripts store the model weights, in order of preference.
_EMA_KEYS = ("state_dict_ema", "model_ema", "ema", "ema_state_dict")
_MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module", "net", "network")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")


def _is_state_dict(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(isinstance(k, str) for k in value)
        and any(isinstance(v, torch.Tensor) for v in value.values())
    )


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Drop prefixes wrappers add to every key (DDP `module.`, torch.compile `_orig_mod.`, Lightning `model.`)."""
    result = dict(state_dict)
    changed = True
    while changed and result:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in result):
                result = {k[len(prefix) :]: v for k, v in result.items()}
                changed = True
    return result


def extract_model_state_dict(checkpoint: Mapping[str, Any], use_ema: bool = False) -> dict[str, torch.Tensor]:
    """The model weights inside a checkpoint dict: unwraps ``model`` / ``state_dict`` / EMA entries and prefixes.

    Args:
        checkpoint: what :func:`linvit.io.load_checkpoint_file` returned (a training checkpoint or a state dict).
        use_ema: take the EMA weights (``state_dict_ema`` / ``model_ema`` ...) when the file has them; falls back to
            the regular weights with a log message when it does not.

    Returns:
        ``{name: tensor}`` with ``module.`` / ``_orig_mod.`` prefixes stripped; non-tensor entries dropped.
    """
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"Expected a checkpoint dict, got {type(checkpoint).__name__}.")
    keys = (_EMA_KEYS + _MODEL_KEYS) if use_ema else _MODEL_KEYS
    chosen = None
    for key in keys:
        if _is_state_dict(checkpoint.get(key)):
            chosen = key
            break
    if use_ema and chosen not in _EMA_KEYS:
        _logger.info("Checkpoint has no EMA weights; using the regular ones.")
    if chosen is not None:
        state_dict = checkpoint[chosen]
    elif _is_state_dict(checkpoint):
        state_dict = checkpoint
    else:
        raise CheckpointError(
            "Found no state dict in the checkpoint: expected tensors at the top level or under one of "
            f"{list(_MODEL_KEYS + _EMA_KEYS)}; top-level keys are {sorted(map(str, checkpoint))[:20]}."
        )
    tensors = {k: v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    return strip_wrapper_prefixes(tensors)


def state_dict_mismatch(
    state_dict: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]
) -> tuple[list[str], list[str], list[tuple[str, tuple[int, ...], tuple[int, ...]]]]:
    """Missing keys, unexpected keys and ``(key, file shape, model shape)`` mismatches of a state dict vs a model's."""
    missing = sorted(set(target) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(target))
    mismatched = [
        (key, tuple(state_dict[key].shape), tuple(target[key].shape))
        for key in target
        if key in state_dict and tuple(state_dict[key].shape) != tuple(target[key].shape)
    ]
    return missing, unexpected, mismatched


def describe_mismatch(
    missing: list[str],
    unexpected: list[str],
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
    limit: int = 3,
) -> str:
    """A short summary: counts and the first ``limit`` names of each kind (never the whole list)."""

    def first(items: list[str]) -> str:
        return "[" + ", ".join(repr(item) for item in items[:limit]) + (", ...]" if len(items) > limit else "]")

    parts = []
    if missing:
        parts.append(f"{len(missing)} missing keys {first(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys {first(unexpected)}")
    if mismatched:
        shown = "; ".join(f"{key}: file {file} vs model {ours}" for key, file, ours in mismatched[:limit])
        parts.append(f"{len(mismatched)} shape mismatches ({shown}{'; ...' if len(mismatched) > limit else ''})")
    return ", ".join(parts)
