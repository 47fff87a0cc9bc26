"""Safe loading of foreign checkpoints (the FLatten authors' ``.pth`` files, safetensors, plain state dicts).

The authors' training scripts save ``{"model", "optimizer", "lr_scheduler", "max_accuracy", "epoch", "config"}``
(plus ``"state_dict_ema"`` for EMA runs), where ``config`` is a pickled yacs ``CfgNode``. PyTorch's safe loader
(``torch.load(weights_only=True)``) refuses that class. Rather than fall back to full unpickling, which would run
whatever code a file names, known configuration classes are mapped onto an inert stand-in: the safe loader then
rebuilds them as plain ``OrderedDict`` objects and never imports or calls the original class. Any other foreign
global is refused with an error that names it; ``trusted=True`` lifts the restriction for files the user trusts.

timm integration: a family's model defines ``load_pretrained(self, checkpoint_path)`` that calls
:func:`load_pretrained_file`, and its ``_create_*`` function builds through :func:`build_model_loading_safely`
(timm's ``build_model_with_cfg`` with the kwargs passed through :func:`route_pretrained_to_model`: timm 1.0.31 resets
``custom_load`` to False when ``pretrained_cfg_overlay`` names a ``file`` or ``url``; this sets it back). timm's
``load_pretrained`` then hands the file to the model instead of reading it with its own loader (which refuses the
pickled config, prefers EMA weights and fails on a bad file with a bare ``EOFError``/``KeyError``), so
``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path))`` reads the authors' raw files,
safetensors from ``linvit convert``, and plain state dicts alike, and a bad file is a short :class:`CheckpointError`
naming it. ``timm.create_model(..., trusted=True)`` is the opt-in for a pickle that runs code.
"""

from __future__ import annotations

import contextvars
import logging
import os
import pickle
import pickletools
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "CheckpointError",
    "UntrustedCheckpointError",
    "build_model_loading_safely",
    "extract_model_state_dict",
    "load_checkpoint_file",
    "describe_mismatch",
    "load_pretrained_file",
    "route_pretrained_to_model",
    "state_dict_mismatch",
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


# Globals a plain torch state dict refers to (tensor rebuilding, OrderedDict): named without alarm.
_SAFE_GLOBAL_PREFIXES = ("torch.", "collections.OrderedDict", "builtins.", "_codecs.encode", "numpy.")

_REFUSAL_MARKERS = (
    "unsupported global",
    "trying to call reduce",
    "can only create new object",
    "can only build",
    "whose module",
)


