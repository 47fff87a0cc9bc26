"""``linvit predict IMAGE... [--model NAME] [--checkpoint W]``: classify images and print or write the top-k.

The images are files, folders (walked recursively) and quoted globs (:mod:`linvit.commands._image_inputs`); the
model is ``--model``, or the one the checkpoint's config names (:mod:`linvit.commands._checkpoint_source`: a weights
file with its ``config.json``, an exported folder, a training run). They are classified in batches; one image prints
its top-k as text, several print each path with its top-k, and ``--format csv|json`` writes one row / record per
image to stdout or ``--output FILE`` (:mod:`linvit.commands._predict_output`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from linvit.commands._checkpoint_source import (  # noqa: F401  (weights_path, read_side_config: linvit export's)
    _LABEL_KEYS,
    NO_MODEL_GIVEN,
    infer_classes_and_channels,
    read_safetensors_labels,
    read_side_config,
    weights_path,
)
from linvit.commands._image_limits import add_image_limit_arguments, image_limits

HELP = "Classify images (files, folders, globs) with a linvit/timm model: top-k classes as text, CSV or JSON."

BAD_FILE_MODES = ("skip", "error")
DEFAULT_BATCH_SIZE = 16  # a CPU's batch: 16 images of 224x224 for linvit_tiny are ~1 GB of activations
DEFAULT_MAX_IMAGES = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files (any format Pillow reads; within --max-pixels / --max-aspect, float pixels finite), folders "
        "(walked recursively in sorted order, images by extension) or quoted globs such as 'imgs/*.png'",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="timm model name, e.g. linvit_nano or flatten_swin_tiny_patch4_224 (default: the one the "
        "checkpoint's config.json, its metadata or its training run names)",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="weights (.safetensors / .pth / .pt), a folder holding model.safetensors + config.json (from `linvit "
        "export` or `linvit convert SRC FOLDER`), or a training run (its directory or a .ckpt: the raw weights of "
        "best.ckpt, else last.ckpt); a config.json beside the weights supplies the model, "
        "num_classes, model arguments, preprocessing and label names; without one, the model and arguments `linvit "
        "convert` recorded in a .safetensors file (its training size and options) are used",
    )
    parser.add_argument("--topk", type=int, default=5, help="how many classes per image (default 5)")
    parser.add_argument(
        "--format",
        choices=("text", "csv", "json"),
        default=None,
        help="text (default: the ranking, under each path for several images), csv (a row per image: path, then "
        "class, label and probability per rank) or json (a list of records per image)",
    )
    parser.add_argument("--json", action="store_true", help="--format json (only the JSON on stdout)")
    parser.add_argument(
        "--output",
        "-o",
        default=None,
        help="write the predictions to this file instead of stdout (a file linvit did not write is not replaced "
        "without --force; never an input)",
    )
    parser.add_argument("--force", action="store_true", help="replace an --output file that linvit did not write")
    parser.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help=f"images per batch (default {DEFAULT_BATCH_SIZE})"
    )
    parser.add_argument(
        "--bad-files",
        choices=BAD_FILE_MODES,
        default="skip",
        help="an image that cannot be read among several: skip it with a warning naming it (default) or stop "
        "(error); one image named alone is always an error",
    )
    parser.add_argument(
        "--max-images",
        type=int,
        default=DEFAULT_MAX_IMAGES,
        help=f"most images listed from the arguments (default {DEFAULT_MAX_IMAGES:,}): a folder or glob beyond it "
        "is an error, not hours of work",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="trust the config beside the weights (or the run's): pass its model arguments to timm even where they "
        "load files or weights, and unpickle a run checkpoint fully (only for files you trust); the model it names "
        "must still be a registered timm architecture",
    )
    parser.add_argument(
        "--allow-non-finite",
        action="store_true",
        help="load weights that hold NaN/Inf (named in a warning) instead of stopping; the prediction still fails "
        "if the output is not finite",
    )
    add_image_limit_arguments(parser)


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


class Predictor:
    """A model ready to classify: its eval transform (timm data config; greyscale for a 1-channel model), labels."""

    def __init__(self, model, name: str, labels: list[str] | None, device: str, source: str | None):
        import timm.data

        self.model, self.name, self.labels, self.device, self.source = model, name, labels, device, source
        config = timm.data.resolve_data_config(model=model)
        self.in_chans = model.in_chans if hasattr(model, "in_chans") else config["input_size"][0]
        mean, std = tuple(config["mean"]), tuple(config["std"])
        if len(mean) != self.in_chans:  # e.g. an ImageNet cfg on a 1-channel model: one averaged value per channel
            mean = (sum(mean) / len(mean),) * self.in_chans
            std = (sum(std) / len(std),) * self.in_chans
        config.update(mean=mean, std=std)
        self.transform = timm.data.create_transform(**config)

    def tensor(self, image_path: str, limits=None):
        """The image as the model's input (C, H, W). It is read by :func:`linvit.io.images.load_image` as training
        reads it (within ``limits``; float pixels finite; transparency on white): every refusal is an
        :class:`~linvit.io.images.ImageInputError` naming the file."""
        from linvit.io.images import load_image

        tensor = self.transform(load_image(image_path, "L" if self.in_chans == 1 else "RGB", limits))
        if tensor.shape[0] != self.in_chans:
            raise ValueError(
                f"{image_path} gives {tensor.shape[0]} channels after preprocessing; the model wants {self.in_chans}"
            )
        return tensor

    def rank(self, tensors: list, paths: list[str], topk: int) -> list[list[tuple[int, float, str | None]]]:
        """The top-k (class index, probability, label) of each image, best first; ValueError naming the first image
        whose output holds NaN/Inf (never a ``nan%`` prediction)."""
        import torch

        with torch.inference_mode():
            logits = self.model(torch.stack(tensors).to(self.device)).float()
        finite = torch.isfinite(logits).all(dim=-1)
        if not bool(finite.all()):
            image = paths[int((~finite).nonzero()[0])]
            raise ValueError(
                f"{self.name} computed NaN/Inf for {image}: no prediction. Its weights"
                f"{f' ({self.source})' if self.source else ''} or the image hold values it cannot compute with."
            )
        values, indices = logits.softmax(dim=-1).topk(min(topk, logits.shape[-1]), dim=-1)
        return [
            [(int(i), float(p), self.labels[int(i)] if self.labels else None) for p, i in zip(row_p, row_i)]
            for row_p, row_i in zip(values.tolist(), indices.tolist())
        ]


def preprocess(image_path: str, model, limits=None):
    """One image as ``model``'s input batch (1, C, H, W): see :meth:`Predictor.tensor`."""
    return Predictor(model, "", None, "cpu", None).tensor(image_path, limits).unsqueeze(0)


