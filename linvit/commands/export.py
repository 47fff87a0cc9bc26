"""``linvit export``: a training run as timm weights, or any model as ONNX / a torch.export program.

- ``linvit export RUN_DIR`` (``--format safetensors``, the default): the run's checkpoint as ``model.safetensors`` +
  timm ``config.json``;
- ``linvit export RUN_DIR --format onnx`` or ``linvit export --model NAME [--checkpoint FILE] --format onnx``: an ONNX
  file with dynamic batch, height and width (``--format pt2``: a ``torch.export`` program, AOTInductor-compilable).

Every file is written under a temporary name in its folder and renamed into place (:mod:`linvit.io.destination`): a
kill leaves the old file or the new one. A destination that exists and that linvit did not write as that format is
refused without ``--force`` (which replaces only the files the export writes); the input checkpoint never.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = (
    "Export a training run as model.safetensors + timm config.json (loadable by timm.create_model), or a run or a "
    "model as ONNX / torch.export (.pt2) with dynamic batch, height and width."
)
FORMATS = ("safetensors", "onnx", "pt2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="?", default=None, help="run directory (holding checkpoints/) or a .ckpt file")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="safetensors",
        help="safetensors: timm weights + config.json (runs only); onnx: one ONNX file (weights over ONNX's 2 GB go "
        "to <file>.data beside it, and both are named); pt2: a torch.export program (default: safetensors)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="export this timm model instead of a run (--format onnx or pt2), e.g. linvit_tiny",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="with a run: which checkpoint, best or last (default best); with --model: a weights file "
        "(.safetensors / .pth / .pt; a config.json beside it supplies num_classes and model arguments), or a folder "
        "holding model.safetensors + config.json (e.g. from `linvit convert SRC FOLDER`)",
    )
    parser.add_argument("--ema", action="store_true", help="export the EMA weights of a run instead of the raw ones")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="safetensors: output folder (default: the run directory); onnx/pt2: output file (default: "
        "<run>/model.onnx or <NAME>.onnx in the current folder, .pt2 likewise; onnx over 2 GB adds <file>.data)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --out that linvit did not write as this format (only the files the export writes; "
        "never the input checkpoint itself)",
    )
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's current one)")
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        default=None,
        help="--format onnx: also write <name>.int8.onnx (ONNX Runtime quantization: static, calibrated on the run's "
        "validation images, with a run; dynamic with --model) and <name>.int8.json, the accuracy change it measured",
    )
    parser.add_argument(
        "--features-only",
        action="store_true",
        help="export the backbone's feature maps (timm features_only: one output per stage) instead of the classifier",
    )
    parser.add_argument(
        "--num-classes", type=int, default=None, help="--model without --checkpoint: classifier width (0 = none)"
    )
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="load a checkpoint that needs full unpickling (runs code from the file: only for files you trust)",
    )
    parser.add_argument(
        "--allow-non-finite", action="store_true", help="export weights that hold NaN/Inf (named in a warning)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr (one line per step)")


def load_snippet(folder: Path) -> str:
    """The Python line that loads the exported weights (``pretrained=True``: without it timm builds random weights)."""
    source = f"local-dir:{folder.resolve()}"
    return f"import timm, linvit; model = timm.create_model({source!r}, pretrained=True)"


def run(args: argparse.Namespace) -> int:
    from linvit.io import allow_non_finite_weights
    from linvit.io.destination import DestinationError

    if args.quantize is not None and (args.format != "onnx" or args.features_only):
        return _fail(f"--quantize {args.quantize} applies to --format onnx of a classifier (not --features-only).")
    with allow_non_finite_weights(args.allow_non_finite, opt_out="--allow-non-finite"):
        try:
            if args.format == "safetensors":
                return _export_weights(args)
            return _export_graph(args)
        except (RunConfigRefused, DestinationError) as error:  # a refused config; a destination not to write
            sys.stderr.write(f"linvit export: {error}\n")
            return 1
        except (ValueError, FileNotFoundError, ImportError) as error:
            sys.stderr.write(f"linvit export: {error}\n")
            return 2


def _fail(message: str) -> int:
    sys.stderr.write(f"linvit export: {message}\n")
    return 2


def _export_weights(args: argparse.Namespace) -> int:
    from linvit.train.runs.export import CONFIG_NAME, export_checkpoint, find_checkpoint

    if args.run is None:
        return _fail(
            "--format safetensors exports a training run: give its directory (or .ckpt); to export a model by name "
            "pass --format onnx or --format pt2 with --model NAME."
        )
    if args.model is not None or args.features_only or args.num_classes is not None:
        return _fail("--model, --features-only and --num-classes apply to --format onnx / pt2 only.")
    which = args.checkpoint or "best"
    if which not in ("best", "last"):
        return _fail(f"--checkpoint with a run is best or last, got {which!r}.")
    try:
        checkpoint = find_checkpoint(args.run, which)
    except FileNotFoundError as error:
        return _fail(str(error))
    refusal = check_run_config(checkpoint, args.trusted)
    if refusal is not None:
        sys.stderr.write(f"linvit export: {refusal}\n")
        return 1
    out = args.out
    if out is None:
        out = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    from linvit.io.destination import DestinationError

    try:
        weights = export_checkpoint(
            checkpoint, out, ema=args.ema, trusted=args.trusted, opt_in="--trusted", force=args.force
        )
    except DestinationError:
        raise
    except ValueError as error:
        return _fail(str(error))
    kind = "EMA" if args.ema else "raw"
    sys.stdout.write(
        f"exported {checkpoint} ({kind} weights)\n  {weights}\n  {weights.parent / CONFIG_NAME}\n"
        f"load: {load_snippet(weights.parent)}\n"
    )
    return 0


class RunConfigRefused(Exception):
    """The run's config.yaml was refused (exit status 1, as ``linvit eval`` does)."""


