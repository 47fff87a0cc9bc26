"""Safe loading of foreign checkpoints (the FLatten authors' ``.pth`` files, safetensors, plain state dicts).

The authors' training scripts save ``{"model", "optimizer", "lr_scheduler", "max_accuracy", "epoch", "config"}``
(plus ``"state_dict_ema"`` for EMA runs), where ``config`` is a pickled yacs ``CfgNode``. PyTorch's safe loader
(``torch.load(weights_only=True)``) refuses that class. Rather than fall back to full unpickling, which would run
whatever code a file names, known configuration classes are mapped onto an inert stand-in: the safe loader then
rebuilds them as plain ``OrderedDict`` objects and never imports or calls the original class. Any other foreign
global is refused with an error that names it; ``trusted=True`` lifts the restriction for files the user trusts.

timm integration: a family's model defines ``load_pretrained(self, checkpoint_path)`` that calls
:func:`load_pretrained_file`, its pretrained cfgs set ``custom_load=True``, and its ``_create_*`` function passes its
kwargs through :func:`route_pretrained_to_model` (timm 1.0.31 resets ``custom_load`` to False when
``pretrained_cfg_overlay`` names a ``file`` or ``url``; this sets it back). timm's ``load_pretrained`` then hands the
file to the model instead of reading it with its own loader (which refuses the pickled config and prefers EMA
weights), so ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path))`` reads the
authors' raw files, safetensors from ``linvit convert``, and plain state dicts alike.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "CheckpointError",
    "UntrustedCheckpointError",
    "extract_model_state_dict",
    "load_checkpoint_file",
    "load_pretrained_file",
    "route_pretrained_to_model",
]

_logger = logging.getLogger(__name__)

# Configuration classes that training scripts pickle next to the weights. They are rebuilt as inert OrderedDicts.
_CONFIG_CLASS_PATHS = (
    "yacs.config.CfgNode",
    "argparse.Namespace",
    "easydict.EasyDict",
)

# Keys under which training scripts store the model weights, in order of preference.
_EMA_KEYS = ("state_dict_ema", "model_ema", "ema", "ema_state_dict")
_MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module", "net", "network")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, or holds no recognisable state dict."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint names Python objects that loading it safely cannot rebuild (it would have to run code)."""


