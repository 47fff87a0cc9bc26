"""timm's classifier and pruning API, shared by the models whose head is a timm `ClassifierHead` (LinViT, FLatten
PVTv2 and CSwin)."""

from __future__ import annotations

import torch
from timm.models._features import feature_take_indices
from torch import nn

__all__ = ["ClassifierHeadMixin"]


class ClassifierHeadMixin:
    """timm's classifier and pruning API for a model with a timm `ClassifierHead` at `self.head`, stages in
    `self.stages` (each with a `grad_checkpointing` flag), `feature_info`, optionally a final `norm`, and a
    `forward_features(x)`. Put it before `nn.Module` in the bases."""

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stages:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        # the new head goes where the model lives (the old head may hold no parameter to take it from)
        reference = next(self.parameters())
        self.head.reset(num_classes, pool_type=global_pool, device=reference.device, dtype=reference.dtype)

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stages after the last tap (and a final `norm`, the head); returns the normalised tap indices."""
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        prune_end = max_index < len(self.stages) - 1
        self.stages = self.stages[: max_index + 1]
        if (prune_norm or prune_end) and isinstance(getattr(self, "norm", None), nn.Module):
            self.norm = nn.Identity()  # the final norm is sized for the last stage
        if prune_end:  # features now end at the last kept stage; the head is re-sized to them
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
            self.head.reset(0, in_features=self.num_features)
        if prune_head or prune_end:
            self.reset_classifier(0, "")
        return take_indices

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=True) if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
