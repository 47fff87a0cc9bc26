"""``linvit convert SRC DST``: turn a foreign checkpoint (e.g. the FLatten authors' .pth) into linvit weights.

Reads SRC safely (pickled configs become inert dicts; code is never run unless ``--trusted``), takes the model (or
EMA) weights, applies the model family's ``checkpoint_filter_fn`` (key mapping, table resizing), checks them against
the model strictly, and writes DST (``.safetensors``, or a plain state dict for ``.pth``/``.pt``/``.bin``). Load it with
``timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=DST))``.

A DST that is a folder (an existing one, a path ending in ``/``, or a path without one of those suffixes) gets the
layout of timm's ``local-dir:`` source: ``DST/model.safetensors`` (the same tensors and metadata as a ``.safetensors``
DST) and ``DST/config.json`` in timm's hub format (``architecture``, ``num_classes``, ``num_features``, the model's
``pretrained_cfg`` at the size it is built at, and ``model_args``: the creation arguments below). It loads with
``timm.create_model("local-dir:DST", pretrained=True)``, no other argument; ``linvit predict`` / ``linvit export``
take the folder as ``--checkpoint``. A file that exists and that linvit did not write (the folder's record, see
:mod:`linvit.io.destination`) is refused without ``--force`` (which, in a folder, replaces those two files and leaves
the others, temporary-looking names included); SRC itself is never replaced.

Without ``--model`` the model is inferred: every registered linvit model whose family filter maps SRC onto it exactly
is a candidate, and the one whose tensors need the least resizing wins (ties are an error listing the candidates).
A classifier for another class count (or none) and a stem for other input channels fit too: the model is then
created with ``num_classes`` / ``in_chans`` read from the weights, and the printed load command passes them.

Nothing the weights determine is lost (:func:`infer_creation`): the options their shapes fix are read from them
(PVT/PVTv2 ``la_sr_ratios`` from each block's spatial-reduction convolution, PVTv2 ``linear=True`` from its 1x1
pooled reduction, CSwin ``la_split_size`` from the stripe tables of linear stages with two branches), and so is the
training size (``img_size``: the smallest square size at which every positional table, stripe table and position
embedding of the model has the checkpoint's own shape). Tables are resized only when ``--img-size`` asks for another
size, or when no size fits them as they are (both said on stderr). Options no shape determines come from
``--model-kwargs``; what the user passes always wins over what is inferred. Everything is recorded in the
safetensors metadata (``model_args``), in a folder's ``config.json``, and in the printed load line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from linvit.commands._checkpoint_fit import (
    Misfit,
    MissingOption,
    family_filter,
    infer_creation,
    reduction_options,
)
from linvit.io.destination import DestinationError, check_destination, check_not_input, prepare_folder, write_file

HELP = "Convert a foreign checkpoint (e.g. the FLatten authors' .pth) into linvit safetensors weights."

_MODEL_PATTERNS = ("flatten_*", "linvit_*")

WEIGHTS_NAME = "model.safetensors"  # the names timm's local-dir source reads first
CONFIG_NAME = "config.json"
# the kinds of the folder's record of what linvit wrote (linvit.io.destination): the same as `linvit export`'s
# (linvit.train.runs.export), so that either may replace what the other wrote in one folder
WEIGHTS_KIND = "safetensors"
CONFIG_KIND = "timm-config"
STATE_DICT_KIND = "state-dict"  # a .pth/.pt/.bin DST, in the folder's record of what linvit wrote
_FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
# pretrained_cfg fields that name the registry's weights (their source, their tag): the folder is their source now
# (timm's local-dir source sets `file` and `source` to it)
_CFG_SOURCES = ("url", "file", "hf_hub_id", "hf_hub_filename", "source", "state_dict", "tag")
_CFG_KEEP_NULL = ("pool_size", "first_conv", "classifier")


def is_folder_destination(dst: str | os.PathLike) -> bool:
    """Whether DST names a folder: an existing one, a path ending in a separator, or one without a weight file's
    suffix (``.safetensors``, ``.pth``, ``.pt``, ``.bin``)."""
    text = os.fspath(dst)
    if os.path.isdir(text) or text.endswith(("/", os.sep)):
        return True
    return Path(text).suffix.lower() not in _FILE_SUFFIXES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="checkpoint to read (.pth/.pt/.bin/.safetensors)")
    parser.add_argument(
        "dst",
        metavar="DST",
        help="file to write (.safetensors; .pth/.pt/.bin for a torch state dict), or a folder (an existing one, a "
        "path ending in / or without those suffixes) to get model.safetensors + timm's config.json in it, which "
        "loads with timm.create_model('local-dir:DST', pretrained=True)",
    )
    parser.add_argument(
        "--model", default=None, help="timm model name (e.g. flatten_swin_tiny_patch4_224); inferred if omitted"
    )
    parser.add_argument(
        "--ema", action="store_true", help="take the EMA weights (state_dict_ema / model_ema) when present"
    )
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="allow arbitrary pickled objects in SRC (runs code from the file: only for files you trust)",
    )
    parser.add_argument(
        "--img-size",
        type=int,
        nargs="+",
        default=None,
        metavar="SIZE",
        help="the input size to build the model at (H or H W). Without it, the checkpoint's training size is inferred "
        "from its tables and kept; another size resizes the tables to it (said so)",
    )
    parser.add_argument(
        "--model-kwargs",
        default=None,
        metavar="JSON",
        help="creation arguments of the model the checkpoint was built with, as JSON, e.g. "
        """'{"depths": [2, 2, 2, 2]}'; options the weights' shapes fix (la_sr_ratios, linear, la_split_size) are """
        "inferred unless given here; all are recorded with the weights and in the printed load line",
    )
    parser.add_argument(
        "--allow-non-finite",
        action="store_true",
        help="convert weights that hold NaN/Inf (named in a warning) instead of refusing them",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace DST when it exists and linvit did not write it (a folder: only its model.safetensors and "
        "config.json; other files stay); SRC itself is never replaced",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr (one line per step)")


def _kwargs_text(model_args: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in model_args.items())


def _creation_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``img_size`` and the ``--model-kwargs`` JSON as creation arguments (ValueError naming a bad value)."""
    creation: dict[str, Any] = {}
    if args.model_kwargs:
        try:
            creation = json.loads(args.model_kwargs)
        except json.JSONDecodeError as error:
            raise ValueError(f'--model-kwargs is not JSON ({error}); e.g. \'{{"la_sr_ratios": "8421"}}\'.') from None
        if not isinstance(creation, dict):
            raise ValueError(f"--model-kwargs must be a JSON object of arguments, got {args.model_kwargs!r}.")
    if args.img_size:
        if len(args.img_size) > 2:
            raise ValueError(f"--img-size takes H or H W, got {len(args.img_size)} numbers.")
        creation["img_size"] = args.img_size[0] if len(args.img_size) == 1 else list(args.img_size)
    return creation


def _key_structure(keys) -> set[str]:
    """Keys with their indices blanked (``layers.#.blocks.#.attn.qkv.weight``): a family's shape of names."""

    return {re.sub(r"\.\d+(?=\.|$)", ".#", key) for key in keys}


def _families(names: list[str]) -> dict[str, list[str]]:
    from linvit.io import model_family

    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(model_family(name) or name, []).append(name)
    return groups


class Conversion(NamedTuple):
    """What `convert_checkpoint` did: the model, every argument to create it with (given, then inferred), the names
    of the inferred ones, and how many tables were resized (0 unless asked for, or unless no size fits them)."""

    model: str
    model_args: dict[str, Any]
    inferred: list[str]
    resized: int


def _infer(state_dict: dict[str, Any]) -> tuple[str, dict[str, Any], Conversion]:
    """The registered model whose family filter maps ``state_dict`` onto it exactly with the least resizing, with
    the creation arguments that keep the weights as they are (`infer_creation`: options, training size,
    ``num_classes`` / ``in_chans`` where the weights differ from its defaults): (name, filtered weights, conversion).

    One representative per family is built first (on the meta device); only families whose mapped key names
    mostly agree with it are searched model by model. Among models that fit equally (no resizing), the one that
    needs the fewest creation arguments wins; a tie is an error listing them.
    """
    import timm

    import linvit.models  # noqa: F401  (registers the families)

    names = sorted({n for pattern in _MODEL_PATTERNS for n in timm.list_models(pattern)})
    fits: list[tuple[dict[str, Any], Conversion]] = []
    nearest: Misfit | None = None
    missing: list[MissingOption] = []
    for members in _families(names).values():
        representative = timm.create_model(members[0], pretrained=False, device="meta")
        mapped = _family_mapping(members[0], representative, state_dict)
        if mapped is not None:
            ours, theirs = _key_structure(representative.state_dict()), _key_structure(mapped)
            if len(ours & theirs) < 0.5 * len(ours | theirs):
                continue
        elif not _same_family_keys(representative, state_dict):
            continue
        for name in members:
            try:
                filtered, resized, model_args, inferred = infer_creation(name, state_dict)
            except Misfit as misfit:
                if nearest is None or misfit.differences < nearest.differences:
                    nearest = misfit
                continue
            except MissingOption as error:
                missing.append(error)
                continue
            except Exception:
                continue
            fits.append((filtered, Conversion(name, model_args, inferred, resized)))
    if not fits and missing:
        raise ValueError(_missing_option_advice(missing))
    if not fits:
        closest = f" The nearest: {nearest}." if nearest is not None else ""
        raise ValueError(
            f"No registered linvit model fits these weights.{closest} Pass --model NAME for the model they were "
            "saved from (`linvit models` lists them); the error for that model will say which keys differ."
        )

    def rank(item: tuple[dict[str, Any], Conversion]) -> tuple[int, int]:
        return item[1].resized, len(item[1].model_args)

    fits.sort(key=rank)
    best = [item for item in fits if rank(item) == rank(fits[0])]
    if len(best) > 1:
        raise ValueError(
            f"Several models fit these weights equally well: {[item[1].model for item in best]}; pass --model."
        )
    return fits[0][1].model, fits[0][0], fits[0][1]


def _family_mapping(name: str, representative: Any, state_dict: dict[str, Any]) -> dict[str, Any] | None:
    """``state_dict`` mapped by the family filter of ``representative`` (model ``name`` on the meta device) for
    comparing key names, or None when the filter refuses it.

    The model is built as the weights ask: with the reductions their shapes fix, and with the options a filter's
    refusal names (`CreationOptionsError`: e.g. PVT's softmax stages, ``attn_layers='LLSS'``). A filter that still
    refuses is given the weights without their positional tables (which it resizes, and cannot when they were
    trained at a non-square size), as only the key names matter here."""
    import timm

    from linvit.commands._checkpoint_fit import ADVICE_ROUNDS, TABLE_NAMES, is_table
    from linvit.models._family import CreationOptionsError

    filter_fn = family_filter(representative)
    if filter_fn is None:
        return state_dict
    without_tables = {key: value for key, value in state_dict.items() if not is_table(key, TABLE_NAMES)}
    for weights in (state_dict, without_tables):
        args, model = reduction_options(representative, state_dict), representative
        for _ in range(ADVICE_ROUNDS):
            try:
                if args:
                    model = timm.create_model(name, pretrained=False, device="meta", **args)
                return filter_fn(dict(weights), model)
            except CreationOptionsError as error:  # built with other options: follow the advice
                if all(args.get(key) == value for key, value in error.options.items()):
                    break
                args = {**args, **error.options}
            except Exception:  # a filter of another family may fail on foreign keys, or on another stage structure
                break
    return None


def _missing_option_advice(missing: list[MissingOption]) -> str:
    """What to pass when the only models the weights fit need an option their shapes do not settle (a non-square
    training size): the model and the option, with the values that fit where some were found."""
    found = [error for error in missing if error.sizes] or missing
    if len(found) == 1:
        return found[0].advice(model_option=True)
    listed = "; ".join(error.advice(model_option=True) for error in found[:3])
    return f"the weights fit {len(found)} models only with an option: {listed}"


def _same_family_keys(representative: Any, state_dict: dict[str, Any]) -> bool:
    """Whether the family of ``representative`` (whose filter refused ``state_dict``: another stage structure than
    the representative's, e.g. stripe branches) is worth searching: the filter's error names such a structure when
    it is of this family; without it, the raw keys' last two parts must mostly agree with the model's."""
    ours = {".".join(key.split(".")[-2:]) for key in representative.state_dict()}
    theirs = {".".join(key.split(".")[-2:]) for key in state_dict}
    return len(ours & theirs) >= 0.5 * len(ours | theirs)


def _what_they_fit(state_dict: dict[str, Any]) -> str:
    """Which registered model the weights do fit (for a --model that they do not), or how to find out."""
    try:
        name, _, conversion = _infer(state_dict)
    except ValueError:
        return (
            "No other registered linvit model fits them either; if they are of this family with another architecture, "
            """pass its creation arguments with --model-kwargs (e.g. '{"depths": [2, 2, 2, 2]}')."""
        )
    created = f" created with {_kwargs_text(conversion.model_args)}" if conversion.model_args else ""
    return f"They fit {name}{created}: pass --model {name}, or leave --model out to infer it."


def hub_config(model_name: str, model_args: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` in timm's hub format for ``model_name`` created with ``model_args``: ``architecture``,
    ``num_classes``, ``num_features``, ``model_args`` and the model's ``pretrained_cfg`` as it is built (its
    ``input_size`` the size it is built at, ``num_classes`` its classifier's width, no weight source: the folder is
    it). timm's ``local-dir:`` source reads it back, passing ``model_args`` to the model's creation."""
    import timm

    import linvit.models  # noqa: F401  (registers the families)

    model = timm.create_model(model_name, pretrained=False, device="meta", **model_args)
    default = timm.models.get_pretrained_cfg(model_name)
    default_size = tuple(default.input_size) if default is not None else None
    cfg = {
        key: value
        for key, value in dict(model.pretrained_cfg).items()
        if key not in _CFG_SOURCES and (value is not None or key in _CFG_KEEP_NULL)
    }
    architecture = cfg.pop("architecture", model_name)
    in_chans = int(getattr(model, "in_chans", model_args.get("in_chans", cfg.get("input_size", (3,))[0])))
    size = model_args.get("img_size")
    if size is None:
        spatial = tuple(cfg.get("input_size", (3, 224, 224)))[1:]
    else:
        spatial = (size, size) if isinstance(size, int) else tuple(size)
    cfg["input_size"] = (in_chans, *spatial)
    if default_size is not None and tuple(cfg["input_size"][1:]) != default_size[1:]:
        cfg["pool_size"] = None  # the default's pooled map does not apply at another size
        cfg.pop("test_input_size", None)
    if "min_input_size" in cfg:
        cfg["min_input_size"] = (in_chans, *tuple(cfg["min_input_size"])[1:])
    cfg["custom_load"] = False  # the folder holds linvit's own layout, which timm's loader reads as it is
    if cfg.get("num_classes") != model.num_classes:  # another classifier: the default's labels do not apply
        for key in ("label_names", "label_descriptions", "label_offset"):
            cfg.pop(key, None)
    cfg["num_classes"] = model.num_classes
    return {
        "architecture": architecture,
        "num_classes": model.num_classes,
        "num_features": int(model.num_features),
        "pretrained_cfg": _json_ready(cfg),
        "model_args": _json_ready(model_args),
    }


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


def convert_checkpoint(
    src: str,
    dst: str,
    model_name: str | None = None,
    use_ema: bool = False,
    trusted: bool = False,
    creation: dict[str, Any] | None = None,
    force: bool = False,
    allow_non_finite: bool = False,
    progress: Any = None,
) -> Conversion:
    """Convert ``src`` to ``dst`` for ``model_name`` (inferred when None, which needs no ``creation``).

    ``creation`` (e.g. ``img_size`` and options) is kept as given; the options and training size the weights
    determine are added (`infer_creation`), then ``num_classes`` / ``in_chans`` where the weights differ from the
    defaults. All of them are recorded in a safetensors file's metadata (``model_args``), and in the ``config.json``
    of a folder ``dst`` (:func:`is_folder_destination`), which gets ``model.safetensors`` beside it, and the SHA-256
    of that file (``"sha256"``, checked before the folder is loaded). Weights with NaN/Inf are refused, named
    (:class:`linvit.io.NonFiniteWeightsError`), unless ``allow_non_finite`` (then named in a warning).

    Every file is written through :func:`linvit.io.destination.write_file` (temporary name in its folder, rename,
    recorded): one that exists and that linvit did not write as that kind is refused unless ``force``, and SRC itself
    always (:class:`~linvit.io.destination.DestinationError`). ``progress``: a :class:`linvit.utils.progress.Progress`
    told each step (default: none)."""
    import torch

    import linvit.models  # noqa: F401  (registers the families)
    from linvit.io import check_finite_weights, extract_model_state_dict, load_checkpoint_file
    from linvit.io.destination import file_sha256
    from linvit.utils.progress import Progress

    progress = progress or Progress("convert", enabled=False)
    if not is_folder_destination(dst):
        _check_destinations(src, _destinations(dst), force)  # before the minutes of inference, not after
    progress.step(f"reading {src}", (1, 3))
    checkpoint = load_checkpoint_file(src, trusted=trusted)
    state_dict = extract_model_state_dict(checkpoint, use_ema=use_ema)
    check_finite_weights(state_dict, str(src), allow=allow_non_finite, opt_out="--allow-non-finite")
    creation = dict(creation or {})
    if model_name is None:
        if creation:
            raise ValueError("--img-size / --model-kwargs describe a model: pass --model NAME with them.")
        progress.step("finding the registered model the weights fit (every linvit family)", (2, 3))
        try:
            model_name, filtered, conversion = _infer(state_dict)
        except ValueError as error:
            raise ValueError(f"'{src}': {error}") from None
    else:
        progress.step(f"fitting the weights to {model_name}", (2, 3))
        try:
            filtered, resized, model_args, inferred = infer_creation(model_name, state_dict, creation)
        except Misfit as misfit:
            raise ValueError(f"{misfit}. {_what_they_fit(state_dict)}") from None
        conversion = Conversion(model_name, model_args, inferred, resized)
    progress.step(f"writing {dst}", (3, 3))
    tensors = {k: v.detach().contiguous().clone() for k, v in filtered.items()}
    folder = is_folder_destination(dst)
    if folder or str(dst).endswith(".safetensors"):
        from safetensors.torch import save_file

        metadata = {"format": "pt", "model": model_name, "converted_from": str(src)}
        if conversion.model_args:
            metadata["model_args"] = json.dumps(conversion.model_args)
        if conversion.inferred:
            metadata["inferred_model_args"] = json.dumps(conversion.inferred)
        if not folder:
            write_file(dst, lambda path: save_file(tensors, str(path), metadata=metadata), WEIGHTS_KIND, force=force)
            return conversion
        config = hub_config(model_name, conversion.model_args)
        out = prepare_folder(dst)
        # both checked before either is written; --force replaces these two and nothing else in the folder
        _check_destinations(src, [(out / WEIGHTS_NAME, WEIGHTS_KIND), (out / CONFIG_NAME, CONFIG_KIND)], force)
        write_file(
            out / WEIGHTS_NAME, lambda path: save_file(tensors, str(path), metadata=metadata), WEIGHTS_KIND, force=force
        )
        config["sha256"] = file_sha256(out / WEIGHTS_NAME)  # checked before the folder is loaded
        text = json.dumps(config, indent=2) + "\n"
        write_file(out / CONFIG_NAME, lambda path: path.write_text(text), CONFIG_KIND, force=force)
    else:
        write_file(dst, lambda path: torch.save(tensors, path), STATE_DICT_KIND, force=force)
    return conversion


def _check_destinations(src: str, destinations: list[tuple[Path, str]], force: bool) -> None:
    """Refuse (DestinationError, one line) a destination that is SRC itself, or exists and was not written by linvit
    as that kind (unless ``force``), or cannot be written."""
    for path, kind in destinations:
        check_not_input(path, src)
        check_destination(path, kind, force=force)


def _destinations(dst: str) -> list[tuple[Path, str]]:
    """The files ``linvit convert`` writes for DST, with their kinds."""
    if is_folder_destination(dst):
        folder = Path(dst)
        return [(folder / WEIGHTS_NAME, WEIGHTS_KIND), (folder / CONFIG_NAME, CONFIG_KIND)]
    kind = WEIGHTS_KIND if str(dst).endswith(".safetensors") else STATE_DICT_KIND
    return [(Path(dst), kind)]


def run(args: argparse.Namespace) -> int:
    from linvit.utils.progress import Progress

    folder = is_folder_destination(args.dst)
    try:
        if folder and Path(args.dst).exists() and not Path(args.dst).is_dir():
            raise DestinationError(
                f"cannot write into '{args.dst}': it is a file, not a folder; name a new folder, or a "
                ".safetensors/.pth file to write one file"
            )
        _check_destinations(args.src, _destinations(args.dst), args.force)  # refused before anything is read
        creation = _creation_arguments(args)
        conversion = convert_checkpoint(
            args.src,
            args.dst,
            args.model,
            use_ema=args.ema,
            trusted=args.trusted,
            creation=creation,
            force=args.force,
            allow_non_finite=args.allow_non_finite,
            progress=Progress("convert", enabled=not args.no_progress),
        )
    except ValueError as error:  # CheckpointError is a ValueError: missing/corrupt/untrusted files, misfits
        print(f"error: {error}", file=sys.stderr)
        return 1
    name, model_args = conversion.model, conversion.model_args
    created_with = f" with {_kwargs_text(model_args)}" if model_args else ""
    if folder:
        written = f"{os.path.join(args.dst, WEIGHTS_NAME)} and {os.path.join(args.dst, CONFIG_NAME)}"
        print(f"wrote {written} for {name}{created_with}")
    else:
        print(f"wrote {args.dst} for {name}{created_with}")
    if conversion.inferred:
        inferred = _kwargs_text({key: model_args[key] for key in conversion.inferred})
        print(f"inferred from the weights' shapes: {inferred} (pass --img-size / --model-kwargs to choose otherwise)")
    if conversion.resized and "img_size" in creation:
        print(
            f"resized {conversion.resized} positional / relative-position tables to img_size={creation['img_size']!r}"
            " (--img-size), from the size the checkpoint was trained at; leave --img-size out to keep its own size",
            file=sys.stderr,
        )
    elif conversion.resized:
        print(
            f"resized {conversion.resized} positional / relative-position tables to the model's default size: no "
            "input size fits them as they are; pass --img-size with the checkpoint's training size to keep them",
            file=sys.stderr,
        )
    if folder:  # config.json names the model and its creation arguments
        print(f"load it with: timm.create_model({'local-dir:' + args.dst!r}, pretrained=True)")
        return 0
    extra = f"{_kwargs_text(model_args)}, " if model_args else ""
    print(
        f"load it with: timm.create_model('{name}', pretrained=True, {extra}"
        f"pretrained_cfg_overlay=dict(file='{args.dst}'))"
    )
    return 0
