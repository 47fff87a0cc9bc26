"""FLatten-DeiT: DeiT with focused linear attention in every block (the paper's variant; its authors' code has none).

FLatten Transformer (Han et al., ICCV 2023, arXiv 2308.00442), Table 5: FLatten-DeiT-T, 6.1M params, 1.1G MACs,
74.1% ImageNet-1k top-1 (DeiT-T 72.2%).

Design choices (the paper gives the result, not the code):
- Class token: it takes part in the linear attention as a query and as a key (so it aggregates the image as in DeiT),
  but the depthwise-convolution enhancement runs on the patch tokens only, laid out as their (H, W) grid; the class
  token's output has no DWC term. The learnable positional encoding, added to the keys as in every FLatten block,
  covers the patch grid only (the class key gets none).
- Position information lives in those per-block key encodings (as in FLatten-Swin, which has no absolute embedding),
  so DeiT's absolute ``pos_embed`` is off by default (``abs_pos_embed=True`` restores it). This is also what keeps
  the model at the paper's 6.1M parameters (with both it would be 6.19M).
- Any input size by default: ``dynamic_img_size=True`` resizes the positional tables (bicubic) to the runtime patch
  grid and ``dynamic_img_pad=True`` pads inputs that are not a multiple of the patch size (both off = timm ViT's
  fixed-size behaviour); ``img_size`` at creation sizes the tables, ``set_input_size`` resizes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from timm.layers import PatchEmbed, resample_abs_pos_embed, to_2tuple, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn

from linvit.attention import ATTENTIONS, stage_attention_specs
from linvit.layers import (
    Backbone,
    LinearHeadMixin,
    PreNormBlock,
    drop_path_rates,
    family_attention_options,
    init_linear_weights,
    stage_attention_kwargs,
    take_feature_indices,
)
from linvit.models._family import (
    PretrainedFileMixin,
    create_family_model,
    family_cfg,
    resize_positional_encodings,
    unwrap_checkpoint,
)

__all__ = ["FlattenDeiT", "checkpoint_filter_fn"]

# attentions that take the class token (num_prefix_tokens): the kinds run by linvit.ops
CLASS_TOKEN_ATTENTIONS = tuple(name for name, kind in ATTENTIONS.items() if kind.class_tokens)


class FlattenDeiT(PretrainedFileMixin, LinearHeadMixin, Backbone):
    """DeiT (ViT with a class token) whose every attention is FLatten's focused linear attention (timm-native).

    Args:
        img_size: input size the positional tables are sized for.
        patch_size, in_chans, num_classes: as in timm's ViT.
        global_pool: ``"token"`` (class token, DeiT's default), ``"avg"`` (mean of patch tokens) or ``""``.
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: transformer sizes.
        attn_layers: the attention of every block, one spec (a name of ``linvit.attention.ATTENTION_NAMES`` that
            takes class tokens: focused, linear, elu; or ``{"name": ..., **kwargs}``).
        focusing_factor, dwc_kernel_size: FLatten's focusing power p and DWC kernel.
        abs_pos_embed: also add DeiT's absolute position embedding (off: see the module docstring).
        dynamic_img_size: accept any input size (tables resized to the patch grid at run time); default True.
        dynamic_img_pad: pad inputs that are not a multiple of the patch size; default True.
        drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate: dropouts and stochastic depth.
    """

    global_pools = ("token", "avg", "")
    no_weight_decay_extra = ("cls_token", "pos_embed")

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        attn_layers: Any = "focused",
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        abs_pos_embed: bool = False,
        dynamic_img_size: bool = True,
        dynamic_img_pad: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        # padded inputs may be any size; otherwise at least one patch (strict sizes: PatchEmbed checks them)
        patch = to_2tuple(patch_size)
        min_size = None if dynamic_img_pad else (int(patch[0]), int(patch[1]))
        super().__init__(in_chans, num_classes, global_pool, img_size, min_size)
        dd = {"device": device, "dtype": dtype}
        ((name, explicit),) = stage_attention_specs(attn_layers, 1, self.model_name, supported=CLASS_TOKEN_ATTENTIONS)
        self.attn_layers = (name,)
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.dynamic_img_size = dynamic_img_size
        self.output_fmt = "NLC"  # forward_features returns tokens, like timm's ViT
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            strict_img_size=not (dynamic_img_size or dynamic_img_pad),
            dynamic_img_pad=dynamic_img_pad,
            output_fmt="NHWC" if dynamic_img_size else None,
            flatten=not dynamic_img_size,
            **dd,
        )
        grid = tuple(self.patch_embed.grid_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd))
        if abs_pos_embed:
            self.pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1] + 1, embed_dim, **dd))
        else:
            self.register_parameter("pos_embed", None)
        self.pos_drop = nn.Dropout(pos_drop_rate)
        options = family_attention_options(
            qkv_bias, attn_drop_rate, proj_drop_rate, focusing_factor, dwc_kernel_size, num_prefix_tokens=1
        )
        attn_kwargs = stage_attention_kwargs(name, explicit, options, pos_size=grid)
        self.blocks = nn.ModuleList(
            [
                PreNormBlock.build(
                    embed_dim,
                    num_heads,
                    name,
                    attn_kwargs,
                    mlp_ratio,
                    proj_drop=proj_drop_rate,
                    drop_path=rate,
                    norm_layer=norm_layer,
                    act_layer=act_layer,
                    **dd,
                )
                for rate in drop_path_rates(drop_path_rate, [depth])[0]
            ]
        )
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": embed_dim, "reduction": reduction} for i in range(depth)
        ]
        self.norm = norm_layer(embed_dim, **dd)
        self.init_head(num_classes, global_pool, drop_rate, num_prefix_tokens=1, **dd)
        self._init_weights()

    def _init_weights(self) -> None:
        if self.cls_token.device.type == "meta":
            return
        trunc_normal_(self.cls_token, std=0.02)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            init_linear_weights(module)

    # ------------------------------------------------------------------ timm API
    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^cls_token|^pos_embed|^patch_embed",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def resize_stem(self, img_size: tuple[int, int]) -> None:
        old_grid = tuple(self.patch_embed.grid_size)
        self.patch_embed.set_input_size(img_size=img_size)
        if self.pos_embed is not None:
            resized = resample_abs_pos_embed(
                self.pos_embed.data, new_size=self.patch_embed.grid_size, old_size=old_grid
            )
            self.pos_embed = nn.Parameter(resized, requires_grad=self.pos_embed.requires_grad)

    def resize_tables(self, img_size: tuple[int, int]) -> None:
        for block in self.blocks:
            block.attn.set_pos_size(tuple(self.patch_embed.grid_size))

    # ------------------------------------------------------------------ forward
    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.patch_embed(self.check_input(x))
        if self.dynamic_img_size:
            B, H, W, C = x.shape
            x = x.reshape(B, H * W, C)
            hw = (H, W)
        else:
            grid = self.patch_embed.grid_size
            hw = (grid[0], grid[1])
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
        pos_embed = self.pos_embed
        if pos_embed is not None:
            if self.dynamic_img_size:
                pos_embed = resample_abs_pos_embed(
                    pos_embed, new_size=[hw[0], hw[1]], old_size=self.patch_embed.grid_size
                )
            x = x + pos_embed
        return self.pos_drop(x), hw

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x, hw = self._embed(x)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs as NCHW maps at stride 16 (or NLC tokens), and the final (normed) tokens.

        ``norm=True`` applies the final norm to every intermediate (as timm's ViT does).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}.")
        take_indices, max_index = take_feature_indices(len(self.blocks), indices, self.registered_name())
        intermediates: list[torch.Tensor] = []
        prefixes: list[torch.Tensor] = []
        x, hw = self._embed(x)
        for i, block in enumerate(self.blocks[: max_index + 1] if stop_early else self.blocks):
            if self.grad_checkpointing:
                x = torch.utils.checkpoint.checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
            if i in take_indices:
                tokens = self.norm(x) if norm else x
                prefixes.append(tokens[:, : self.num_prefix_tokens])
                patches = tokens[:, self.num_prefix_tokens :]
                if output_fmt == "NCHW":
                    patches = patches.reshape(x.shape[0], hw[0], hw[1], x.shape[-1]).permute(0, 3, 1, 2).contiguous()
                intermediates.append(patches)
        if return_prefix_tokens:  # timm's ViT convention: (spatial, prefix tokens) pairs
            intermediates = list(zip(intermediates, prefixes))  # type: ignore[arg-type]
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        take_indices, max_index = take_feature_indices(len(self.blocks), indices, self.registered_name(), "out_indices")
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


# ---------------------------------------------------------------------- checkpoints
def checkpoint_filter_fn(state_dict: dict[str, Any], model: FlattenDeiT) -> dict[str, torch.Tensor]:
    """Map a FLatten-DeiT state dict (a full training checkpoint is unwrapped) onto ``model``.

    Resizes the blocks' positional encodings (bicubic, square source grid) and ``pos_embed`` to the model's grid.
    """
    state_dict = dict(unwrap_checkpoint(state_dict))
    target = model.state_dict()
    pos_embed = state_dict.get("pos_embed")
    if pos_embed is not None and "pos_embed" in target and pos_embed.shape != target["pos_embed"].shape:
        grid = list(model.patch_embed.grid_size)
        state_dict["pos_embed"] = resample_abs_pos_embed(pos_embed, new_size=grid, num_prefix_tokens=1)
    return resize_positional_encodings(state_dict, model)


# ---------------------------------------------------------------------- registration
def _create_flatten_deit(variant: str, pretrained: bool = False, **kwargs: Any) -> FlattenDeiT:
    return create_family_model(FlattenDeiT, variant, pretrained, 3, **kwargs)


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return family_cfg(
        **{
            "pool_size": None,
            "crop_pct": 0.875,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": "apache-2.0",
            **kwargs,
        }
    )


default_cfgs = generate_default_cfgs(
    {
        "flatten_deit_tiny_patch16_224.untrained": _cfg(
            notes=(
                "paper: 6.1M params, 1.1G MACs, 74.1% top-1",
                # the paper prints one decimal: 1.145G rounds to its 1.1G (and DeiT-T's 1.254G to 1.3G)
                "MACs at 224 (linvit.utils.count_macs, exact): 1.1447G = 1.0746G linears and patch embedding "
                "(DeiT-T's own) + 0.0586G linear-attention products (k^T v, q S, q z per head) + 0.0113G 5x5 DWC",
            ),
        ),
        "flatten_deit_small_patch16_224.untrained": _cfg(),
    }
)


@register_model
def flatten_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> FlattenDeiT:
    """FLatten-DeiT-T: DeiT-T (192 wide, 12 blocks, 3 heads) with focused linear attention; 6.15M params."""
    args = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3}
    return _create_flatten_deit("flatten_deit_tiny_patch16_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> FlattenDeiT:
    """FLatten-DeiT-S: DeiT-S (384 wide, 12 blocks, 6 heads) with focused linear attention."""
    args = {"patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6}
    return _create_flatten_deit("flatten_deit_small_patch16_224", pretrained=pretrained, **dict(args, **kwargs))
