"""Reading configs back from run directories, checkpoints and ``config.json`` files without running code from them.

A run directory, a checkpoint and an exported folder are data that someone may send you. Their configs name what to
build: Hydra ``_target_`` entries (``config.yaml``), Lightning hyper-parameters (``*.ckpt``) and timm creation
arguments (``config.json``). Hydra imports and calls any ``_target_`` it is given (``pathlib.Path.write_text`` as
readily as a DataModule), and timm follows hub names, local folders and checkpoint paths. So every command that
builds something from a saved config first checks it here:

- only the object being built, the run's DataModule or its model, may carry a ``_target_``, and it must name one of
  linvit's own classes of that kind (:data:`TRUSTED_DATAMODULES`, :data:`TRUSTED_MODELS`); a ``_target_`` anywhere
  below it (an argument built as an object) is refused, whatever it names, and Lightning's ``_instantiator`` is
  refused outright;
- a model must be a registered timm name (no ``hf-hub:`` / ``local-dir:`` source), created without arguments that
  load files or pretrained configs (:data:`LOADING_ARGUMENTS`).

Anything else raises :class:`UntrustedConfigError` naming the file, the key and the opt-in (``--trusted``,
``trust_checkpoint=true``), which skips these checks for files you trust.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from linvit.io.errors import UntrustedConfigError

__all__ = [
    "refusal",
    "LOADING_ARGUMENTS",
    "TRUSTED_DATAMODULES",
    "TRUSTED_MODELS",
    "TRUSTED_TARGETS",
    "UntrustedConfigError",
    "check_model_arguments",
    "check_targets",
]

TRUSTED_DATAMODULES: frozenset[str] = frozenset(
    {
        "linvit.train.data.datamodules.DigitsDataModule",
        "linvit.train.data.datamodules.FashionMNISTDataModule",
        "linvit.train.data.datamodules.ImageFolderDataModule",
        "linvit.train.data.datamodules.CIFARDataModule",
        "linvit.train.data.segmentation.SegmentationDataModule",
    }
)
"""The classes a saved config's ``data._target_`` may name without an opt-in: linvit's DataModules."""

TRUSTED_MODELS: frozenset[str] = frozenset(
    {
        # classification, and segmentation (backbone + its FPN / UperNet head)
        "linvit.train.modules.classification.ImageClassifier",
        "linvit.train.modules.segmentation.SegmentationModule",
    }
)
"""The classes a saved config's ``model._target_`` may name without an opt-in: linvit's LightningModules."""

TRUSTED_TARGETS: frozenset[str] = TRUSTED_DATAMODULES | TRUSTED_MODELS
"""Every class a saved config may name in a top-level ``_target_`` (of its ``data`` or its ``model``)."""

LOADING_ARGUMENTS: frozenset[str] = frozenset(
    {"checkpoint_path", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "pretrained"}
)
"""``timm.create_model`` arguments that read files or fetch weights: never taken from a saved config."""

# Hydra keys that make a node callable; Lightning's hyper-parameter key that names a function to construct with.
_CALLABLE_KEYS = ("_target_", "_instantiator")


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, key, value) of every mapping entry below ``node``, depth first."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            yield where, key, value
            yield from _walk(value, where)
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")


def _plain(node: Any) -> Any:
    """OmegaConf containers as plain ones, interpolations left unresolved (a ``${...}`` target is not trusted)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with hydra-core, a dependency
        return node
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=False)
    return node


def refusal(source: str | Path, what: str, opt_in: str) -> UntrustedConfigError:
    return UntrustedConfigError(
        f"Refusing {what} from '{source}': saved configs may only build linvit's own classes and registered models, "
        f"and nothing from this one was run. If you trust this file and its source, pass {opt_in}."
    )


def check_targets(
    config: Any,
    source: str | Path,
    opt_in: str = "--trusted",
    prefix: str = "",
    *,
    allowed: frozenset[str] = TRUSTED_TARGETS,
) -> None:
    """Raise :class:`UntrustedConfigError` unless ``config`` builds at most one object, itself, of a class in
    ``allowed``.

    ``config``: a dict or OmegaConf node: the section that is built (a run's ``data`` or ``model``), or checkpoint
    hyper-parameters (``allowed=frozenset()``: arguments, nothing in them is built). Only a ``_target_`` at the root
    of ``config`` is looked up in ``allowed``; one anywhere below it is refused whatever it names (an allow-listed
    class built as an argument would run with arguments nobody checked, e.g. a checkpoint path), and Lightning's
    ``_instantiator`` is always refused. ``source``: the file it came from, for the message. ``prefix``: the key of
    ``config`` inside that file (e.g. ``data``), so the message names the full key.
    """
    for where, key, value in _walk(_plain(config), prefix):
        if key not in _CALLABLE_KEYS:
            continue
        at_root = where == (f"{prefix}.{key}" if prefix else key)
        if key == "_target_" and at_root and isinstance(value, str) and value in allowed:
            continue
        what = f"{where}={value!r}"
        if key == "_target_" and (not at_root or not allowed):
            what += " (a saved config builds its DataModule and its model, and nothing named below them)"
        raise refusal(source, what, opt_in)


def check_model_arguments(
    model_name: str | None,
    model_args: Mapping[str, Any] | None,
    source: str | Path,
    opt_in: str = "--trusted",
    prefix: str = "model_args",
) -> None:
    """Raise :class:`UntrustedConfigError` unless ``model_name`` is a registered timm model (None: the caller names
    the model itself, and only the loading arguments are refused) and ``model_args`` holds only creation arguments
    of its class that a file may set, as plain values (:func:`linvit.io.allowed_config.check_model_args`: nothing
    that loads, trusts or names a file, see :data:`LOADING_ARGUMENTS`); nested ``_target_`` entries are checked as
    by :func:`check_targets`."""
    import timm

    import linvit.models  # noqa: F401  (registers linvit's families)
    from linvit.io.allowed_config import NEVER_FROM_A_FILE, check_model_args

    if model_name is not None and (
        not isinstance(model_name, str) or ":" in model_name or not timm.is_model(model_name)
    ):
        raise refusal(source, f"model {model_name!r} (not a registered timm model name)", opt_in)
    check_targets(dict(model_args or {}), source, opt_in, prefix=prefix, allowed=frozenset())
    if model_name is not None:
        check_model_args(model_name, model_args, source, opt_in, prefix=prefix)
        return
    loading = sorted((LOADING_ARGUMENTS | NEVER_FROM_A_FILE).intersection(model_args or {}))
    if loading:
        raise refusal(source, f"model arguments {loading} (they load files or weights)", opt_in)
