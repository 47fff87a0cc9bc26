"""Export a training checkpoint as timm-loadable weights: ``model.safetensors`` + ``config.json``.

The folder then loads with ``timm.create_model("local-dir:<folder>")`` (architecture, ``num_classes`` and the
creation arguments come from ``config.json``), or with an explicit name::

    timm.create_model(name, pretrained=True, num_classes=..., img_size=...,
                      pretrained_cfg_overlay=dict(file=".../model.safetensors", num_classes=...))

(the ``num_classes`` in the overlay keeps the trained classifier: timm drops a head whose class count differs from
the pretrained cfg's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from linvit.io import UntrustedCheckpointError, load_checkpoint_file
from linvit.io.destination import check_destination, check_not_input, prepare_folder, write_file
from linvit.train.runs.checkpoint_hparams import check_classifier_hparams

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
WEIGHTS_KIND = "safetensors"  # the kinds in the folder's record of what linvit wrote (linvit.io.destination)
CONFIG_KIND = "timm-config"
_CFG_DROP = (
    "url",
    "hf_hub_id",
    "hf_hub_filename",
    "file",
    "state_dict",
    "source",
    "tag",
    "architecture",
    "test_input_size",
    "test_crop_pct",
    "min_input_size",
    "pool_size",
)


def find_checkpoint(path: str | os.PathLike, which: str = "best") -> Path:
    """A ``.ckpt`` file from a run directory (``which``: ``best`` or ``last``) or the file itself."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / "checkpoints" / f"{which}.ckpt", path / f"{which}.ckpt"):
        if candidate.is_file():
            return candidate
    if which == "best":  # a run without validation has only last.ckpt
        return find_checkpoint(path, "last")
    raise FileNotFoundError(f"no {which}.ckpt in {path} or {path / 'checkpoints'}: give a run directory or a .ckpt.")


def untrusted_checkpoint_error(path: str | os.PathLike, error: BaseException, opt_in: str) -> UntrustedCheckpointError:
    """The refusal of a checkpoint that ``torch.load(weights_only=True)`` cannot read, naming the opt-in."""
    reason = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return UntrustedCheckpointError(
        f"Refusing to load '{path}' without {opt_in}: it holds pickled Python objects that only running code from "
        f"the file could rebuild (linvit's own checkpoints never do). Nothing from it was executed. If you trust "
        f"this file and its source, pass {opt_in} (runs arbitrary code from the file). Loader message: {reason}"
    )


def load_checkpoint(
    path: str | os.PathLike, trusted: bool = False, opt_in: str = "trusted=True", *, mmap: bool = False
) -> dict[str, Any]:
    """A training checkpoint as a dict, read with ``torch.load(weights_only=True)`` unless ``trusted``.

    Our own checkpoints hold only tensors and plain containers (hyper-parameters, loop and callback state), so
    they load safely; a file that names other Python objects raises :class:`UntrustedCheckpointError` naming
    ``opt_in``. A missing, empty, truncated or corrupt file (an HTML page saved as ``.ckpt``) raises
    :class:`~linvit.io.CheckpointError` naming it and what it holds, as for weight files
    (:func:`linvit.io.load_checkpoint_file`). ``mmap``: memory-map it (to read its hyper-parameters cheaply).
    """
    return load_checkpoint_file(path, trusted=trusted, map_location="cpu", opt_in=opt_in, mmap=mmap)


def model_state_dict(checkpoint: dict[str, Any], ema: bool = False) -> dict[str, torch.Tensor]:
    """The timm model's weights from a LightningModule checkpoint (``model.*``, or ``model_ema.module.*``)."""
    prefix = "model_ema.module." if ema else "model."
    state = checkpoint["state_dict"]
    weights = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
    if not weights:
        if ema:
            raise ValueError("the checkpoint has no EMA weights (model_ema.*): train with model.ema.enabled=true.")
        raise ValueError("the checkpoint has no 'model.*' weights: it was not written by linvit's ImageClassifier.")
    return weights


