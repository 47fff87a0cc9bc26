"""LinViT: linvit's own hierarchical linear-attention backbone, for any input resolution.

Convolutional stem (stride 4) -> four stages at strides 4/8/16/32 -> LayerNorm -> classifier head. For images under
128 px the stem may take stride 2 (``stem_stride=2``: stages at 2/4/8/16, the same parameters).
Each stage: a 3x3 stride-2 convolutional downsample (stages 2-4), then pre-norm transformer blocks with a
convolutional position encoding (depthwise 3x3, residual) before each block. The attention of each stage is chosen by
name (``linvit.attention.create_attention``): by default focused linear attention with depthwise-conv enhancement in
the two high-resolution stages (global, linear in the token count) and 8x8 window softmax (shifted in every other
block) in the two low-resolution ones. No parameter depends on the input size; any H x W works (strided convolutions
round up, window attention pads and crops internally).

Layout for speed: feature maps stay NCHW in channels-last memory, so the (B, N, C) token view the blocks use and the
(B, C, H, W) view the convolutions use are the same memory, with no copy between them. The variants spend their MACs
in stage 3 (stride 16), where token matrices are GEMM-friendly, and keep one block at stride 4, where elementwise
work on many narrow tokens is memory-bound. 8x8 windows tile the power-of-two maps of high-resolution inputs
(1024 -> 64 and 32) without padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import shifted_block_kwargs, stage_attention_specs
from linvit.layers import (
    ClassifierHeadMixin,
    ConvDownsample,
    ConvStem,
    StagedBackbone,
    TokenStage,
    TransformerBlock,
    conv_grids,
    drop_path_rates,
    init_linear_weights,
    stage_attention_kwargs,
)
from linvit.models._family import PretrainedFileMixin, create_family_model, family_cfg

__all__ = ["LinViT"]

DEFAULT_ATTN_LAYERS = ("focused", "focused", "window", "window")


class LinViT(PretrainedFileMixin, ClassifierHeadMixin, StagedBackbone):
    """Hierarchical linear-attention vision transformer (strides 4/8/16/32), native to timm.

    Args:
        in_chans: input image channels.
        num_classes: classifier outputs (0 = no classifier; ``forward`` returns pooled features).
        global_pool: ``"avg"`` (default), ``"max"``, ``"avgmax"``, ``"catavgmax"`` or ``""`` for unpooled maps.
        embed_dims: channels of the four stages.
        depths: blocks per stage.
        num_heads: attention heads per stage (``None``: ``embed_dim // head_dim``).
        attn_layers: the attention of each stage: a name from ``linvit.attention.ATTENTION_NAMES`` or
            ``{"name": ..., **kwargs}`` with that module's arguments; one spec for all stages or one per stage.
            Windowed kinds get ``window_size`` and alternate shifted windows; linear kinds get no positional table
            (``pos_encoding="none"``: the blocks' convolutional position encoding gives position) unless asked for.
        window_size: window of the windowed stages.
        mlp_ratio, qkv_bias, drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate: as in timm's ViTs.
        cpe_kernel_size: depthwise kernel of the position encoding before each block (``None`` = none).
        stem_stride: 4 (stages at strides 4/8/16/32) or 2 (2/4/8/16: four times the tokens, for images under 128 px;
            training on a folder of such images chooses it, ``auto.small_image_stem``). No parameter depends on it,
            so weights load either way: a model is rebuilt with the stride it was trained at (its config.json).
        img_size: sizes a learnable positional table where a stage asks for one; nothing else depends on it.
    """

    def __init__(
        self,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] | None = None,
        head_dim: int = 32,
        attn_layers: Any = DEFAULT_ATTN_LAYERS,
        window_size: int = 8,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        cpe_kernel_size: int | None = 3,
        stem_stride: int = 4,
        img_size: int | tuple[int, int] | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__(in_chans, num_classes, global_pool, img_size)
        dd = {"device": device, "dtype": dtype}
        self.num_stages = num_stages = len(embed_dims)
        if len(depths) != num_stages:
            raise ValueError(f"embed_dims and depths need one entry per stage, got {len(embed_dims)} and {len(depths)}")
        specs = stage_attention_specs(attn_layers, num_stages, "LinViT")
        self.attn_layers = tuple(name for name, _ in specs)
        if num_heads is None:
            num_heads = tuple(max(1, d // head_dim) for d in embed_dims)
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.drop_rate = drop_rate

        self.stem_stride = stem_stride
        self.stem = ConvStem(in_chans, embed_dims[0], stride=stem_stride, **dd)
        grids = self.stage_grids(self.img_size or (224, 224))
        options = {"pos_encoding": "none"}  # no parameter tied to the input size (the blocks' CPE gives position)
        block_options = {
            "mlp_ratio": mlp_ratio,
            "qkv_bias": qkv_bias,
            "proj_drop": proj_drop_rate,
            "attn_drop": attn_drop_rate,
            "cpe_kernel_size": cpe_kernel_size,
            **dd,
        }
        stages = []
        for i, ((name, explicit), rates) in enumerate(zip(specs, drop_path_rates(drop_path_rate, depths))):
            stage_kwargs = stage_attention_kwargs(name, explicit, options, window_size=window_size, pos_size=grids[i])
            downsample = ConvDownsample(embed_dims[i - 1], embed_dims[i], **dd) if i > 0 else None
            blocks = [
                TransformerBlock(
                    embed_dims[i],
                    num_heads[i],
                    name,
                    shifted_block_kwargs(name, stage_kwargs, j),
                    drop_path=rate,
                    **block_options,
                )
                for j, rate in enumerate(rates)
            ]
            stages.append(TokenStage(blocks, downsample))
            self.add_feature_info(embed_dims[i], stem_stride * 2**i)
        self.add_stages_norm_head(
            stages, nn.LayerNorm(self.num_features, **dd), num_classes, global_pool, drop_rate, **dd
        )
        self.apply(partial(init_linear_weights, trunc_normal=nn.init.trunc_normal_))

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The stem's stride and stride-2 downsamplings, every one rounding up."""
        return conv_grids(img_size, self.num_stages, stem=(1, self.stem_stride, 0), downsample=(1, 2, 0))


# ---------------------------------------------------------------------------------------------------- factory
def _create_linvit(variant: str, pretrained: bool = False, **kwargs) -> LinViT:
    """timm's builder; a weight file (``pretrained_cfg_overlay=dict(file=...)``) goes to ``LinViT.load_pretrained``."""
    return create_family_model(LinViT, variant, pretrained, **kwargs)


def _cfg(**kwargs) -> dict[str, Any]:
    return family_cfg(
        url="",
        first_conv="stem.conv1",
        license="apache-2.0",
        origin_url="https://github.com/LeapLabTHU/FLatten-Transformer",
        notes=("linvit's own design; no pretrained weights are published yet",),
        **kwargs,
    )


# No weights exist yet: the cfgs carry the preprocessing and the shapes, not a weight source.
default_cfgs = generate_default_cfgs(
    {
        "linvit_nano.untrained": _cfg(),
        "linvit_tiny.untrained": _cfg(),
        "linvit_small.untrained": _cfg(),
        "linvit_base.untrained": _cfg(),
    }
)


@register_model
def linvit_nano(pretrained: bool = False, **kwargs) -> LinViT:
    """LinViT-Nano: ~2M parameters, for tests, CPUs and tiny images (trains from scratch at 32x32)."""
    args = {"embed_dims": (32, 64, 128, 256), "depths": (1, 1, 3, 1)}
    return _create_linvit("linvit_nano", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def linvit_tiny(pretrained: bool = False, **kwargs) -> LinViT:
    """LinViT-Tiny: the Swin-T budget (28.1M parameters, 4.5 GMACs at 224)."""
    args = {"embed_dims": (64, 128, 320, 640), "depths": (1, 2, 12, 2)}
    return _create_linvit("linvit_tiny", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def linvit_small(pretrained: bool = False, **kwargs) -> LinViT:
    """LinViT-Small: the Swin-S budget."""
    args = {"embed_dims": (64, 128, 384, 768), "depths": (1, 2, 20, 2)}
    return _create_linvit("linvit_small", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def linvit_base(pretrained: bool = False, **kwargs) -> LinViT:
    """LinViT-Base: the Swin-B budget."""
    args = {"embed_dims": (96, 192, 512, 1024), "depths": (1, 2, 20, 2)}
    return _create_linvit("linvit_base", pretrained=pretrained, **dict(args, **kwargs))