def check_run_config(checkpoint: Path, trusted: bool) -> str | None:
    """The one-line refusal of the run's ``config.yaml`` beside ``checkpoint`` (see
    :func:`linvit.train.runs.saved_run.load_run_config`), or None when it passes or the run has none. The weights
    come from the checkpoint, but a run whose config is refused is not exported: it is the same run ``linvit eval``
    refuses."""
    from linvit.train.runs.saved_run import load_run_config

    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    config = run_dir / "config.yaml"
    if not (config.exists() or config.is_symlink()):
        return None
    try:
        load_run_config(config, trusted=trusted)
    except ValueError as error:
        return str(error)
    return None


def _export_graph(args: argparse.Namespace) -> int:
    import warnings

    from linvit.utils.deploy import (
        StaticSizeWarning,
        example_size,
        export_onnx,
        export_program,
        native_size,
        onnx_data_file,
        program_sizes,
        save_program,
    )
    from linvit.utils.progress import Progress

    if (args.run is None) == (args.model is None):
        return _fail("give a run directory (or .ckpt) or --model NAME, not both and not neither.")
    progress = Progress("export", enabled=not args.no_progress)
    progress.step("building the model" + (" from the run's checkpoint" if args.run is not None else ""), (1, 3))
    if args.run is not None:
        model, source, default_out, inputs = _model_from_run(args)
    else:
        model, source, inputs = _model_from_name(args)
        default_out = Path(f"{args.model}.{args.format}")
    out = args.out or default_out
    if out.suffix != f".{args.format}":
        out = out.with_name(out.name + f".{args.format}") if out.suffix == "" else out
    from linvit.io.destination import check_destination, check_not_input

    check_not_input(out, *inputs)
    check_destination(out, args.format, force=args.force)  # refused before the export's minutes, not after
    if args.quantize is not None:
        from linvit.commands._export_quantize import check_destinations

        check_destinations(out, args.force)
    height, width = native_size(model)
    traced = "x".join(str(side) for side in example_size(model))
    channels = getattr(model, "in_chans", 3)
    if args.format == "onnx":
        progress.step(f"converting to ONNX and writing {out} (the longest step: minutes for a large model)", (2, 3))
        path = export_onnx(model, out, opset=args.opset, force=args.force, inputs=inputs)
        progress.step(f"wrote {out}", (3, 3))
        sizes = "batch/height/width dynamic"
        data = onnx_data_file(path)
        written = f"{path} (one file)" if data is None else f"{path} and {data} (weights over ONNX's 2 GB: keep both)"
    else:
        progress.step("tracing with torch.export (dynamic batch, height and width where the model allows)", (2, 3))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", StaticSizeWarning)
            program = export_program(model)
        progress.step(f"saving the program to {out}", (3, 3))
        path = save_program(program, out, force=args.force, inputs=inputs)
        sizes = f"batch dynamic, {program_sizes(program).describe()}"
        static = [str(w.message) for w in caught if issubclass(w.category, StaticSizeWarning)]
        if static:  # traced at the native size, static there
            sizes = f"{static[0]}; --format onnx serves every size"
            traced = f"{height}x{width}"
        for other in (w for w in caught if not issubclass(w.category, StaticSizeWarning)):
            warnings.showwarning(other.message, other.category, other.filename, other.lineno)
        written = str(path)
    sys.stdout.write(
        f"exported {source} as {args.format}: {written}\n"
        f"  input 'image' (batch, {channels}, height, width), {sizes} "
        f"(native size {height}x{width}, traced at {traced}); attention on the torch backend (standard ops)\n"
    )
    if args.quantize is not None:
        from linvit.commands._export_quantize import quantize_export

        int8, report = quantize_export(args, path, model)
        sys.stdout.write(f"  {int8}\n  {report}\n")
    return 0