def data_config(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The DataModule's preprocessing saved in the checkpoint (see ``ClassificationDataModule.state_dict``)."""
    for value in checkpoint.values():
        if isinstance(value, dict) and "data_config" in value:
            return dict(value["data_config"], label_names=list(value.get("class_names", [])))
    return {}


def timm_config(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` in timm's hub format: architecture, num_classes, model_args, pretrained_cfg."""
    import timm

    import linvit  # noqa: F401  (registers linvit models)

    hparams = dict(checkpoint.get("hyper_parameters", {}))
    name = hparams["model_name"]
    model_args = dict(hparams.get("model_kwargs") or {})
    model_args.pop("drop_path_rate", None)
    model_args.pop("drop_rate", None)
    model_args["in_chans"] = int(hparams.get("in_chans", 3))
    pretrained_cfg = timm.models.get_pretrained_cfg(name)
    cfg = pretrained_cfg.to_dict() if pretrained_cfg is not None else {}
    cfg = {k: v for k, v in cfg.items() if k not in _CFG_DROP and v is not None}
    data = data_config(checkpoint)
    label_names = data.pop("label_names", None)
    cfg.update({k: v for k, v in data.items() if v is not None})
    cfg["num_classes"] = int(hparams["num_classes"])
    cfg["input_size"] = [model_args["in_chans"], *list(cfg.get("input_size", (3, 224, 224)))[1:]]
    config = {
        "architecture": name,
        "num_classes": int(hparams["num_classes"]),
        "num_features": None,
        "model_args": model_args,
        "pretrained_cfg": _json_ready(cfg),
    }
    if label_names:
        config["label_names"] = label_names
    return config


def export_checkpoint(
    checkpoint_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    ema: bool = False,
    trusted: bool = False,
    opt_in: str = "trusted=True",
    force: bool = False,
) -> Path:
    """Write ``model.safetensors`` and ``config.json`` for ``checkpoint_path`` into ``out_dir``; returns the weights.

    Both go through :func:`linvit.io.destination.write_file` (temporary name, rename, recorded): an existing one that
    linvit did not write is refused unless ``force`` (:class:`~linvit.io.destination.DestinationError`, before
    anything is written), which replaces those two files and nothing else in ``out_dir``; exporting a run again into
    its own folder needs no ``force``.

    ``ema``: export the EMA weights instead of the raw ones. ``trusted``: allow a checkpoint that runs code when
    loaded (see :func:`load_checkpoint`) or whose hyper-parameters name a model outside the registry or arguments
    that load files (see :mod:`linvit.utils.saved_config`). Weights with NaN/Inf are refused, named (unless allowed
    by :func:`linvit.io.allow_non_finite_weights`).
    """
    from safetensors.torch import save_file

    from linvit.io import check_finite_weights
    from linvit.io.destination import file_sha256

    checkpoint = load_checkpoint(checkpoint_path, trusted=trusted, opt_in=opt_in)
    if not trusted:  # config.json will name the model and its arguments: only registered ones that load nothing
        check_classifier_hparams(checkpoint.get("hyper_parameters") or {}, checkpoint_path, opt_in)
    weights = model_state_dict(checkpoint, ema=ema)
    check_finite_weights(weights, str(checkpoint_path))
    config = timm_config(checkpoint)
    config["num_features"] = _num_features(config)
    out_dir = prepare_folder(out_dir)
    weights_path, config_path = out_dir / WEIGHTS_NAME, out_dir / CONFIG_NAME
    for path, kind in ((weights_path, WEIGHTS_KIND), (config_path, CONFIG_KIND)):
        check_not_input(path, checkpoint_path)
        check_destination(path, kind, force=force)  # both refused before either is written
    tensors = {key: value.detach().contiguous().clone() for key, value in weights.items()}
    write_file(
        weights_path, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}), WEIGHTS_KIND, force=force
    )
    config["sha256"] = file_sha256(weights_path)  # of model.safetensors: checked before the folder is loaded
    text = json.dumps(config, indent=2) + "\n"
    write_file(config_path, lambda tmp: Path(tmp).write_text(text), CONFIG_KIND, force=force)
    return weights_path


def _num_features(config: dict[str, Any]) -> int | None:
    import timm

    try:
        with torch.device("meta"):
            model = timm.create_model(config["architecture"], num_classes=config["num_classes"], **config["model_args"])
        return int(model.num_features)
    except Exception:  # informative only; the weights are what matters
        return None


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value
