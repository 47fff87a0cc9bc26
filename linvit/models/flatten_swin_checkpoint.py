"""How a FLatten-Swin checkpoint of the authors meets the model, for `flatten_swin.checkpoint_filter_fn`.

- `check_stage_attention`: each stage's attention kind (linear, window softmax, or the authors' mixed stage: linear
  blocks then softmax ones) as the keys show it, the same in file and model, or a ValueError that says how to build
  the model;
- `shrunk_window_stages`: the stages whose softmax windows the authors' code shrank to a small map (and those it
  shifted), read from the buffers their files keep;
- `fit_relative_position_tables`: each relative position bias table at the model's size, centred for windows the
  authors shrank, else resized bicubically.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from linvit.attention import resize_relative_position_bias
from linvit.attention.window import centre_relative_position_bias
from linvit.models._family import CreationOptionsError, spell_options

__all__ = ["DROPPED_SUFFIXES", "check_stage_attention", "fit_relative_position_tables", "shrunk_window_stages"]

DROPPED_SUFFIXES = ("relative_position_index", "attn_mask", "relative_coords_table")
_STAGE_KEY = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.")


def _stage_of(key: str) -> int:
    """The stage of a block key ``layers.{stage}.blocks.{j}...``, -1 for other keys."""
    match = _STAGE_KEY.match(key)
    return int(match.group(1)) if match else -1


def _stage_letters(keys: Any, num_stages: int) -> list[str | None]:
    """Per stage, the authors' letter of its attention as its blocks' keys show it: "L" (blocks with
    ``positional_encoding`` only), "S" (``relative_position_bias_table`` only), "M{k}" (k such linear blocks, then
    softmax ones: the authors' mixed stage), or None (other kinds, or no blocks)."""
    blocks: list[dict[int, set[str]]] = [{} for _ in range(num_stages)]
    for key in keys:
        match = _STAGE_KEY.match(key)
        if match and int(match.group(1)) < num_stages:
            for table in ("positional_encoding", "relative_position_bias_table"):
                if key.endswith(f".attn.{table}"):
                    blocks[int(match.group(1))].setdefault(int(match.group(2)), set()).add(table)
    letters: list[str | None] = []
    for found in blocks:
        kinds = "".join(
            {frozenset({"positional_encoding"}): "L", frozenset({"relative_position_bias_table"}): "S"}.get(
                frozenset(found.get(j, ())), "?"
            )
            for j in range(max(found, default=-1) + 1)
        )
        linear = len(kinds) - len(kinds.lstrip("L"))
        if not kinds or "?" in kinds or kinds != "L" * linear + "S" * (len(kinds) - linear):
            letters.append(None)
        else:
            letters.append("L" if linear == len(kinds) else "S" if linear == 0 else f"M{linear}")
    return letters


def _attn_layers(letters: list[str | None]) -> str | tuple[str, ...]:
    """The ``attn_layers`` that builds stages of these letters: the authors' string ("LLSS", "LLMS4": one letter per
    stage, then the count of every M stage), or a tuple of letters where M stages differ in their counts."""
    stage_letters = [letter or "?" for letter in letters]
    counts = {letter[1:] for letter in stage_letters if letter.startswith("M")}
    if len(counts) > 1:
        return tuple(stage_letters)
    return "".join(letter[0] for letter in stage_letters) + "".join(counts)


def _kind(letter: str) -> str:
    if letter.startswith("M"):
        return f"mixed (its first {letter[1:]} blocks focused linear attention, then window softmax)"
    return {"L": "focused linear attention", "S": "window softmax attention"}[letter]


def check_stage_attention(state_dict: dict[str, torch.Tensor], model: nn.Module) -> None:
    """ValueError when a stage's attention kind (linear, window softmax, or the authors' mixed stage) differs between
    checkpoint and model.

    The messages of checkpoint filters are one sentence: the loader reports the first sentence of a filter's error.
    """
    ours = _stage_letters(model.state_dict(), model.num_stages)
    theirs = _stage_letters(state_dict, model.num_stages)
    for i, (mine, found) in enumerate(zip(ours, theirs)):
        if mine is not None and found is not None and mine != found:
            options = {"attn_layers": _attn_layers(theirs)}
            raise CreationOptionsError(
                f"stage {i + 1} of the checkpoint is {_kind(found)} but stage {i + 1} of the model is {_kind(mine)}: "
                f"build the model with the checkpoint's attention per stage, {spell_options(options)} "
                "(L = linear, S = softmax, M = the first blocks linear)",
                options,
            )


def shrunk_window_stages(state_dict: dict[str, torch.Tensor]) -> tuple[set[int], set[int]]:
    """(stages whose softmax windows the authors' code shrank to the map, stages it shifted) in an authors' file.

    Their softmax blocks with an odd index shift (and store an ``attn_mask``) exactly when the map is larger than the
    window; a stage whose odd softmax blocks store none had its window clamped to the map. Only files that keep the
    computed buffers (``relative_position_index``) tell; others give two empty sets.
    """
    if not any(key.endswith(".relative_position_index") for key in state_dict):
        return set(), set()
    odd_softmax, shifted = set(), set()
    for key in state_dict:
        match = _STAGE_KEY.match(key)
        if match and int(match.group(2)) % 2 == 1 and key.endswith(".attn.relative_position_index"):
            odd_softmax.add(int(match.group(1)))
            if key[: -len("attn.relative_position_index")] + "attn_mask" in state_dict:
                shifted.add(int(match.group(1)))
    return odd_softmax - shifted, shifted


def _table_window(table: torch.Tensor) -> int | None:
    """w of a square ((2w-1)^2, heads) table, else None."""
    side = math.isqrt(table.shape[0])
    return (side + 1) // 2 if side * side == table.shape[0] and side % 2 == 1 else None


def fit_relative_position_tables(
    state_dict: dict[str, torch.Tensor], model: nn.Module, shrunk: set[int], shifted: set[int]
) -> dict[str, torch.Tensor]:
    """Each relative position bias table at the size of the model's.

    A table the authors shrank with its window (a model built below its native size) goes to the centre of the
    model's, offset by offset (`centre_relative_position_bias`), exact where the model clamps its window to the same
    map; the model's offsets beyond it repeat its edge. A table of another configured window (a 224 checkpoint in a
    384 model) is resized bicubically, as the authors' fine-tuning does. Their configured window is that of their
    shifted stages; when none shifted, it is taken to be the model's.
    """
    target = model.state_dict()
    tables = [key for key in state_dict if key.endswith(".relative_position_bias_table") and _STAGE_KEY.match(key)]
    configured = {_table_window(state_dict[key]) for key in tables if _stage_of(key) in shifted}
    for key, value in list(state_dict.items()):
        if not key.endswith(".relative_position_bias_table") or key not in target or value.shape == target[key].shape:
            continue
        window = model.get_submodule(key[: -len(".relative_position_bias_table")]).window_size
        old = _table_window(value)
        same_configuration = not configured or configured == {window[0]} == {window[1]}
        if _stage_of(key) in shrunk and old is not None and old < min(window) and same_configuration:
            state_dict[key] = centre_relative_position_bias(value, (old, old), window)
        else:
            state_dict[key] = resize_relative_position_bias(value, target[key].shape[0])
    return state_dict
