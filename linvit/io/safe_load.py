"""Reading a checkpoint file without running code from it (the FLatten authors' ``.pth`` files, safetensors, plain
state dicts, training checkpoints).

The authors' training scripts save ``{"model", "optimizer", "lr_scheduler", "max_accuracy", "epoch", "config"}``
(plus ``"state_dict_ema"`` for EMA runs), where ``config`` is a pickled yacs ``CfgNode``. PyTorch's safe loader
(``torch.load(weights_only=True)``) refuses that class. Rather than fall back to full unpickling, which would run
whatever code a file names, known configuration classes are mapped onto an inert stand-in: the safe loader then
rebuilds them as plain ``OrderedDict`` objects and never imports or calls the original class. Any other foreign
global is refused with an error that names it; ``trusted=True`` lifts the restriction for files the user trusts.
"""

from __future__ import annotations

import logging
import os
import pickle
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from linvit.io.errors import CheckpointError, UntrustedCheckpointError, short_message
from linvit.io.integrity import verify_file
from linvit.io.pickle_scan import describe_contents, refusal_reason, unsupported_protocol_error

__all__ = ["check_checkpoint_intact", "load_checkpoint_file"]

_log = logging.getLogger(__name__)

# Configuration classes that training scripts pickle next to the weights. They are rebuilt as inert OrderedDicts.
_CONFIG_CLASS_PATHS = (
    "yacs.config.CfgNode",
    "argparse.Namespace",
    "easydict.EasyDict",
)


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


def _read_error(path: Path, error: BaseException) -> CheckpointError:
    return CheckpointError(
        f"Could not read checkpoint '{path}' (truncated or corrupt?): it is {describe_contents(path)}. "
        f"Save or download it again. Loader message: {short_message(error)}"
    )


def _load_safetensors(path: Path, map_location: str | torch.device | None) -> dict[str, Any]:
    from safetensors.torch import load_file

    device = "cpu" if map_location is None else str(map_location)
    try:
        return dict(load_file(str(path), device=device))
    except Exception as error:
        raise CheckpointError(
            f"Could not read safetensors file '{path}' (truncated or corrupt?): {short_message(error)}. Save, "
            "download or convert it again."
        ) from error


def _check_exists_and_not_empty(path: Path) -> None:
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file not found: '{path}'. Check the path (a file, not a directory).")
    if path.stat().st_size == 0:
        raise CheckpointError(
            f"Checkpoint '{path}' is empty (0 bytes): its save or download did not finish. Save or download it again."
        )


def check_checkpoint_intact(path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` naming ``path`` if it is missing, empty, a damaged zip archive (a save or
    download cut short) or neither a zip archive nor a pickle (text, an HTML page): checks that read the file's
    first bytes and a zip's directory, and unpickle nothing (for files loaded with ``trusted=True``). Then the file's
    integrity (:func:`linvit.io.integrity.verify_file`: every zip entry's CRC-32, a safetensors header, a recorded
    SHA-256) raises :class:`~linvit.io.integrity.DamagedCheckpointError` naming the damaged entry."""
    path = Path(path)
    _check_exists_and_not_empty(path)
    if path.name.endswith(".safetensors"):
        verify_file(path)
        return
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
        if head == b"PK\x03\x04":
            with zipfile.ZipFile(path):  # reads the central directory at the end: a cut file has none
                pass
            verify_file(path)
            return
        elif head[:1] == b"\x80":
            verify_file(path)
            return
        reason = "not a zip archive or a pickle"
    except (OSError, zipfile.BadZipFile) as error:
        reason = short_message(error)
    raise CheckpointError(
        f"Could not read checkpoint '{path}' (truncated or corrupt?): it is {describe_contents(path)}. "
        f"Save or download it again. Loader message: {reason}"
    )


def load_checkpoint_file(
    path: str | os.PathLike,
    *,
    trusted: bool = False,
    map_location: str | torch.device | None = "cpu",
    opt_in: str | None = None,
    mmap: bool = False,
) -> dict[str, Any]:
    """Read a checkpoint file into a dict without executing code from it (unless ``trusted=True``).

    ``.safetensors`` files are read with safetensors; anything else (``.pth``, ``.pt``, ``.bin``, ``.pth.tar``) with
    ``torch.load(weights_only=True)``, where pickled yacs/argparse/EasyDict configs come back as inert
    ``OrderedDict`` objects. The result is the file's top-level dict (a training checkpoint or a plain state dict);
    pass it to :func:`linvit.io.extract_model_state_dict` for the weights. ``opt_in``: the option that gives
    ``trusted=True`` where the caller is a command or a config (e.g. ``--trusted``), named in the refusal.
    ``mmap``: memory-map a zip checkpoint instead of reading it into memory (to look at it without its cost).

    Raises:
        CheckpointError (a ValueError): the file is missing, truncated or corrupt, or does not hold a dict.
        UntrustedCheckpointError (a CheckpointError): the file names other Python objects; loading it needs
            ``trusted=True``, which runs arbitrary code from the file, so pass it only for files you trust.
        DamagedCheckpointError (a CheckpointError): a zip entry fails its CRC-32, a safetensors header does not
            match the file, or the file differs from the SHA-256 recorded for it (:mod:`linvit.io.integrity`).
    """
    path = Path(path)
    _check_exists_and_not_empty(path)
    checked = verify_file(path)  # before anything is unpickled or mapped
    if path.name.endswith(".safetensors"):
        _log.info("loading %s (verified: %s; safetensors)", path, checked)
        return _load_safetensors(path, map_location)

    mmap = mmap and zipfile.is_zipfile(path)  # a legacy (non-zip) file cannot be memory-mapped
    how = "weights_only=False: trusted" if trusted else "weights_only=True"
    _log.info("loading %s (verified: %s; torch.load(%s%s))", path, checked, how, ", mmap" if mmap else "")
    try:
        if trusted:
            checkpoint = torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
        else:
            with torch.serialization.safe_globals(_safe_globals()), warnings.catch_warnings():
                # protocol 4-5 files: torch warns, then fails; the refusal below says it better
                warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
                checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        unsupported = None if trusted else unsupported_protocol_error(path, error)
        if unsupported is not None:
            raise unsupported from error
        reason = None if trusted else refusal_reason(error)
        if reason is not None:
            names = _unsafe_globals_in(path)
            named = f" It refers to: {', '.join(names)}." if names else ""
            how = (
                f"pass {opt_in} (runs arbitrary code from the file)"
                if opt_in
                else "load it with trusted=True (e.g. timm.create_model(..., trusted=True); runs arbitrary code from "
                "the file), or convert it once with `linvit convert SRC DST.safetensors --trusted`"
            )
            raise UntrustedCheckpointError(
                f"Refusing to load '{path}': it holds pickled Python objects that can only be rebuilt by running "
                f"code from the file.{named} Nothing from it was executed. If you trust this file and its source, "
                f"{how}. Loader message: {reason}"
            ) from error
        raise _read_error(path, error) from error
    except CheckpointError:
        raise
    except (
        Exception
    ) as error:  # any failure of the unpickler on damaged bytes (IndexError, TypeError ...) is a read error
        raise _read_error(path, error) from error
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(
            f"Checkpoint '{path}' holds a {type(checkpoint).__name__}, expected a dict (a state dict or a training "
            "checkpoint with a 'model' / 'state_dict' entry). Save `model.state_dict()` rather than the module."
        )
    return dict(checkpoint)
