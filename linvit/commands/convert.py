"""``linvit convert SRC DST``: turn a foreign checkpoint (e.g. the FLatten authors' .pth) into linvit weights.

Reads SRC safely (pickled configs become inert dicts; code is never run unless ``--trusted``), takes the model (or
EMA) weights, applies the model family's ``checkpoint_filter_fn`` (key mapping, table resizing), checks them against
the model strictly, and writes DST (``.safetensors``, or a plain state dict for ``.pth``/``.pt``/``.bin``). Load it with
``timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=DST))``.

Without ``--model`` the model is inferred: every registered linvit model whose family filter maps SRC onto it exactly
is a candidate, and the one whose tensors need the least resizing wins (ties are an error listing the candidates).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--force", action="store_true", help="overwrite DST if it exists")


def _family_filter(model: Any):
    module = sys.modules[type(model).__module__]
    return getattr(module, "checkpoint_filter_fn", None)


def _convert_for(name: str, state_dict: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Filtered state dict for model ``name`` (built on the meta device) and how many source tensors it reshaped.

    Raises ValueError when the weights do not fit the model exactly.
    """
    import timm
    import torch

    from linvit.models._checkpoint import describe_mismatch, state_dict_mismatch

    model = timm.create_model(name, pretrained=False, device="meta")
    filter_fn = _family_filter(model)
    filtered = filter_fn(dict(state_dict), model) if filter_fn is not None else dict(state_dict)
    missing, unexpected, mismatched = state_dict_mismatch(filtered, model.state_dict())
    if missing or unexpected or mismatched:
        raise ValueError(f"weights do not fit {name}: {describe_mismatch(missing, unexpected, mismatched)}")
    source_shapes = {tuple(v.shape) for v in state_dict.values() if isinstance(v, torch.Tensor)}
    reshaped = sum(1 for v in filtered.values() if tuple(v.shape) not in source_shapes)
    return filtered, reshaped


def _key_structure(keys) -> set[str]:
    """Keys with their indices blanked (``layers.#.blocks.#.attn.qkv.weight``): a family's shape of names."""
    import re

    return {re.sub(r"\.\d+(?=\.|$)", ".#", key) for key in keys}


def _families(names: list[str]) -> dict[str, list[str]]:
    try:
        from timm.models._registry import _model_to_module
    except ImportError:  # pragma: no cover - older or newer timm: every model is its own family
        return {name: [name] for name in names}
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_model_to_module.get(name, name), []).append(name)
    return groups


def _infer(state_dict: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The registered model whose family filter maps ``state_dict`` onto it exactly with the least resizing.

    One representative per family is built first (on the meta device); only families whose mapped key names
    mostly agree with it are searched model by model.
    """
    import timm

    import linvit.models  # noqa: F401  (registers the families)

    names = sorted({n for pattern in _MODEL_PATTERNS for n in timm.list_models(pattern)})
    fits: list[tuple[int, str, dict[str, Any]]] = []
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
                filtered, reshaped = _convert_for(name, state_dict)
            except Exception:
                continue
            fits.append((reshaped, name, filtered))
    if not fits:
        raise ValueError(
            "No registered linvit model fits these weights. Pass --model NAME (see `timm.list_models('flatten_*')`); "
            "the error for that model will say which keys differ."
        )
    fits.sort(key=lambda item: item[0])
    best = [item for item in fits if item[0] == fits[0][0]]
    if len(best) > 1:
        raise ValueError(f"Several models fit these weights equally well: {[n for _, n, _ in best]}; pass --model.")
    return fits[0][1], fits[0][2]


def convert_checkpoint(
    src: str, dst: str, model_name: str | None = None, use_ema: bool = False, trusted: bool = False
) -> str:
    """Convert ``src`` to ``dst`` for ``model_name`` (inferred when None); returns the model name."""
    import torch

    import linvit.models  # noqa: F401  (registers the families)
    from linvit.models._checkpoint import extract_model_state_dict, load_checkpoint_file

    checkpoint = load_checkpoint_file(src, trusted=trusted)
    state_dict = extract_model_state_dict(checkpoint, use_ema=use_ema)
    if model_name is None:
        model_name, filtered = _infer(state_dict)
    else:
        filtered, _ = _convert_for(model_name, state_dict)
    tensors = {k: v.detach().contiguous().clone() for k, v in filtered.items()}
    if dst.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(tensors, dst, metadata={"format": "pt", "model": model_name, "converted_from": str(src)})
    else:
        torch.save(tensors, dst)
    return model_name


def run(args: argparse.Namespace) -> int:
    import os

    if os.path.exists(args.dst) and not args.force:
        print(f"error: {args.dst} exists; pass --force to overwrite it.", file=sys.stderr)
        return 2
    try:
        name = convert_checkpoint(args.src, args.dst, args.model, use_ema=args.ema, trusted=args.trusted)
    except ValueError as error:  # CheckpointError is a ValueError: missing/corrupt/untrusted files, misfits
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst} for {name}")
    print(f"load it with: timm.create_model('{name}', pretrained=True, pretrained_cfg_overlay=dict(file='{args.dst}'))")
    return 0
