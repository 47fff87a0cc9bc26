"""A run's name from what it trains on: ``task_name`` = ``<data>_<model>`` (``configs/train.yaml``).

``python train.py data=imagefolder data.root=/data/flowers`` used to land in ``outputs/digits_linvit_nano/``, the
default task's folder. ``task_name: ${linvit.task_name:${data},${model}}`` names it from the data config (the folder
of an ImageFolder or segmentation root, the CIFAR variant, else the data set) and the model config (the timm model,
or the backbone of a segmentation model): ``flowers_linvit_nano``. An explicit ``task_name=...`` still wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["RESOLVER", "data_label", "model_label", "register_resolvers", "task_name"]

RESOLVER = "linvit.task_name"
# data sets with a name of their own (their root is where they are, not what they are)
_NAMED_DATA = {"DigitsDataModule": "digits", "FashionMNISTDataModule": "fashion_mnist"}


def data_label(data: Mapping[str, Any]) -> str:
    """What a data config trains on, as a folder-name-safe label."""
    target = str(data.get("_target_", "")).rsplit(".", 1)[-1]
    if target in _NAMED_DATA:
        return _NAMED_DATA[target]
    if data.get("variant"):
        return _safe(str(data["variant"]))
    for key in ("root", "data_dir"):
        if data.get(key):
            name = PurePath(str(data[key]).rstrip("/\\")).name
            if name:
                return _safe(name)
    return _safe(re.sub(r"(?<!^)(?=[A-Z])", "_", target.removesuffix("DataModule")).lower() or "data")


def model_label(model: Mapping[str, Any]) -> str:
    """The model a model config builds: ``model_name`` (classification) or ``backbone`` (segmentation)."""
    for key in ("model_name", "backbone"):
        if model.get(key):
            return _safe(str(model[key]).split("/")[-1])
    return _safe(str(model.get("_target_", "model")).rsplit(".", 1)[-1].lower())


def task_name(data: Mapping[str, Any], model: Mapping[str, Any]) -> str:
    return f"{data_label(data)}_{model_label(model)}"


def register_resolvers() -> None:
    """Register ``${linvit.task_name:...}`` with OmegaConf (idempotent); done by every entry that composes configs."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, task_name)


def _safe(text: str) -> str:
    """Letters, digits, ``.``, ``-`` and ``_`` only (a folder name on every system)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "data"