def _pickle_bytes(path: Path) -> bytes | None:
    """The pickle stream of a torch checkpoint (``*/data.pkl`` inside the zip, or the legacy file itself)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = [name for name in archive.namelist() if name.endswith("data.pkl")]
                return archive.read(names[0]) if names else None
        return path.read_bytes()
    except (OSError, zipfile.BadZipFile, KeyError):
        return None


def _scan_pickle(data: bytes) -> tuple[int | None, list[str], bool]:
    """Protocol, ``module.name`` globals and completeness (a STOP reached) of a pickle stream, parsed with
    pickletools (nothing is executed).

    ``STACK_GLOBAL`` (protocol 4+) takes its names from the two strings pushed before it (directly or via the memo).
    """
    protocol: int | None = None
    complete = False
    found: list[str] = []
    strings: list[str] = []
    memo: dict[int, Any] = {}
    last: Any = None
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name == "PROTO":
                protocol = int(arg)
            elif name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif name == "STOP":
                complete = True
                break
            if isinstance(arg, str) and "UNICODE" in name:
                strings.append(arg)
                last = arg
            elif name == "MEMOIZE":
                memo[len(memo)] = last
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = last
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                last = memo.get(int(arg))
                if isinstance(last, str):
                    strings.append(last)
            else:
                last = None
    except Exception:  # a truncated stream: report what was read
        pass
    return protocol, list(dict.fromkeys(found)), complete


def _refusal_reason(error: BaseException) -> str | None:
    """The line of a safe-loader error that says which object it refused, or None when the file is just corrupt."""
    for line in str(error).splitlines():
        if any(marker in line.lower() for marker in _REFUSAL_MARKERS):
            return line.strip()
    return None


def _unsupported_protocol_error(path: Path, error: BaseException) -> UntrustedCheckpointError | None:
    """PyTorch's safe unpickler reads pickle protocols 2-3 only: it stops at the first protocol-4 opcode (FRAME,
    STACK_GLOBAL, ...) with "Unsupported operand". Such a file cannot be checked safely, whatever it holds."""
    if "unsupported operand" not in str(error).lower():
        return None
    data = _pickle_bytes(path)
    protocol, names, complete = _scan_pickle(data) if data is not None else (None, [], False)
    if not complete:  # not a whole pickle (text, a cut file): corrupt, not a protocol matter
        return None
    unsafe = [name for name in names if not name.startswith(_SAFE_GLOBAL_PREFIXES)]
    if unsafe:
        named = f"It names Python objects the safe loader would refuse: {', '.join(unsafe[:8])}."
    else:
        named = "It names no objects beyond tensors and plain containers, but that cannot be verified by loading."
    saved_with = f"pickle protocol {protocol}" if protocol is not None else "a newer pickle protocol"
    opcode = next((line.strip() for line in str(error).splitlines() if "nsupported operand" in line), "")
    return UntrustedCheckpointError(
        f"Refusing to load '{path}': it was saved with {saved_with}, which PyTorch's safe loader cannot read (it "
        f"supports protocols 2-3; it stopped at: {opcode}). {named} Nothing from it was executed. If you trust "
        "this file and its source, load it with trusted=True (runs arbitrary code from the file), or re-save it "
        "once in a trusted environment with "
        "`torch.save(state_dict, path)` (default protocol) or `linvit convert SRC DST.safetensors --trusted`."
    )


def _describe_contents(path: Path) -> str:
    """What the first bytes of an unreadable file say it is (read only, nothing is parsed or run)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
    except OSError:
        return "it could not be read"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (PyTorch's format) that is incomplete or damaged, e.g. a download or save cut short"
    if head[:1] == b"\x80":
        return "a pickle stream that is incomplete or damaged"
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        return "a safetensors file (name it *.safetensors) or a damaged one"
    text = head.decode("utf-8", errors="ignore")  # a character cut at byte 64 is dropped
    if text.startswith("version https://git-lfs"):
        return "a Git LFS pointer, not the weights: fetch them with `git lfs pull`"
    if text.lstrip().lower().startswith(("<!doctype html", "<html")):
        return "an HTML page, not weights (a download that saved an error or login page?)"
    if text and all(char.isprintable() or char in "\t\n\r" for char in text):
        return f"text, not a checkpoint (it starts with {text.splitlines()[0][:40]!r})"
    return "not a PyTorch checkpoint (neither a zip archive nor a pickle)"


def _first_line(error: BaseException, limit: int = 160) -> str:
    """The loader's own message, short: its first sentence or line (PyTorch's zip errors run to a paragraph)."""
    line = str(error).strip().split("\n")[0].split(". ")[0]
    return line if len(line) <= limit else line[:limit] + "..."


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
    if path.stat().st_size == 0:
        raise CheckpointError(
            f"Checkpoint '{path}' is empty (0 bytes): its save or download did not finish. Save or download it again."
        )
    if path.name.endswith(".safetensors"):
        from safetensors.torch import load_file

        device = "cpu" if map_location is None else str(map_location)
        try:
            return dict(load_file(str(path), device=device))
        except Exception as error:
            raise CheckpointError(
                f"Could not read safetensors file '{path}' (truncated or corrupt?): {_first_line(error)}. Save, "
                "download or convert it again."
            ) from error

    try:
        if trusted:
            checkpoint = torch.load(path, map_location=map_location, weights_only=False)
        else:
            with torch.serialization.safe_globals(_safe_globals()), warnings.catch_warnings():
                # protocol 4-5 files: torch warns, then fails; the refusal below says it better
                warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
                checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        unsupported = None if trusted else _unsupported_protocol_error(path, error)
        if unsupported is not None:
            raise unsupported from error
        reason = None if trusted else _refusal_reason(error)
        if reason is not None:
            names = _unsafe_globals_in(path)
            named = f" It refers to: {', '.join(names)}." if names else ""
            raise UntrustedCheckpointError(
                f"Refusing to load '{path}': it holds pickled Python objects that can only be rebuilt by running "
                f"code from the file.{named} Nothing from it was executed. If you trust this file and its source, "
                "load it with trusted=True (e.g. timm.create_model(..., trusted=True); runs arbitrary code from the "
                "file), or convert it once with `linvit convert SRC DST.safetensors --trusted`. "
                f"Loader message: {reason}"
            ) from error
        raise CheckpointError(
            f"Could not read checkpoint '{path}' (truncated or corrupt?): it is {_describe_contents(path)}. "
            f"Save or download it again. Loader message: {_first_line(error)}"
        ) from error
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, AttributeError, ImportError) as error:
        raise CheckpointError(
            f"Could not read checkpoint '{path}' (truncated or corrupt?): it is {_describe_contents(path)}. "
            f"Save or download it again. Loader message: {_first_line(error)}"
        ) from error
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


def _variants_that_fit(
    model: nn.Module,
    state_dict: dict[str, torch.Tensor],
    filter_fn: Callable[[dict[str, torch.Tensor], nn.Module], dict[str, torch.Tensor]] | None,
) -> list[str]:
    """Registered models of ``model``'s family (built on the meta device) that ``state_dict`` fits exactly."""
    import timm
    from timm.models._registry import _model_to_module

    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    family = _model_to_module.get(architecture or "")
    if family is None:
        return []
    fits = []
    for name in sorted(n for n, module in _model_to_module.items() if module == family):
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
    filter_fn: Callable[[dict[str, torch.Tensor], nn.Module], dict[str, torch.Tensor]] | None = None,
    *,
    use_ema: bool = False,
    trusted: bool | None = None,
    strict: bool = True,
) -> None:
    """Load a foreign or native checkpoint file into ``model`` (what a model's ``load_pretrained`` calls).

    Reads the file safely (:func:`load_checkpoint_file`), unwraps the weights (:func:`extract_model_state_dict`),
    applies the family's ``filter_fn(state_dict, model)`` (key mapping, table resizing), adapts the stem to the
    model's input channels and drops a classifier of another size, then compares names and shapes with the model
    before touching it: any difference raises a short :class:`CheckpointError` (counts, first few names, the
    registered variant the file fits) and leaves the model as it was. ``strict=False`` loads what matches.
    ``trusted=None`` takes the choice made at creation (``timm.create_model(..., trusted=True)``), else False.
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
            f"Checkpoint '{path}' holds no weights {target} can use: {_first_line(error, limit=400)}"
        ) from error
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
    trusts, e.g. ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), trusted=True)``.
    """
    from timm.models import build_model_with_cfg

    trusted = kwargs.pop("trusted", False)
    if not isinstance(trusted, bool):
        raise TypeError(f"trusted must be True or False, got {trusted!r} ({type(trusted).__name__})")
    token = _TRUSTED_LOAD.set(trusted)
    try:
        return build_model_with_cfg(model_cls, variant, pretrained, **route_pretrained_to_model(kwargs))
    finally:
        _TRUSTED_LOAD.reset(token)