def load_predictor(source, device: str = "cpu", trusted: bool = False, allow_non_finite: bool = False) -> Predictor:
    """The model of a resolved :class:`~linvit.commands._checkpoint_source.ModelSource` on ``device``, in eval
    mode, with its labels.

    Weights with NaN/Inf are refused naming the tensors (:class:`linvit.io.NonFiniteWeightsError`) unless
    ``allow_non_finite``; a file that does not load is a :class:`~linvit.io.CheckpointError` naming it."""
    import pickle

    from safetensors import SafetensorError

    from linvit.commands._checkpoint_source import load_run_model
    from linvit.io import CheckpointError, allow_non_finite_weights, check_finite_weights

    checkpoint = source.weights or source.run_checkpoint
    side_config = source.side_config
    try:
        with allow_non_finite_weights(allow_non_finite, opt_out="--allow-non-finite"):
            if source.run_checkpoint is not None:
                model, side_config = load_run_model(source, trusted, allow_non_finite)
            else:
                model = build_model(source.model_name, source.weights, side_config)
                if source.weights is not None:  # also a model outside linvit's families, read by timm's loader
                    check_finite_weights(model.state_dict(), source.weights, opt_out="--allow-non-finite")
    except (RuntimeError, EOFError, KeyError, pickle.UnpicklingError, SafetensorError) as error:
        if checkpoint is None:
            raise
        # a model outside linvit's families reads the file with timm's loader, which does not name it
        raise CheckpointError(
            f"Could not load the weights in '{checkpoint}' into {source.model_name or 'the model'}: "
            f"{str(error).strip()[:300]}. If the file is truncated or corrupt, save, download or export it again; if "
            "it holds another model, pass that --model."
        ) from error
    model = model.to(device).eval()
    if model.num_classes <= 0:
        raise ValueError(f"{source.model_name} has no classifier (num_classes=0): nothing to predict")
    labels = label_names_for(model, source.weights, side_config)
    return Predictor(model, source.model_name, labels, device, None if checkpoint is None else str(checkpoint))


def predict(
    image: str,
    model_name: str | None,
    checkpoint: str | None = None,
    topk: int = 5,
    device: str = "cpu",
    trusted: bool = False,
    allow_non_finite: bool = False,
    limits=None,
):
    """[(class index, probability, label or None)] for the top-k classes of one image, best first.

    ``model_name`` None: the model the checkpoint's config names. ``image`` is checked (a regular file, its header
    within ``limits``: :class:`~linvit.io.images.ImageLimits`) before the model is built, and decoded after: any
    refusal is an :class:`~linvit.io.images.ImageInputError`.

    Weights with NaN/Inf are refused naming the tensors (:class:`linvit.io.NonFiniteWeightsError`) unless
    ``allow_non_finite``; an output with NaN/Inf is a ValueError either way (never a ``nan%`` prediction).
    """
    from linvit.commands._checkpoint_source import resolve_source
    from linvit.io.images import open_image

    with open_image(image, limits):  # the header only: a bad image is named before the model is built
        pass
    predictor = load_predictor(resolve_source(checkpoint, model_name, trusted), device, trusted, allow_non_finite)
    return predictor.rank([predictor.tensor(image, limits)], [image], topk)[0]


