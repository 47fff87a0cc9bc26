"""A weight file into a timm model: what a family's ``load_pretrained`` and ``timm.create_model(..., pretrained=True)``
run for linvit's families.

A family's model defines ``load_pretrained(self, checkpoint_path)`` that calls :func:`load_pretrained_file`, and its
``_create_*`` function builds through :func:`build_model_loading_safely` (timm's ``build_model_with_cfg`` with the
kwargs passed through :func:`route_pretrained_to_model`: timm 1.0.31 resets ``custom_load`` to False when
``pretrained_cfg_overlay`` names a ``file`` or ``url``; this sets it back). timm's ``load_pretrained`` then hands the
file to the model instead of reading it with its own loader (which refuses the pickled config, prefers EMA weights and
fails on a bad file with a bare ``EOFError``/``KeyError``), so
``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path))`` reads the authors' raw files,
safetensors from ``linvit convert``, and plain state dicts alike, and a bad file is a short
:class:`~linvit.io.CheckpointError` naming it. ``timm.create_model(..., trusted=True)`` is the opt-in for a pickle
that runs code. Weights with NaN/Inf are refused naming the tensors; ``timm.create_model(...,
allow_non_finite=True)`` loads them anyway (see :mod:`linvit.io.finite`). A ``local-dir:`` folder is read by timm's
own loader: :func:`build_model_loading_safely` verifies the file it will read first (:func:`linvit.io.verify_file`,
with the ``"sha256"`` of the folder's ``config.json``) and checks the loaded weights for NaN/Inf after.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from linvit.io.errors import CheckpointError, short_message
from linvit.io.families import family_models
from linvit.io.finite import allow_non_finite_weights, check_finite_weights
from linvit.io.integrity import verify_file
from linvit.io.safe_load import load_checkpoint_file
from linvit.io.state_dict import describe_mismatch, extract_model_state_dict, state_dict_mismatch

__all__ = ["build_model_loading_safely", "load_pretrained_file", "route_pretrained_to_model"]

_logger = logging.getLogger(__name__)

CheckpointFilter = Callable[[dict[str, torch.Tensor], nn.Module], dict[str, torch.Tensor]]


def _adapt_classifier_and_stem(
    state_dict: dict[str, torch.Tensor], model: nn.Module, pretrained_cfg: Mapping[str, Any]
) -> set[str]:
    """Adapt the first conv to the model's input channels; drop a classifier whose shape differs (new class count).

    Returns the keys that may then be missing from the state dict.
    """
    from timm.models import adapt_input_conv

    allowed_missing: set[str] = set()
    model_state = model.state_dict()
    first_conv = pretrained_cfg.get("first_conv")
    for conv_name in (first_conv,) if isinstance(first_conv, str) else tuple(first_conv or ()):
        weight_name = f"{conv_name}.weight"
        if weight_name in state_dict and weight_name in model_state:
            target_chans = model_state[weight_name].shape[1]
            if state_dict[weight_name].shape[1] != target_chans:
                state_dict[weight_name] = adapt_input_conv(target_chans, state_dict[weight_name])
    classifier = pretrained_cfg.get("classifier")
    for head_name in (classifier,) if isinstance(classifier, str) else tuple(classifier or ()):
        for suffix in ("weight", "bias"):
            name = f"{head_name}.{suffix}"
            if name in state_dict and (name not in model_state or model_state[name].shape != state_dict[name].shape):
                del state_dict[name]
                allowed_missing.add(name)
    return allowed_missing


def _variants_that_fit(
    model: nn.Module, state_dict: dict[str, torch.Tensor], filter_fn: CheckpointFilter | None
) -> list[str]:
    """Registered models of ``model``'s family (built on the meta device) that ``state_dict`` fits exactly."""
    import timm

    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    fits = []
    for name in family_models(architecture) if architecture else []:
        try:
            candidate = timm.create_model(name, pretrained=False, device="meta")
            mapped = filter_fn(dict(state_dict), candidate) if filter_fn is not None else state_dict
            missing, unexpected, mismatched = state_dict_mismatch(mapped, candidate.state_dict())
        except Exception:  # a variant that cannot be built or mapped is simply not a suggestion
            continue
        classifier = candidate.pretrained_cfg.get("classifier") or ()
        heads = tuple(f"{head}." for head in ((classifier,) if isinstance(classifier, str) else classifier))
        mismatched = [item for item in mismatched if not item[0].startswith(heads)]  # class counts may differ
        missing = [key for key in missing if not key.startswith(heads)]
        if not unexpected and not mismatched and not missing:
            fits.append(name)
    return fits


