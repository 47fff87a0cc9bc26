"""FLatten-CSwin: CSWin Transformer with focused linear attention in its first two stages (FLatten, ICCV 2023).

Papers:
* FLatten Transformer: Vision Transformer using Focused Linear Attention - https://arxiv.org/abs/2308.00442
* CSWin Transformer: A General Vision Transformer Backbone with Cross-Shaped Windows - https://arxiv.org/abs/2107.00652

Architecture as in the FLatten authors' release (LeapLabTHU/FLatten-Transformer, `attn_type: LLSS`):
- stem: 7x7/4 convolution + LayerNorm; between stages a 3x3/2 convolution + LayerNorm doubling the channels;
- every block: `qkv` Linear at block level, the attention branches, `proj`, then an MLP;
- linear ("L") blocks, stages 1-2: their stripe (`la_split_size`, 56-28-14-7 at 224, 96-48-24-12 at 384) equals the
  stage resolution, so each block is ONE global focused linear attention over all channels and heads (learnable
  positional encoding on k, shared 5x5 depthwise conv on v) plus CSWin's locally-enhanced positional encoding: a 3x3
  depthwise conv of v (`get_v`) added to the output. With ``la_split_size`` narrower than a stage's map at
  ``img_size`` (the authors' models built at 448 keep 56-28-14-7), such a block has two branches, as theirs: half
  the channels and heads in vertical stripes (map height x split), half in horizontal ones, each with its own tables;
- softmax ("S") blocks, stages 3-4: CSWin's cross-shaped window attention with LePE: in stage 3 half the channels
  and heads attend within vertical stripes (full height x `split_size` columns), the other half within horizontal
  stripes; in stage 4 one branch attends over the whole map;
- final LayerNorm, average of the tokens, linear classifier.

Any input size: the linear blocks resize their positional encoding to the map (bicubic); the stripe attention pads
the map to a multiple of the stripe width and masks the padded keys out of the softmax (padded values are zeros,
exactly the LePE convolution's own zero padding at the border), then crops. The structure (branches per block) is
fixed by the stage index, not by `img_size`, so any checkpoint loads at any resolution; only ``la_split_size`` makes
the linear stages' branches depend on the maps at ``img_size``, as the authors' code does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from timm.layers import DropPath, LayerNorm2d
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import (
    FocusedLinearLePEAttention,
    LePEAttention,
    StripeBranches,
    resize_positional_table,
    stage_attention_specs,
    stripe_branches,
)
from linvit.attention.stripe import stripe_window
from linvit.layers import (
    ClassifierHeadMixin,
    Mlp,
    StagedBackbone,
    TokenStage,
    conv_grids,
    drop_path_rates,
    init_linear_weights,
    stage_attention_kwargs,
)
from linvit.models._family import (
    CreationOptionsError,
    PretrainedFileMixin,
    authors_release,
    create_family_model,
    family_cfg,
    is_converted,
    one_based_stage,
    positive_per_stage,
    rename_keys,
    resize_positional_encodings,
    spell_options,
    unwrap_checkpoint,
)

__all__ = ["FlattenCSwin", "FlattenCSwinBlock", "LePEAttention", "checkpoint_filter_fn"]

# The 7x7/4 stem (padding 2) gives an empty map below 3x3; from 3x3 up every stage has at least one token.
MIN_INPUT_SIZE = (3, 3)
# the authors' per-stage letters (`attn_type: LLSS`): L = focused linear attention, S = stripe softmax
ATTN_ALIASES = {"L": "focused", "S": "stripe"}
# what each kind's branches take (the block owns qkv and proj)
_BRANCH_ARGUMENTS = {
    "focused": ("pos_size", "focusing_factor", "dwc_kernel_size"),
    "stripe": ("split_size", "directions", "attn_drop"),
}


def _attention_branches(name: str, dim: int, num_heads: int, kwargs: dict[str, Any], device=None, dtype=None):
    """The branches of a block of attention ``name`` ("focused" or "stripe") from its stage's keywords.

    A focused stage with a ``linear_split`` (the authors' ``la_split_size``) has a vertical and a horizontal branch
    of stripes that wide, each on half the channels and heads, with tables of one stripe of the map ``pos_size``.
    """
    if name == "focused":
        options = (kwargs["focusing_factor"], kwargs["dwc_kernel_size"], device, dtype)
        split = kwargs.get("linear_split")
        if split is None:
            return StripeBranches([FocusedLinearLePEAttention(dim, num_heads, kwargs["pos_size"], *options)])
        if dim % 2 or num_heads % 2:
            raise ValueError(
                f"two stripe branches split dim={dim} and num_heads={num_heads} evenly; use multiples of 2, or no "
                "la_split_size for this stage."
            )
        return StripeBranches(
            [
                FocusedLinearLePEAttention(
                    dim // 2,
                    num_heads // 2,
                    stripe_window(direction, split, kwargs["pos_size"]),
                    *options,
                    direction=direction,
                    split_size=split,
                )
                for direction in ("vertical", "horizontal")
            ]
        )
    return stripe_branches(
        dim, num_heads, kwargs["split_size"], kwargs["directions"], kwargs["attn_drop"], device=device, dtype=dtype
    )


class FlattenCSwinBlock(nn.Module):
    """CSWin block: LN -> qkv -> attention branches -> proj, residual; LN -> MLP, residual.

    ``attention`` is "focused" (one branch of focused linear attention with LePE over the whole map) or "stripe"
    (cross-shaped stripe branches), with the stage's keywords ``attn_kwargs``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str,
        attn_kwargs: dict[str, Any],
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attns = _attention_branches(attention, dim, num_heads, attn_kwargs, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        attended = self.attns(self.qkv(self.norm1(x)), hw)
        x = x + self.drop_path(self.proj_drop(self.proj(attended)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvNorm(nn.Module):
    """Strided convolution + LayerNorm over channels: CSwin's stem (7x7/4, pad 2) and Merge_Block (3x3/2, pad 1)."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int, device=None, dtype=None):
        super().__init__()
        padding = (kernel_size - stride + 1) // 2  # 2 for the 7x7/4 stem, 1 for the 3x3/2 merges, as CSwin
        self.conv = nn.Conv2d(in_chans, out_chans, kernel_size, stride, padding, device=device, dtype=dtype)
        self.norm = LayerNorm2d(out_chans, eps=1e-5, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class FlattenCSwin(PretrainedFileMixin, ClassifierHeadMixin, StagedBackbone):
    """FLatten-CSwin backbone and classifier. Features are NCHW at strides 4, 8, 16, 32.

    ``attn_layers``: "focused" or "stripe" per stage (or the authors' letters, ``"LLSS"``); ``split_size``: the
    stripe width per stage (the last stage's stripes cover the whole map, as CSwin's).

    ``la_split_size``: the stripe width of the linear ("focused") stages, per stage, or the authors' string
    (``"56-28-14-7"``). None (default): every linear block attends over its whole map, which is what the authors'
    stripes do at their native size (the stripe is the map). Given, a linear stage whose map at ``img_size`` is
    not its stripe (and is not the last stage) gets two stripe branches, as in the authors' code: 56-28-14-7 at 448
    gives stage 1 vertical 112x56 and horizontal 56x112 stripes. Their checkpoints built that way load only into a
    model built that way (``img_size`` and ``la_split_size`` of their config).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 64,
        depths: Sequence[int] = (2, 4, 18, 1),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        split_size: Sequence[int] = (1, 2, 7, 7),
        attn_layers: Any = "LLSS",
        la_split_size: Sequence[int] | str | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__(in_chans, num_classes, global_pool, img_size, MIN_INPUT_SIZE)
        dd = {"device": device, "dtype": dtype}
        self.num_stages = num_stages = len(depths)
        if not (len(num_heads) == len(split_size) == num_stages):
            raise ValueError(
                f"depths {tuple(depths)}, num_heads {tuple(num_heads)} and split_size {tuple(split_size)} need one "
                "entry per stage; give them the same length."
            )
        specs = stage_attention_specs(attn_layers, num_stages, self.model_name, ATTN_ALIASES, tuple(_BRANCH_ARGUMENTS))
        self.attn_layers = tuple(name for name, _ in specs)
        self.la_split_size = _linear_splits(la_split_size, num_stages)
        dims = [embed_dim * 2**i for i in range(num_stages)]
        self.num_features = self.head_hidden_size = dims[-1]

        self.stem = ConvNorm(in_chans, embed_dim, 7, 4, **dd)
        grids = self.stage_grids(self.img_size)
        stages = []
        for i, rates in enumerate(drop_path_rates(drop_path_rate, depths)):
            name, explicit = specs[i]
            options = {
                "focusing_factor": focusing_factor,
                "dwc_kernel_size": dwc_kernel_size,
                "split_size": split_size[i],
                "directions": ("full",) if i == num_stages - 1 else ("vertical", "horizontal"),
                "attn_drop": attn_drop_rate,
            }
            unknown = sorted(set(explicit) - set(_BRANCH_ARGUMENTS[name]))
            if unknown:
                raise TypeError(
                    f"FlattenCSwin's {name!r} stages take {', '.join(_BRANCH_ARGUMENTS[name])} in a spec, got "
                    f"{', '.join(unknown)}."
                )
            attn_kwargs = stage_attention_kwargs(name, explicit, options, pos_size=grids[i])
            if name == "focused":
                attn_kwargs["linear_split"] = self.linear_split(i, grids[i])
            downsample = ConvNorm(dims[i - 1], dims[i], 3, 2, **dd) if i > 0 else None
            blocks = [
                FlattenCSwinBlock(
                    dims[i],
                    num_heads[i],
                    name,
                    attn_kwargs,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop_rate,
                    drop_path=rate,
                    **dd,
                )
                for rate in rates
            ]
            stages.append(TokenStage(blocks, downsample))
            self.add_feature_info(dims[i], 4 * 2**i)
        norm = nn.LayerNorm(self.num_features, eps=1e-5, **dd)
        self.add_stages_norm_head(stages, norm, num_classes, global_pool, drop_rate, **dd)
        self.apply(init_linear_weights)

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """7x7/4 stem with padding 2, then 3x3/2 merges with padding 1."""
        return conv_grids(img_size, self.num_stages, stem=(7, 4, 2), downsample=(3, 2, 1))

    def linear_split(self, stage: int, grid: tuple[int, int]) -> int | None:
        """The stripe width of linear stage ``stage`` with a map of ``grid`` at ``img_size``: None (one branch over the
        whole map) without ``la_split_size``, in the last stage, or where the stripe is the map (the authors'
        ``patches_resolution == split_size``); else ``la_split_size[stage]``."""
        if self.la_split_size is None or stage == self.num_stages - 1:
            return None
        split = self.la_split_size[stage]
        return None if grid == (split, split) else split

    def resize_tables(self, img_size: tuple[int, int]) -> None:
        """Each linear branch's positional table to its stripe (or whole map) at ``img_size`` (bicubic)."""
        for stage, grid in zip(self.stage_modules(), self.stage_grids(img_size)):
            for module in stage.modules():
                if isinstance(module, FocusedLinearLePEAttention):
                    module.set_grid(grid)


def _linear_splits(la_split_size: Sequence[int] | str | None, num_stages: int) -> tuple[int, ...] | None:
    """``la_split_size`` as one positive int per stage (the authors write "56-28-14-7"), or None."""
    if la_split_size is None:
        return None
    parts = la_split_size.split("-") if isinstance(la_split_size, str) else la_split_size
    return positive_per_stage(
        parts,
        num_stages,
        f"la_split_size needs one positive stripe width per stage ({num_stages}), got {la_split_size!r}; e.g. "
        f"'56-28-14-7' or (56, 28, 14, 7).",
    )


_BRANCH_KEY = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.attns\.(\d+)\.")


def _checkpoint_branches(state_dict: dict[str, torch.Tensor]) -> dict[tuple[int, int], dict[int, str]]:
    """Per block (stage, index) of a linvit-layout state dict: its branches, each "linear" or "stripe" by its keys."""
    blocks: dict[tuple[int, int], dict[int, str]] = {}
    for key in state_dict:
        match = _BRANCH_KEY.match(key)
        if match:
            stage, index, branch = (int(group) for group in match.groups())
            kinds = blocks.setdefault((stage, index), {})
            if ".focused." in key or kinds.get(branch) == "linear":
                kinds[branch] = "linear"
            else:
                kinds[branch] = "stripe"
    return blocks


def _stage_options(blocks: dict[tuple[int, int], dict[int, str]]) -> dict[str, str]:
    """The ``attn_layers`` of a checkpoint's blocks (`_checkpoint_branches`): L where a stage's blocks attend in
    linear branches, else S."""
    letters: dict[int, str] = {}
    for (stage, _), kinds in sorted(blocks.items()):
        letters[stage] = "L" if "linear" in kinds.values() else "S"
    return {"attn_layers": "".join(letters[stage] for stage in sorted(letters))}


def _structure_error(
    stage: int,
    theirs: dict[int, str],
    branches: StripeBranches,
    grid: tuple[int, int],
    state_dict_branches: dict[tuple[int, int], dict[int, str]],
) -> str:
    """One sentence on how a block's branches differ between checkpoint and model, and how to build a model that
    fits (the loader reports a filter's first sentence)."""
    ours = ["linear" if isinstance(branch, FocusedLinearLePEAttention) else "stripe" for branch in branches]
    kinds = {"linear": "focused linear attention", "stripe": "stripe softmax attention"}
    if set(theirs.values()) != set(ours):
        return (
            f"stage {stage + 1} of the checkpoint is {kinds[next(iter(theirs.values()))]} but stage {stage + 1} of the "
            f"model is {kinds[ours[0]]}: build the model with the checkpoint's attention per stage, "
            f"{spell_options(_stage_options(state_dict_branches))} (L = linear, S = stripe softmax)"
        )
    if ours == ["linear"]:
        return (
            f"stage {stage + 1} of the checkpoint attends in {len(theirs)} linear stripe branches (the authors' "
            f"la_split_size narrower than the map) but the model in one branch over its whole {grid[0]}x{grid[1]} map: "
            "build the model with the checkpoint's la_split_size and img_size, e.g. la_split_size='56-28-14-7', "
            "img_size=448 for their config at 448"
        )
    if ours[0] == "linear":
        split = branches[0].split_size
        return (
            f"stage {stage + 1} of the checkpoint attends in one linear branch over the whole map but the model in "
            f"{len(ours)} stripe branches ({split} wide on its {grid[0]}x{grid[1]} map at img_size): build the model "
            "without la_split_size, or at the img_size the checkpoint was trained at, where its stripes are the map"
        )
    return (
        f"stage {stage + 1} of the checkpoint has {len(theirs)} stripe branches per block but the model "
        f"{len(ours)}: build the model with the checkpoint's stage layout (depths, attn_layers)"
    )


def _match_branches(state_dict: dict[str, torch.Tensor], model: FlattenCSwin) -> dict[str, torch.Tensor]:
    """Check that every block has the model's branches; ValueError naming the difference otherwise.

    One case converts exactly: a stripe-softmax block that the authors built with one branch over the whole map
    (their blocks whose map equals the stripe width, e.g. stage 3 of a 112 input) equals linvit's two branches whose
    stripes cover that map, with half the channels and heads each: its LePE weights are split between them.
    """
    grids = model.stage_grids(model.img_size)
    blocks = _checkpoint_branches(state_dict)
    for (stage, index), theirs in blocks.items():
        if stage >= len(model.stages) or index >= len(model.stages[stage].blocks):
            continue  # the loader reports blocks the model lacks
        branches = model.stages[stage].blocks[index].attns
        if len(theirs) == len(branches) and all(
            theirs.get(i) == ("linear" if isinstance(branch, FocusedLinearLePEAttention) else "stripe")
            for i, branch in enumerate(branches)
        ):
            continue
        halves = [branch.direction for branch in branches] == ["vertical", "horizontal"]
        prefix = f"stages.{stage}.blocks.{index}.attns."
        if theirs == {0: "stripe"} and halves and isinstance(branches[0], LePEAttention):
            for suffix in ("get_v.weight", "get_v.bias"):
                first, second = state_dict.pop(prefix + "0." + suffix).chunk(2)
                state_dict[prefix + "0." + suffix], state_dict[prefix + "1." + suffix] = first, second
            continue
        message = _structure_error(stage, theirs, branches, grids[stage], blocks)
        ours = {"linear" if isinstance(branch, FocusedLinearLePEAttention) else "stripe" for branch in branches}
        if set(theirs.values()) != ours:  # another kind of attention: attn_layers builds the checkpoint's
            raise CreationOptionsError(message, _stage_options(blocks))
        raise ValueError(message)
    return state_dict


def _resize_stripe_tables(state_dict: dict[str, torch.Tensor], model: FlattenCSwin) -> dict[str, torch.Tensor]:
    """Stripe branches' positional tables at the model's stripe grid (bicubic). A checkpoint's stripe is taken to be
    as wide as the model's (the same ``la_split_size``): vertical tables of n positions are (n / split, split)."""
    for name, branch in model.named_modules():
        if not isinstance(branch, FocusedLinearLePEAttention) or branch.direction == "full":
            continue
        key = f"{name}.focused.positional_encoding"
        table = state_dict.get(key)
        if table is None or table.shape[1:] == branch.focused.positional_encoding.shape[1:]:
            continue
        positions, split = table.shape[1], branch.split_size
        if positions % split:
            raise ValueError(
                f"{key} has {positions} positions, not a whole number of {split}-wide stripe rows: the checkpoint's "
                f"la_split_size differs from the model's ({split} in this stage); build the model with its own"
            )
        grid = (positions // split, split) if branch.direction == "vertical" else (split, positions // split)
        state_dict[key] = resize_positional_table(table, grid, branch.focused.pos_size)
    return state_dict


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-CSwin checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Renames `stage1_conv_embed.{0,2}` -> `stem.{conv,norm}`, `merge{s}` -> `stages.{s}.downsample`,
    `stage{s}.{j}` -> `stages.{s-1}.blocks.{j}`, a linear branch's `attns.{b}.{scale,positional_encoding,dwc}` ->
    `attns.{b}.focused.*`, `head` -> `head.fc`; checks that every block has the model's branches (`_match_branches`:
    a ValueError names a difference, e.g. stripe branches from ``la_split_size``), and resizes the linear branches'
    positional encodings when the model was built for another resolution.
    """
    state_dict = unwrap_checkpoint(state_dict)
    if is_converted(state_dict):
        state_dict = dict(state_dict)
    else:
        rules = [
            (r"stage1_conv_embed\.0\.", "stem.conv."),
            (r"stage1_conv_embed\.2\.", "stem.norm."),
            (r"^merge(\d+)\.", r"stages.\1.downsample."),
            (r"^stage(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
            (r"\.attns\.(\d+)\.(scale|positional_encoding|dwc\.)", r".attns.\1.focused.\2"),
            (r"^head\.", "head.fc."),
        ]
        state_dict = rename_keys(state_dict, rules)
    state_dict = _resize_stripe_tables(_match_branches(state_dict, model), model)
    return resize_positional_encodings(state_dict, model)


def _create_flatten_cswin(variant: str, pretrained: bool = False, **kwargs) -> FlattenCSwin:
    return create_family_model(FlattenCSwin, variant, pretrained, **kwargs)


def _cfg(**kwargs) -> dict[str, Any]:
    return family_cfg(
        first_conv="stem.conv", license="mit", paper_ids=["arXiv:2308.00442", "arXiv:2107.00652"], **kwargs
    )


# Of this family the authors released only FLatten-CSwin-T (Tsinghua Cloud link in `origin_url`; timm cannot fetch it
# itself: the link has no file name). Download it and load it with
# pretrained_cfg_overlay=dict(file="path/to/flatten_cswin_tiny.pth").
default_cfgs = generate_default_cfgs(
    {
        "flatten_cswin_tiny_224.in1k": _cfg(
            **authors_release(
                "https://cloud.tsinghua.edu.cn/f/48ba765ba8b0451d9d5a/?dl=1", "83.1% top-1, its 'model' weights"
            )
        ),
        "flatten_cswin_small_224.in1k": _cfg(),
        "flatten_cswin_base_224.in1k": _cfg(),
        "flatten_cswin_base_384.in1k": _cfg(input_size=(3, 384, 384), pool_size=(12, 12), crop_pct=1.0),
    }
)


@register_model
def flatten_cswin_tiny_224(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-T: 21.2M params, 4.32G MACs, 83.1% ImageNet-1k top-1 (published)."""
    args = {"embed_dim": 64, "depths": (2, 4, 18, 1), "num_heads": (2, 4, 8, 16), "split_size": (1, 2, 7, 7)}
    return _create_flatten_cswin("flatten_cswin_tiny_224", pretrained, **dict(args, **kwargs))


@register_model
def flatten_cswin_small_224(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-S (CSWin-S depths 2, 4, 32, 2)."""
    args = {"embed_dim": 64, "depths": (2, 4, 32, 2), "num_heads": (2, 4, 8, 16), "split_size": (1, 2, 7, 7)}
    return _create_flatten_cswin("flatten_cswin_small_224", pretrained, **dict(args, **kwargs))


@register_model
def flatten_cswin_base_224(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-B (CSWin-B: width 96, depths 3, 6, 29, 2)."""
    args = {"embed_dim": 96, "depths": (3, 6, 29, 2), "num_heads": (4, 8, 16, 32), "split_size": (1, 2, 7, 7)}
    return _create_flatten_cswin("flatten_cswin_base_224", pretrained, **dict(args, **kwargs))


@register_model
def flatten_cswin_base_384(pretrained: bool = False, **kwargs) -> FlattenCSwin:
    """FLatten-CSwin-B at 384 (stripes 12 in stages 3-4, linear tables 96x96 / 48x48)."""
    args = {
        "img_size": 384,
        "embed_dim": 96,
        "depths": (3, 6, 29, 2),
        "num_heads": (4, 8, 16, 32),
        "split_size": (1, 2, 12, 12),
    }
    return _create_flatten_cswin("flatten_cswin_base_384", pretrained, **dict(args, **kwargs))