class _InertConfig:
    """Stand-in for a pickled configuration class: constructing it yields a plain ``OrderedDict``.

    PyTorch's safe unpickler calls ``cls.__new__(cls, *args)`` for allow-listed classes and then only fills
    dict/OrderedDict objects (items) or sets ``__dict__`` attributes (state); an OrderedDict accepts both, and no
    code of the original class ever runs.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> OrderedDict:  # type: ignore[misc]
        return OrderedDict()


def _numpy_safe_globals() -> list[Any]:
    """numpy scalars and dtypes (e.g. a ``max_accuracy`` saved as ``np.float64``); rebuilding them runs no user code."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch in practice
        return []
    found: list[Any] = [np.dtype]
    for module_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = __import__(module_name, fromlist=["scalar"])
        except ImportError:
            continue
        found.append((module.scalar, f"{module_name}.scalar"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found.extend(getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType"))
    return found


def _safe_globals() -> list[Any]:
    return [(_InertConfig, path) for path in _CONFIG_CLASS_PATHS] + _numpy_safe_globals()


def _unsafe_globals_in(path: Path) -> list[str]:
    """Names of the globals a torch checkpoint refers to beyond the safe set (read without executing anything)."""
    getter = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if getter is None:
        return []
    try:
        names = getter(str(path))
    except Exception:  # the file may be a legacy (non-zip) pickle; the loader's own message is then enough
        return []
    allowed = set(_CONFIG_CLASS_PATHS)
    return [name for name in names if name not in allowed and "numpy" not in name]


_REFUSAL_MARKERS = (
    "unsupported global",
    "trying to call reduce",
    "can only create new object",
    "can only build",
    "whose module",
)


def _refusal_reason(error: BaseException) -> str | None:
    """The line of a safe-loader error that says which object it refused, or None when the file is just corrupt."""
    for line in str(error).splitlines():
        if any(marker in line.lower() for marker in _REFUSAL_MARKERS):
            return line.strip()
    return None


def load_checkpoint_file(
    path: str | os.PathLike, *, trusted: bool = False, map_location: str | torch.device | None = "cpu"
) -> dict[str, Any]:
    """Read a checkpoint file into a dict without executing code from it (unless ``trusted=True``).

    ``.safetensors`` files are read with safetensors; anything else (``.pth``, ``.pt``, ``.bin``, ``.pth.tar``) with
    ``torch.load(weights_only=True)``, where pickled yacs/argparse/EasyDict configs come back as inert
    ``OrderedDict`` objects. The result is the file's top-level dict (a training checkpoint or a plain state dict);
    pass it to :func:`extract_model_state_dict` for the weights.

    Raises:
        CheckpointError (a ValueError): the file is missing, truncated or corrupt, or does not hold a dict.
        UntrustedCheckpointError (a CheckpointError): the file names other Python objects; loading it needs
            ``trusted=True``, which runs arbitrary code from the file, so pass it only for files you trust.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file not found: '{path}'. Check the path (a file, not a directory).")
    if path.name.endswith(".safetensors"):
        from safetensors.torch import load_file

        device = "cpu" if map_location is None else str(map_location)
        try:
            return dict(load_file(str(path), device=device))
        except Exception as error:
            raise CheckpointError(
                f"Could not read safetensors file '{path}' (truncated or corrupt?): {error}"
            ) from error

    try:
        if trusted:
            checkpoint = torch.load(path, map_location=map_location, weights_only=False)
        else:
            with torch.serialization.safe_globals(_safe_globals()):
                checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        reason = None if trusted else _refusal_reason(error)
        if reason is not None:
            names = _unsafe_globals_in(path)
            named = f" It refers to: {', '.join(names)}." if names else ""
            raise UntrustedCheckpointError(
                f"Refusing to load '{path}': it holds pickled Python objects that can only be rebuilt by running "
                f"code from the file.{named} Nothing from it was executed. If you trust this file and its source, "
                f"load it with trusted=True (runs arbitrary code from the file), or convert it once with "
                f"`linvit convert` in a trusted environment. Loader message: {reason}"
            ) from error
        raise CheckpointError(f"Could not unpickle checkpoint '{path}' (truncated or corrupt?): {error}") from error
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, AttributeError, ImportError) as error:
        raise CheckpointError(f"Could not read checkpoint '{path}' (truncated or corrupt?): {error}") from error
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(
            f"Checkpoint '{path}' holds a {type(checkpoint).__name__}, expected a dict (a state dict or a training "
            "checkpoint with a 'model' / 'state_dict' entry). Save `model.state_dict()` rather than the module."
        )
    return dict(checkpoint)


def _is_state_dict(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(isinstance(k, str) for k in value)
        and any(isinstance(v, torch.Tensor) for v in value.values())
    )


def _strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
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
        checkpoint: what :func:`load_checkpoint_file` returned (a training checkpoint or a plain state dict).
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
    return _strip_wrapper_prefixes(tensors)


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


def load_pretrained_file(
    model: nn.Module,
    path: str | os.PathLike,
    filter_fn: Callable[[dict[str, torch.Tensor], nn.Module], dict[str, torch.Tensor]] | None = None,
    *,
    use_ema: bool = False,
    trusted: bool = False,
    strict: bool = True,
) -> None:
    """Load a foreign or native checkpoint file into ``model`` (what a model's ``load_pretrained`` calls).

    Reads the file safely (:func:`load_checkpoint_file`), unwraps the weights (:func:`extract_model_state_dict`),
    applies the family's ``filter_fn(state_dict, model)`` (key mapping, table resizing), adapts the stem to the
    model's input channels and drops a classifier of another size, then loads strictly.
    """
    checkpoint = load_checkpoint_file(path, trusted=trusted, map_location="cpu")
    state_dict = extract_model_state_dict(checkpoint, use_ema=use_ema)
    if filter_fn is not None:
        state_dict = filter_fn(state_dict, model)
    pretrained_cfg = getattr(model, "pretrained_cfg", None) or {}
    allowed_missing = _adapt_classifier_and_stem(state_dict, model, pretrained_cfg)
    incompatible = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in incompatible.missing_keys if k not in allowed_missing]
    unexpected = list(incompatible.unexpected_keys)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"Checkpoint '{path}' does not match {type(model).__name__}: missing keys {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected keys {unexpected[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''}. Check that the model name matches the checkpoint's variant."
        )
    if allowed_missing:
        _logger.info("Classifier left at its initialisation (class count differs from the checkpoint).")


_FILE_SOURCES = ("file", "url")


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
