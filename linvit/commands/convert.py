"""``linvit convert SRC DST``: turn a foreign checkpoint (e.g. the FLatten authors' .pth) into linvit weights.

Reads SRC safely (pickled configs become inert dicts; code is never run unless ``--trusted``), takes the model (or
EMA) weights, applies the model family's ``checkpoint_filter_fn`` (key mapping, table resizing), checks them against
the model strictly, and writes DST (``.safetensors``, or a plain state dict for ``.pth``/``.pt``/``.bin``). Load it with
``timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=DST))``.

Without ``--model`` the model is inferred: every registered linvit model whose family filter maps SRC onto it exactly
is a candidate, and the one whose tensors need the least resizing wins (ties are an error listing the candidates).
A classifier for another class count (or none) and a stem for other input channels fit too: the model is then
created with ``num_classes`` / ``in_chans`` read from the weights, and the printed load command passes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

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
        help="the input size the checkpoint was trained at (H or H W): the model is built at that size and its tables "
        "are kept as they are; without it, tables of another size are resized to the model's default size (said so)",
    )
    parser.add_argument(
        "--model-kwargs",
        default=None,
        metavar="JSON",
        help="creation arguments of the model the checkpoint was built with, as JSON, e.g. "
        """'{"la_sr_ratios": "8421"}' (recorded with the weights and in the printed load line)""",
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


def _convert_for(
    name: str, state_dict: dict[str, Any], creation: dict[str, Any] | None = None
) -> tuple[dict[str, Any], int, dict[str, int]]:
    """Filtered state dict for model ``name`` (built on the meta device), how many source tensors it reshaped, and
    the ``num_classes`` / ``in_chans`` to create the model with when the weights have another classifier or stem.

    Raises _Misfit (a ValueError) when the weights do not fit the model exactly.
    """
    import timm
    import torch

    from linvit.io import describe_mismatch, state_dict_mismatch

    creation = dict(creation or {})

    def fit(model_args: dict[str, int]) -> tuple[dict[str, Any], tuple[list, list, list]]:
        model = timm.create_model(name, pretrained=False, device="meta", **creation, **model_args)
        filter_fn = _family_filter(model)
        filtered = filter_fn(dict(state_dict), model) if filter_fn is not None else dict(state_dict)
        return filtered, state_dict_mismatch(filtered, model.state_dict())

    filtered, mismatch = fit({})
    model_args: dict[str, int] = {}
    if any(mismatch):  # another class or channel count? then the rest must fit exactly
        guess = _class_and_channel_args(timm.create_model(name, pretrained=False, device="meta", **creation), filtered)
        refit, remaining = fit(guess) if guess else (filtered, mismatch)
        if not any(remaining):
            filtered, mismatch, model_args = refit, remaining, guess
    if any(mismatch):
        raise _Misfit(f"weights do not fit {name}: {describe_mismatch(*mismatch)}", sum(map(len, mismatch)))
    source_shapes = {tuple(v.shape) for v in state_dict.values() if isinstance(v, torch.Tensor)}
    reshaped = sum(1 for v in filtered.values() if tuple(v.shape) not in source_shapes)
    return filtered, reshaped, model_args


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


def _infer(state_dict: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, int], int]:
    """The registered model whose family filter maps ``state_dict`` onto it exactly with the least resizing (and the
    ``num_classes`` / ``in_chans`` to create it with, where the weights differ from its defaults, and how many tensors
    it resized).

    One representative per family is built first (on the meta device); only families whose mapped key names
    mostly agree with it are searched model by model.
    """
    import timm

    import linvit.models  # noqa: F401  (registers the families)

    names = sorted({n for pattern in _MODEL_PATTERNS for n in timm.list_models(pattern)})
    fits: list[tuple[int, str, dict[str, Any], dict[str, int]]] = []
    nearest: _Misfit | None = None
    for members in _families(names).values():
        representative = timm.create_model(members[0], pretrained=False, device="meta")
        filter_fn = _family_filter(representative)
        try:
            mapped = filter_fn(dict(state_dict), representative) if filter_fn is not None else state_dict
        except Exception:  # a filter of another family may fail on foreign keys: not this family
            continue
        ours, theirs = _key_structure(representative.state_dict()), _key_structure(mapped)
        if len(ours & theirs) < 0.5 * len(ours | theirs):
            continue
        for name in members:
            try:
                filtered, reshaped, model_args = _convert_for(name, state_dict)
            except _Misfit as misfit:
                if nearest is None or misfit.differences < nearest.differences:
                    nearest = misfit
                continue
            except Exception:
                continue
            fits.append((reshaped, name, filtered, model_args))
    if not fits:
        closest = f" The nearest: {nearest}." if nearest is not None else ""
        raise ValueError(
            f"No registered linvit model fits these weights.{closest} Pass --model NAME for the model they were "
            "saved from (`linvit models` lists them); the error for that model will say which keys differ."
        )
    fits.sort(key=lambda item: (item[0], len(item[3])))
    best = [item for item in fits if item[0] == fits[0][0] and len(item[3]) == len(fits[0][3])]
    if len(best) > 1:
        raise ValueError(f"Several models fit these weights equally well: {[n for _, n, _, _ in best]}; pass --model.")
    return fits[0][1], fits[0][2], fits[0][3], fits[0][0]


def _what_they_fit(state_dict: dict[str, Any]) -> str:
    """Which registered model the weights do fit (for a --model that they do not), or how to find out."""
    try:
        name, _, model_args, _ = _infer(state_dict)
    except ValueError:
        return "No other registered linvit model fits them either."
    created = f" created with {_kwargs_text(model_args)}" if model_args else ""
    return f"They fit {name}{created}: pass --model {name}, or leave --model out to infer it."


def convert_checkpoint(
    src: str,
    dst: str,
    model_name: str | None = None,
    use_ema: bool = False,
    trusted: bool = False,
    creation: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any], int]:
    """Convert ``src`` to ``dst`` for ``model_name`` (inferred when None, which needs no ``creation``); returns the
    model name, the arguments to create it with (``creation``, e.g. ``img_size`` and options, then ``num_classes`` /
    ``in_chans`` where the weights differ from the defaults) and how many tensors were resized to fit it."""
    import torch

    import linvit.models  # noqa: F401  (registers the families)
    from linvit.io import extract_model_state_dict, load_checkpoint_file

    checkpoint = load_checkpoint_file(src, trusted=trusted)
    state_dict = extract_model_state_dict(checkpoint, use_ema=use_ema)
    creation = dict(creation or {})
    if model_name is None:
        if creation:
            raise ValueError("--img-size / --model-kwargs describe a model: pass --model NAME with them.")
        model_name, filtered, model_args, reshaped = _infer(state_dict)
    else:
        try:
            filtered, reshaped, model_args = _convert_for(model_name, state_dict, creation)
        except _Misfit as misfit:
            raise ValueError(f"{misfit}. {_what_they_fit(state_dict)}") from None
    model_args = {**creation, **model_args}
    tensors = {k: v.detach().contiguous().clone() for k, v in filtered.items()}
    if dst.endswith(".safetensors"):
        from safetensors.torch import save_file

        metadata = {"format": "pt", "model": model_name, "converted_from": str(src)}
        if model_args:
            metadata["model_args"] = json.dumps(model_args)
        save_file(tensors, dst, metadata=metadata)
    else:
        torch.save(tensors, dst)
    return model_name, model_args, reshaped


def run(args: argparse.Namespace) -> int:
    import os

    if os.path.exists(args.dst) and not args.force:
        print(f"error: {args.dst} exists; pass --force to overwrite it.", file=sys.stderr)
        return 2
    try:
        creation = _creation_arguments(args)
        name, model_args, reshaped = convert_checkpoint(
            args.src, args.dst, args.model, use_ema=args.ema, trusted=args.trusted, creation=creation
        )
    except ValueError as error:  # CheckpointError is a ValueError: missing/corrupt/untrusted files, misfits
        print(f"error: {error}", file=sys.stderr)
        return 1
    created_with = f" with {_kwargs_text(model_args)}" if model_args else ""
    print(f"wrote {args.dst} for {name}{created_with}")
    if reshaped:
        print(
            f"resized {reshaped} tensors (positional / relative-position tables) to the model's size: the checkpoint "
            "was saved at another one; pass --img-size with its training size to keep them as they are",
            file=sys.stderr,
        )
    extra = f"{_kwargs_text(model_args)}, " if model_args else ""
    print(
        f"load it with: timm.create_model('{name}', pretrained=True, {extra}"
        f"pretrained_cfg_overlay=dict(file='{args.dst}'))"
    )
    return 0
