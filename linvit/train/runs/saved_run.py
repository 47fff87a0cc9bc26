"""A saved run's objects built again without Hydra: its ``config.yaml`` read as plain data, the DataModule it names
built through linvit's allow-list, and its LightningModule rebuilt from the checkpoint's hyper-parameters.

``linvit eval`` uses these. Hydra's ``instantiate`` imports and calls whatever a ``_target_`` names; here every
``_target_`` is checked against :data:`linvit.utils.saved_config.TRUSTED_TARGETS` first (``trusted=True`` skips
the check, for runs you trust), and classes that moved keep working under the name older runs saved
(:data:`RENAMED_TARGETS`, :data:`MOVED_MODULES`).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "MOVED_MODULES",
    "RENAMED_TARGETS",
    "build_from_config",
    "current_target",
    "load_run_config",
    "module_from_checkpoint",
    "set_option",
]

RENAMED_TARGETS: dict[str, str] = {
    # segmentation training moved beside classification training (dense/ holds no Lightning code)
    "linvit.dense.seg_data.SegmentationDataModule": "linvit.train.data.segmentation.SegmentationDataModule",
    "linvit.dense.seg_module.SegmentationModule": "linvit.train.modules.segmentation.SegmentationModule",
}
"""``_target_`` names that runs saved before a class moved still carry, and the class's name now."""

MOVED_MODULES: dict[str, str] = {
    # linvit.train was one flat folder until it split into the rooms data, modules and runs: the modules whose
    # classes a config names (DataModules, LightningModules, callbacks, the CSV logger, the Hydra callback)
    "linvit.train.datamodules": "linvit.train.data.datamodules",
    "linvit.train.timm_datamodules": "linvit.train.data.timm_datamodules",
    "linvit.train.seg_data": "linvit.train.data.segmentation",
    "linvit.train.module": "linvit.train.modules.classification",
    "linvit.train.seg_module": "linvit.train.modules.segmentation",
    "linvit.train.callbacks": "linvit.train.modules.callbacks",
    "linvit.train.fault_tolerance": "linvit.train.modules.fault_tolerance",
    "linvit.train.logged_metrics": "linvit.train.modules.logged_metrics",
    "linvit.train.run": "linvit.train.runs.run",
}
"""Modules that moved, by their old name: a ``_target_`` ``<old module>.<class>`` (what configs and runs saved
before the move name) is ``<new module>.<class>`` now."""

# Options that runs saved before they existed did not record, with the value that reproduces those runs: they
# trained on every training image, so their test split is what it was then (not a share of train held out, which
# that model trained on; not a CIFAR validation split).
_OPTIONS_OF_OLDER_RUNS = {
    "linvit.train.data.datamodules.ImageFolderDataModule": {"test_fraction": 0},
    "linvit.train.data.datamodules.CIFARDataModule": {"val_size": 0},
}
# Hydra keys a saved node may carry besides its target: arguments are always plain containers here (`_convert_`)
_SPECIAL_KEYS = ("_target_", "_args_", "_partial_", "_convert_")
_CLASSIFIER = "linvit.train.modules.classification.ImageClassifier"
_SEGMENTER = "linvit.train.modules.segmentation.SegmentationModule"


def current_target(name: Any) -> Any:
    """The name a ``_target_`` has now (see :data:`RENAMED_TARGETS` and :data:`MOVED_MODULES`); any other value as
    it is."""
    if not isinstance(name, str):
        return name
    if name in RENAMED_TARGETS:
        return RENAMED_TARGETS[name]
    module, _, attribute = name.rpartition(".")
    return f"{MOVED_MODULES[module]}.{attribute}" if module in MOVED_MODULES else name


