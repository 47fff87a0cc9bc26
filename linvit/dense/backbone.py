"""Any timm backbone as a multi-scale feature extractor with NCHW outputs, known channels and strides.

``create_feature_backbone("linvit_tiny")`` (or any timm name) builds ``timm.create_model(name, features_only=True)``
and wraps it in :class:`FeatureBackbone`, which

- always returns a list of (B, C, H, W) maps (timm's Swin family returns NHWC; those are permuted),
- exposes ``channels`` and ``strides`` (from timm's ``feature_info``),
- optionally pads the input to a multiple of the largest stride (``pad_to_stride=True``) for backbones that need it,
  and crops each map back to ``ceil(H / stride)`` so the caller never sees the padding.

Checkpoints: a timm/FLatten file, a plain state dict or a Lightning ``.ckpt`` (prefixes such as ``model.`` are
stripped) are loaded through timm's pretrained path, so the model's own ``checkpoint_filter_fn`` converts foreign
layouts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.models import check_model_name

__all__ = ["FeatureBackbone", "create_feature_backbone", "check_model_name", "load_checkpoint_state_dict"]


def _strip_prefix_for(model_keys: set, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Strip the key prefix (e.g. Lightning's ``model.``) that makes the most keys match the model's own keys."""
    best_prefix, best_hits = "", sum(k in model_keys for k in state_dict)
    candidates = {k[: i + 1] for k in state_dict for i, ch in enumerate(k) if ch == "."}
    for prefix in candidates:
        hits = sum(k[len(prefix) :] in model_keys for k in state_dict if k.startswith(prefix))
        if hits > best_hits:
            best_prefix, best_hits = prefix, hits
    if not best_prefix:
        return state_dict
    return {k[len(best_prefix) :]: v for k, v in state_dict.items() if k.startswith(best_prefix)}


def load_checkpoint_state_dict(name: str, path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a checkpoint file safely for timm model ``name``: training-checkpoint entries and wrapper prefixes
    (DDP ``module.``, Lightning ``model.``/``backbone.``, ...) removed. Foreign layouts are converted later by the
    model's own ``checkpoint_filter_fn`` (timm's pretrained path). Weights with NaN/Inf are refused, named
    (:func:`linvit.io.check_finite_weights`)."""
    import timm

    from linvit.io import check_finite_weights, extract_model_state_dict, load_checkpoint_file

    state_dict = extract_model_state_dict(load_checkpoint_file(path))
    check_finite_weights(state_dict, str(path))
    with torch.device("meta"):
        reference = timm.create_model(name, pretrained=False, num_classes=0)
    return _strip_prefix_for(set(reference.state_dict().keys()), state_dict)


class FeatureBackbone(nn.Module):
    """A timm ``features_only`` model whose forward returns a list of NCHW maps.

    Args:
        model: a timm feature model (``timm.create_model(..., features_only=True)``).
        pad_to_stride: pad the input (zeros, bottom/right) to a multiple of the largest stride and crop every
            output to ``ceil(size / stride)``. Needed only by backbones that reject other sizes.
    """

    def __init__(self, model: nn.Module, pad_to_stride: bool = False) -> None:
        super().__init__()
        self.model = model
        info = model.feature_info
        self.channels: list[int] = list(info.channels())
        self.strides: list[int] = list(info.reduction())
        fmt = getattr(model, "output_fmt", "NCHW")
        self.channels_last_output = str(getattr(fmt, "value", fmt)).upper() == "NHWC"
        self.pad_to_stride = pad_to_stride

    @property
    def out_channels(self) -> list[int]:
        return self.channels

    def forward(self, x: Tensor) -> list[Tensor]:
        height, width = x.shape[-2:]
        if self.pad_to_stride:
            multiple = max(self.strides)
            pad_h = (multiple - height % multiple) % multiple
            pad_w = (multiple - width % multiple) % multiple
            if pad_h or pad_w:
                x = F.pad(x, (0, pad_w, 0, pad_h))
        features = self.model(x)
        if isinstance(features, dict):
            features = list(features.values())
        outputs: list[Tensor] = []
        for feature, stride in zip(features, self.strides):
            if self.channels_last_output:
                feature = feature.permute(0, 3, 1, 2)
            if self.pad_to_stride:
                feature = feature[..., : math.ceil(height / stride), : math.ceil(width / stride)]
            outputs.append(feature.contiguous())
        return outputs


def create_feature_backbone(
    name: str,
    pretrained: bool = False,
    checkpoint: str | os.PathLike | None = None,
    out_indices: Sequence[int] | None = None,
    pad_to_stride: bool = False,
    **kwargs,
) -> FeatureBackbone:
    """Build ``name`` (any timm model, linvit's included) as a :class:`FeatureBackbone`.

    Args:
        name: a timm model name, e.g. ``"linvit_tiny"``, ``"resnet18"``.
        pretrained: load timm's default weights (needs them cached or reachable).
        checkpoint: a local weight file (timm, FLatten authors', Lightning ``.ckpt``); implies ``pretrained``.
        out_indices: which feature levels to return (timm's ``out_indices``); default all.
        pad_to_stride: see :class:`FeatureBackbone`.
        kwargs: passed to ``timm.create_model`` (e.g. ``img_size``, ``drop_path_rate``).
    """
    import timm

    check_model_name(name)
    if out_indices is not None:
        kwargs["out_indices"] = tuple(out_indices)
    if checkpoint is not None:
        state_dict = load_checkpoint_state_dict(name, checkpoint)
        kwargs.setdefault("num_classes", 0)  # a checkpoint's classifier never matters for features
        kwargs["pretrained_cfg_overlay"] = {"state_dict": state_dict}
        pretrained = True
    model = timm.create_model(name, pretrained=pretrained, features_only=True, **kwargs)
    return FeatureBackbone(model, pad_to_stride=pad_to_stride)
