"""What a file may say: allow-lists of keys and value types for configs that name how to build a model.

A ``config.json`` beside weights, a safetensors file's ``model_args`` metadata, timm's ``config.json`` of a
``local-dir:`` folder and a checkpoint's hyper-parameters all end up as keyword arguments of ``timm.create_model``.
Nothing in them is trusted: a key is taken only if it is a named parameter of the registered model's own class
(:func:`model_arguments_allowed`), less the arguments that load, fetch or trust anything
(:data:`NEVER_FROM_A_FILE`: ``trusted``, ``allow_non_finite``, ``pretrained*``, ``checkpoint_path`` ...), and its
value is a JSON scalar or a short flat list of them (:func:`check_model_args`). The top level of a ``config.json``
and its ``pretrained_cfg`` are allow-listed as well (:func:`check_side_config`). Anything else is refused in one
:class:`~linvit.io.errors.UntrustedConfigError` line naming the file, the key and the opt-in.

Trust comes only from the command line (``--trusted``, ``trust_checkpoint=true``) or from a Python caller who writes
``trusted=True`` in code; no file can widen it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from linvit.io.errors import UntrustedConfigError

__all__ = [
    "MAX_LIST_ITEMS",
    "MAX_TEXT_CHARS",
    "NEVER_FROM_A_FILE",
    "check_model_args",
    "check_side_config",
    "constructor_arguments",
    "model_arguments_allowed",
    "registered_model_class",
]

MAX_LIST_ITEMS = 64  # widths, depths, ratios per stage: a handful of numbers
MAX_LABELS = 100_000  # label names of a classifier
MAX_TEXT_CHARS = 4096  # a string value (notes and descriptions are the longest)

NEVER_FROM_A_FILE: frozenset[str] = frozenset(
    {
        # trust and the checks it lifts
        "trusted",
        "allow_non_finite",
        # what loads, fetches or names weights and configs
        "pretrained",
        "pretrained_cfg",
        "pretrained_cfg_overlay",
        "pretrained_model_args",
        "pretrained_strict",
        "pretrained_filter_fn",
        "checkpoint_path",
        "cache_dir",
        "model_cfg",
        "kwargs_filter",
        # features_only wraps the model (and its loading) in another class
        "features_only",
        "feature_cfg",
        "feature_cls",
        "out_indices",
        # where and how it is built
        "device",
        "dtype",
        "scriptable",
        "exportable",
        "no_jit",
    }
)
"""Creation arguments no file may set, whatever the class's signature says: they load, trust or place the model."""


def _refusal(source: str | Path, what: str, opt_in: str) -> UntrustedConfigError:
    return UntrustedConfigError(
        f"Refusing {what} from '{source}': a file may set only the model's own creation arguments, as plain values, "
        f"and nothing from it was run or loaded. If you trust this file and its source, pass {opt_in}."
    )


