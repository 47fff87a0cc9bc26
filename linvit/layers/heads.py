"""timm's classifier API, for the two kinds of head the families' checkpoints hold.

- :class:`ClassifierHeadMixin`: a timm ``ClassifierHead`` at ``head`` (keys ``head.fc.*``): LinViT, FLatten-PVT,
  FLatten-PVTv2, FLatten-CSwin;
- :class:`LinearHeadMixin`: a bare ``nn.Linear`` at ``head`` (keys ``head.weight``/``head.bias``, as the authors' Swin
  and DeiT files have them) after pooling and ``head_drop``: FLatten-Swin, FLatten-DeiT.

Both give ``init_head``, ``get_classifier``, ``reset_classifier`` and ``forward_head``, and list the ``global_pools``
they accept. Put the mixin before the backbone frame in the bases.
"""

from __future__ import annotations

import torch
from timm.layers import ClassifierHead
from torch import nn

__all__ = ["ClassifierHeadMixin", "LinearHeadMixin"]


def _check_global_pool(model: nn.Module, global_pool: str) -> None:
    if global_pool not in model.global_pools:
        raise ValueError(
            f"{type(model).__name__} global_pool must be one of {', '.join(map(repr, model.global_pools))}, got "
            f"{global_pool!r} ('' keeps the unpooled features)."
        )


def _reset_classes(model: nn.Module, num_classes: int, global_pool: str | None) -> torch.Tensor:
    """Record the new class count and pool; returns a parameter of the model, whose device and dtype a new head takes
    (the old head may hold no parameter)."""
    if global_pool is not None:
        _check_global_pool(model, global_pool)
        model.global_pool = global_pool
    model.num_classes = num_classes
    return next(model.parameters())


class ClassifierHeadMixin:
    """Classifier API for a timm ``ClassifierHead`` at ``self.head`` on (B, C, H, W) features."""

    global_pools: tuple[str, ...] = ("avg", "max", "avgmax", "catavgmax", "")

    def init_head(self, num_classes: int, global_pool: str, drop_rate: float = 0.0, device=None, dtype=None) -> None:
        """Build the head on ``self.num_features`` channels."""
        _check_global_pool(self, global_pool)
        self.head = ClassifierHead(
            self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate, device=device, dtype=dtype
        )

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        reference = _reset_classes(self, num_classes, global_pool)
        # timm < 1.0.31's reset takes no in_features: the head keeps the ones it was built with, which are these
        self.head.in_features = self.num_features
        self.head.reset(num_classes, pool_type=global_pool, device=reference.device, dtype=reference.dtype)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=True) if pre_logits else self.head(x)


class LinearHeadMixin:
    """Classifier API for pooling, ``self.head_drop`` and an ``nn.Linear`` (or, without classes, ``nn.Identity``) at
    ``self.head``. Features are maps (B, C, H, W) (``output_fmt`` "NCHW") or tokens (B, N, C) after
    ``num_prefix_tokens`` class tokens ("NLC");
    ``global_pools`` names the pools a family accepts: "avg" (mean over the map or the patch tokens), "token" (the
    first class token) and "" (no pooling: the head runs on every position)."""

    global_pools: tuple[str, ...] = ("avg", "")

    def init_head(
        self,
        num_classes: int,
        global_pool: str,
        drop_rate: float = 0.0,
        num_prefix_tokens: int = 0,
        device=None,
        dtype=None,
    ) -> None:
        _check_global_pool(self, global_pool)
        self.num_prefix_tokens = num_prefix_tokens
        self.head_drop = nn.Dropout(drop_rate)
        self.head = self._linear_head(num_classes, device, dtype)

    def _linear_head(self, num_classes: int, device=None, dtype=None) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        return nn.Linear(self.num_features, num_classes, device=device, dtype=dtype)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        reference = _reset_classes(self, num_classes, global_pool)
        self.head = self._linear_head(num_classes, reference.device, reference.dtype)
        self.head.train(self.training)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled features: (B, C) for "avg" and "token", ``x`` itself for ""."""
        if self.global_pool == "token":
            return x[:, 0]
        if self.global_pool == "avg":
            return x.mean(dim=(2, 3)) if self.output_fmt == "NCHW" else x[:, self.num_prefix_tokens :].mean(dim=1)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.pool(x))
        if pre_logits:
            return x
        if self.global_pool == "" and self.output_fmt == "NCHW":  # unpooled maps: the classifier runs per position
            return self.head(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(x)
