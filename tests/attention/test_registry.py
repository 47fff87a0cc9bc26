"""The attention vocabulary: names, traits, specs per stage, options, shifts, and set_pos_size."""

import pytest
import torch

from linvit.attention import (
    ATTENTION_NAMES,
    ATTENTIONS,
    FocusedLinearAttention,
    attention_kind,
    attention_options,
    create_attention,
    parse_attention_spec,
    resize_positional_table,
    shifted_block_kwargs,
    stage_attention_specs,
)


def test_traits_say_what_a_stage_supplies():
    windowed = {name for name, kind in ATTENTIONS.items() if kind.windowed}
    shifted = {name for name, kind in ATTENTIONS.items() if kind.shifted}
    assert windowed == shifted == {"window", "hybrid"}
    assert {name for name, kind in ATTENTIONS.items() if kind.class_tokens} == {"focused", "linear", "elu"}
    for name, kind in ATTENTIONS.items():  # a trait promises an argument the module takes
        assert kind.accepts("window_size") or not kind.windowed, name
        assert kind.accepts("shift_size") or not kind.shifted, name
        assert kind.accepts("pos_size") or not kind.positional_size, name
        assert kind.accepts("num_prefix_tokens") or not kind.class_tokens, name
    assert attention_kind("window").default("window_size") == 7
    assert attention_kind("linear").default("dwc_kernel_size") == 0


def test_nystrom_and_linformer_are_global_and_linformer_takes_the_stage_grid():
    """Neither attends in windows or takes class tokens; Linformer's learned projections are sized by the stage's
    token grid (pos_size), which the pooled default ignores."""
    for name in ("nystrom", "linformer"):
        kind = attention_kind(name)
        assert not (kind.windowed or kind.shifted or kind.class_tokens), name
    assert not attention_kind("nystrom").positional_size and attention_kind("linformer").positional_size
    stage = attention_options("linformer", {"qkv_bias": False, "focusing_factor": 2.0}, {"projection": "learned"})
    assert stage == {"qkv_bias": False, "projection": "learned"}
    learned = create_attention("linformer", 16, 2, **stage, pos_size=(5, 6))
    assert learned.key_projection.shape == (256, 30)
    with pytest.raises(TypeError, match="attention 'nystrom' takes no argument window_size; it takes qkv_bias"):
        attention_options("nystrom", {}, {"window_size": 7})


def test_specs_are_names_or_mappings_with_aliases():
    assert parse_attention_spec("focused") == ("focused", {})
    assert parse_attention_spec({"name": "window", "window_size": 12}) == ("window", {"window_size": 12})
    assert parse_attention_spec("L", aliases={"L": "focused"}) == ("focused", {})
    with pytest.raises(ValueError, match="valid names are focused, .*stripe, nystrom, linformer, L"):
        parse_attention_spec("performer", aliases={"L": "focused"})
    with pytest.raises(TypeError, match="'name' key"):
        parse_attention_spec({"window_size": 12})
    with pytest.raises(TypeError, match="a name or a mapping"):
        parse_attention_spec(3)


def test_stage_specs_one_for_all_a_list_or_a_string_of_letters():
    assert stage_attention_specs("window", 2, "M") == [("window", {}), ("window", {})]
    assert stage_attention_specs({"name": "softmax"}, 2, "M") == [("softmax", {}), ("softmax", {})]
    aliases = {"L": "focused", "S": "stripe"}
    assert [name for name, _ in stage_attention_specs("LLSS", 4, "M", aliases)] == [
        "focused",
        "focused",
        "stripe",
        "stripe",
    ]
    with pytest.raises(ValueError, match="one entry per stage"):
        stage_attention_specs(["focused", "window"], 4, "M")
    with pytest.raises(ValueError, match="Unknown attention 'focusd'"):
        stage_attention_specs("focusd", 4, "M")
    with pytest.raises(ValueError, match="M cannot build 'window' attention; its stages take focused, stripe"):
        stage_attention_specs("window", 2, "M", supported=("focused", "stripe"))


def test_options_reach_only_the_modules_that_take_them():
    family = {"focusing_factor": 2.0, "dwc_kernel_size": 3, "qkv_bias": False}
    assert attention_options("window", family, {}) == {"qkv_bias": False}
    assert attention_options("focused", family, {"pos_size": (4, 4)}) == {**family, "pos_size": (4, 4)}
    assert attention_options("linear", family, {}) == {"focusing_factor": 2.0, "qkv_bias": False}  # DWC stays off
    assert attention_options("linear", family, {"dwc_kernel_size": 5})["dwc_kernel_size"] == 5  # unless asked for
    with pytest.raises(TypeError, match="attention 'window' takes no argument focusing_factor; it takes window_size"):
        attention_options("window", {}, {"focusing_factor": 2.0})


def test_shifted_kinds_alternate_half_windows():
    stage = {"window_size": 8}
    assert [shifted_block_kwargs("window", stage, i).get("shift_size") for i in range(3)] == [None, 4, None]
    assert shifted_block_kwargs("hybrid", {"window_size": (6, 4)}, 1)["shift_size"] == (3, 2)
    assert shifted_block_kwargs("window", {}, 1)["shift_size"] == 3  # the module's default window, 7
    assert shifted_block_kwargs("window", {"shift_size": 0}, 1) == {"shift_size": 0}
    assert shifted_block_kwargs("focused", stage, 1) == stage


def test_every_name_builds_and_runs():
    for name in ATTENTION_NAMES:
        module = create_attention(name, 16, 2, **({"pos_size": (3, 5)} if name == "focused" else {}))
        assert module(torch.randn(1, 15, 16), (3, 5)).shape == (1, 15, 16), name


def test_set_pos_size_resizes_the_table_and_a_window_tied_to_it():
    torch.manual_seed(0)
    attn = FocusedLinearAttention(16, 2, pos_size=(4, 4), window_size=(4, 4))
    attn.positional_encoding.data.normal_()
    attn.positional_encoding.requires_grad_(False)
    old = attn.positional_encoding.detach().clone()
    attn.set_pos_size((6, 3))
    assert attn.pos_size == (6, 3) and attn.window_size == (6, 3)
    assert not attn.positional_encoding.requires_grad
    torch.testing.assert_close(attn.positional_encoding, resize_positional_table(old, (4, 4), (6, 3)))

    global_attn = FocusedLinearAttention(16, 2, pos_size=(4, 4))
    global_attn.set_pos_size(5)
    assert global_attn.pos_size == (5, 5) and global_attn.window_size is None
    assert global_attn.positional_encoding.shape == (1, 25, 16)

    untied = FocusedLinearAttention(16, 2, pos_size=(2, 2), window_size=(4, 4))
    untied.set_pos_size((3, 3))
    assert untied.window_size == (4, 4)
    no_table = FocusedLinearAttention(16, 2, pos_encoding="none")
    no_table.set_pos_size((3, 3))
    assert no_table.positional_encoding is None and no_table.pos_size is None


def test_prefix_tokens_need_a_kernel_of_the_ops_layer():
    with pytest.raises(ValueError, match="num_prefix_tokens=1 is not supported with kernel='favor'"):
        create_attention("favor", 16, 2, num_prefix_tokens=1)