def load_pretrained_file(
    model: nn.Module,
    path: str | os.PathLike,
    filter_fn: CheckpointFilter | None = None,
    *,
    use_ema: bool = False,
    trusted: bool | None = None,
    strict: bool = True,
    allow_non_finite: bool | None = None,
) -> None:
    """Load a foreign or native checkpoint file into ``model`` (what a model's ``load_pretrained`` calls).

    Reads the file safely (:func:`linvit.io.load_checkpoint_file`), unwraps the weights
    (:func:`linvit.io.extract_model_state_dict`), applies the family's ``filter_fn(state_dict, model)`` (key mapping,
    table resizing), adapts the stem to the model's input channels and drops a classifier of another size, then
    compares names and shapes with the model before touching it: any difference raises a short
    :class:`~linvit.io.CheckpointError` (counts, first few names, the registered variant the file fits) and leaves
    the model as it was. ``strict=False`` loads what matches. ``trusted=None`` takes the choice made at creation
    (``timm.create_model(..., trusted=True)``), else False. Weights with NaN/Inf raise
    :class:`~linvit.io.NonFiniteWeightsError` naming them, unless ``allow_non_finite`` (None: the choice made at
    creation, ``timm.create_model(..., allow_non_finite=True)``, or :func:`linvit.io.allow_non_finite_weights`).
    """
    if trusted is None:
        trusted = _TRUSTED_LOAD.get()
    checkpoint = load_checkpoint_file(path, trusted=trusted, map_location="cpu")
    pretrained_cfg = getattr(model, "pretrained_cfg", None) or {}
    architecture = pretrained_cfg.get("architecture")
    target = f"{architecture} ({type(model).__name__})" if architecture else type(model).__name__
    try:
        raw_state_dict = extract_model_state_dict(checkpoint, use_ema=use_ema)
        state_dict = filter_fn(dict(raw_state_dict), model) if filter_fn is not None else raw_state_dict
    except (ValueError, KeyError, IndexError, RuntimeError, TypeError) as error:  # the family filter on foreign keys
        raise CheckpointError(
            f"Checkpoint '{path}' holds no weights {target} can use: {short_message(error, limit=400)}"
        ) from error
    check_finite_weights(raw_state_dict, str(path), allow=allow_non_finite)
    allowed_missing = _adapt_classifier_and_stem(state_dict, model, pretrained_cfg)
    missing, unexpected, mismatched = state_dict_mismatch(state_dict, model.state_dict())
    missing = [key for key in missing if key not in allowed_missing]
    if strict and (missing or unexpected or mismatched):
        fits = _variants_that_fit(model, raw_state_dict, filter_fn)
        if fits:
            hint = (
                f"The file fits {', '.join(fits)}: create that model instead, e.g. timm.create_model('{fits[0]}', "
                "pretrained=True, pretrained_cfg_overlay=dict(file=...))."
            )
        else:
            hint = (
                "Create the variant the file was saved from (same widths and depths), or run "
                f"`linvit convert {path} OUT.safetensors`, which names the registered model that fits it."
            )
        raise CheckpointError(
            f"Checkpoint '{path}' does not match {target}: {describe_mismatch(missing, unexpected, mismatched)}. {hint}"
        )
    if mismatched:  # strict=False: load what fits, leave the rest at its initialisation
        _logger.warning("Skipping %s", describe_mismatch([], [], mismatched))
        for key, _, _ in mismatched:
            del state_dict[key]
    model.load_state_dict(state_dict, strict=False)
    if allowed_missing:
        _logger.info("Classifier left at its initialisation (class count differs from the checkpoint).")


_FILE_SOURCES = ("file", "url")

# `trusted=` given to timm.create_model, for the model's load_pretrained (timm calls it with the path only)
_TRUSTED_LOAD: contextvars.ContextVar[bool] = contextvars.ContextVar("linvit_trusted_load", default=False)


