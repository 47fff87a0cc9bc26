"""FLatten-Swin: Swin Transformer with focused linear attention in its high-resolution stages.

FLatten Transformer: Vision Transformer using Focused Linear Attention (Han et al., ICCV 2023, arXiv 2308.00442).
Stages 1-2 use focused linear attention inside a large "linear window" (56 at 224, 96 at 384) clamped to the
feature map, i.e. one global window without shift at the native resolution; stages 3-4 keep Swin's shifted-window
softmax attention (window 7, 12 at 384) with relative position bias. Loads the authors' released checkpoints.

Shifts, as the authors' blocks: every second block of a stage shifts its windows by half the window where the map is
larger than the window. Softmax blocks mask the shifted regions (Swin); linear blocks roll the map without a mask
(`ShiftedLinearBlock`: the authors' code passes the mask to the linear attention, which ignores it), so at 448 input
(768 for B-384) stage 1 of the authors' model alternates plain and rolled 56x56 linear windows.

Resolution policy (any input size; non-square and not a multiple of 32 is fine, padding happens inside):
- ``img_size`` at creation sets the positional-encoding grid of each linear stage to its feature map at that size,
  clamped to the linear window; so a model created for 512 keeps 56x56 linear windows in stage 1 (the config's
  window), and one created for 160 holds a 40x40 table.
- At run time a linear stage whose map is larger than its table splits into padded windows of the table's size
  (linear cost, no interpolation); a map smaller than the table in some dimension attends globally over that
  dimension with the table interpolated bicubically. ``set_input_size(img_size=...)`` resizes the tables instead.
- Softmax stages keep their window (clamped to the map, without shift, when the map is not larger than it) and its
  relative position table: a clamped window uses the table's central offsets.

Layout differences to the authors' code, mapped by :func:`checkpoint_filter_fn`: patch merging sits at the start
of the next stage (``layers.{i+1}.downsample``, as in timm's Swin) instead of the end of the current one, so stage
outputs are at their own resolution; ``relative_position_index`` / ``attn_mask`` are computed, not stored. Built below
its native size, the authors' model shrinks a softmax window to its map and the relative position table with it
(window 6 of a 96 input: an 11x11 table); linvit keeps the configured table and places such a table in its centre,
where a clamped window reads it (see :func:`checkpoint_filter_fn`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import PatchEmbed, to_2tuple
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import (
    attention_kind,
    shifted_block_kwargs,
    stage_attention_specs,
)
from linvit.attention.positional import resize_positional_table, square_grid
from linvit.layers import (
    LinearHeadMixin,
    PreNormBlock,
    StagedBackbone,
    TokenStage,
    conv_grids,
    drop_path_rates,
    family_attention_options,
    init_linear_weights,
    stage_attention_kwargs,
)
from linvit.models._family import (
    CreationOptionsError,
    PretrainedFileMixin,
    create_family_model,
    family_cfg,
    resize_positional_encodings,
    unwrap_checkpoint,
)
from linvit.models.flatten_swin_checkpoint import (
    DROPPED_SUFFIXES,
    check_stage_attention,
    fit_relative_position_tables,
    shrunk_window_stages,
)
from linvit.ops.windows import exporting, wrap_index

__all__ = [
    "FlattenSwin",
    "PatchMerging",
    "ShiftedLinearBlock",
    "checkpoint_filter_fn",
    "roll_linear_windows",
    "swin_stage_specs",
]

torch.fx.wrap("resize_positional_table")  # ape: the table resized to a traced patch grid (one call under FX)

# the authors' per-stage letters: L = focused linear attention (in a linear window), S = shifted-window softmax;
# M (mixed) takes a count k: the stage's first k blocks are L, the rest S
ATTN_ALIASES = {"L": "focused", "S": "window"}
_MIXED = re.compile(r"^M(\d+)$")


def swin_stage_specs(attn_layers: Any, num_stages: int) -> list[tuple[str, dict[str, Any], int | None]]:
    """(registry name, keyword arguments, k or None) per stage of ``attn_layers``: names, specs and the letters L/S as
    `stage_attention_specs` reads them, plus the authors' mixed stages, whose first k blocks are focused linear
    attention and the rest window softmax (the name is then "focused", for the first blocks).

    Mixed stages are spelled as the authors' ``attn_type``: one letter per stage, then the count, which every ``M``
    stage takes (``"LLMS4"``: stage 3 has 4 linear blocks, then softmax ones); or an ``"M4"`` entry in a sequence
    (``("L", "L", "M4", "S")``).
    """
    if isinstance(attn_layers, str) and "M" in attn_layers[:num_stages]:
        letters, count = attn_layers[:num_stages], attn_layers[num_stages:]
        if len(letters) != num_stages or not set(letters) <= {"L", "S", "M"} or not count.isdigit():
            raise ValueError(
                f"FlattenSwin attn_layers {attn_layers!r}: a mixed stage (M) is spelled as the authors' attn_type, one "
                f"letter L, S or M per stage ({num_stages}) then the count of linear blocks of the M stages, e.g. "
                f"{'LLMS4' if num_stages == 4 else 'M' * num_stages + '1'!r}; or a sequence with 'M4' entries."
            )
        attn_layers = [f"M{count}" if letter == "M" else letter for letter in letters]
    mixed: list[int | None] = [None] * num_stages
    if not isinstance(attn_layers, (str, Mapping)):
        entries = list(attn_layers)
        for i, entry in enumerate(entries[:num_stages]):
            match = _MIXED.match(entry) if isinstance(entry, str) else None
            if match:
                mixed[i], entries[i] = int(match.group(1)), "focused"
        attn_layers = entries
    specs = stage_attention_specs(attn_layers, num_stages, "FlattenSwin", ATTN_ALIASES)
    return [(name, explicit, count) for (name, explicit), count in zip(specs, mixed)]


class PatchMerging(nn.Module):
    """2x2 neighbour concatenation, LayerNorm and a linear reduction (Swin's down-sampling); pads odd maps.

    (B, C, H, W) -> (B, C_out, ceil(H/2), ceil(W/2)) in channels-last memory. The concatenation order (top-left,
    bottom-left, top-right, bottom-right) is Swin's, so the authors' ``reduction`` / ``norm`` weights apply unchanged.
    """

    def __init__(
        self,
        in_chans: int,
        out_chans: int | None = None,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.in_chans = in_chans
        self.out_chans = out_chans or 2 * in_chans
        self.norm = norm_layer(4 * in_chans, **dd)
        self.reduction = nn.Linear(4 * in_chans, self.out_chans, bias=False, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        x = F.pad(x, (0, W % 2, 0, H % 2))
        x = x.reshape(B, C, (H + 1) // 2, 2, (W + 1) // 2, 2)
        # (B, H/2, W/2, w-offset, h-offset, C): flattening gives Swin's [x00, x10, x01, x11] channel blocks
        x = x.permute(0, 2, 4, 5, 3, 1).flatten(3)
        return self.reduction(self.norm(x)).permute(0, 3, 1, 2)


@torch.fx.wrap  # branches on the map size: FX records one call
def roll_linear_windows(x: torch.Tensor, hw: tuple[int, int], window: tuple[int, int], forward: bool) -> torch.Tensor:
    """Roll (B, N, C) tokens of an (H, W) map by minus half the window (``forward``) or back, along each dimension
    where the map is larger than the window; other dimensions (one window wide) and smaller maps stay as they are."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if exporting():  # symbolic sizes: the same roll as one gather, the shift as arithmetic on the sizes
            return _roll_tokens_symbolic(x, hw, window, forward)
    shift_h = window[0] // 2 if hw[0] > window[0] else 0
    shift_w = window[1] // 2 if hw[1] > window[1] else 0
    if shift_h == 0 and shift_w == 0:
        return x
    if forward:
        shift_h, shift_w = -shift_h, -shift_w
    grid = x.reshape(x.shape[0], hw[0], hw[1], x.shape[-1])
    return torch.roll(grid, (shift_h, shift_w), (1, 2)).reshape(x.shape)


def _roll_tokens_symbolic(x: torch.Tensor, hw: tuple[int, int], window: tuple[int, int], forward: bool) -> torch.Tensor:
    """`roll_linear_windows` without branches on the sizes (torch.export with dynamic H, W): shift = half the window
    times min(max(H - window, 0), 1), so zero where the map is not larger, and the roll is an index_select."""
    height, width = hw
    shift_h = (window[0] // 2) * torch.sym_min(torch.sym_max(height - window[0], 0), 1)
    shift_w = (window[1] // 2) * torch.sym_min(torch.sym_max(width - window[1], 0), 1)
    if not forward:
        shift_h, shift_w = -shift_h, -shift_w
    token = torch.arange(height * width, device=x.device)
    row = torch.div(token, width, rounding_mode="floor")
    col = token - row * width
    index = wrap_index(row + shift_h, height) * width + wrap_index(col + shift_w, width)
    return x.index_select(1, index)


class ShiftedLinearBlock(PreNormBlock):
    """A pre-norm block whose windowed linear attention sees the map rolled by half its window (the authors' shifted
    linear blocks: a cyclic shift without a mask, so windows at the border join both edges of the map).

    The attention is a `FocusedLinearAttention` with a ``window_size``; the roll applies along each dimension where
    the map is larger than that window (padding for maps that are no multiple of it comes after the roll).
    """

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        window = self.attn.window_size
        assert window is not None
        attended = self.attn(roll_linear_windows(self.norm1(x), hw, window, True), hw)
        x = x + self.drop_path1(roll_linear_windows(attended, hw, window, False))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class FlattenSwin(PretrainedFileMixin, LinearHeadMixin, StagedBackbone):
    """FLatten-Swin backbone and classifier (timm-native).

    Args:
        img_size: input size the positional encodings of the linear stages are sized for (see module docstring).
        patch_size: stem patch size.
        in_chans: input channels.
        num_classes: classifier classes (0 = no classifier).
        global_pool: ``"avg"`` or ``""`` (no pooling; ``forward`` then returns NCHW maps).
        embed_dim: channels of stage 1 (doubled at every stage).
        depths, num_heads: blocks and heads per stage.
        attn_layers: the attention of each stage (see ``linvit.attention.ATTENTION_NAMES``; the authors' letters
            ``"L"``/``"S"`` or ``"LLSS"`` are accepted). Linear kinds ("focused", ...) attend within the linear
            window with a positional table of its size; windowed kinds ("window", "hybrid") use ``window_size`` and
            shift every other block. The authors' mixed stages: ``"LLMS4"`` (their ``attn_type``: a letter per
            stage, then the count) or an ``"M4"`` entry make a stage's first 4 blocks focused linear attention and
            the rest window softmax; every block keeps its index's shift (`swin_stage_specs`).
        linear_window_size: the linear window (56 at 224, 96 at 384 in the paper), clamped to each feature map.
        window_size: softmax window (7, or 12 at 384).
        mlp_ratio, qkv_bias: block widths and qkv bias.
        focusing_factor: focusing power p (3 in the paper).
        dwc_kernel_size: kernel of the depthwise-convolution enhancement (5).
        drop_rate: dropout before the classifier; proj_drop_rate: after attention projections and MLPs (the
            authors' ``drop_rate``); attn_drop_rate: attention dropout; drop_path_rate: stochastic depth, linearly
            increasing over blocks.
        ape: the authors' (Swin's) absolute position embedding ``absolute_pos_embed`` (1, patches, embed_dim), added
            to the patch tokens and resized bicubically to the patch grid of other input sizes.
    """

    stage_container = "layers"
    group_stem = r"^patch_embed"

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        attn_layers: Any = ("focused", "focused", "window", "window"),
        linear_window_size: int | tuple[int, int] = 56,
        window_size: int = 7,
        shift_linear_windows: bool = True,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        ape: bool = False,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__(in_chans, num_classes, global_pool, img_size)
        dd = {"device": device, "dtype": dtype}
        self.num_stages = num_stages = len(depths)
        if len(num_heads) != num_stages:
            raise ValueError(f"depths and num_heads need one entry per stage; got {len(depths)} and {len(num_heads)}.")
        specs = swin_stage_specs(attn_layers, num_stages)
        self.attn_layers = tuple(name if count is None else f"M{count}" for name, _, count in specs)
        self.patch_size = patch_size
        self.linear_window_size = to_2tuple(linear_window_size)
        self.window_size = window_size
        embed_dims = [int(embed_dim * 2**i) for i in range(num_stages)]
        self.num_features = self.head_hidden_size = embed_dims[-1]

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            norm_layer=norm_layer,
            output_fmt="NHWC",  # its norm is over channels; forward_stem turns the result into NCHW
            strict_img_size=False,
            dynamic_img_pad=True,
            **dd,
        )
        self.ape = ape
        self.absolute_pos_embed: nn.Parameter | None = None
        if ape:  # the authors' absolute position embedding of the patch grid at img_size (Swin's ape=True)
            grid = conv_grids(self.img_size, 1, (patch_size, patch_size, 0), (1, 2, 0))[0]
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dim, **dd))
            self.absolute_pos_grid = grid
            if self.absolute_pos_embed.device.type != "meta":
                nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        grids = self.stage_grids(self.img_size)
        options = family_attention_options(qkv_bias, attn_drop_rate, proj_drop_rate, focusing_factor, dwc_kernel_size)
        stages = []
        for i, ((name, explicit, mixed), rates) in enumerate(zip(specs, drop_path_rates(drop_path_rate, depths))):
            downsample = PatchMerging(embed_dims[i - 1], embed_dims[i], norm_layer, **dd) if i > 0 else None
            blocks = []
            for j, rate in enumerate(rates):
                block_name = "window" if mixed is not None and j >= mixed else name  # M: L blocks, then S
                stage_options = dict(options)
                if not attention_kind(block_name).windowed:  # linear kinds attend within the linear window
                    stage_options["window_size"] = grids[i]
                stage_kwargs = stage_attention_kwargs(
                    block_name, explicit if mixed is None else {}, stage_options, window_size=window_size,
                    pos_size=grids[i],
                )  # fmt: skip
                linear_windows = not attention_kind(block_name).windowed and "window_size" in stage_kwargs
                block_cls = (
                    ShiftedLinearBlock if shift_linear_windows and linear_windows and j % 2 == 1 else PreNormBlock
                )
                blocks.append(
                    block_cls.build(
                        embed_dims[i],
                        num_heads[i],
                        block_name,
                        shifted_block_kwargs(block_name, stage_kwargs, j),
                        mlp_ratio,
                        proj_drop=proj_drop_rate,
                        drop_path=rate,
                        norm_layer=norm_layer,
                        act_layer=act_layer,
                        **dd,
                    )
                )
            stages.append(TokenStage(blocks, downsample))
            self.add_feature_info(embed_dims[i], patch_size * 2**i)
        self.add_stages_norm_head(
            stages, norm_layer(self.num_features, **dd), num_classes, global_pool, drop_rate, **dd
        )
        self.apply(init_linear_weights)  # the authors' init; attention tables are set by their modules

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The grid of each stage's positional tables: its map at ``img_size`` (the patch grid, then halved with
        padding by each merge), clamped to the linear window."""
        grids = conv_grids(img_size, self.num_stages, (self.patch_size, self.patch_size, 0), downsample=(1, 2, 0))
        window = self.linear_window_size
        return [(min(h, window[0]), min(w, window[1])) for h, w in grids]

    def resize_stem(self, img_size: tuple[int, int]) -> None:
        self.patch_embed.set_input_size(img_size=img_size)
        if self.absolute_pos_embed is not None:
            grid = conv_grids(to_2tuple(img_size), 1, (self.patch_size, self.patch_size, 0), (1, 2, 0))[0]
            old = self.absolute_pos_embed
            with torch.no_grad():
                resized = resize_positional_table(old.detach(), self.absolute_pos_grid, grid)
            self.absolute_pos_embed = nn.Parameter(resized, requires_grad=old.requires_grad)
            self.absolute_pos_grid = grid

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, H, W, C)
        if self.absolute_pos_embed is not None:  # resized bicubically to the grid of this input
            height, width = x.shape[1], x.shape[2]
            table = resize_positional_table(self.absolute_pos_embed, self.absolute_pos_grid, (height, width))
            x = x + table.view(1, height, width, x.shape[-1]).to(x.dtype)
        return x.permute(0, 3, 1, 2)

    def forward_stages(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


# ---------------------------------------------------------------------- checkpoints
def checkpoint_filter_fn(state_dict: dict[str, Any], model: FlattenSwin) -> dict[str, torch.Tensor]:
    """Map the authors' (or a linvit-layout) FLatten-Swin state dict onto ``model``.

    Unwraps a full training checkpoint, moves ``layers.{i}.downsample`` (end of stage, the authors' layout) to
    ``layers.{i+1}.downsample``, drops computed buffers, fits the relative position bias tables (the centre for
    windows the authors shrank to a small map, else bicubic: `fit_relative_position_tables`) and resizes
    positional encodings and the absolute position embedding (bicubic) when the resolution differs from the
    model's. A stage whose attention kind differs from the model's (linear, softmax, or mixed), or an absolute
    position embedding the model lacks (or the other way round: ``ape``), is a `CreationOptionsError` (a
    ValueError) that says so and how to build the model.
    """
    state_dict = unwrap_checkpoint(state_dict)
    ape = "absolute_pos_embed" in state_dict
    ape_differs = ape != (model.absolute_pos_embed is not None)
    try:
        check_stage_attention(state_dict, model)
    except CreationOptionsError as error:  # one message with every option to change
        if ape_differs:
            raise CreationOptionsError(
                f"{error} and ape={ape} (the checkpoint's absolute position embedding)", {**error.options, "ape": ape}
            ) from None
        raise
    if ape_differs:
        raise CreationOptionsError(
            f"the checkpoint {'has' if ape else 'has no'} the authors' absolute position embedding "
            f"(absolute_pos_embed, Swin's ape) but the model {'has one' if not ape else 'has none'}: build the model "
            f"with ape={ape}",
            {"ape": ape},
        )
    shrunk, shifted = shrunk_window_stages(state_dict)
    authors_layout = any(k.startswith("layers.0.downsample.") for k in state_dict)
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(DROPPED_SUFFIXES):
            continue
        parts = key.split(".")
        if authors_layout and len(parts) > 2 and parts[0] == "layers" and parts[2] == "downsample":
            parts[1] = str(int(parts[1]) + 1)
            key = ".".join(parts)
        out[key] = value
    table = out.get("absolute_pos_embed")
    if table is not None and table.shape != model.absolute_pos_embed.shape:  # trained at another size: bicubic
        grid = square_grid(table.shape[1], "absolute_pos_embed")
        out["absolute_pos_embed"] = resize_positional_table(table, grid, model.absolute_pos_grid)
    return resize_positional_encodings(fit_relative_position_tables(out, model, shrunk, shifted), model)


# ---------------------------------------------------------------------- registration
def _create_flatten_swin(variant: str, pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    out_indices = tuple(range(len(kwargs.get("depths", (2, 2, 6, 2)))))
    return create_family_model(FlattenSwin, variant, pretrained, out_indices, **kwargs)


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return family_cfg(
        **{
            "crop_pct": 0.875,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": "mit",
            "origin_url": "https://github.com/LeapLabTHU/FLatten-Transformer",
            **kwargs,
        }
    )


# Sizes at the native resolution, linvit vs the paper: params 29.19M / 50.51M / 88.97M / 91.43M (29.2 / 50.5 / 89.0 /
# 91.4); MACs 4.483G / 8.734G / 15.42G / 46.38G (4.48 / 8.73 / 15.4 / 46.4). MACs are counted with
# linvit.utils.count_macs (PyTorch's flop counter: linears, convolutions, matmuls; elementwise work not counted) with
# every product of the definition made visible to it: window softmax through explicit matmuls (the counter misses
# PyTorch's fused CPU attention kernel) and linear attention per head. tests/models/test_flatten_swin.py checks them.
default_cfgs = generate_default_cfgs(
    {
        "flatten_swin_tiny_patch4_224.in1k": _cfg(
            notes=("ImageNet-1k top-1 82.1; weights: https://cloud.tsinghua.edu.cn/f/e1518e76703e4e57a7f2/?dl=1",),
        ),
        "flatten_swin_small_patch4_224.in1k": _cfg(
            notes=("ImageNet-1k top-1 83.5; weights: https://cloud.tsinghua.edu.cn/f/94188e52af354bf4a88b/?dl=1",),
        ),
        "flatten_swin_base_patch4_224.in1k": _cfg(
            notes=("ImageNet-1k top-1 83.8; weights: https://cloud.tsinghua.edu.cn/f/7a9e5186bad04e7fb3a9/?dl=1",),
        ),
        "flatten_swin_base_patch4_384.in1k": _cfg(
            input_size=(3, 384, 384),
            pool_size=(12, 12),
            crop_pct=1.0,
            notes=("ImageNet-1k top-1 85.0; weights: https://cloud.tsinghua.edu.cn/f/0d0330cf2e5249f1abb6/?dl=1",),
        ),
    }
)


@register_model
def flatten_swin_tiny_patch4_224(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-T: 29.2M params, 4.48 GMACs, 82.1% ImageNet-1k (paper)."""
    args = {
        "embed_dim": 96,
        "depths": (2, 2, 6, 2),
        "num_heads": (3, 6, 12, 24),
        "linear_window_size": 56,
        "window_size": 7,
    }
    return _create_flatten_swin("flatten_swin_tiny_patch4_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_swin_small_patch4_224(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-S: 50.5M params, 8.73 GMACs, 83.5% ImageNet-1k (paper)."""
    args = {
        "embed_dim": 96,
        "depths": (2, 2, 18, 2),
        "num_heads": (3, 6, 12, 24),
        "linear_window_size": 56,
        "window_size": 7,
    }
    return _create_flatten_swin("flatten_swin_small_patch4_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_swin_base_patch4_224(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-B: 89.0M params, 15.4 GMACs, 83.8% ImageNet-1k (paper)."""
    args = {
        "embed_dim": 128,
        "depths": (2, 2, 18, 2),
        "num_heads": (4, 8, 16, 32),
        "linear_window_size": 56,
        "window_size": 7,
    }
    return _create_flatten_swin("flatten_swin_base_patch4_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_swin_base_patch4_384(pretrained: bool = False, **kwargs: Any) -> FlattenSwin:
    """FLatten-Swin-B at 384: 91.4M params, 46.4 GMACs, 85.0% ImageNet-1k (paper)."""
    args = {
        "img_size": 384,
        "embed_dim": 128,
        "depths": (2, 2, 18, 2),
        "num_heads": (4, 8, 16, 32),
        "linear_window_size": 96,
        "window_size": 12,
    }
    return _create_flatten_swin("flatten_swin_base_patch4_384", pretrained=pretrained, **dict(args, **kwargs))