def constructor_arguments(model_cls: type, exclude: frozenset[str] = NEVER_FROM_A_FILE) -> frozenset[str]:
    """The named parameters of ``model_cls.__init__``, and of its bases' while each passes ``**kwargs`` on, less
    ``exclude`` (default: those no file may set for a model)."""
    names: set[str] = set()
    for cls in model_cls.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            break
        names.update(p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self")
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return frozenset(names - exclude)


@functools.lru_cache(maxsize=64)
def registered_model_class(model_name: str) -> type | None:
    """The class ``timm.create_model(model_name)`` builds (built on the meta device: no memory, no weights)."""
    import timm  # linvit's families are registered: importing linvit.io ran linvit/__init__

    if ":" in model_name or not timm.is_model(model_name):
        return None
    try:
        return type(timm.create_model(model_name, pretrained=False, device="meta"))
    except Exception:  # a model that cannot be built bare: no file may set its arguments
        return None


def model_arguments_allowed(model: str | type) -> frozenset[str]:
    """The creation arguments a file may set for ``model`` (a registered name or the class itself)."""
    model_cls = registered_model_class(model) if isinstance(model, str) else model
    return constructor_arguments(model_cls) if model_cls is not None else frozenset()


def _is_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= MAX_TEXT_CHARS
    return value is None or isinstance(value, (bool, int))


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _check_value(value: Any, key: str, source: str | Path, opt_in: str, max_items: int = MAX_LIST_ITEMS) -> None:
    """A JSON scalar (finite numbers, strings of bounded length) or a flat list of at most ``max_items`` of them."""
    if _is_scalar(value):
        return
    if isinstance(value, (list, tuple)):
        if len(value) > max_items:
            raise _refusal(source, f"{key} (a list of {len(value)} items, over the {max_items} it may hold)", opt_in)
        for index, item in enumerate(value):
            if not _is_scalar(item):
                raise _refusal(source, f"{key}[{index}]={_describe(item)} (not a plain number, text or switch)", opt_in)
        return
    raise _refusal(
        source, f"{key}={_describe(value)} (a {type(value).__name__}: a plain value or a flat list is wanted)", opt_in
    )


def check_model_args(
    model: str | type,
    args: Any,
    source: str | Path,
    opt_in: str = "--trusted",
    prefix: str = "model_args",
) -> None:
    """Raise :class:`UntrustedConfigError` unless ``args`` (creation arguments read from ``source``) is a mapping
    whose every key is a creation argument of ``model`` a file may set (:func:`model_arguments_allowed`) and whose
    every value is plain (a scalar or a flat list). ``prefix`` names ``args`` inside the file."""
    if args is None:
        return
    if not isinstance(args, Mapping):
        raise _refusal(source, f"{prefix}={_describe(args)} (not a mapping of creation arguments)", opt_in)
    allowed = model_arguments_allowed(model)
    name = model if isinstance(model, str) else model.__name__
    for key, value in args.items():
        where = f"{prefix}.{key}"
        if not isinstance(key, str) or key not in allowed:
            reason = "an argument that loads, trusts or places the model" if key in NEVER_FROM_A_FILE else None
            reason = reason or f"not a creation argument of {name}"
            raise _refusal(source, f"{where} ({reason})", opt_in)
        _check_value(value, where, source, opt_in)


# --------------------------------------------------------------------------------------- config.json beside weights
def _pretrained_cfg_keys() -> frozenset[str]:
    from timm.models import PretrainedCfg

    where_weights_are = {"url", "file", "state_dict", "hf_hub_id", "hf_hub_filename", "source"}
    return frozenset(field.name for field in dataclasses.fields(PretrainedCfg)) - where_weights_are


_LABEL_LISTS = ("label_names", "class_names")


def _check_labels(value: Any, key: str, source: str | Path, opt_in: str) -> None:
    if value is not None:
        _check_value(value, key, source, opt_in, max_items=MAX_LABELS)


def _check_descriptions(value: Any, key: str, source: str | Path, opt_in: str) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or len(value) > MAX_LABELS:
        raise _refusal(source, f"{key} (a mapping of at most {MAX_LABELS} label descriptions is wanted)", opt_in)
    for name, text in value.items():
        _check_value(text, f"{key}.{name}", source, opt_in)


def _check_integer(value: Any, key: str, source: str | Path, opt_in: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**7):
        raise _refusal(source, f"{key}={_describe(value)} (a count of at least 0 is wanted)", opt_in)


def _check_text(value: Any, key: str, source: str | Path, opt_in: str) -> None:
    if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT_CHARS):
        raise _refusal(source, f"{key}={_describe(value)} (a text is wanted)", opt_in)


