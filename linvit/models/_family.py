"""What every family file shares besides the backbone frame: the weight-file entry, checkpoint mapping helpers,
the pretrained cfg and the timm builder.

- `PretrainedFileMixin`: timm's ``custom_load`` entry (``load_pretrained``), reading a weight file safely through
  the family module's ``checkpoint_filter_fn``;
- `unwrap_checkpoint`, `is_converted`, `rename_keys`, `one_based_stage`, `fuse_q_kv`: the authors' training files,
  their key names and their separate ``q`` / ``kv`` projections;
- `resize_positional_encodings`: a checkpoint's learnable positional tables at the model's grids;
- `CreationOptionsError`: a filter's refusal of weights built with other creation options, with the options;
- `family_cfg`, `authors_release`, `create_family_model`: the pretrained cfg (with the authors' released file where
  there is one) and the ``timm.create_model`` builder of every family.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn

from linvit.attention import FocusedLinearAttention, resize_positional_table, square_grid
from linvit.io import build_model_loading_safely, extract_model_state_dict, load_pretrained_file
from linvit.layers import check_creation_arguments


class CreationOptionsError(ValueError):
    """A checkpoint filter's refusal of weights built with other creation options than the model's.

    ``options`` holds the creation arguments that build a model the weights fit, as the message spells them out
    ("build the model with ..."), so that a tool can follow the advice (``linvit convert`` does)."""

    def __init__(self, message: str, options: dict[str, Any]):
        super().__init__(message)
        self.options = dict(options)


def spell_options(options: dict[str, Any]) -> str:
    """``k=v, ...`` as a creation call takes them: what an error's advice says to pass."""
    return ", ".join(f"{key}={value!r}" for key, value in options.items())


__all__ = [
    "CreationOptionsError",
    "PretrainedFileMixin",
    "authors_release",
    "create_family_model",
    "family_cfg",
    "family_checkpoint_filter",
    "fuse_q_kv",
    "is_converted",
    "one_based_stage",
    "positive_per_stage",
    "rename_keys",
    "resize_positional_encodings",
    "unwrap_checkpoint",
]

CheckpointFilter = Callable[[dict[str, torch.Tensor], nn.Module], dict[str, torch.Tensor]]


def family_checkpoint_filter(model: nn.Module) -> CheckpointFilter | None:
    """The ``checkpoint_filter_fn(state_dict, model)`` of the module that defines ``model``'s class, if any (the
    timm convention; ``linvit convert`` finds it the same way)."""
    return getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)


class PretrainedFileMixin:
    """``load_pretrained(path)``, timm's hook for ``pretrained_cfg['custom_load']``: reads the file safely, maps it
    with the family's ``checkpoint_filter_fn`` (authors' keys, table sizes), adapts stem and classifier, checks that
    it fits (see `linvit.io.load_pretrained_file`)."""

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        load_pretrained_file(self, checkpoint_path, family_checkpoint_filter(self))


