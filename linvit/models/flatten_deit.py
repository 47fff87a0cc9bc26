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
from timm.layers import (
    Mlp,
    PatchEmbed,
    register_notrace_module,
    resample_abs_pos_embed,
    to_2tuple,
    trunc_normal_,
)
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint
from torch import nn

from linvit.attention import FocusedLinearAttention, resize_positional_table
from linvit.layers import PreNormBlock
from linvit.models._checkpoint import extract_model_state_dict, load_pretrained_file
from linvit.models._flatten_common import create_flatten_model, flatten_cfg
from linvit.models._validation import check_image_batch

__all__ = ["FLattenDeiT", "FLattenDeiTAttention", "FLattenDeiTBlock", "checkpoint_filter_fn"]


class FLattenDeiTAttention(FocusedLinearAttention):
    """Global focused linear attention over prefix (class) tokens followed by an (H, W) grid of patch tokens.

    Same parameters and state-dict keys as :class:`linvit.attention.FocusedLinearAttention` (``qkv``, ``proj``,
    ``scale``, ``positional_encoding`` over the patch grid, ``dwc``). x: (B, P + H*W, C) with P prefix tokens, which
    attend and are attended to but get no positional term and no DWC (``num_prefix_tokens``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        pos_size: tuple[int, int],
        num_prefix_tokens: int = 1,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        device=None,
        dtype=None,
    ):
        super().__init__(
            dim,
            num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            focusing_factor=focusing_factor,
            dwc_kernel_size=dwc_kernel_size,
            pos_size=pos_size,
            window_size=None,
            num_prefix_tokens=num_prefix_tokens,
            device=device,
            dtype=dtype,
        )


# The patch grid (H, W) drives a table resize (a branch on sizes): FX keeps the attention as one call.
register_notrace_module(FLattenDeiTAttention)


class FLattenDeiTBlock(PreNormBlock):
    """Pre-norm ViT block with FLatten attention."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        pos_size: tuple[int, int],
        num_prefix_tokens: int = 1,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        dd = {"device": device, "dtype": dtype}
        attn = FLattenDeiTAttention(
            dim,
            num_heads,
            pos_size=pos_size,
            num_prefix_tokens=num_prefix_tokens,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            focusing_factor=focusing_factor,
            dwc_kernel_size=dwc_kernel_size,
            **dd,
        )
        mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop, **dd)
        super().__init__(dim, attn, mlp, drop_path=drop_path, norm_layer=norm_layer, **dd)