def _with_current_targets(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {
            key: current_target(value) if key == "_target_" else _with_current_targets(value)
            for key, value in node.items()
        }
    if isinstance(node, (list, tuple)):
        return [_with_current_targets(value) for value in node]
    return node


def load_run_config(path: str | Path, trusted: bool = False) -> dict[str, Any]:
    """A run directory's ``config.yaml`` (written resolved) as plain dicts and lists, with renamed targets updated
    and the options of older runs filled in.

    The file is read within bounds (:func:`linvit.io.bounded.read_yaml`: a regular file, its size and nesting, no
    YAML tags or aliases, no keys with white space around them) and its values are checked against their types
    (:func:`linvit.train.runs.config_types.check_config_types`). Unless ``trusted``, Hydra's special keys are
    refused (:func:`check_special_keys`). Every refusal is a ValueError of one line naming the file and the key.
    """
    from linvit.io.bounded import read_yaml
    from linvit.train.runs.config_types import check_config_types

    path = Path(path)
    config = read_yaml(path, what="run config")
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, expected the mapping of a run's config.yaml.")
    if not trusted:
        check_special_keys(config, path)
    check_config_types(config, source=path)
    config = _with_current_targets(config)
    if not trusted:  # the sections eval builds: one of linvit's classes each, with its own arguments only
        from linvit.utils.saved_config import check_targets

        for section, allowed in _sections_built().items():
            node = config.get(section)
            if isinstance(node, dict) and "_target_" in node:
                check_targets(node, path, prefix=section, allowed=allowed)
                _check_arguments(node, path, "--trusted", section)
    data = config.get("data")
    if isinstance(data, dict):
        for key, value in _OPTIONS_OF_OLDER_RUNS.get(str(data.get("_target_")), {}).items():
            data.setdefault(key, value)
    return config


# the sections of a run's config.yaml whose entries are objects (each with its own top-level _target_)
_SECTIONS_OF_OBJECTS = ("callbacks", "logger")
# the sections linvit eval builds, through check_targets (which refuses and names a _target_ below their top)
_SECTIONS_BUILT = ("data", "model")


def _sections_built() -> dict[str, frozenset[str]]:
    from linvit.utils.saved_config import TRUSTED_DATAMODULES, TRUSTED_MODELS

    return {"data": TRUSTED_DATAMODULES, "model": TRUSTED_MODELS}


def check_special_keys(config: Mapping[str, Any], source: str | Path, opt_in: str = "--trusted") -> None:
    """Refuse Hydra's special keys in a saved run's config, except those a run writes: a ``_target_`` at the top of
    a section (``data``, ``model``, ``trainer``) or of an entry of ``callbacks`` / ``logger`` (its class is checked
    when it is built), and ``_convert_: all`` at the top of a section. ``_partial_``, ``_recursive_``, ``_args_``
    and any other ``_name_`` key anywhere are refused, naming the file and the key. A ``_target_`` deeper down is
    left to :func:`linvit.utils.saved_config.check_targets`, which refuses it when the section is built."""
    from linvit.utils.saved_config import UntrustedConfigError

    def refuse(where: str, value: Any) -> UntrustedConfigError:
        shown = repr(value) if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"
        return UntrustedConfigError(
            f"Refusing {where}={shown} from '{source}': a run's config.yaml holds no Hydra special keys but the "
            f"_target_ of each section, and nothing from it was run. If you trust this run, pass {opt_in}."
        )

    def allowed(key: str, value: Any, depth: int, section: str) -> bool:
        if key == "_convert_":
            return depth == 1 and value == "all"
        if key != "_target_":
            return False
        # a section's own class, an entry of callbacks/logger; below data/model check_targets names it when built
        return depth == 1 or (depth == 2 and section in _SECTIONS_OF_OBJECTS) or section in _SECTIONS_BUILT

    def walk(node: Any, where: str, depth: int, section: str) -> None:
        if isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{where}[{index}]", depth + 1, section)
            return
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            dotted = f"{where}.{key}" if where else str(key)
            special = isinstance(key, str) and re.fullmatch(r"_\w*_", key)
            if special and not allowed(key, value, depth, section):
                raise refuse(dotted, value)
            walk(value, dotted, depth + 1, section or str(key))

    walk(config, "", 0, "")


_SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def set_option(config: dict[str, Any], key: str, text: str) -> None:
    """``config[a][b] = value`` for ``key="a.b"``, the value read as YAML (``3``, ``true``, ``[1, 2]``, ``1e-3``, an
    empty text as None), creating missing levels: what ``--data KEY=VALUE`` sets."""
    import yaml

    value = yaml.safe_load(text) if text else None
    if isinstance(value, str) and _SCIENTIFIC.match(value):  # YAML 1.1 reads 1e-3 as a string
        value = float(value)
    node = config
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _locate(path: str) -> Any:
    """The object a dotted ``module.attribute`` path names (the longest importable module, then attributes)."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(f"cannot import {path!r}: no module of that name")


def _build(node: Any) -> Any:
    """Hydra's ``instantiate(node, _convert_="all")`` for plain containers: nested nodes first, then the call."""
    if isinstance(node, (list, tuple)):
        return [_build(value) for value in node]
    if not isinstance(node, Mapping):
        return node
    unknown = sorted(key for key in node if re.fullmatch(r"_\w+_", str(key)) and key not in _SPECIAL_KEYS)
    if unknown:
        raise ValueError(f"unsupported config key(s) {unknown}: a saved config may use {list(_SPECIAL_KEYS)}.")
    built = {key: _build(value) for key, value in node.items() if key not in _SPECIAL_KEYS}
    if "_target_" not in node:
        return built
    target = _locate(str(node["_target_"]))
    args = _build(list(node.get("_args_", [])))
    if node.get("_partial_", False):
        return functools.partial(target, *args, **built)
    return target(*args, **built)


def build_from_config(
    config: Mapping[str, Any],
    source: str | Path,
    *,
    trusted: bool = False,
    prefix: str = "",
    opt_in: str = "--trusted",
    allowed: frozenset[str] | None = None,
) -> Any:
    """Build what ``config`` names by ``_target_`` (nested nodes first), as Hydra would, after checking, unless
    ``trusted``, that only its root names a class, one in ``allowed`` (default: linvit's allow-list,
    :data:`~linvit.utils.saved_config.TRUSTED_TARGETS`).

    ``source`` and ``prefix`` (the key of ``config`` in that file) name the refused entry in the
    :class:`~linvit.utils.saved_config.UntrustedConfigError`; ``opt_in`` is the option that trusts the file.
    """
    from linvit.utils.saved_config import TRUSTED_TARGETS, UntrustedConfigError, check_targets

    if not isinstance(config, Mapping) or not isinstance(config.get("_target_"), str):
        key = f"{prefix}._target_" if prefix else "_target_"
        raise UntrustedConfigError(
            f"'{source}': {key} is missing, so it names nothing to build; it should be the config.yaml a run wrote"
        )
    config = _with_current_targets(config)
    if not trusted:
        allowed = TRUSTED_TARGETS if allowed is None else allowed
        check_targets(config, source, opt_in=opt_in, prefix=prefix, allowed=allowed)
        _check_arguments(config, source, opt_in, prefix)
    return _build(config)


def _check_arguments(config: Mapping[str, Any], source: str | Path, opt_in: str, prefix: str) -> None:
    """The keys of an allow-listed class's node are its constructor's own arguments (an unknown one would end in a
    TypeError deep inside the build), naming the first other one."""
    from linvit.io.allowed_config import constructor_arguments
    from linvit.utils.saved_config import UntrustedConfigError

    if "_target_" not in config:
        return
    target = _locate(str(config["_target_"]))
    known = constructor_arguments(target, exclude=frozenset()) | set(_SPECIAL_KEYS)
    for key in config:
        if key not in known:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise UntrustedConfigError(
                f"Refusing {where} from '{source}': {target.__name__} takes no argument {key!r}. Remove it from the "
                f"file, or pass {opt_in} if you trust this run."
            )


def module_from_checkpoint(
    saved: Mapping[str, Any],
    model_target: str | None,
    source: str | Path,
    *,
    trusted: bool = False,
    datamodule: Any = None,
    opt_in: str = "--trusted",
) -> Any:
    """The run's LightningModule with the checkpoint's weights: ``ImageClassifier``, or ``SegmentationModule`` when
    the run's ``model._target_`` names it.

    Unless ``trusted``, the hyper-parameters are checked first (no callables; a registered model created without
    arguments that load files). Weights never come from anywhere but ``saved`` (no pretrained download, no backbone
    checkpoint file). ``datamodule``: the run's, whose class names label a segmentation run that recorded none.
    """
    from linvit.train.runs.checkpoint_hparams import check_classifier_hparams, check_segmenter_hparams

    hparams = dict(saved.get("hyper_parameters") or {})
    if current_target(model_target) == _SEGMENTER:
        from linvit.train.modules.segmentation import SegmentationModule

        if not trusted:
            check_segmenter_hparams(hparams, source, opt_in)
        names = hparams.get("class_names") or getattr(datamodule, "class_names", None)
        module = SegmentationModule(**{**hparams, "pretrained": False, "checkpoint": None, "class_names": names})
    else:
        from linvit.train.modules.classification import ImageClassifier

        if not trusted:
            check_classifier_hparams(hparams, source, opt_in)
        module = ImageClassifier(**{**hparams, "pretrained": False})
    module.load_state_dict(saved["state_dict"])
    return module
