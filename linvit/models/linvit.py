"""LinViT: linvit's own hierarchical linear-attention backbone, for any input resolution.

Convolutional stem (stride 4) -> four stages at strides 4/8/16/32 -> LayerNorm -> classifier head.
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
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ClassifierHead
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint
from torch import nn

from linvit.layers import ConvDownsample, ConvStem, TransformerBlock, map_to_tokens, tokens_to_map
from linvit.models._checkpoint import build_model_loading_safely, load_pretrained_file
from linvit.models._classifier import ClassifierHeadMixin
from linvit.models._validation import check_image_batch

__all__ = ["LinViT", "LinViTStage"]

DEFAULT_ATTN_LAYERS = ("focused", "focused", "window", "window")
# global linear-attention kinds: their learnable position table would tie parameters to the input size, and the
# blocks' convolutional position encoding already gives position, so linvit builds them with pos_encoding="none"
LINEAR_ATTENTIONS = ("focused", "linear", "elu", "favor", "taylor")


class LinViTStage(nn.Module):
    """Optional downsample, then ``depth`` transformer blocks on (B, N, C) tokens. NCHW (channels-last) in and out."""

    def __init__(
        self,
        in_dim: int,
        dim: int,
        depth: int,
        num_heads: int,
        attention: str = "focused",
        attn_kwargs: dict[str, Any] | None = None,
        downsample: bool = True,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: Sequence[float] | float = 0.0,
        cpe_kernel_size: int | None = 3,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.grad_checkpointing = False
        self.downsample = ConvDownsample(in_dim, dim, **dd) if downsample else nn.Identity()
        drop_paths = [drop_path] * depth if isinstance(drop_path, (int, float)) else list(drop_path)
        attn_kwargs = dict(attn_kwargs or {})
        # windowed attentions alternate plain and half-shifted windows (as Swin) unless the caller fixed the shift
        shifted = attention in ("window", "hybrid") and "shift_size" not in attn_kwargs
        window_size = attn_kwargs.get("window_size", 8)
        shift = window_size // 2 if isinstance(window_size, int) else tuple(w // 2 for w in window_size)
        self.blocks = nn.ModuleList(
            [
                TransformerBlock(
                    dim,
                    num_heads,
                    attention=attention,
                    attn_kwargs={**attn_kwargs, "shift_size": shift} if shifted and i % 2 == 1 else attn_kwargs,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop,
                    attn_drop=attn_drop,
                    drop_path=drop_paths[i],
                    cpe_kernel_size=cpe_kernel_size,
                    **dd,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        hw = (x.shape[2], x.shape[3])
        x = map_to_tokens(x)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw)
            else:
                x = block(x, hw)
        return tokens_to_map(x, hw)


class LinViT(ClassifierHeadMixin, nn.Module):
    """Hierarchical linear-attention vision transformer (strides 4/8/16/32), native to timm.

    Args:
        in_chans: input image channels.
        num_classes: classifier outputs (0 = no classifier; ``forward`` returns pooled features).
        global_pool: ``"avg"`` (default), ``"max"``, ``"avgmax"``, ... or ``""`` for unpooled maps.
        embed_dims: channels of the four stages.
        depths: blocks per stage.
        num_heads: attention heads per stage (``None``: ``embed_dim // head_dim``).
        attn_layers: attention name per stage, from ``linvit.attention.ATTENTION_NAMES``.
        attn_kwargs: extra keyword arguments per stage for that attention (one dict for all, or one per stage).
        window_size: window of the ``"window"``/``"hybrid"`` stages (passed only to those).
        mlp_ratio, qkv_bias, drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate: as in timm's ViTs.
        cpe_kernel_size: depthwise kernel of the position encoding before each block (``None`` = none).
        img_size: accepted for timm compatibility; nothing depends on it (only the pretrained cfg uses it).
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
        attn_layers: Sequence[str] = DEFAULT_ATTN_LAYERS,
        attn_kwargs: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        window_size: int = 8,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        cpe_kernel_size: int | None = 3,
        img_size: int | tuple[int, int] | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        num_stages = len(embed_dims)
        attn_layers = (attn_layers,) * num_stages if isinstance(attn_layers, str) else tuple(attn_layers)
        if not (len(depths) == len(attn_layers) == num_stages):
            raise ValueError(
                f"embed_dims, depths and attn_layers need one entry per stage, got {len(embed_dims)}, {len(depths)} "
                f"and {len(attn_layers)} ({tuple(attn_layers)}); pass e.g. attn_layers=('focused',) * {num_stages}"
            )
        if num_heads is None:
            num_heads = tuple(max(1, d // head_dim) for d in embed_dims)
        if attn_kwargs is None or isinstance(attn_kwargs, dict):
            attn_kwargs = [attn_kwargs] * num_stages
        if len(attn_kwargs) != num_stages:
            raise ValueError(f"attn_kwargs needs one dict per stage ({num_stages}), got {len(attn_kwargs)}")

        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.output_fmt = "NCHW"
        self.attn_layers = attn_layers
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.drop_rate = drop_rate

        self.stem = ConvStem(in_chans, embed_dims[0], **dd)
        # stochastic depth rising linearly over all blocks (plain Python: the model may be built on the meta device)
        total = sum(depths)
        rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        dpr = [rates[sum(depths[:i]) : sum(depths[: i + 1])] for i in range(num_stages)]
        stages = []
        self.feature_info = []
        in_dim = embed_dims[0]
        for i in range(num_stages):
            stage_kwargs = dict(attn_kwargs[i] or {})
            if attn_layers[i] in ("window", "hybrid"):
                stage_kwargs.setdefault("window_size", window_size)
            if attn_layers[i] in LINEAR_ATTENTIONS:
                stage_kwargs.setdefault("pos_encoding", "none")
            stages.append(
                LinViTStage(
                    in_dim,
                    embed_dims[i],
                    depths[i],
                    num_heads[i],
                    attention=attn_layers[i],
                    attn_kwargs=stage_kwargs,
                    downsample=i > 0,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=dpr[i],
                    cpe_kernel_size=cpe_kernel_size,
                    **dd,
                )
            )
            in_dim = embed_dims[i]
            self.feature_info.append({"num_chs": embed_dims[i], "reduction": 4 * 2**i, "module": f"stages.{i}"})
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(self.num_features, **dd)
        self.head = ClassifierHead(self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------------------------------------ timm API
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        names = {n for n, p in self.named_parameters() if p.ndim <= 1 or n.endswith(".scale")}
        names |= {n for n, _ in self.named_parameters() if "relative_position_bias_table" in n}
        names |= {n for n, _ in self.named_parameters() if "positional_encoding" in n}
        return names

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^stem",
            "blocks": r"^stages\.(\d+)"
            if coarse
            else [
                (r"^stages\.(\d+)\.downsample", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        }

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        """timm's ``custom_load`` entry: read a weight file safely, adapt stem and classifier, check it fits."""
        load_pretrained_file(self, checkpoint_path)

    # ------------------------------------------------------------------------------------------------ forward
    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Stage outputs (NCHW) at ``indices`` and, unless ``intermediates_only``, the final normed features.

        ``norm`` applies the final norm to the last stage's tap (the only stage it fits).
        """
        if output_fmt != "NCHW":
            raise ValueError(f"LinViT intermediates are NCHW maps, got output_fmt={output_fmt!r}; use 'NCHW'")
        x = self._check_input(x)
        intermediates: list[torch.Tensor] = []
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last_index = len(self.stages) - 1
        x = self.stem(x)
        ran_last = False
        for i, stage in enumerate(self.stages):
            if stop_early and i > max_index:
                break
            x = stage(x)
            ran_last = i == last_index
            if i in take_indices:
                intermediates.append(self._norm_map(x) if norm and i == last_index else x)
        if intermediates_only:
            return intermediates
        if ran_last:
            x = self._norm_map(x)
        return x, intermediates

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        return check_image_batch(x, self.in_chans, model_name="LinViT", weight_dtype=self.stem.conv1.weight.dtype)

    def _norm_map(self, x: torch.Tensor) -> torch.Tensor:
        # LayerNorm over channels on the channels-last (B, H, W, C) view: no copy either way
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x)
        x = self.stem(x)
        x = self.stages(x)
        return self._norm_map(x)


# ---------------------------------------------------------------------------------------------------- factory
def _create_linvit(variant: str, pretrained: bool = False, **kwargs) -> LinViT:
    """timm's builder; a weight file (``pretrained_cfg_overlay=dict(file=...)``) goes to ``LinViT.load_pretrained``."""
    out_indices = kwargs.pop("out_indices", (0, 1, 2, 3))
    return build_model_loading_safely(
        LinViT,
        variant,
        pretrained,
        feature_cfg={"feature_cls": "getter", "out_indices": out_indices},
        **kwargs,
    )


def _cfg(url: str = "", **kwargs) -> dict[str, Any]:
    return {
        "url": url,
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "stem.conv1",
        "classifier": "head.fc",
        "license": "apache-2.0",
        "paper_ids": "arXiv:2308.00442",
        "paper_name": "FLatten Transformer: Vision Transformer using Focused Linear Attention",
        "origin_url": "https://github.com/LeapLabTHU/FLatten-Transformer",
        "notes": ("linvit's own design; no pretrained weights are published yet",),
        **kwargs,
    }


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