class FLattenDeiT(nn.Module):
    """DeiT (ViT with a class token) whose every attention is FLatten's focused linear attention (timm-native).

    Args:
        img_size: input size the positional tables are sized for.
        patch_size, in_chans, num_classes: as in timm's ViT.
        global_pool: ``"token"`` (class token, DeiT's default), ``"avg"`` (mean of patch tokens) or ``""``.
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: transformer sizes.
        focusing_factor, dwc_kernel_size: FLatten's focusing power p and DWC kernel.
        abs_pos_embed: also add DeiT's absolute position embedding (off: see the module docstring).
        dynamic_img_size: accept any input size (tables resized to the patch grid at run time); default True.
        dynamic_img_pad: pad inputs that are not a multiple of the patch size; default True.
        drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate: dropouts and stochastic depth.
    """

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
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if global_pool not in ("token", "avg", ""):
            raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}.")
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.dynamic_img_size = dynamic_img_size
        # padded inputs may be any size; otherwise at least one patch (strict sizes: PatchEmbed checks them)
        patch = to_2tuple(patch_size)
        self.min_input_size: tuple[int, int] | None = None if dynamic_img_pad else (int(patch[0]), int(patch[1]))
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
        drop_paths = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
        self.blocks = nn.ModuleList(
            [
                FLattenDeiTBlock(
                    embed_dim,
                    num_heads,
                    pos_size=grid,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=drop_paths[i],
                    act_layer=act_layer,
                    norm_layer=norm_layer,
                    **dd,
                )
                for i in range(depth)
            ]
        )
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": embed_dim, "reduction": reduction} for i in range(depth)
        ]
        self.norm = norm_layer(embed_dim, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        if self.cls_token.device.type == "meta":
            return
        trunc_normal_(self.cls_token, std=0.02)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ timm API
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        names = {"cls_token", "*.positional_encoding", "*.attn.scale"}
        if self.pos_embed is not None:
            names.add("pos_embed")
        return names

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {
            "stem": r"^cls_token|^pos_embed|^patch_embed",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}.")
            self.global_pool = global_pool
        self.num_classes = num_classes
        reference = self.cls_token
        self.head = (
            nn.Linear(self.embed_dim, num_classes, device=reference.device, dtype=reference.dtype)
            if num_classes > 0
            else nn.Identity()
        )
        self.head.train(self.training)

    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: Any = None) -> None:
        """Resize the positional tables (and ``pos_embed``) for ``img_size``; ``requires_grad`` is kept."""
        if patch_size is not None and tuple(self.patch_embed.patch_size) != tuple(
            (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
        ):
            raise ValueError("FLatten-DeiT cannot change its patch size; pass img_size only.")
        if img_size is None:
            return
        old_grid = tuple(self.patch_embed.grid_size)
        self.patch_embed.set_input_size(img_size=img_size)
        grid = tuple(self.patch_embed.grid_size)
        if self.pos_embed is not None:
            resized = resample_abs_pos_embed(self.pos_embed.data, new_size=grid, old_size=old_grid)
            self.pos_embed = nn.Parameter(resized, requires_grad=self.pos_embed.requires_grad)
        for block in self.blocks:
            attn = block.attn
            old = attn.positional_encoding
            with torch.no_grad():
                resized = resize_positional_table(old.data, attn.pos_size, grid)
            attn.positional_encoding = nn.Parameter(resized, requires_grad=old.requires_grad)
            attn.pos_size = grid

    @torch.jit.ignore
    def load_pretrained(self, checkpoint_path: str) -> None:
        """timm's hook for ``custom_load``: read a weight file safely and map it (see ``checkpoint_filter_fn``)."""
        load_pretrained_file(self, checkpoint_path, checkpoint_filter_fn)

    # ------------------------------------------------------------------ forward
    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.patch_embed(x)
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

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        """The entry check of every forward path: shape, channels, dtype (and the smallest size, where one exists)."""
        return check_image_batch(
            x, self.in_chans, self.min_input_size, "FLattenDeiT", weight_dtype=self.patch_embed.proj.weight.dtype
        )

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x)
        x, hw = self._embed(x)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw)
            else:
                x = block(x, hw)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

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
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        intermediates: list[torch.Tensor] = []
        prefixes: list[torch.Tensor] = []
        x = self._check_input(x)
        B = x.shape[0]
        x, hw = self._embed(x)
        blocks = self.blocks if torch.jit.is_scripting() or not stop_early else self.blocks[: max_index + 1]
        for i, block in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw)
            else:
                x = block(x, hw)
            if i in take_indices:
                tokens = self.norm(x) if norm else x
                prefixes.append(tokens[:, : self.num_prefix_tokens])
                patches = tokens[:, self.num_prefix_tokens :]
                if output_fmt == "NCHW":
                    patches = patches.reshape(B, hw[0], hw[1], patches.shape[-1]).permute(0, 3, 1, 2).contiguous()
                intermediates.append(patches)
        if return_prefix_tokens:  # timm's ViT convention: (spatial, prefix tokens) pairs
            intermediates = list(zip(intermediates, prefixes))  # type: ignore[arg-type]
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


# ---------------------------------------------------------------------- checkpoints
def checkpoint_filter_fn(state_dict: dict[str, Any], model: FLattenDeiT) -> dict[str, torch.Tensor]:
    """Map a FLatten-DeiT state dict (a full training checkpoint is unwrapped) onto ``model``.

    Resizes the blocks' positional encodings (bicubic, square source grid) and ``pos_embed`` to the model's grid.
    """
    if not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        state_dict = extract_model_state_dict(state_dict)
    target = model.state_dict()
    grid = tuple(model.patch_embed.grid_size)
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key in target and value.shape != target[key].shape:
            if key.endswith("positional_encoding"):
                side = int(round(value.shape[1] ** 0.5))
                value = resize_positional_table(value, (side, side), grid)
            elif key == "pos_embed":
                value = resample_abs_pos_embed(value, new_size=list(grid), num_prefix_tokens=1)
        out[key] = value
    return out


# ---------------------------------------------------------------------- registration
def _create_flatten_deit(variant: str, pretrained: bool = False, **kwargs: Any) -> FLattenDeiT:
    return create_flatten_model(FLattenDeiT, variant, pretrained, checkpoint_filter_fn, 3, **kwargs)


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return flatten_cfg(
        **{
            "pool_size": None,
            "crop_pct": 0.875,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": "apache-2.0",
            "paper_ids": "arXiv:2308.00442",
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
def flatten_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> FLattenDeiT:
    """FLatten-DeiT-T: DeiT-T (192 wide, 12 blocks, 3 heads) with focused linear attention; 6.15M params."""
    args = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3}
    return _create_flatten_deit("flatten_deit_tiny_patch16_224", pretrained=pretrained, **dict(args, **kwargs))


@register_model
def flatten_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> FLattenDeiT:
    """FLatten-DeiT-S: DeiT-S (384 wide, 12 blocks, 6 heads) with focused linear attention."""
    args = {"patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6}
    return _create_flatten_deit("flatten_deit_small_patch16_224", pretrained=pretrained, **dict(args, **kwargs))