def check_side_config(
    config: Any, model: str | type, source: str | Path, opt_in: str = "--trusted", prefix: str = ""
) -> None:
    """Raise :class:`UntrustedConfigError` unless ``config`` (a ``config.json`` in timm's hub format, read from
    ``source``) holds only the keys timm and linvit write there, each with a plain value: ``architecture``,
    ``num_classes``, ``num_features``, ``model_args`` (see :func:`check_model_args`), ``pretrained_cfg`` (timm's
    fields that describe preprocessing and labels; none that names where weights are), ``label_names`` /
    ``class_names``, ``label_descriptions`` and ``sha256`` (of the weights)."""
    if not isinstance(config, Mapping):
        raise _refusal(source, f"{prefix or 'the top level'} (not timm's config object)", opt_in)
    dotted = (lambda key: f"{prefix}.{key}") if prefix else (lambda key: key)
    for key, value in config.items():
        where = dotted(key)
        if key == "model_args":
            check_model_args(model, value, source, opt_in, prefix=where)
        elif key == "pretrained_cfg":
            if not isinstance(value, Mapping):
                raise _refusal(source, f"{where} (not a mapping)", opt_in)
            check_pretrained_cfg(value, source, opt_in, prefix=where)
        elif key in ("num_classes", "num_features"):
            _check_integer(value, where, source, opt_in)
        elif key in ("architecture", "sha256"):
            _check_text(value, where, source, opt_in)
        elif key in _LABEL_LISTS:
            _check_labels(value, where, source, opt_in)
        elif key == "label_descriptions":
            _check_descriptions(value, where, source, opt_in)
        else:
            raise _refusal(source, f"{where} (not a key of timm's config.json that linvit reads)", opt_in)


def check_pretrained_cfg(cfg: Mapping[str, Any], source: str | Path, opt_in: str, prefix: str) -> None:
    """timm's pretrained cfg fields, less those that say where weights are (``url``, ``file``, ``hf_hub_id`` ...)."""
    allowed = _pretrained_cfg_keys()
    for key, value in cfg.items():
        where = f"{prefix}.{key}"
        if key not in allowed:
            raise _refusal(source, f"{where} (not a pretrained_cfg field a file may set)", opt_in)
        if key in ("num_classes", "label_offset"):
            _check_integer(value, where, source, opt_in)
        elif key == "label_names":
            _check_labels(value, where, source, opt_in)
        elif key == "label_descriptions":
            _check_descriptions(value, where, source, opt_in)
        else:
            _check_value(value, where, source, opt_in)
            wanted = _PREPROCESSING.get(key)
            if wanted is not None and value is not None and not wanted[0](value):
                raise _refusal(source, f"{where}={_describe(value)} ({wanted[1]} is wanted)", opt_in)


def _numbers(value: Any, lengths: range, low: float, high: float) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) in lengths
        and all(isinstance(item, (int, float)) and not isinstance(item, bool) and low < item <= high for item in value)
    )


def _positive_ints(value: Any, length: int) -> bool:
    return _numbers(value, range(length, length + 1), 0, 1 << 20) and all(isinstance(item, int) for item in value)


def _names(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))


# What timm's transforms and builder read from a pretrained cfg, with the shape each must have (a wrong one ends in
# an assertion deep inside timm, e.g. an input_size of two numbers).
_PREPROCESSING: dict[str, tuple[Any, str]] = {
    "input_size": (lambda v: _positive_ints(v, 3), "3 positive whole numbers (channels, height, width)"),
    "test_input_size": (lambda v: _positive_ints(v, 3), "3 positive whole numbers"),
    "min_input_size": (lambda v: _positive_ints(v, 3), "3 positive whole numbers"),
    "pool_size": (lambda v: _positive_ints(v, 2), "2 positive whole numbers"),
    "mean": (lambda v: _numbers(v, range(1, 5), -1e6, 1e6), "1 to 4 finite numbers"),
    "std": (lambda v: _numbers(v, range(1, 5), 0, 1e6), "1 to 4 finite numbers above 0"),
    "crop_pct": (lambda v: _numbers([v], range(1, 2), 0, 10), "a number in (0, 10]"),
    "test_crop_pct": (lambda v: _numbers([v], range(1, 2), 0, 10), "a number in (0, 10]"),
    "interpolation": (
        lambda v: v in ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming", "random"),
        "one of nearest, bilinear, bicubic, lanczos, box, hamming",
    ),  # fmt: skip
    "crop_mode": (lambda v: v in ("center", "squash", "border"), "center, squash or border"),
    "fixed_input_size": (lambda v: isinstance(v, bool), "true or false"),
    "first_conv": (_names, "a layer name or a list of them"),
    "classifier": (_names, "a layer name or a list of them"),
}
