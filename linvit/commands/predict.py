"""``linvit predict IMAGE --model NAME [--checkpoint F] [--topk 5]``: classify one image and print the top-k."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from linvit.commands._image_limits import add_image_limit_arguments, image_limits

HELP = "Classify an image with a linvit/timm model and print the top-k classes (with labels when known)."

_LABEL_KEYS = ("label_names", "class_names")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "image",
        help="image file (any format Pillow reads; within --max-pixels / --max-aspect, float pixels finite)",
    )
    parser.add_argument(
        "--model", required=True, help="timm model name, e.g. linvit_nano or flatten_swin_tiny_patch4_224"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="weights (.safetensors / .pth / .pt), or a folder holding model.safetensors + config.json (from `linvit "
        "export` or `linvit convert SRC FOLDER`); a config.json beside the weights supplies "
        "num_classes, model arguments, preprocessing and label names; without one, the model arguments `linvit "
        "convert` recorded in a .safetensors file (its training size and options) are used",
    )
    parser.add_argument("--topk", type=int, default=5, help="how many classes to print (default 5)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="trust the config.json beside the weights: pass its model arguments to timm even where they load "
        "files or weights (only for files you trust)",
    )
    parser.add_argument(
        "--allow-non-finite",
        action="store_true",
        help="load weights that hold NaN/Inf (named in a warning) instead of stopping; the prediction still fails "
        "if the output is not finite",
    )
    add_image_limit_arguments(parser)


# ------------------------------------------------------------------------------------------------ checkpoint facts
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
            "`linvit export` does); pass the weights file itself"
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


# ------------------------------------------------------------------------------------------------ model and labels
def build_model(name: str, checkpoint: str | None, side_config: dict[str, Any]):
    import timm

    import linvit.models  # noqa: F401  (registers linvit's families)
    from linvit.io import verify_file

    if not timm.is_model(name):
        raise ValueError(f"unknown model {name!r}; list linvit's models with `linvit models`")
    kwargs: dict[str, Any] = dict(side_config.get("model_args") or {})
    if checkpoint is None:
        return timm.create_model(name, **kwargs)
    verify_file(checkpoint)  # before any loader reads it (timm's own, for a model outside linvit's families)
    num_classes = side_config.get("num_classes")
    in_chans = kwargs.get("in_chans")
    if num_classes is None or in_chans is None:
        classifier = timm.get_pretrained_cfg_value(name, "classifier")
        first_conv = timm.get_pretrained_cfg_value(name, "first_conv")
        found_classes, found_chans = infer_classes_and_channels(
            checkpoint,
            classifier if isinstance(classifier, str) else None,
            first_conv if isinstance(first_conv, str) else None,
        )
        num_classes = num_classes if num_classes is not None else found_classes
        in_chans = in_chans if in_chans is not None else found_chans
    overlay: dict[str, Any] = {"file": str(checkpoint)}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
        overlay["num_classes"] = num_classes  # keep the trained head: timm drops one whose width differs from the cfg
    if in_chans is not None:
        kwargs["in_chans"] = in_chans
        # timm checks the stem weights against the cfg's channel count: the cfg must describe the trained stem
        overlay["input_size"] = (in_chans, *timm.get_pretrained_cfg_value(name, "input_size")[1:])
    for key in ("mean", "std", "input_size", "crop_pct", "interpolation", "crop_mode"):
        value = (side_config.get("pretrained_cfg") or {}).get(key)
        if value is not None:
            overlay[key] = tuple(value) if isinstance(value, list) else value
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)


def label_names_for(model, checkpoint: str | None, side_config: dict[str, Any]) -> list[str] | None:
    """Class names: config.json, then safetensors metadata, then the model's cfg, then ImageNet for 1000 classes."""
    num_classes = model.num_classes
    sources = []
    for key in _LABEL_KEYS:
        sources.append(side_config.get(key))
    if checkpoint is not None:
        sources.append(read_safetensors_labels(checkpoint))
    sources.append(getattr(model, "pretrained_cfg", {}).get("label_names"))
    for names in sources:
        if names and len(names) == num_classes:
            return [str(n) for n in names]
    if num_classes == 1000:
        from timm.data import ImageNetInfo

        info = ImageNetInfo()
        return [info.index_to_description(i) for i in range(1000)]
    return None