# ------------------------------------------------------------------------------------------------ checkpoints
def unwrap_checkpoint(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model weights of a training file (``model``, ``state_dict_ema``, ...); a state dict as it is."""
    if not all(isinstance(value, torch.Tensor) for value in checkpoint.values()):
        return extract_model_state_dict(checkpoint)
    return checkpoint


def is_converted(state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict is already in linvit's layout (its stages under `stages.`), not the authors'."""
    return any(key.startswith("stages.") for key in state_dict)


def fuse_q_kv(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate the authors' separate `attn.q` and `attn.kv` projections into one `attn.qkv` (rows q, k, v)."""
    out = {}
    for key, value in state_dict.items():
        if ".attn.kv." in key:
            continue
        if ".attn.q." in key:
            kv_key = key.replace(".attn.q.", ".attn.kv.")
            if kv_key not in state_dict:
                raise ValueError(f"checkpoint has {key} but no {kv_key}; the authors' PVT attention has both.")
            out[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat([value, state_dict[kv_key]], dim=0)
            continue
        out[key] = value
    return out


def one_based_stage(template: str) -> Callable[[re.Match], str]:
    """A `re.sub` replacement for the authors' 1-based stage numbers: group 1 becomes `{stage}` (0-based) and group 2,
    if any, `{index}` in `template`."""

    def replace(match: re.Match) -> str:
        index = match.group(2) if match.re.groups > 1 else ""
        return template.format(stage=int(match.group(1)) - 1, index=index)

    return replace


def positive_per_stage(parts: Iterable[Any], num_stages: int, error: str) -> tuple[int, ...]:
    """``parts`` as one positive int per stage (the authors' per-stage options, e.g. "56-28-14-7" split), else a
    ValueError with ``error``."""
    try:
        values = tuple(int(part) for part in parts)
    except (TypeError, ValueError):
        values = ()
    if len(values) != num_stages or min(values) < 1:
        raise ValueError(error)
    return values


def rename_keys(
    state_dict: dict[str, torch.Tensor], rules: Sequence[tuple[str, str | Callable[[re.Match], str]]]
) -> dict[str, torch.Tensor]:
    """Every key rewritten by the `(pattern, replacement)` rules of `re.sub`, applied in order."""
    out = {}
    for key, value in state_dict.items():
        for pattern, replacement in rules:
            key = re.sub(pattern, replacement, key)
        out[key] = value
    return out


def resize_positional_encodings(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Resize every ``positional_encoding`` whose size differs from the model's to the grid of the model's attention
    (bicubic, from the square grid the file's table covers)."""
    grids = {
        name: module.pos_size for name, module in model.named_modules() if isinstance(module, FocusedLinearAttention)
    }
    target = model.state_dict()
    for key, value in list(state_dict.items()):
        if not key.endswith(".positional_encoding") or key not in target or value.shape == target[key].shape:
            continue
        source = square_grid(value.shape[1], key)
        state_dict[key] = resize_positional_table(value, source, grids[key[: -len(".positional_encoding")]])
    return state_dict


# ------------------------------------------------------------------------------------------------ cfgs and builder
def family_cfg(**kwargs: Any) -> dict[str, Any]:
    """A family's pretrained cfg: ImageNet defaults at 224 (any input size works), a 7x7 final map, the FLatten paper;
    ``kwargs`` add the family's own fields (``first_conv``, ``classifier``, ``license``, ``paper_ids``, ...) or
    override these."""
    return {
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "classifier": "head.fc",
        "paper_ids": "arXiv:2308.00442",
        "paper_name": "FLatten Transformer: Vision Transformer using Focused Linear Attention",
        # released weights are the authors' training checkpoints: the model reads them itself (safely)
        "custom_load": True,
        **kwargs,
    }


def authors_release(url: str, result: str) -> dict[str, Any]:
    """The cfg fields of a checkpoint the authors released behind a link timm cannot fetch (it has no file name):
    where to download it and, in ``notes``, ``result`` (its published accuracy) and how to load the file."""
    return {
        "origin_url": url,
        "notes": (f"authors' release ({result}); download it and pass pretrained_cfg_overlay=dict(file=...)",),
    }


def create_family_model(
    model_cls: type,
    variant: str,
    pretrained: bool,
    default_out_indices: Any = (0, 1, 2, 3),
    **kwargs: Any,
) -> nn.Module:
    """timm's ``build_model_with_cfg`` for a family: the module's ``checkpoint_filter_fn`` converts checkpoints,
    ``features_only`` gets timm's getter over ``forward_intermediates`` (``out_indices`` from kwargs, else
    ``default_out_indices``), and a weight file goes to the model's own safe loader (``trusted=True`` in kwargs: see
    `build_model_loading_safely`). The arguments every family shares are checked first
    (`linvit.layers.arguments.check_creation_arguments`; ``out_indices`` by the frame's feature taps)."""
    check_creation_arguments(variant, **kwargs)
    out_indices = kwargs.pop("out_indices", default_out_indices)
    filter_fn = getattr(sys.modules[model_cls.__module__], "checkpoint_filter_fn", None)
    return build_model_loading_safely(
        model_cls,
        variant,
        pretrained,
        pretrained_filter_fn=filter_fn,
        feature_cfg={"feature_cls": "getter", "out_indices": out_indices},
        **kwargs,
    )
