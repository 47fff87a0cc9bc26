"""The backbone frame: timm's model API once for every family.

:class:`Backbone` holds what every family shares (the input check, ``forward``, ``set_input_size``,
``no_weight_decay``); FLatten-DeiT, a plain ViT, builds on it directly. :class:`StagedBackbone` adds the rest for
the hierarchical families: a staged model is stem -> stages (each a :class:`~linvit.layers.TokenStage`) -> final
norm over channels -> classifier head, with NCHW maps at strides 4, 8, 16, 32 between stages, and the frame gives
feature taps (``forward_intermediates``, ``feature_info``) and pruning, gradient checkpointing, ``group_matcher``;
a head mixin (:mod:`linvit.layers.heads`) gives the classifier API.

A family subclasses ``(HeadMixin, StagedBackbone)``, calls ``super().__init__(...)``, then builds, in its own order
(which fixes the seeded weights and the key order): its stem, its stages in an ``nn.Sequential`` named
``stage_container`` (``stages``; FLatten-Swin's checkpoints say ``layers``), ``norm`` (or ``nn.Identity``) and the
head (``init_head``). It supplies ``forward_stem`` (when its stem is not ``self.stem``), ``stage_grids`` (the token
grid of each stage for an input size) and ``group_stem`` (the regex of its stem's parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from timm.layers import to_2tuple, trunc_normal_
from torch import nn

from linvit.layers.arguments import check_creation_arguments, take_feature_indices
from linvit.layers.image_input import check_image_batch
from linvit.ops.windows import exporting

__all__ = ["Backbone", "StagedBackbone", "init_linear_weights", "no_weight_decay_names"]

# attention parameters that weight decay would pull towards zero for no gain: FLatten's positional tables and
# focusing temperatures, Swin's relative position bias tables
_NO_DECAY_SUFFIXES = ("positional_encoding", "relative_position_bias_table", ".scale")


def init_linear_weights(module: nn.Module, trunc_normal: Callable[..., Any] = trunc_normal_) -> None:
    """The ViT initialisation of the families, for ``model.apply``: truncated-normal (std 0.02) linear weights, zero
    biases; every other layer keeps its own.

    ``trunc_normal`` draws the weights: timm's (the FLatten authors' code) by default. PyTorch's
    ``nn.init.trunc_normal_`` draws other values from the same seed (LinViT was first built with it, and keeps it so
    that its seeded weights stay what they were).
    """
    if isinstance(module, nn.Linear):
        trunc_normal(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def no_weight_decay_names(model: nn.Module, extra: Sequence[str] = ()) -> set[str]:
    """The parameters of ``model`` that take no weight decay: attention tables and temperatures, and ``extra``
    parameter names (absolute position embeddings, class tokens). timm skips norms and biases (ndim <= 1) itself."""
    names = {name for name, _ in model.named_parameters() if name.endswith(_NO_DECAY_SUFFIXES)}
    return names | {name for name, _ in model.named_parameters() if name.rsplit(".", 1)[-1] in extra}


class Backbone(nn.Module):
    """What every family shares, staged or not: the input check, ``forward``, ``set_input_size`` and
    ``no_weight_decay``. A family gives ``forward_features`` and, where something depends on the input size,
    ``resize_stem`` and ``resize_tables``.

    Args:
        in_chans: input channels.
        num_classes: classifier outputs (0: ``forward`` returns pooled features).
        global_pool: the head's pooling (see the head mixin's ``global_pools``).
        img_size: the input size position tables are sized for (None where nothing depends on it).
        min_input_size: smallest (H, W) the model takes, or None for any.
    """

    no_weight_decay_extra: tuple[str, ...] = ()

    def __init__(
        self,
        in_chans: int,
        num_classes: int,
        global_pool: str,
        img_size: int | tuple[int, int] | None = None,
        min_input_size: tuple[int, int] | None = None,
    ):
        super().__init__()
        check_creation_arguments(type(self).__name__, in_chans=in_chans, num_classes=num_classes, img_size=img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.img_size = None if img_size is None else tuple(int(s) for s in to_2tuple(img_size))
        self.min_input_size = min_input_size
        self.model_name = type(self).__name__
        self.output_fmt = "NCHW"
        self.feature_info: list[dict[str, Any]] = []

    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        """The entry check of every forward path: shape, channels, dtype and the smallest size (`check_image_batch`)."""
        if torch.jit.is_scripting():
            return check_image_batch(x, self.in_chans, self.min_input_size, self.model_name)
        return check_image_batch(x, self.in_chans, self.min_input_size, self.model_name, self._weight_dtype())

    @torch.jit.unused
    def registered_name(self) -> str:
        """The name the model was created by (``timm.create_model``), else its class name: for messages."""
        cfg = getattr(self, "pretrained_cfg", None)
        return str(cfg.get("architecture") or self.model_name) if isinstance(cfg, dict) else self.model_name

    @torch.jit.unused
    def _weight_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: Any = None) -> None:
        """Resize what depends on the input size (positional tables, bicubic; ``requires_grad`` kept) for
        ``img_size``. The patch size (the stem's stride) cannot change."""
        stride = self.feature_info[0]["reduction"]
        if patch_size is not None and tuple(to_2tuple(patch_size)) != (stride, stride):
            raise ValueError(
                f"{self.model_name} cannot change its patch size ({stride}), got patch_size={patch_size!r}; pass "
                "img_size only."
            )
        if img_size is None:
            return
        self.img_size = tuple(int(s) for s in to_2tuple(img_size))
        self.resize_stem(self.img_size)
        self.resize_tables(self.img_size)

    def resize_stem(self, img_size: tuple[int, int]) -> None:
        """Tell the stem the new input size (for stems that keep one, such as timm's ``PatchEmbed``)."""

    def resize_tables(self, img_size: tuple[int, int]) -> None:
        """Resize the positional tables for a new input size."""

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return no_weight_decay_names(self, self.no_weight_decay_extra)


class StagedBackbone(Backbone):
    """stem -> stages -> norm -> head, with timm's backbone API (see the module docstring)."""

    stage_container: str = "stages"
    group_stem: str = r"^stem"

    # ------------------------------------------------------------------------------------------------ building
    def add_feature_info(self, num_chs: int, reduction: int) -> None:
        """Describe the next stage's output for timm's feature extraction."""
        module = f"{self.stage_container}.{len(self.feature_info)}"
        self.feature_info.append({"num_chs": num_chs, "reduction": reduction, "module": module})

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The token grid (h, w) of every stage for an input of ``img_size``; families with tables supply it."""
        raise NotImplementedError(f"{self.model_name} has no size-dependent tables to resize")

    @torch.jit.ignore
    def stage_modules(self) -> nn.Sequential:
        return getattr(self, self.stage_container)

    def add_stages_norm_head(
        self,
        stages: Sequence[nn.Module],
        norm: nn.Module,
        num_classes: int,
        global_pool: str,
        drop_rate: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        """Register the stages (as ``stage_container``), the final norm and the head, in that (key) order."""
        setattr(self, self.stage_container, nn.Sequential(*stages))
        self.norm = norm
        self.init_head(num_classes, global_pool, drop_rate, device=device, dtype=dtype)

    # ------------------------------------------------------------------------------------------------ forward
    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x)

    def forward_stages(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x)

    def forward_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm over the channels of a map, on its (B, H, W, C) view (no copy for channels-last maps)."""
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
            if exporting():  # channels-last maps make torch.export specialise the batch size in the pooling head
                x = x.contiguous()
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_stem(self.check_input(x))
        return self.forward_norm(self.forward_stages(x))

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

        ``norm`` applies the final norm to the last stage's tap (the only stage it fits); ``stop_early`` runs no
        stage after the last tap (the final features are then the last stage run, without the norm).
        """
        if output_fmt != "NCHW":
            raise ValueError(
                f"{self.model_name} intermediates are NCHW maps, got output_fmt={output_fmt!r}; use 'NCHW'"
            )
        stages = self.stage_modules()
        take_indices, max_index = take_feature_indices(len(stages), indices, self.registered_name())
        last_index = len(stages) - 1
        x = self.forward_stem(self.check_input(x))
        intermediates: list[torch.Tensor] = []
        ran_last = False
        for i, stage in enumerate(stages):
            if stop_early and i > max_index:
                break
            x = stage(x)
            ran_last = i == last_index
            if i in take_indices:
                intermediates.append(self.forward_norm(x) if norm and ran_last else x)
        if intermediates_only:
            return intermediates
        return (self.forward_norm(x) if ran_last else x), intermediates

    # ------------------------------------------------------------------------------------------------ timm API
    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stages after the last tap (and the final norm and the head); returns the normalised indices.
        (timm's ``features_only`` calls it with the ``out_indices`` given at creation, which it checks.)"""
        stages = self.stage_modules()
        take_indices, max_index = take_feature_indices(len(stages), indices, self.registered_name(), "out_indices")
        prune_end = max_index < len(stages) - 1
        setattr(self, self.stage_container, stages[: max_index + 1])
        if prune_norm or prune_end:
            self.norm = nn.Identity()  # the final norm is sized for the last stage
        if prune_end:  # features now end at the last kept stage; a head is sized for them
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
        if prune_head or prune_end:
            self.reset_classifier(0, "")
        return take_indices

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stage_modules():
            stage.grad_checkpointing = enable

    def resize_tables(self, img_size: tuple[int, int]) -> None:
        for stage, grid in zip(self.stage_modules(), self.stage_grids(img_size)):
            stage.set_grid(grid)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Stem, then per stage its downsampling with its first block, its blocks, and the norms last."""
        stages = self.stage_container
        if coarse:
            return {"stem": self.group_stem, "blocks": rf"^{stages}\.(\d+)"}
        return {
            "stem": self.group_stem,
            "blocks": [
                (rf"^{stages}\.(\d+)\.blocks\.(\d+)", None),
                (rf"^{stages}\.(\d+)\.norm", (99999,)),
                (rf"^{stages}\.(\d+)\.", (0,)),
                (r"^norm", (99999,)),
            ],
        }