def _features_only(name: str, kwargs: dict[str, Any], checkpoint: str | None = None):
    import timm

    if checkpoint is None:
        return timm.create_model(name, features_only=True, **kwargs)
    from linvit.io import verify_file

    verify_file(checkpoint)  # before any loader reads it (timm's own, for a model outside linvit's families)
    overlay = {"file": checkpoint}
    return timm.create_model(name, features_only=True, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)


def _model_from_name(args: argparse.Namespace):
    import timm

    import linvit.models  # noqa: F401  (registers linvit's families)
    from linvit.commands.predict import build_model, read_side_config, weights_path

    if not timm.is_model(args.model):
        raise ValueError(f"unknown model {args.model!r}; list linvit's models with `linvit models`")
    checkpoint = weights_path(args.checkpoint) if args.checkpoint is not None else None
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint!r} does not exist")
    side_config = read_side_config(checkpoint, args.model, args.trusted) if checkpoint else {}
    if args.num_classes is not None:
        if checkpoint is not None:
            raise ValueError("--num-classes applies without --checkpoint (a checkpoint's classifier sets it).")
        side_config = {"model_args": {"num_classes": args.num_classes}}
    if args.features_only:
        kwargs = dict(side_config.get("model_args") or {})
        kwargs.pop("num_classes", None)
        model = _features_only(args.model, kwargs, checkpoint)
    else:
        model = build_model(args.model, checkpoint, side_config)
    source = args.model + (f" ({checkpoint})" if checkpoint else " (random weights)")
    inputs = [args.checkpoint, checkpoint]
    if checkpoint is not None:
        inputs.append(Path(checkpoint).with_name("config.json"))  # the side config read beside the weights
    return model.eval(), source, inputs


def _model_from_run(args: argparse.Namespace):
    import timm
    import torch

    import linvit.models  # noqa: F401  (registers linvit's families)
    from linvit.train.runs.checkpoint_hparams import check_classifier_hparams
    from linvit.train.runs.export import find_checkpoint, load_checkpoint, model_state_dict, timm_config

    which = args.checkpoint or "best"
    if which not in ("best", "last"):
        raise ValueError(f"--checkpoint with a run is best or last, got {which!r} (a weights file goes with --model).")
    checkpoint_path = find_checkpoint(args.run, which)
    refusal = check_run_config(checkpoint_path, args.trusted)
    if refusal is not None:
        raise RunConfigRefused(refusal)
    checkpoint = load_checkpoint(checkpoint_path, trusted=args.trusted, opt_in="--trusted")
    if not args.trusted:
        check_classifier_hparams(checkpoint.get("hyper_parameters") or {}, checkpoint_path, "--trusted")
    config = timm_config(checkpoint)
    weights = model_state_dict(checkpoint, ema=args.ema)
    model_args = dict(config["model_args"])
    with torch.device("cpu"):
        model = timm.create_model(config["architecture"], num_classes=config["num_classes"], **model_args)
    model.load_state_dict(weights)
    model.pretrained_cfg = {**(model.pretrained_cfg or {}), **config["pretrained_cfg"]}  # the run's input size
    if args.features_only:  # timm's feature getter over the trained backbone (it prunes the classifier)
        model = timm.create_model(config["architecture"], features_only=True, **model_args)
        missing = model.model.load_state_dict(weights, strict=False).missing_keys
        if missing:
            raise ValueError(f"the run's weights lack {len(missing)} backbone tensors, e.g. {missing[0]!r}.")
    run_dir = checkpoint_path.parent.parent if checkpoint_path.parent.name == "checkpoints" else checkpoint_path.parent
    kind = "EMA" if args.ema else "raw"
    return model.eval(), f"{checkpoint_path} ({kind} weights)", run_dir / f"model.{args.format}", [checkpoint_path]
