"""What the FLatten PVT, PVTv2 and CSwin families share: stage geometry, positional tables, checkpoint mapping.

- `drop_path_rates`, `conv_stage_grids`: per-block stochastic depth and the token grid of every stage;
- `set_attention_grid` (a built model) and `resize_tables_to_model` (a checkpoint): resize the learnable positional
  encodings of `FocusedLinearAttention` to another grid;
- `unwrap_checkpoint`, `fuse_q_kv`: the authors' training files and their separate `q` / `kv` projections;
- `flatten_cfg`, `create_flatten_model`: the pretrained cfg and the timm builder call every FLatten family shares.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn

from linvit.attention import resize_positional_table
from linvit.models._checkpoint import build_model_loading_safely, extract_model_state_dict

__all__ = [
    "conv_stage_grids",
    "create_flatten_model",
    "drop_path_rates",
    "flatten_cfg",
    "fuse_q_kv",
    "is_converted",
    "one_based_stage",
    "rename_keys",
    "resize_tables_to_model",
    "set_attention_grid",
    "stage_model_cfg",
    "unwrap_checkpoint",
]


def drop_path_rates(drop_path_rate: float, num_blocks: int) -> list[float]:
    """Stochastic-depth rate of every block, rising linearly from 0 (plain Python: works under the meta device)."""
    if num_blocks <= 1:
        return [0.0] * num_blocks
    return [drop_path_rate * i / (num_blocks - 1) for i in range(num_blocks)]


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def conv_stage_grids(img_size: tuple[int, int], num_stages: int, stem_padding: int) -> list[tuple[int, int]]:
    """Token grid of every stage behind a 7x7/4 stem (padding `stem_padding`) and 3x3/2 downsamplings (padding 1)."""
    h, w = _conv_out(img_size[0], 7, 4, stem_padding), _conv_out(img_size[1], 7, 4, stem_padding)
    grids = [(h, w)]
    for _ in range(num_stages - 1):
        h, w = _conv_out(h, 3, 2, 1), _conv_out(w, 3, 2, 1)
        grids.append((h, w))
    return grids


def set_attention_grid(attn: nn.Module, new_size: tuple[int, int]) -> None:
    """Resize a `FocusedLinearAttention`'s learnable positional encoding to a new (h, w) grid in place."""
    old_size = tuple(attn.pos_size)
    new_size = tuple(new_size)
    if old_size == new_size:
        return
    old = attn.positional_encoding
    with torch.no_grad():
        resized = resize_positional_table(old.data, old_size, new_size)
    attn.positional_encoding = nn.Parameter(resized, requires_grad=old.requires_grad)
    attn.pos_size = new_size


def resize_tables_to_model(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Resize every `positional_encoding` whose token count differs from the model's (grid from the model)."""
    grids = {name: tuple(module.pos_size) for name, module in model.named_modules() if hasattr(module, "pos_size")}
    target = model.state_dict()
    for key, value in list(state_dict.items()):
        if not key.endswith("positional_encoding") or key not in target:
            continue
        if value.shape == target[key].shape:
            continue
        new_size = grids[key[: -len(".positional_encoding")]]
        tokens = value.shape[1]
        side = int(round(tokens**0.5))
        if side * side != tokens:
            raise ValueError(
                f"cannot resize {key} of shape {tuple(value.shape)}: its {tokens} tokens are not a square grid; "
                "convert it at the resolution it was trained at."
            )
        state_dict[key] = resize_positional_table(value, (side, side), new_size)
    return state_dict


def unwrap_checkpoint(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model weights of an authors' training file (`model`, `state_dict_ema`, ...); a state dict as it is."""
    if "model" in checkpoint or "state_dict_ema" in checkpoint or "state_dict" in checkpoint:
        return extract_model_state_dict(checkpoint)
    return checkpoint


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


def is_converted(state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict is already in linvit's layout (its stages under `stages.`), not the authors'."""
    return any(key.startswith("stages.") for key in state_dict)


def one_based_stage(template: str) -> Callable[[re.Match], str]:
    """A `re.sub` replacement for the authors' 1-based stage numbers: group 1 becomes `{stage}` (0-based) and group 2,
    if any, `{index}` in `template`."""

    def replace(match: re.Match) -> str:
        index = match.group(2) if match.re.groups > 1 else ""
        return template.format(stage=int(match.group(1)) - 1, index=index)

    return replace


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


def flatten_cfg(**kwargs: Any) -> dict[str, Any]:
    """A FLatten family's pretrained cfg: ImageNet defaults at 224, any input size, the model's own (safe) loader;
    `kwargs` add the family's own fields or override these."""
    return {
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "paper_name": "FLatten Transformer: Vision Transformer using Focused Linear Attention",
        # the released weights are the authors' training checkpoints; the model reads them itself (safely)
        "custom_load": True,
        **kwargs,
    }


def stage_model_cfg(first_conv: str, license: str, paper_id: str, **kwargs: Any) -> dict[str, Any]:
    """`flatten_cfg` of the pyramid families with a timm `ClassifierHead` (PVT, PVTv2, CSwin): 7x7 final map, crop
    0.9, the FLatten paper and the base architecture's `paper_id`."""
    return flatten_cfg(
        **{
            "pool_size": (7, 7),
            "crop_pct": 0.9,
            "first_conv": first_conv,
            "classifier": "head.fc",
            "license": license,
            "paper_ids": ["arXiv:2308.00442", paper_id],
            **kwargs,
        }
    )


def create_flatten_model(
    model_cls: type,
    variant: str,
    pretrained: bool,
    filter_fn: Any,
    default_out_indices: Any,
    flatten_sequential: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """timm's `build_model_with_cfg` for a FLatten family: `filter_fn` converts checkpoints, `features_only` gets
    timm's getter over `forward_intermediates` (`out_indices` from kwargs, else `default_out_indices`), and a
    pretrained file is routed to the model's own loader (``trusted=True`` in kwargs: see build_model_loading_safely)."""
    out_indices = kwargs.pop("out_indices", default_out_indices)
    feature_cfg = {"flatten_sequential": True} if flatten_sequential else {}
    feature_cfg.update(feature_cls="getter", out_indices=out_indices)
    return build_model_loading_safely(
        model_cls, variant, pretrained, pretrained_filter_fn=filter_fn, feature_cfg=feature_cfg, **kwargs
    )