def preprocess(image_path: str, model, limits=None):
    """The model's own eval transform (timm data config); greyscale models get a greyscale image.

    The image is read by :func:`linvit.io.images.load_image` as training reads it (within ``limits``; float pixels
    finite; transparency on white): every refusal is an :class:`~linvit.io.images.ImageInputError` naming the file.
    """
    import timm.data

    from linvit.io.images import load_image

    config = timm.data.resolve_data_config(model=model)
    in_chans = model.in_chans if hasattr(model, "in_chans") else config["input_size"][0]
    mean, std = tuple(config["mean"]), tuple(config["std"])
    if len(mean) != in_chans:  # e.g. an ImageNet cfg on a 1-channel model: one averaged value per channel
        mean = (sum(mean) / len(mean),) * in_chans
        std = (sum(std) / len(std),) * in_chans
    config.update(mean=mean, std=std)
    transform = timm.data.create_transform(**config)
    tensor = transform(load_image(image_path, "L" if in_chans == 1 else "RGB", limits))
    if tensor.shape[0] != in_chans:
        raise ValueError(
            f"{image_path} gives {tensor.shape[0]} channels after preprocessing; the model wants {in_chans}"
        )
    return tensor.unsqueeze(0)


def predict(
    image: str,
    model_name: str,
    checkpoint: str | None = None,
    topk: int = 5,
    device: str = "cpu",
    trusted: bool = False,
    allow_non_finite: bool = False,
    limits=None,
):
    """[(class index, probability, label or None)] for the top-k classes, best first.

    ``image`` is checked (a regular file, its header within ``limits``: :class:`~linvit.io.images.ImageLimits`)
    before the model is built, and decoded after: any refusal is an :class:`~linvit.io.images.ImageInputError`.

    Weights with NaN/Inf are refused naming the tensors (:class:`linvit.io.NonFiniteWeightsError`) unless
    ``allow_non_finite``; an output with NaN/Inf is a ValueError either way (never a ``nan%`` prediction).
    """
    import pickle

    import torch
    from safetensors import SafetensorError

    from linvit.io import CheckpointError, allow_non_finite_weights, check_finite_weights
    from linvit.io.images import open_image

    with open_image(image, limits):  # the header only: a bad image is named before the model is built
        pass
    if checkpoint is not None:
        checkpoint = weights_path(checkpoint)
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint!r} does not exist")
    side_config = read_side_config(checkpoint, model_name, trusted) if checkpoint else {}
    try:
        with allow_non_finite_weights(allow_non_finite, opt_out="--allow-non-finite"):
            model = build_model(model_name, checkpoint, side_config).to(device).eval()
            if checkpoint is not None:  # also a model outside linvit's families, read by timm's loader
                check_finite_weights(model.state_dict(), checkpoint, opt_out="--allow-non-finite")
    except (RuntimeError, EOFError, KeyError, pickle.UnpicklingError, SafetensorError) as error:
        if checkpoint is None:
            raise
        # a model outside linvit's families reads the file with timm's loader, which does not name it
        raise CheckpointError(
            f"Could not load the weights in '{checkpoint}' into {model_name}: {str(error).strip()[:300]}. If the file "
            "is truncated or corrupt, save, download or export it again; if it holds another model, pass that --model."
        ) from error
    if model.num_classes <= 0:
        raise ValueError(f"{model_name} has no classifier (num_classes=0): nothing to predict")
    labels = label_names_for(model, checkpoint, side_config)
    x = preprocess(image, model, limits).to(device)
    with torch.inference_mode():
        logits = model(x).float()
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(
            f"{model_name} computed NaN/Inf for {image}: no prediction. Its weights"
            f"{f' ({checkpoint})' if checkpoint else ''} or the image hold values it cannot compute with."
        )
    probabilities = logits.softmax(dim=-1)[0]
    values, indices = probabilities.topk(min(topk, probabilities.numel()))
    return [(int(i), float(p), labels[int(i)] if labels else None) for p, i in zip(values, indices)]


def run(args: argparse.Namespace) -> int:
    if args.topk < 1:
        print("--topk must be at least 1", file=sys.stderr)
        return 2
    if args.checkpoint is None:
        print(
            f"note: no --checkpoint given: {args.model} has random weights (no linvit weights are published)",
            file=sys.stderr,
        )
    try:
        results = predict(
            args.image,
            args.model,
            args.checkpoint,
            args.topk,
            args.device,
            args.trusted,
            args.allow_non_finite,
            image_limits(args),
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    width = max(len(str(index)) for index, _, _ in results)
    for rank, (index, probability, label) in enumerate(results, 1):
        text = f"{rank}. {probability * 100:6.2f}%  class {index:>{width}d}"
        print(f"{text}  {label}" if label else text)
    return 0