def predict_paths(
    predictor: Predictor, paths: list[str], topk: int, batch_size: int, limits=None, skip_bad: bool = True
) -> tuple[list[tuple[str, list]], list[str]]:
    """The (path, top-k) of every image of ``paths`` that can be read, in order, classified ``batch_size`` at a time,
    with progress on stderr for more than one batch; and the one-line refusals of those skipped (``skip_bad``;
    otherwise the first refusal is raised)."""
    from linvit.commands._predict_output import Progress
    from linvit.io.images import ImageInputError

    rows: list[tuple[str, list]] = []
    skipped: list[str] = []
    progress = Progress(len(paths), enabled=len(paths) > batch_size)
    try:
        for start in range(0, len(paths), batch_size):
            tensors, kept = [], []
            for path in paths[start : start + batch_size]:
                try:
                    tensors.append(predictor.tensor(path, limits))
                except ImageInputError as error:
                    if not skip_bad:
                        raise
                    print(f"warning: skipped: {error}", file=sys.stderr)
                    skipped.append(str(error))
                    continue
                kept.append(path)
            if tensors:
                rows += zip(kept, predictor.rank(tensors, kept, topk))
            progress.update(len(paths[start : start + batch_size]))
    finally:
        progress.close()
    return rows, skipped


def _option_problem(args: argparse.Namespace) -> str | None:
    for option, value in (("--topk", args.topk), ("--batch-size", args.batch_size), ("--max-images", args.max_images)):
        if value < 1:
            return f"{option} must be at least 1, got {value}"
    if args.json and args.format not in (None, "json"):
        return f"--json is --format json; it cannot go with --format {args.format}"
    return None


def run(args: argparse.Namespace) -> int:
    import contextlib

    from linvit.commands._checkpoint_source import resolve_source
    from linvit.commands._image_inputs import expand_images
    from linvit.commands._predict_output import render

    problem = _option_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    form = "json" if args.json else args.format or "text"
    data_stream = getattr(args, "data_stream", None) or sys.stdout  # the real stdout (see linvit.cli)
    if args.model is None and args.checkpoint is None:
        print(f"error: {NO_MODEL_GIVEN}", file=sys.stderr)
        return 2
    if args.checkpoint is None:
        print(
            f"note: no --checkpoint given: {args.model} has random weights (no linvit weights are published)",
            file=sys.stderr,
        )
    # the data, and only the data, on stdout: anything a library prints meanwhile goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if form != "text" or args.output else contextlib.nullcontext()
    try:
        with quiet:
            limits = image_limits(args)
            inputs = expand_images(args.images, args.max_images)
            for warning in inputs.warnings:
                print(f"warning: {warning}", file=sys.stderr)
            source = resolve_source(args.checkpoint, args.model, args.trusted)
            if args.output is not None:
                _check_output(args, form, inputs.paths, source.inputs)
            if inputs.single_file:
                from linvit.io.images import open_image

                with open_image(inputs.paths[0], limits):  # the header: a bad image is named before the model is built
                    pass
            predictor = load_predictor(source, args.device, args.trusted, args.allow_non_finite)
            skip_bad = args.bad_files == "skip" and not inputs.single_file
            rows, skipped = predict_paths(predictor, inputs.paths, args.topk, args.batch_size, limits, skip_bad)
            if not rows:
                raise ValueError(f"none of the {len(inputs.paths):,} images could be read (each named above)")
            text = render(rows, form, single=inputs.single_file)
            if args.output is not None:
                from linvit.io.destination import write_text

                write_text(args.output, text, _output_kind(form), force=args.force)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.output is not None:
        print(f"wrote the top-{args.topk} of {len(rows):,} image(s) to {args.output}", file=sys.stderr)
    else:
        data_stream.write(text)
        data_stream.flush()
    if skipped:
        print(f"warning: {len(skipped):,} of {len(inputs.paths):,} images skipped (named above)", file=sys.stderr)
    return 0


def _output_kind(form: str) -> str:
    return f"predictions-{form}"


def _check_output(args: argparse.Namespace, form: str, images: list[str], inputs: list[Path]) -> None:
    """Refuse ``--output`` before any work: an input (an image, the weights, their config), or a file linvit did not
    write as these predictions (without ``--force``)."""
    from linvit.io.destination import check_destination, check_not_input

    check_not_input(args.output, *images, *inputs)
    check_destination(args.output, _output_kind(form), force=args.force)