def route_pretrained_to_model(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Make timm hand a user-supplied weight ``file``/``url`` to the model's own ``load_pretrained``.

    timm resets ``custom_load`` to False when ``pretrained_cfg_overlay`` (or a ``pretrained_cfg`` dict) names a
    weight source; this sets it to True unless the caller chose a value. Returns a new kwargs dict.
    """
    kwargs = dict(kwargs)
    for key in ("pretrained_cfg_overlay", "pretrained_cfg"):
        cfg = kwargs.get(key)
        if isinstance(cfg, Mapping) and any(cfg.get(source) for source in _FILE_SOURCES):
            cfg = dict(cfg)
            cfg.setdefault("custom_load", True)
            kwargs[key] = cfg
    return kwargs


def build_model_loading_safely(model_cls: type, variant: str, pretrained: bool, **kwargs: Any) -> nn.Module:
    """timm's ``build_model_with_cfg`` for a linvit family, with a weight file read by the model's own safe loader.

    ``kwargs`` go to ``build_model_with_cfg`` through :func:`route_pretrained_to_model`, less ``trusted`` (default
    False): ``trusted=True`` lets :func:`load_pretrained_file` unpickle a file that runs code, for files the user
    trusts, e.g. ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), trusted=True)``;
    and less ``allow_non_finite`` (default: refuse weights with NaN/Inf, naming them; True loads them with a warning).
    """
    from timm.models import build_model_with_cfg

    _check_arguments_from_a_file(model_cls, kwargs)
    trusted = kwargs.pop("trusted", False)
    allow_non_finite = kwargs.pop("allow_non_finite", None)
    for name, value in (("trusted", trusted), ("allow_non_finite", allow_non_finite)):
        if not isinstance(value, bool) and not (name == "allow_non_finite" and value is None):
            raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    local_weights = _local_dir_weights(kwargs.get("pretrained_cfg")) if pretrained else None
    if local_weights is not None:  # timm reads the folder with its own loader: verify the file first
        verify_file(local_weights)
    token = _TRUSTED_LOAD.set(trusted)
    try:
        with allow_non_finite_weights(allow_non_finite) if allow_non_finite is not None else contextlib.nullcontext():
            model = build_model_with_cfg(model_cls, variant, pretrained, **route_pretrained_to_model(kwargs))
            if local_weights is not None:  # ... and the weights it loaded (NaN/Inf named, or warned when allowed)
                check_finite_weights(model.state_dict(), str(local_weights))
            return model
    finally:
        _TRUSTED_LOAD.reset(token)


def _check_arguments_from_a_file(model_cls: type, kwargs: Mapping[str, Any]) -> None:
    """Refuse creation arguments that a ``local-dir:`` folder's or a hub repo's ``config.json`` added.

    timm merges that file's ``model_args`` into the caller's kwargs and also passes them as ``pretrained_model_args``:
    each must be a plain creation argument of ``model_cls`` (see :mod:`linvit.io.allowed_config`), so the file
    cannot turn on ``trusted`` or ``allow_non_finite`` nor name other files. A caller who writes ``trusted=True``
    lifts the check, unless the file itself says ``trusted``.
    """
    from_file = kwargs.get("pretrained_model_args")
    if not from_file:
        return
    if kwargs.get("trusted") is True and "trusted" not in from_file:
        return
    from linvit.io.allowed_config import check_model_args

    check_model_args(model_cls, from_file, _config_source(kwargs.get("pretrained_cfg")), opt_in="trusted=True")


def _config_source(pretrained_cfg: Any) -> str:
    """The ``config.json`` timm read the model's arguments from, for messages."""
    cfg = pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else dict(pretrained_cfg or {})
    where = cfg.get("file") or cfg.get("hf_hub_id")
    return f"{str(where).rstrip('/')}/config.json" if where else "config.json"


def _local_dir_weights(pretrained_cfg: Any) -> Path | None:
    """The file timm's ``local-dir:`` source reads from the folder ``pretrained_cfg`` names (its first preferred
    name, else the first file of the first suffix that has one), or None for another source."""
    if not isinstance(pretrained_cfg, Mapping) or pretrained_cfg.get("source") != "local-dir":
        return None
    folder = Path(str(pretrained_cfg.get("file") or ""))
    if not folder.is_dir():
        return None  # timm names the path
    try:
        from timm.models._hub import _EXT_PRIORITY, _PREFERRED_FILES
    except ImportError:  # another timm: the names it has read first so far
        _PREFERRED_FILES, _EXT_PRIORITY = ("model.safetensors", "pytorch_model.bin"), (".safetensors", ".bin")
    for name in _PREFERRED_FILES:
        if (folder / name).exists():
            return folder / name
    for suffix in _EXT_PRIORITY:
        found = sorted(folder.glob(f"*{suffix}"))
        if found:
            return found[0]
    return None
