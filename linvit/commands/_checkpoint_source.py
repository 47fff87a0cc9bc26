"""Where ``linvit predict --checkpoint`` finds the weights, the model's name and its config.

A ``--checkpoint`` is a weights file (``.safetensors`` / ``.pth`` / ``.pt``; a ``config.json`` beside it supplies the
model's name, class count, creation arguments, preprocessing and labels), a folder holding ``model.safetensors`` +
``config.json`` (``linvit export``, ``linvit convert SRC FOLDER``), or a training run: its directory (``config.yaml``
and ``checkpoints/best.ckpt``) or a ``.ckpt`` of it, read as ``linvit export`` reads one.

Every name and argument read from those files is data: the model's name must be a registered timm architecture
(:func:`registered_name`; never an ``hf-hub:`` / ``local-dir:`` source, never a pretrained tag), and its arguments
pass :mod:`linvit.io.allowed_config` unless ``--trusted``. Heavy imports (torch, timm) happen inside the functions:
``linvit --help`` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LABEL_KEYS = ("label_names", "class_names")
_RUN_CHECKPOINTS = ("checkpoints/best.ckpt", "checkpoints/last.ckpt", "best.ckpt", "last.ckpt")
NO_MODEL = "pass --model NAME (a timm model, e.g. linvit_nano; `linvit models` lists linvit's)"
NO_MODEL_GIVEN = f"no model to predict with: {NO_MODEL}, or --checkpoint with weights whose config names it"


def weights_path(checkpoint: str | Path) -> str:
    """The weights a ``--checkpoint`` names: a file as it is; a folder (``linvit convert SRC FOLDER``, ``linvit
    export``) by its ``model.safetensors``, whose ``config.json`` beside it :func:`read_side_config` then reads.
    FileNotFoundError for a folder without one."""
    path = Path(checkpoint)
    if not path.is_dir():
        return str(checkpoint)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(
            f"checkpoint folder {str(checkpoint)!r} holds no model.safetensors (a folder from `linvit convert` or "
            "`linvit export` does) and no checkpoints/best.ckpt or last.ckpt (a training run does); pass the weights "
            "file itself"
        )
    return str(weights)


def read_side_config(checkpoint: str | Path, model_name: str, trusted: bool = False) -> dict[str, Any]:
    """``config.json`` beside the weights (timm hub format); else the creation arguments ``linvit convert`` recorded
    in a safetensors file's metadata (``model_args``: the training size and options of a converted checkpoint), as
    ``{"model_args": ...}``; else {}.

    Either is read within bounds (:mod:`linvit.io.bounded`: size, nesting, a regular file, plain JSON) and, unless
    ``trusted``, through the allow-list of :mod:`linvit.io.allowed_config`: the keys timm writes in a
    ``config.json`` and, as model arguments, only plain creation arguments of ``model_name``'s class (nothing that
    loads files, trusts them or names another file). Anything else raises
    :class:`~linvit.utils.saved_config.UntrustedConfigError` naming the file and the key.
    """
    from linvit.io.allowed_config import check_model_args, check_side_config
    from linvit.io.bounded import read_json

    path = Path(checkpoint).with_name("config.json")
    if not (path.exists() or path.is_symlink()):  # a FIFO, a folder or a dangling link is named by read_json
        model_args = _recorded_model_args(checkpoint)
        if model_args is None:
            return {}
        if not trusted:
            check_model_args(model_name, model_args, checkpoint)
        return {"model_args": model_args}
    config = read_json(path, what="config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a {type(config).__name__}, not timm's config object; fix or remove it")
    if not trusted:
        check_side_config(config, model_name, path)
    return config


def _safetensors_metadata(checkpoint: str | Path) -> dict[str, str]:
    if not str(checkpoint).endswith(".safetensors"):
        return {}
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(checkpoint), framework="pt") as handle:
            return handle.metadata() or {}
    except (OSError, SafetensorError):  # a missing or damaged file: loading the weights names it
        return {}


def _recorded_model_args(checkpoint: str | Path) -> dict[str, Any] | None:
    """The ``model_args`` JSON object of a safetensors file's metadata (written by ``linvit convert``), or None."""
    from linvit.io.bounded import parse_json

    text = _safetensors_metadata(checkpoint).get("model_args")
    if text is None:
        return None
    model_args = parse_json(text, f"'{checkpoint}': its metadata's model_args")
    if not isinstance(model_args, dict):
        raise ValueError(f"{checkpoint}: its metadata's model_args is a {type(model_args).__name__}, not an object")
    return model_args


