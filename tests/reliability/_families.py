"""The registered linvit model names, grouped by family (model file), for tests that cover every family."""

import re

import timm
import torch

import linvit  # noqa: F401  (registers the models)
from linvit.io import model_family


def linvit_model_names() -> list[str]:
    return timm.list_models("linvit_*") + timm.list_models("flatten_*")


_SIZE_ORDER = ("nano", "b0", "tiny", "b1", "small", "b2", "medium", "b3", "base", "b4", "large")


def _size_rank(name: str) -> tuple[int, str]:
    parts = re.split(r"[_\.]", name)
    ranks = [_SIZE_ORDER.index(p) for p in parts if p in _SIZE_ORDER]
    return (min(ranks) if ranks else len(_SIZE_ORDER), name)


def smallest_variant_per_family() -> list[str]:
    """One registered name per model file (family): the smallest by its size word (nano < b0 < tiny < ...)."""
    families: dict[str, list[str]] = {}
    for name in linvit_model_names():
        families.setdefault(model_family(name) or name, []).append(name)
    return sorted(min(names, key=_size_rank) for names in families.values())


# Fewer blocks (same widths and heads, so every kind of block and attention is still there) to keep the tests fast.
SHALLOW_KWARGS = {
    "flatten_cswin": {"depths": (1, 1, 1, 1)},
    "flatten_deit": {"depth": 2},
    "flatten_pvt": {"depths": (1, 1, 1, 1)},
    "flatten_pvt_v2": {"depths": (1, 1, 1, 1)},
    "flatten_swin": {"depths": (1, 1, 2, 1), "embed_dim": 48},  # stage 3: a plain and a shifted window block
    "linvit": {"depths": (1, 1, 2, 1)},  # the third stage: a plain and a shifted window block
}


def create_shallow(name: str, **kwargs) -> torch.nn.Module:
    """``timm.create_model(name)`` with fewer blocks (SHALLOW_KWARGS) where its family is known."""
    shallow = SHALLOW_KWARGS.get(model_family(name) or "", {})
    return timm.create_model(name, **{"pretrained": False, **shallow, **kwargs})
