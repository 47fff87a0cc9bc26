"""The attention vocabulary: every attention module by one name, with the traits a stage needs to build it.

A model chooses the attention of each stage with a *spec*: a name (``"focused"``) or a mapping with a ``name`` and
that module's keyword arguments (``{"name": "window", "window_size": 12}``). The registry entry of the name says
what a stage must supply (:class:`AttentionKind`): a window size, Swin's alternating shifts, the token grid of a
learnable positional table, class tokens. Families may accept their authors' spellings as aliases (FLatten-Swin's
``"linear"``/``"softmax"``, CSwin's ``"LLSS"``), which they pass to :func:`stage_attention_specs`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.hybrid import HybridAttention
from linvit.attention.linformer import LinformerAttention
from linvit.attention.nystrom import NystromAttention
from linvit.attention.softmax import GlobalAttention
from linvit.attention.stripe import StripeAttention
from linvit.attention.window import WindowAttention

__all__ = [
    "ATTENTIONS",
    "ATTENTION_NAMES",
    "AttentionKind",
    "attention_kind",
    "attention_options",
    "create_attention",
    "parse_attention_spec",
    "shifted_block_kwargs",
    "stage_attention_specs",
]


@dataclass(frozen=True)
class AttentionKind:
    """A registry entry: the module, its fixed defaults, and what a stage supplies to it.

    Attributes:
        module: the class, called as ``module(dim, num_heads, **kwargs)``; forward(x, hw) on (B, N, C) tokens.
        defaults: keyword arguments this name fixes (``"linear"`` is the focused module with kernel="relu", ...).
        windowed: attends within windows of ``window_size`` (the stage's window).
        shifted: Swin's shifted windows: a stage alternates plain and half-shifted windows (``shift_size``).
        positional_size: may hold a learnable positional table sized by ``pos_size`` (the stage's token grid).
        class_tokens: takes ``num_prefix_tokens`` leading tokens (class tokens) before the token grid.
        summary: one line for the docs and error messages.
    """

    module: type[nn.Module]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    windowed: bool = False
    shifted: bool = False
    positional_size: bool = False
    class_tokens: bool = False
    summary: str = ""

    def parameters(self) -> Mapping[str, inspect.Parameter]:
        """The module's keyword parameters by name (its constructor's signature)."""
        return inspect.signature(self.module).parameters

    def accepts(self, keyword: str) -> bool:
        return keyword in self.parameters()

    def default(self, keyword: str) -> Any:
        """The value of ``keyword`` when the stage passes none: this entry's fixed one, else the module's default."""
        if keyword in self.defaults:
            return self.defaults[keyword]
        return self.parameters()[keyword].default


# The plain-kernel baselines are "vanilla" linear attention: no DWC and no positional encoding unless asked for
# (FLatten's ablation: vanilla 70.5, + focusing 71.8, + DWC 74.1 on DeiT-T). Keyword arguments override these.
_BASELINE_DEFAULTS = {"dwc_kernel_size": 0, "pos_encoding": "none"}
_LINEAR = {"positional_size": True}

ATTENTIONS: dict[str, AttentionKind] = {
    "focused": AttentionKind(
        FocusedLinearAttention, class_tokens=True, summary="FLatten focused linear attention", **_LINEAR
    ),
    "linear": AttentionKind(
        FocusedLinearAttention,
        {"kernel": "relu", **_BASELINE_DEFAULTS},
        class_tokens=True,
        summary="ReLU linear attention",
        **_LINEAR,
    ),
    "elu": AttentionKind(
        FocusedLinearAttention,
        {"kernel": "elu", **_BASELINE_DEFAULTS},
        class_tokens=True,
        summary="ELU+1 linear attention",
        **_LINEAR,
    ),
    "favor": AttentionKind(
        FocusedLinearAttention, {"kernel": "favor", **_BASELINE_DEFAULTS}, summary="FAVOR+ random features", **_LINEAR
    ),
    "taylor": AttentionKind(
        FocusedLinearAttention,
        {"kernel": "taylor", **_BASELINE_DEFAULTS},
        summary="second-order Taylor features",
        **_LINEAR,
    ),
    "window": AttentionKind(WindowAttention, windowed=True, shifted=True, summary="Swin window softmax"),
    "softmax": AttentionKind(GlobalAttention, summary="global softmax"),
    "hybrid": AttentionKind(
        HybridAttention,
        windowed=True,
        shifted=True,
        positional_size=True,
        summary="window softmax + a global branch (focused linear, Nyström or Linformer)",
    ),
    "stripe": AttentionKind(StripeAttention, summary="CSwin cross-shaped stripe softmax with LePE"),
    "nystrom": AttentionKind(NystromAttention, summary="Nyströmformer: softmax through landmark means"),
    # the stage's grid sizes the learned projections (projection="learned"); the default pooled form ignores it
    "linformer": AttentionKind(
        LinformerAttention, positional_size=True, summary="Linformer: keys and values projected to k tokens"
    ),
}

ATTENTION_NAMES: tuple[str, ...] = tuple(ATTENTIONS)
"""Valid names for `create_attention` and every model's per-stage ``attn_layers``:
"focused" (FLatten focused linear attention), "linear" (ReLU linear attention), "elu" (ELU+1 linear attention),
"favor" (FAVOR+ random features), "taylor" (second-order Taylor features), "window" (Swin window softmax),
"softmax" (global softmax), "hybrid" (window softmax + a global branch), "stripe" (CSwin stripes), "nystrom"
(Nyströmformer), "linformer" (Linformer)."""


def attention_kind(name: str) -> AttentionKind:
    """The registry entry of ``name``; ValueError listing the valid names otherwise."""
    if name not in ATTENTIONS:
        raise ValueError(f"Unknown attention {name!r}; valid names are {', '.join(ATTENTION_NAMES)}.")
    return ATTENTIONS[name]


def create_attention(name: str, dim: int, num_heads: int, **kwargs: Any) -> nn.Module:
    """An attention module by name: `create_attention("focused", 96, 3, pos_size=(56, 56))`.

    Every module's forward is `forward(x, hw)` with x (B, N, C) and hw = (H, W). Keyword arguments go to the
    module's constructor (see `FocusedLinearAttention`, `WindowAttention`, `GlobalAttention`, `HybridAttention`,
    `StripeAttention`, `NystromAttention`, `LinformerAttention`). The kernel-named entries ("linear", "elu",
    "favor", "taylor") are `FocusedLinearAttention` with that kernel, without DWC or positional encoding unless
    `dwc_kernel_size` / `pos_encoding` are passed.
    """
    kind = attention_kind(name)
    fixed_kernel = kind.defaults.get("kernel")
    if fixed_kernel is not None and kwargs.get("kernel", fixed_kernel) != fixed_kernel:
        raise ValueError(
            f"create_attention({name!r}) fixes kernel={fixed_kernel!r} but got kernel={kwargs['kernel']!r}; "
            f"to choose the kernel yourself use create_attention('focused', dim, num_heads, kernel=...)."
        )
    return kind.module(dim, num_heads, **{**kind.defaults, **kwargs})


def parse_attention_spec(spec: Any, aliases: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """A spec (a name, or a mapping with ``name`` and keyword arguments) as (registry name, keyword arguments).

    ``aliases`` maps a family's own spellings to registry names. Raises ValueError for an unknown name and TypeError
    for a spec of another type or a mapping without ``name``.
    """
    aliases = aliases or {}
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, Mapping):
        if "name" not in spec:
            raise TypeError(
                f"an attention spec mapping needs a 'name' key, got keys {sorted(spec)}; e.g. "
                "{'name': 'window', 'window_size': 12}."
            )
        kwargs = {key: value for key, value in spec.items() if key != "name"}
        name = spec["name"]
    else:
        raise TypeError(
            f"an attention spec is a name or a mapping {{'name': ..., **kwargs}}, got {type(spec).__name__} {spec!r}."
        )
    name = aliases.get(name, name)
    if name not in ATTENTIONS:
        spellings = ", ".join([*ATTENTION_NAMES, *aliases])
        raise ValueError(f"Unknown attention {spec!r}; valid names are {spellings}.")
    return name, kwargs


def stage_attention_specs(
    specs: Any,
    num_stages: int,
    model_name: str,
    aliases: Mapping[str, str] | None = None,
    supported: Sequence[str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """One (name, keyword arguments) per stage from a model's ``attn_layers``.

    ``specs`` is one spec for every stage, or a sequence with one spec per stage; a string of one-letter aliases
    (CSwin's ``"LLSS"``) is a sequence. ``supported`` limits the names a family can build.
    """
    aliases = aliases or {}
    if isinstance(specs, Mapping) or (isinstance(specs, str) and (specs in ATTENTIONS or specs in aliases)):
        specs = [specs] * num_stages
    elif isinstance(specs, str) and specs and all(letter in aliases for letter in specs):
        specs = list(specs)
    elif isinstance(specs, str):
        parse_attention_spec(specs, aliases)  # raises, naming the valid names
    specs = list(specs)
    if len(specs) != num_stages:
        raise ValueError(
            f"{model_name} attn_layers needs one entry per stage ({num_stages}), got {len(specs)}: {specs!r}; pass "
            f"e.g. attn_layers={('focused',) * num_stages}."
        )
    parsed = [parse_attention_spec(spec, aliases) for spec in specs]
    for name, _ in parsed:
        if supported is not None and name not in supported:
            raise ValueError(f"{model_name} cannot build {name!r} attention; its stages take {', '.join(supported)}.")
    return parsed


def attention_options(name: str, options: Mapping[str, Any], explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a stage's attention: the family's ``options`` the module takes and its name does not
    fix (``focusing_factor`` reaches the focused module, not the window one; ``"linear"`` keeps its zero DWC), then
    the spec's ``explicit`` ones, which must all be the module's. TypeError names an argument the module lacks."""
    kind = attention_kind(name)
    unknown = sorted(key for key in explicit if not kind.accepts(key))
    if unknown:
        takes = ", ".join(key for key in kind.parameters() if key not in ("dim", "num_heads", "device", "dtype"))
        raise TypeError(f"attention {name!r} takes no argument {', '.join(unknown)}; it takes {takes}.")
    kept = {key: value for key, value in options.items() if kind.accepts(key) and key not in kind.defaults}
    return {**kept, **explicit}


def shifted_block_kwargs(name: str, stage_kwargs: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The attention keywords of a stage's block ``index``: shifted kinds alternate plain and half-shifted windows
    (Swin), unless the stage fixed ``shift_size``."""
    kind = attention_kind(name)
    if not kind.shifted or index % 2 == 0 or "shift_size" in stage_kwargs:
        return dict(stage_kwargs)
    window = stage_kwargs.get("window_size", kind.default("window_size"))
    shift = window // 2 if isinstance(window, int) else tuple(w // 2 for w in window)
    return {**stage_kwargs, "shift_size": shift}