def read_safetensors_labels(checkpoint: str | Path) -> list[str] | None:
    """Label names stored in a safetensors file's metadata (``label_names`` or ``class_names``, a JSON list)."""
    from linvit.io.bounded import MAX_CONFIG_BYTES, UntrustedFileError, parse_json

    metadata = _safetensors_metadata(checkpoint)
    for key in _LABEL_KEYS:
        if key in metadata:
            try:
                names = parse_json(metadata[key], f"'{checkpoint}': its metadata's {key}")
            except UntrustedFileError:  # not JSON: one name a line (bounded as well)
                names = metadata[key][:MAX_CONFIG_BYTES].split("\n")
            if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
                raise ValueError(f"{checkpoint}: its metadata's {key} is not a list of names")
            return [str(n) for n in names]
    return None


def infer_classes_and_channels(
    checkpoint: str | Path, classifier: str | None, first_conv: str | None
) -> tuple[int | None, int | None]:
    """Classifier width and input channels read from the weights (the cfg's layer names, or usual ones)."""
    from linvit.io import extract_model_state_dict, load_checkpoint_file

    state = extract_model_state_dict(load_checkpoint_file(checkpoint))
    num_classes = in_chans = None
    heads = ([f"{classifier}.weight"] if classifier else []) + ["head.fc.weight", "head.weight", "fc.weight"]
    for key in heads:
        if key in state and state[key].ndim >= 2:
            num_classes = int(state[key].shape[0])
            break
    if first_conv and f"{first_conv}.weight" in state and state[f"{first_conv}.weight"].ndim == 4:
        in_chans = int(state[f"{first_conv}.weight"].shape[1])
    return num_classes, in_chans


# ------------------------------------------------------------------------------------------------ the model's name
def registered_name(value: Any, source: str | Path, key: str) -> str:
    """``value`` (read from ``source`` at ``key``) if it names a registered timm architecture; else
    :class:`~linvit.io.errors.UntrustedConfigError` naming the file and the key. A file picks an architecture only:
    no ``hf-hub:`` / ``local-dir:`` source (they fetch or read other files) and no pretrained tag (``name.tag``
    selects weights to download), whatever ``--trusted`` says."""
    import timm

    import linvit.models  # noqa: F401  (registers linvit's families)
    from linvit.io.errors import UntrustedConfigError

    if isinstance(value, str) and ":" not in value and "." not in value and timm.is_model(value):
        return value
    text = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise UntrustedConfigError(
        f"'{source}': {key}={text} is not a registered timm architecture, so no model is built from it (a file names "
        "a model such as linvit_nano; `linvit models` lists linvit's). Pass --model NAME to choose the model"
    )


def named_model(weights: str | Path) -> str:
    """The model a weights file's own config names: ``architecture`` of the ``config.json`` beside it, else the
    ``model`` that ``linvit convert`` records in a safetensors file's metadata. ValueError saying to pass ``--model``
    when neither names one."""
    from linvit.io.bounded import read_json

    config_path = Path(weights).with_name("config.json")
    if config_path.exists() or config_path.is_symlink():  # a FIFO, a folder or a dangling link is named by read_json
        config = read_json(config_path, what="config.json")
        if not isinstance(config, dict):
            kind = type(config).__name__
            raise ValueError(f"{config_path} holds a {kind}, not timm's config object; fix or remove it")
        if "architecture" in config:
            return registered_name(config["architecture"], config_path, "architecture")
    recorded = _safetensors_metadata(weights).get("model")
    if recorded is not None:
        return registered_name(recorded, weights, "its metadata's model")
    beside = f"{config_path} names" if config_path.exists() else f"no config.json beside {weights}, and it names"
    raise ValueError(f"no --model given and {beside} no model (its 'architecture'): {NO_MODEL}")


# ------------------------------------------------------------------------------------------------ resolving a source
@dataclass
class ModelSource:
    """What ``--model`` / ``--checkpoint`` resolve to: a model name with a weights file and its side config, or a
    training checkpoint (``run_checkpoint``) whose model is named when it is read (:func:`load_run_model`).
    ``inputs``: every file read, never to be overwritten by an output."""

    model_name: str | None
    weights: str | None = None
    side_config: dict[str, Any] = field(default_factory=dict)
    run_checkpoint: Path | None = None
    inputs: list[Path] = field(default_factory=list)


