"""``linvit convert SRC DST``: turn a foreign checkpoint (e.g. the FLatten authors' .pth) into linvit weights.

Reads SRC safely (pickled configs become inert dicts; code is never run unless ``--trusted``), takes the model (or
EMA) weights, applies the model family's ``checkpoint_filter_fn`` (key mapping, table resizing), checks them against
the model strictly, and writes DST (``.safetensors``, or a plain state dict for ``.pth``/``.pt``/``.bin``). Load it with
``timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=DST))``.

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
safetensors metadata (``model_args``) and in the printed load line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, NamedTuple

HELP = "Convert a foreign checkpoint (e.g. the FLatten authors' .pth) into linvit safetensors weights."

_MODEL_PATTERNS = ("flatten_*", "linvit_*")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="checkpoint to read (.pth/.pt/.bin/.safetensors)")
    parser.add_argument("dst", metavar="DST", help="file to write (.safetensors; .pth/.pt/.bin for a torch state dict)")
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
    parser.add_argument("--force", action="store_true", help="overwrite DST if it exists")


def _family_filter(model: Any):
    module = sys.modules[type(model).__module__]
    return getattr(module, "checkpoint_filter_fn", None)


class _Misfit(ValueError):
    """The weights do not fit a model; ``differences`` counts the keys that differ (to name the nearest model)."""

    def __init__(self, message: str, differences: int):
        super().__init__(message)
        self.differences = differences


def _layer_names(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


def _class_and_channel_args(model: Any, filtered: dict[str, Any]) -> dict[str, int]:
    """``num_classes`` / ``in_chans`` the weights were saved with, where they differ from ``model``'s.

    Read from the layers the pretrained cfg names: the classifier's rows (no classifier keys: 0 classes) and the
    first convolution's input channels.
    """
    target = model.state_dict()
    args: dict[str, int] = {}
    heads = _layer_names(model.pretrained_cfg.get("classifier"))
    head_weights = [f"{head}.weight" for head in heads if f"{head}.weight" in target]
    if head_weights:
        weight = head_weights[0]
        if weight in filtered and filtered[weight].shape[0] != target[weight].shape[0]:
            args["num_classes"] = int(filtered[weight].shape[0])
        elif not any(key.startswith(tuple(f"{head}." for head in heads)) for key in filtered):
            args["num_classes"] = 0
    for conv in _layer_names(model.pretrained_cfg.get("first_conv")):
        weight = f"{conv}.weight"
        both = weight in filtered and weight in target and filtered[weight].ndim == target[weight].ndim == 4
        if both and filtered[weight].shape[1] != target[weight].shape[1]:
            args["in_chans"] = int(filtered[weight].shape[1])
    return args


# positional tables whose token count follows the input size (not ``scale``: (1, 1, C) too)
_TABLE_NAMES = ("positional_encoding", "pos_embed", "absolute_pos_embed", "relative_position_bias_table")
_SIZED_TABLE_NAMES = ("positional_encoding", "pos_embed", "absolute_pos_embed")
# the smallest and largest square sizes tried for a checkpoint's training size
_SIZE_RANGE = (16, 8192)
_MAX_SIZE_CANDIDATES = 8


def _is_table(key: str, names: tuple[str, ...] = _TABLE_NAMES) -> bool:
    """Whether ``key`` names a table, in linvit's or the authors' layout (their PVT's ``pos_embed1`` ...)."""
    return re.sub(r"\d+$", "", key.rsplit(".", 1)[-1]) in names


def _resized_tables(state_dict: dict[str, Any], filtered: dict[str, Any]) -> int:
    """How many tables of ``filtered`` have a shape that no table of ``state_dict`` has: the ones a filter resized.

    Only tables count: a filter that fuses ``q``/``kv`` into ``qkv`` or splits a LePE convolution changes shapes
    without resizing anything."""
    source = {tuple(v.shape) for v in state_dict.values() if hasattr(v, "shape")}
    return sum(1 for k, v in filtered.items() if _is_table(k) and tuple(v.shape) not in source)


def _fit(
    name: str, state_dict: dict[str, Any], creation: dict[str, Any], built: Any = None
) -> tuple[dict[str, Any], int, dict[str, int]]:
    """Filtered state dict for model ``name`` built with ``creation`` (on the meta device), how many tables its
    filter resized, and the ``num_classes`` / ``in_chans`` to create the model with when the weights have another
    classifier or stem.

    ``built``: the model already built with ``creation`` on the meta device, if at hand. Raises _Misfit (a
    ValueError) when the weights do not fit the model exactly; a family filter's own ValueError (another stage
    structure) passes through.
    """
    import timm

    from linvit.io import describe_mismatch, state_dict_mismatch

    def fit(model_args: dict[str, int]) -> tuple[dict[str, Any], tuple[list, list, list]]:
        if model_args or built is None:
            model = timm.create_model(name, pretrained=False, device="meta", **creation, **model_args)
        else:
            model = built
        filter_fn = _family_filter(model)
        filtered = filter_fn(dict(state_dict), model) if filter_fn is not None else dict(state_dict)
        return filtered, state_dict_mismatch(filtered, model.state_dict())

    filtered, mismatch = fit({})
    model_args: dict[str, int] = {}
    if any(mismatch):  # another class or channel count? then the rest must fit exactly
        model = built if built is not None else timm.create_model(name, pretrained=False, device="meta", **creation)
        guess = _class_and_channel_args(model, filtered)
        refit, remaining = fit(guess) if guess else (filtered, mismatch)
        if not any(remaining):
            filtered, mismatch, model_args = refit, remaining, guess
    if any(mismatch):
        raise _Misfit(f"weights do not fit {name}: {describe_mismatch(*mismatch)}", sum(map(len, mismatch)))
    return filtered, _resized_tables(state_dict, filtered), model_args


# ------------------------------------------------------------------------------------ what the shapes determine
_REDUCTION_KEY = re.compile(r"^(?:block(\d+)\.|stages\.(\d+)\.blocks\.)\d+\.attn\.sr\.weight$")
_LINEAR_BRANCH_KEY = re.compile(
    r"^(?:stage(\d+)\.|stages\.(\d+)\.blocks\.)\d+\.attns\.(\d+)\.(?:focused\.)?positional_encoding$"
)


def _stage_of(match: re.Match) -> int:
    """0-based stage of an authors' (1-based ``block{s}`` / ``stage{s}``) or linvit (``stages.{i}``) key."""
    return int(match.group(1)) - 1 if match.group(1) is not None else int(match.group(2))


def _reduction_options(model: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """PVT/PVTv2: ``la_sr_ratios`` (the s of each stage's s x s, stride-s ``attn.sr`` convolution) or ``linear=True``
    (a 1x1 ``attn.sr``: PVTv2-Li's pooled reduction), read from the weights; {} for other families and for weights
    without a reduction (the defaults)."""
    ratios_now = getattr(model, "la_sr_ratios", None)
    if ratios_now is None:
        return {}
    ratios = [1] * len(ratios_now)
    linear = False
    for key, value in state_dict.items():
        match = _REDUCTION_KEY.match(key)
        if match and getattr(value, "ndim", 0) == 4 and 0 <= _stage_of(match) < len(ratios):
            if value.shape[-1] == 1:
                linear = True
            else:
                ratios[_stage_of(match)] = int(value.shape[-1])
    if linear:
        return {"linear": True}  # the pooled form reduces every stage to 7x7 whatever its ratio
    if max(ratios) > 1:
        return {"la_sr_ratios": "".join(map(str, ratios)) if max(ratios) < 10 else ratios}
    return {}


def _stripe_options(model: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """CSwin: the ``la_split_size`` that gives ``model``'s linear stages the checkpoint's stripe branches at the
    model's ``img_size``, or {} (other families; no stage with two linear branches; no whole stripe width fits).

    A linear stage with two branches holds (map height x stripe) tables: the stripe is the table's positions over
    the map's height at ``img_size``. A linear stage with one branch has the map as its stripe. Stages where the
    width does not matter (softmax stages, the last stage) take half the previous one's, as the authors' configs.
    """
    if not hasattr(model, "la_split_size") or not hasattr(model, "stage_grids"):
        return {}
    branches: dict[int, set[int]] = {}
    positions: dict[int, int] = {}
    for key, value in state_dict.items():
        match = _LINEAR_BRANCH_KEY.match(key)
        if match and getattr(value, "ndim", 0) == 3:
            stage = int(match.group(1)) - 1 if match.group(1) is not None else int(match.group(2))
            branches.setdefault(stage, set()).add(int(match.group(3)))
            positions[stage] = int(value.shape[1])
    striped = {stage for stage, found in branches.items() if len(found) == 2}
    if not striped:
        return {}
    grids = model.stage_grids(model.img_size)
    splits: list[int | None] = []
    for stage, (height, width) in enumerate(grids):
        if stage in striped:
            split, remainder = divmod(positions[stage], height)
            if remainder or not 0 < split < min(height, width):
                return {}
            splits.append(split)
        elif stage in branches and stage < len(grids) - 1:
            splits.append(height)  # one branch: the stripe is the map
        else:
            splits.append(None)
    for stage, split in enumerate(splits):
        if split is None:
            previous = splits[stage - 1] if stage > 0 else None
            splits[stage] = max(previous // 2, 1) if previous else max(grids[stage][0], 1)
    return {"la_split_size": "-".join(str(split) for split in splits)}


def _size_candidates(default: int, source_tokens: set[int], model_tokens: set[int]) -> list[int]:
    """Square input sizes at which the model's tables (``model_tokens`` positions at ``default``) may have the
    checkpoint's (``source_tokens``): the default scaled by the ratio of the grids' sides (square tables, with or
    without a class token) or of the positions (stripe tables, one side of which follows the size); the sizes that
    most table pairs agree on first, then the smaller."""
    import math
    from collections import Counter

    votes: Counter[int] = Counter()
    for theirs in source_tokens:
        for ours in model_tokens:
            for a, b in ((theirs, ours), (theirs - 1, ours - 1)):
                side, side0 = (math.isqrt(a), math.isqrt(b)) if a > 0 and b > 0 else (0, 0)
                if side and side * side == a and side0 * side0 == b and default * side % side0 == 0:
                    votes[default * side // side0] += 1
            if default * theirs % ours == 0:
                votes[default * theirs // ours] += 1
    sizes = [size for size in votes if size != default and _SIZE_RANGE[0] <= size <= _SIZE_RANGE[1]]
    return sorted(sizes, key=lambda size: (-votes[size], size))[:_MAX_SIZE_CANDIDATES]


def _table_tokens(state: dict[str, Any]) -> set[int]:
    return {
        int(v.shape[1])
        for k, v in state.items()
        if _is_table(k, _SIZED_TABLE_NAMES) and getattr(v, "ndim", 0) == 3 and v.shape[0] == 1
    }


def infer_creation(
    name: str, state_dict: dict[str, Any], creation: dict[str, Any] | None = None
) -> tuple[dict[str, Any], int, dict[str, Any], list[str]]:
    """The weights for model ``name`` and the creation arguments that keep everything in them.

    ``creation`` (the user's ``img_size`` and ``--model-kwargs``) is kept as given. To it are added the options the
    weights' shapes determine (``la_sr_ratios`` / ``linear`` / ``la_split_size``) and, without a given ``img_size``,
    the training size: the default first, then the square sizes the tables suggest (`_size_candidates`), until one
    fits every table as it is. When none does, the tables are resized to the default size (the count says so).

    Returns (filtered state dict, how many tables were resized, every creation argument, the names of those that
    were inferred). Raises _Misfit when the weights do not fit the model, or a family filter's ValueError when no
    size or option makes the structures agree.
    """
    import timm

    given = dict(creation or {})
    default = timm.create_model(name, pretrained=False, device="meta", **given)
    options = {key: value for key, value in _reduction_options(default, state_dict).items() if key not in given}
    base = {**given, **options}
    if options:
        default = timm.create_model(name, pretrained=False, device="meta", **base)

    def attempt(args: dict[str, Any], model: Any) -> tuple[dict[str, Any], int, dict[str, Any], list[str]]:
        stripes = {} if "la_split_size" in given else _stripe_options(model, state_dict)
        args = {**args, **stripes}
        filtered, resized, extra = _fit(name, state_dict, args, None if stripes else model)
        inferred = [key for key in args if key not in given] + list(extra)
        return filtered, resized, {**args, **extra}, inferred

    fallback, failure = None, None
    try:
        fallback = attempt(base, default)
    except _Misfit:
        raise  # widths, depths or blocks differ: no size or option changes that
    except ValueError as error:  # a filter's structure error (stripe branches at this size): try other sizes
        failure = error
    sized = getattr(default, "img_size", None)  # models without one take any size with the same tables
    if "img_size" in given or sized is None or (fallback is not None and fallback[1] == 0):
        if fallback is None:
            raise failure  # type: ignore[misc]
        return fallback
    size = int(sized[0]) if isinstance(sized, (tuple, list)) else int(sized)
    for candidate in _size_candidates(size, _table_tokens(state_dict), _table_tokens(default.state_dict())):
        args = {**base, "img_size": candidate}
        try:
            result = attempt(args, timm.create_model(name, pretrained=False, device="meta", **args))
        except ValueError:  # _Misfit too: this size does not fit
            continue
        if result[1] == 0:
            return result
    if fallback is None:
        raise failure  # type: ignore[misc]
    return fallback


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
    import re

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
    nearest: _Misfit | None = None
    for members in _families(names).values():
        representative = timm.create_model(members[0], pretrained=False, device="meta")
        filter_fn = _family_filter(representative)
        try:
            mapped = filter_fn(dict(state_dict), representative) if filter_fn is not None else state_dict
        except Exception:  # a filter of another family may fail on foreign keys, or on another stage structure
            mapped = None
        options = _reduction_options(representative, state_dict)
        if mapped is None and options and filter_fn is not None:  # built with the weights' reductions
            try:
                reduced = timm.create_model(members[0], pretrained=False, device="meta", **options)
                mapped = filter_fn(dict(state_dict), reduced)
            except Exception:
                mapped = None
        if mapped is not None:
            ours, theirs = _key_structure(representative.state_dict()), _key_structure(mapped)
            if len(ours & theirs) < 0.5 * len(ours | theirs):
                continue
        elif not _same_family_keys(representative, state_dict):
            continue
        for name in members:
            try:
                filtered, resized, model_args, inferred = infer_creation(name, state_dict)
            except _Misfit as misfit:
                if nearest is None or misfit.differences < nearest.differences:
                    nearest = misfit
                continue
            except Exception:
                continue
            fits.append((filtered, Conversion(name, model_args, inferred, resized)))
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
        return "No other registered linvit model fits them either."
    created = f" created with {_kwargs_text(conversion.model_args)}" if conversion.model_args else ""
    return f"They fit {name}{created}: pass --model {name}, or leave --model out to infer it."


def convert_checkpoint(
    src: str,
    dst: str,
    model_name: str | None = None,
    use_ema: bool = False,
    trusted: bool = False,
    creation: dict[str, Any] | None = None,
) -> Conversion:
    """Convert ``src`` to ``dst`` for ``model_name`` (inferred when None, which needs no ``creation``).

    ``creation`` (e.g. ``img_size`` and options) is kept as given; the options and training size the weights
    determine are added (`infer_creation`), then ``num_classes`` / ``in_chans`` where the weights differ from the
    defaults. All of them are recorded in a safetensors file's metadata (``model_args``)."""
    import torch

    import linvit.models  # noqa: F401  (registers the families)
    from linvit.io import extract_model_state_dict, load_checkpoint_file

    checkpoint = load_checkpoint_file(src, trusted=trusted)
    state_dict = extract_model_state_dict(checkpoint, use_ema=use_ema)
    creation = dict(creation or {})
    if model_name is None:
        if creation:
            raise ValueError("--img-size / --model-kwargs describe a model: pass --model NAME with them.")
        model_name, filtered, conversion = _infer(state_dict)
    else:
        try:
            filtered, resized, model_args, inferred = infer_creation(model_name, state_dict, creation)
        except _Misfit as misfit:
            raise ValueError(f"{misfit}. {_what_they_fit(state_dict)}") from None
        conversion = Conversion(model_name, model_args, inferred, resized)
    tensors = {k: v.detach().contiguous().clone() for k, v in filtered.items()}
    if dst.endswith(".safetensors"):
        from safetensors.torch import save_file

        metadata = {"format": "pt", "model": model_name, "converted_from": str(src)}
        if conversion.model_args:
            metadata["model_args"] = json.dumps(conversion.model_args)
        if conversion.inferred:
            metadata["inferred_model_args"] = json.dumps(conversion.inferred)
        save_file(tensors, dst, metadata=metadata)
    else:
        torch.save(tensors, dst)
    return conversion


def run(args: argparse.Namespace) -> int:
    import os

    if os.path.exists(args.dst) and not args.force:
        print(f"error: {args.dst} exists; pass --force to overwrite it.", file=sys.stderr)
        return 2
    try:
        creation = _creation_arguments(args)
        conversion = convert_checkpoint(
            args.src, args.dst, args.model, use_ema=args.ema, trusted=args.trusted, creation=creation
        )
    except ValueError as error:  # CheckpointError is a ValueError: missing/corrupt/untrusted files, misfits
        print(f"error: {error}", file=sys.stderr)
        return 1
    name, model_args = conversion.model, conversion.model_args
    created_with = f" with {_kwargs_text(model_args)}" if model_args else ""
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
    extra = f"{_kwargs_text(model_args)}, " if model_args else ""
    print(
        f"load it with: timm.create_model('{name}', pretrained=True, {extra}"
        f"pretrained_cfg_overlay=dict(file='{args.dst}'))"
    )
    return 0
