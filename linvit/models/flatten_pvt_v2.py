"""FLatten-PVTv2: PVTv2 with focused linear attention in every block (FLatten Transformer, ICCV 2023).

Papers:
* FLatten Transformer: Vision Transformer using Focused Linear Attention - https://arxiv.org/abs/2308.00442
* PVT v2: Improved Baselines with Pyramid Vision Transformer - https://arxiv.org/abs/2106.13797

Architecture as in the FLatten authors' release (LeapLabTHU/FLatten-Transformer, config `PVT_LA_SR_RATIOS: 1111`):
overlapping patch embeddings (7x7/4 stem, 3x3/2 downsampling), every block a global focused linear attention
without spatial reduction (learnable positional encoding added to the keys, depthwise 5x5 enhancement of the
values), an MLP with a 3x3 depthwise convolution, and a LayerNorm closing every stage. Their code's other options:
``la_sr_ratios`` (keys and values from a map reduced s x s, e.g. "8421") and ``linear`` (PVTv2-Li: keys and values
pooled to 7x7, a ReLU in the MLP), both through `ReducedKeysFocusedAttention`; and their ``attn_type`` letters
(``attn_layers="LLSS"``): ``S`` stages are PVT's softmax attention with spatial reduction by ``sr_ratios`` (8, 4, 2,
1), `SpatialReductionAttention`.

The authors' attention keeps separate `q` and `kv` projections; here the attention is linvit's one
`FocusedLinearAttention` with a fused `qkv`, and `checkpoint_filter_fn` concatenates `q` and `kv` (same outputs).

Any input size works: the convolutions handle any map and each attention resizes its positional-encoding table
(bicubic) when the map differs from the grid it was built for (`img_size`); `set_input_size` resizes the tables
themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import stage_attention_specs
from linvit.layers import (
    ClassifierHeadMixin,
    Mlp,
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
    PretrainedFileMixin,
    authors_release,
    create_family_model,
    family_cfg,
    fuse_q_kv,
    is_converted,
    one_based_stage,
    rename_keys,
    resize_positional_encodings,
    unwrap_checkpoint,
)
from linvit.models.flatten_pvt_reduction import (
    ReducedKeysFocusedAttention,
    SpatialReductionAttention,
    check_reductions,
    reduction_ratios,
)

__all__ = [
    "ATTN_ALIASES",
    "PVT_STAGE_SHAPES",
    "FlattenPvtV2",
    "PatchEmbedStage",
    "build_block",
    "checkpoint_filter_fn",
    "convert_authors_checkpoint",
    "pvt_stage_specs",
]

# the authors' attn_type letters: L = focused linear attention, S = PVT's softmax attention with spatial reduction
ATTN_ALIASES = {"L": "focused", "S": "softmax"}


def pvt_stage_specs(attn_layers: Any, num_stages: int, model_name: str) -> list[tuple[str, dict[str, Any], bool]]:
    """(registry name, keyword arguments, whether it is the authors' ``S``) per stage of ``attn_layers``: names and
    specs as every family's (`stage_attention_specs`), and the authors' letters, a string ``"LLSS"`` or ``"L"`` /
    ``"S"`` entries. An ``S`` stage is PVT's softmax attention with spatial reduction (`SpatialReductionAttention`);
    the name ``"softmax"`` stays linvit's global softmax (`GlobalAttention`)."""
    specs = stage_attention_specs(attn_layers, num_stages, model_name, ATTN_ALIASES)
    if isinstance(attn_layers, str) and attn_layers not in ATTN_ALIASES:
        entries = list(attn_layers) if all(letter in ATTN_ALIASES for letter in attn_layers) else [attn_layers]
    elif isinstance(attn_layers, (str, Mapping)):
        entries = [attn_layers]
    else:
        entries = list(attn_layers)
    entries = entries * num_stages if len(entries) == 1 else entries
    out = []
    for (name, explicit), entry in zip(specs, entries):
        softmax = entry == "S" or (isinstance(entry, Mapping) and entry.get("name") == "S")
        if softmax and explicit:
            raise TypeError(
                f"{model_name}: the authors' S stage takes no arguments, got {sorted(explicit)}; its keys and values "
                "are reduced by sr_ratios (or linear), its other settings are the model's."
            )
        out.append((name, explicit, softmax))
    return out


class OverlapPatchEmbed(nn.Module):
    """Overlapping strided convolution followed by LayerNorm over channels: (B, C, H, W) -> (B, C', H', W')."""

    def __init__(
        self,
        in_chans: int,
        out_chans: int,
        patch_size: int = 7,
        stride: int = 4,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.proj = nn.Conv2d(in_chans, out_chans, patch_size, stride=stride, padding=patch_size // 2, **dd)
        self.norm = nn.LayerNorm(out_chans, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class MlpWithDepthwiseConv(nn.Module):
    """fc1 -> (ReLU with ``linear``, PVTv2-Li) -> 3x3 depthwise conv over the token grid -> GELU -> fc2 (PVTv2's
    feed-forward)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, linear: bool = False, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.linear = linear
        self.fc1 = nn.Linear(dim, hidden_dim, **dd)
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim, **dd)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim, **dd)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.fc1(x)
        if self.linear:
            x = F.relu(x)
        batch, _, channels = x.shape
        x = x.transpose(1, 2).reshape(batch, channels, hw[0], hw[1])
        x = self.dwconv(x).flatten(2).transpose(1, 2)
        x = self.drop1(self.act(x))
        return self.drop2(self.fc2(x))


class FlattenPvtV2Block(PreNormBlock):
    """Pre-norm block whose MLP takes the token grid too (its depthwise convolution needs it)."""

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        return x + self.drop_path2(self.mlp(self.norm2(x), hw))


def build_block(block_cls: type[PreNormBlock], block: dict[str, Any], mlp_layer: Any = Mlp) -> PreNormBlock:
    """A block from the keyword arguments of `PreNormBlock.build` plus ``reduction``: None (the attention by name),
    or (letter, sr_ratio, linear): "L", a `ReducedKeysFocusedAttention`, or "S", the authors' softmax stage
    `SpatialReductionAttention`; attention then MLP, in that order, either way."""
    block = dict(block)
    reduction = block.pop("reduction")
    if reduction is None:
        return block_cls.build(**block, mlp_layer=mlp_layer)
    dim, dd = block["dim"], {"device": block["device"], "dtype": block["dtype"]}
    letter, sr_ratio, linear = reduction
    attention = SpatialReductionAttention if letter == "S" else ReducedKeysFocusedAttention
    attn = attention(dim, block["num_heads"], sr_ratio, linear, **block["attn_kwargs"], **dd)
    mlp = mlp_layer(dim, int(dim * block["mlp_ratio"]), drop=block["proj_drop"], **dd)
    return block_cls(dim, attn, mlp, block["drop_path"], block["norm_layer"], **dd)


class PatchEmbedStage(TokenStage):
    """PVT's stage: its downsampling is the authors' ``patch_embed`` (keys ``patch_embed.*``, ``blocks.*``,
    ``norm.*``)."""

    def __init__(self, patch_embed: nn.Module, blocks: Sequence[nn.Module], norm: nn.Module | None = None):
        super().__init__(blocks, patch_embed, norm, downsample_name="patch_embed")

    def downsample_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_embed(x)


class FlattenPvtV2(PretrainedFileMixin, ClassifierHeadMixin, StagedBackbone):
    """FLatten-PVTv2 backbone and classifier. Features are NCHW at strides 4, 8, 16, 32.

    ``attn_layers``: the attention of each stage (``linvit.attention.ATTENTION_NAMES``; one for all or one per
    stage), global focused linear attention by default; the other arguments as in timm's PVTv2. `FlattenPvt` (v1)
    differs only in its stages (`build_stage`, `stage_grids`) and their position embeddings (`init_tables`).

    The authors' ``attn_type`` letters are accepted too (``attn_layers="LLSS"``, or ``"L"`` / ``"S"`` entries):
    ``L`` is focused linear attention, ``S`` PVT's softmax attention whose keys and values come from the map reduced
    by ``sr_ratios`` (`SpatialReductionAttention`; their checkpoints' ``attn.q``, ``attn.kv``, ``attn.sr``,
    ``attn.norm`` load). ``"softmax"`` stays linvit's global softmax, without reduction.

    ``la_sr_ratios``: the authors' spatial reduction of the focused stages' keys and values, one ratio per stage (an
    int for all, a sequence, or their digits ``"8421"``); 1 (their configs' ``1111``) reduces nothing. As in their
    code it does not apply to ``S`` stages, which take ``sr_ratios``: one ratio per stage, PVT's (8, 4, 2, 1) by
    default (halving to 1 at the last stage for other stage counts). ``linear``: PVTv2-Li, keys and values pooled
    to 7x7 in every focused and ``S`` stage (the ratios then do not apply) and a ReLU in the MLPs. Reduced focused
    stages are `ReducedKeysFocusedAttention`.
    """

    group_stem = r"^stages\.0\.patch_embed"

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        depths: Sequence[int] = (3, 4, 6, 3),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8.0, 8.0, 4.0, 4.0),
        attn_layers: Any = "focused",
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        la_sr_ratios: int | str | Sequence[int] = 1,
        linear: bool = False,
        sr_ratios: int | str | Sequence[int] | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__(in_chans, num_classes, global_pool, img_size)
        dd = {"device": device, "dtype": dtype}
        if len({len(embed_dims), len(depths), len(num_heads), len(mlp_ratios)}) != 1:
            raise ValueError(
                f"{self.model_name} embed_dims {tuple(embed_dims)}, depths {tuple(depths)}, num_heads "
                f"{tuple(num_heads)} and mlp_ratios {tuple(mlp_ratios)} need one entry per stage; give them the same "
                "length."
            )
        self.num_stages = len(depths)
        specs = pvt_stage_specs(attn_layers, self.num_stages, self.model_name)
        self.attn_layers = tuple("S" if softmax else name for name, _, softmax in specs)
        self.la_sr_ratios = reduction_ratios(la_sr_ratios, self.num_stages)
        if sr_ratios is None:  # PVT's 8, 4, 2, 1
            sr_ratios = tuple(2 ** (self.num_stages - 1 - i) for i in range(self.num_stages))
        self.sr_ratios = reduction_ratios(sr_ratios, self.num_stages, "sr_ratios")
        self.linear = linear
        for name, ratio in zip(self.attn_layers, self.la_sr_ratios):
            if name not in ("focused", "S") and (ratio > 1 or linear):
                raise ValueError(
                    f"la_sr_ratios and linear reduce the keys of focused attention (and linear those of the authors' "
                    f"S stages), but a stage has {name!r}; give such stages ratio 1 and linear=False, or "
                    f"attn_layers='focused'."
                )
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.drop_rate = drop_rate

        options = family_attention_options(qkv_bias, attn_drop_rate, proj_drop_rate, focusing_factor, dwc_kernel_size)
        grids = self.stage_grids(self.img_size)
        stages = []
        for i, rates in enumerate(drop_path_rates(drop_path_rate, depths)):
            name, explicit, softmax = specs[i]
            reduction = None
            if softmax:  # the authors' S: every such stage is PVT's spatial-reduction attention
                reduction = ("S", self.sr_ratios[i], linear)
            elif linear or self.la_sr_ratios[i] > 1:
                reduction = ("L", self.la_sr_ratios[i], linear)
            block = {
                "dim": embed_dims[i],
                "num_heads": num_heads[i],
                "attention": name,
                "attn_kwargs": stage_attention_kwargs(name, explicit, options, pos_size=grids[i]),
                "mlp_ratio": mlp_ratios[i],
                "proj_drop": proj_drop_rate,
                "norm_layer": partial(nn.LayerNorm, eps=1e-6),
                "reduction": reduction,
                **dd,
            }
            in_dim = in_chans if i == 0 else embed_dims[i - 1]
            stages.append(self.build_stage(i, in_dim, [{**block, "drop_path": rate} for rate in rates], grids[i]))
            self.add_feature_info(embed_dims[i], 4 * 2**i)
        # every PVTv2 stage ends in its own norm; PVT's final norm is built by the authors but never applied
        self.add_stages_norm_head(stages, nn.Identity(), num_classes, global_pool, drop_rate, **dd)
        self.init_tables()
        self.apply(self._init_weights)

    def build_stage(self, index: int, in_dim: int, blocks: list[dict[str, Any]], grid: tuple[int, int]) -> TokenStage:
        """Stage ``index``: overlapping patch embedding, the blocks (keyword arguments of `PreNormBlock.build`) with
        the depthwise-conv MLP, LayerNorm."""
        dim, dd = blocks[0]["dim"], {"device": blocks[0]["device"], "dtype": blocks[0]["dtype"]}
        first = index == 0
        patch_embed = OverlapPatchEmbed(in_dim, dim, 7 if first else 3, 4 if first else 2, **dd)
        mlp = partial(MlpWithDepthwiseConv, linear=self.linear)
        layers = [build_block(FlattenPvtV2Block, block, mlp) for block in blocks]
        return PatchEmbedStage(patch_embed, layers, nn.LayerNorm(dim, eps=1e-6, **dd))

    def init_tables(self) -> None:
        """Draw the stages' own tables, before the layers (PVT's position embeddings; PVTv2 has none)."""

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        init_linear_weights(module)
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
            nn.init.normal_(module.weight, std=(2.0 / fan_out) ** 0.5)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """7x7/4 stem, then 3x3/2 overlapping convolutions."""
        return conv_grids(img_size, self.num_stages, stem=(7, 4, 3), downsample=(3, 2, 1))

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        return x  # the first stage's patch embedding is the stem


def convert_authors_checkpoint(
    state_dict: dict[str, Any],
    model: nn.Module,
    rules: list[tuple[str, Any]],
    keep: Callable[[str], bool] = lambda key: True,
) -> dict[str, torch.Tensor]:
    """The conversion both PVT families share: unwrap the authors' file; unless already in linvit's layout, fuse
    `attn.q`/`attn.kv` into `attn.qkv`, keep the keys ``keep`` accepts and rename them by ``rules`` (`rename_keys`);
    then check that every block reduces its keys and values as the model's (`check_reductions`)."""
    state_dict = unwrap_checkpoint(state_dict)
    if is_converted(state_dict):
        state_dict = dict(state_dict)
    else:
        state_dict = rename_keys({key: value for key, value in fuse_q_kv(state_dict).items() if keep(key)}, rules)
    check_reductions(state_dict, model)
    return state_dict


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """Convert a FLatten-PVTv2 checkpoint of the authors (LeapLabTHU/FLatten-Transformer) to this model's keys.

    Accepts the authors' whole file (`model`, maybe `state_dict_ema`, `optimizer`, `config`) or its `model` dict;
    fuses `attn.q`/`attn.kv` into `attn.qkv`, renames `patch_embed{s}`, `block{s}`, `norm{s}`, `dwconv.dwconv`
    and `head`, checks that every block attends (the authors' ``L`` or ``S``) and reduces its keys and values as the
    model's (``attn_layers``, ``la_sr_ratios``, ``sr_ratios``, ``linear``: a ValueError names a difference and the
    options that fit), and resizes the positional encodings when the model was built for another
    resolution.
    """
    rules = [
        (r"^patch_embed(\d+)\.", one_based_stage("stages.{stage}.patch_embed.")),
        (r"^block(\d+)\.(\d+)\.", one_based_stage("stages.{stage}.blocks.{index}.")),
        (r"^norm(\d+)\.", one_based_stage("stages.{stage}.norm.")),
        (r"\.mlp\.dwconv\.dwconv\.", ".mlp.dwconv."),
        (r"^head\.", "head.fc."),
    ]
    return resize_positional_encodings(convert_authors_checkpoint(state_dict, model, rules), model)


def _create_flatten_pvt_v2(variant: str, pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    return create_family_model(FlattenPvtV2, variant, pretrained, **kwargs)


def _cfg(paper_id: str = "arXiv:2106.13797", **kwargs) -> dict[str, Any]:
    """The cfg of the PVT families: FLatten's paper and the base architecture's (PVTv2; PVT's for FlattenPvt)."""
    return family_cfg(
        first_conv="stages.0.patch_embed.proj", license="apache-2.0", paper_ids=["arXiv:2308.00442", paper_id], **kwargs
    )


# Of this family the authors released only FLatten-PVTv2-B0 (Tsinghua Cloud link in `origin_url`; timm cannot fetch it
# itself: the link has no file name). Download it and load it with
# pretrained_cfg_overlay=dict(file="path/to/flatten_pvt_v2_b0.pth").
default_cfgs = generate_default_cfgs(
    {
        "flatten_pvt_v2_b0.in1k": _cfg(
            **authors_release("https://cloud.tsinghua.edu.cn/f/5d1f01532b104da28e7b/?dl=1", "71.1% top-1")
        ),
        "flatten_pvt_v2_b1.in1k": _cfg(),
        "flatten_pvt_v2_b2.in1k": _cfg(),
        "flatten_pvt_v2_b3.in1k": _cfg(),
        "flatten_pvt_v2_b4.in1k": _cfg(),
        "flatten_pvt_v2_b5.in1k": _cfg(),
    }
)

# the stage widths, heads and MLP ratios of PVTv2-B1 and up (B5: other ratios), and of every PVT (v1) size
PVT_STAGE_SHAPES = {"embed_dims": (64, 128, 320, 512), "num_heads": (1, 2, 5, 8), "mlp_ratios": (8, 8, 4, 4)}


@register_model
def flatten_pvt_v2_b0(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B0: 3.6M params, 0.58G MACs, 71.1% ImageNet-1k top-1 (published)."""
    args = {
        "embed_dims": (32, 64, 160, 256),
        "num_heads": (1, 2, 5, 8),
        "mlp_ratios": (8, 8, 4, 4),
        "depths": (2, 2, 2, 2),
    }
    return _create_flatten_pvt_v2("flatten_pvt_v2_b0", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b1(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B1: 12.9M params, 2.22G MACs, 79.5% ImageNet-1k top-1 (published)."""
    args = dict(PVT_STAGE_SHAPES, depths=(2, 2, 2, 2))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b1", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b2(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B2: 22.6M params, 4.25G MACs, 82.5% ImageNet-1k top-1 (published)."""
    args = dict(PVT_STAGE_SHAPES, depths=(3, 4, 6, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b2", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b3(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B3 (PVTv2-B3 depths 3, 4, 18, 3); the paper publishes no size or accuracy for it."""
    args = dict(PVT_STAGE_SHAPES, depths=(3, 4, 18, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b3", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b4(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B4 (PVTv2-B4 depths 3, 8, 27, 3); the paper publishes no size or accuracy for it."""
    args = dict(PVT_STAGE_SHAPES, depths=(3, 8, 27, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b4", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_pvt_v2_b5(pretrained: bool = False, **kwargs) -> FlattenPvtV2:
    """FLatten-PVTv2-B5 (PVTv2-B5: depths 3, 6, 40, 3, MLP ratio 4): 67.06M params, as the authors' code builds it
    (no reduction, their configs' 1111); the paper publishes no size or accuracy for it."""
    args = dict(PVT_STAGE_SHAPES, mlp_ratios=(4, 4, 4, 4), depths=(3, 6, 40, 3))
    return _create_flatten_pvt_v2("flatten_pvt_v2_b5", pretrained=pretrained, **dict(args, **kwargs))