def run_checkpoint(checkpoint: str | Path) -> Path | None:
    """The training checkpoint a ``--checkpoint`` names: a ``.ckpt`` file, or a run directory's ``best.ckpt`` (else
    ``last.ckpt``; in ``checkpoints/`` or beside ``config.yaml``) when the directory holds no exported
    ``model.safetensors`` (which then wins: it is what ``linvit export`` made of the run). None otherwise."""
    path = Path(checkpoint)
    if path.suffix == ".ckpt" and not path.is_dir():
        return path
    if not path.is_dir() or (path / "model.safetensors").is_file():
        return None
    return next((path / name for name in _RUN_CHECKPOINTS if (path / name).is_file()), None)


def resolve_source(checkpoint: str | None, model_name: str | None, trusted: bool = False) -> ModelSource:
    """The model and the weights of ``--checkpoint`` / ``--model``, their config read and checked (see the module).
    ``--model`` wins over a name in a file (a note says when they differ)."""
    import sys

    if checkpoint is None:
        if model_name is None:
            raise ValueError(NO_MODEL_GIVEN)
        return ModelSource(model_name)
    run = run_checkpoint(checkpoint)
    if run is not None:
        if not run.is_file():
            raise FileNotFoundError(f"checkpoint {str(run)!r} does not exist")
        config = _run_dir(run) / "config.yaml"
        return ModelSource(model_name, run_checkpoint=run, inputs=[run, config])
    weights = weights_path(checkpoint)
    if not Path(weights).is_file():
        raise FileNotFoundError(f"checkpoint {weights!r} does not exist")
    name = model_name if model_name is not None else named_model(weights)
    side_config = read_side_config(weights, name, trusted)
    declared = side_config.get("architecture")
    if model_name is not None and isinstance(declared, str) and declared != model_name:
        print(f"note: building --model {model_name}; {Path(weights).with_name('config.json')} names {declared}",
              file=sys.stderr)  # fmt: skip
    return ModelSource(name, weights, side_config, inputs=[Path(weights), Path(weights).with_name("config.json")])


def _run_dir(checkpoint: Path) -> Path:
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def load_run_model(source: ModelSource, trusted: bool = False, allow_non_finite: bool = False):
    """The classifier of a training checkpoint (its raw weights) and the timm ``config.json`` ``linvit export``
    would write for it (labels, preprocessing). The run's ``config.yaml`` and the checkpoint's hyper-parameters are
    checked first, as ``linvit eval`` / ``export`` check them; ``source.model_name`` (``--model``), if given, must
    be the model the run trained."""
    import timm
    import torch

    from linvit.commands.export import check_run_config
    from linvit.io import check_finite_weights
    from linvit.io.errors import UntrustedConfigError
    from linvit.train.runs.checkpoint_hparams import check_classifier_hparams
    from linvit.train.runs.export import load_checkpoint, model_state_dict, timm_config

    path = source.run_checkpoint
    assert path is not None
    refusal = check_run_config(path, trusted)
    if refusal is not None:
        raise UntrustedConfigError(refusal)
    saved = load_checkpoint(path, trusted=trusted, opt_in="--trusted")
    hparams = saved.get("hyper_parameters") if isinstance(saved, dict) else None
    if not isinstance(hparams, dict) or "model_name" not in hparams or "num_classes" not in hparams:
        raise ValueError(
            f"'{path}' holds no hyper_parameters.model_name / num_classes: not a checkpoint of linvit's image "
            "classifier (predict classifies); pass the weights file with --model NAME instead"
        )
    if not trusted:
        check_classifier_hparams(hparams, path, "--trusted")
    name = registered_name(hparams["model_name"], path, "hyper_parameters.model_name")
    if source.model_name is not None and source.model_name != name:
        raise ValueError(
            f"--model {source.model_name}, but the run '{path}' trained {name}: drop --model or pass {name}"
        )
    config = timm_config(saved)
    weights = model_state_dict(saved)
    check_finite_weights(weights, str(path), allow=allow_non_finite, opt_out="--allow-non-finite")
    with torch.device("cpu"):
        model = timm.create_model(name, num_classes=config["num_classes"], **config["model_args"])
    model.load_state_dict(weights)
    model.pretrained_cfg = {**(model.pretrained_cfg or {}), **config["pretrained_cfg"]}  # the run's preprocessing
    source.model_name = name
    return model, config
