"""Safe checkpoint loading: authors' training files with pickled configs, refusal of code, corrupt files."""

from __future__ import annotations

import sys
import types
from collections import OrderedDict

import pytest
import torch

from linvit.io import (
    CheckpointError,
    UntrustedCheckpointError,
    extract_model_state_dict,
    load_checkpoint_file,
    load_pretrained_file,
)


@pytest.fixture
def fake_yacs(monkeypatch):
    """A stand-in for ``yacs.config.CfgNode`` (a dict subclass with attributes), importable under yacs's name."""

    class CfgNode(dict):
        def __init__(self, items=None):
            super().__init__(items or {})
            self.__dict__["__immutable__"] = False
            self.__dict__["__deprecated_keys__"] = set()
            self.__dict__["__new_allowed__"] = False

    CfgNode.__module__ = "yacs.config"
    CfgNode.__qualname__ = "CfgNode"
    package = types.ModuleType("yacs")
    module = types.ModuleType("yacs.config")
    module.CfgNode = CfgNode
    package.config = module
    monkeypatch.setitem(sys.modules, "yacs", package)
    monkeypatch.setitem(sys.modules, "yacs.config", module)
    return CfgNode


def _authors_style_checkpoint(cfg_class, state_dict):
    config = cfg_class({"MODEL": cfg_class({"TYPE": "flatten_swin", "DROP_PATH_RATE": 0.2}), "TAG": "default"})
    return {
        "model": state_dict,
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
        "lr_scheduler": {"last_epoch": 3},
        "max_accuracy": 81.5,
        "epoch": 299,
        "config": config,
        "state_dict_ema": {k: v + 1 for k, v in state_dict.items()},
    }


def test_authors_file_with_pickled_config_loads_safely(tmp_path, fake_yacs):
    weights = {"layer.weight": torch.randn(3, 2), "layer.bias": torch.randn(3)}
    path = tmp_path / "ckpt.pth"
    torch.save(_authors_style_checkpoint(fake_yacs, weights), path)

    # The config class must not be needed (or imported) to load the file.
    del sys.modules["yacs.config"]
    checkpoint = load_checkpoint_file(path)
    assert isinstance(checkpoint["config"], OrderedDict)
    assert checkpoint["config"]["MODEL"]["TYPE"] == "flatten_swin"
    assert checkpoint["epoch"] == 299
    state = extract_model_state_dict(checkpoint)
    assert state.keys() == weights.keys()
    torch.testing.assert_close(state["layer.weight"], weights["layer.weight"])
    ema = extract_model_state_dict(checkpoint, use_ema=True)
    torch.testing.assert_close(ema["layer.bias"], weights["layer.bias"] + 1)


class _Payload:
    """Pickles as a call to ``_record_execution``: loading it would run code."""

    def __reduce__(self):
        return (_record_execution, ("payload ran",))


_EXECUTED: list[str] = []


def _record_execution(message):
    _EXECUTED.append(message)
    return message


def test_malicious_payload_is_refused_and_not_run(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "config": _Payload()}, path)
    _EXECUTED.clear()
    with pytest.raises(UntrustedCheckpointError, match="trusted=True") as info:
        load_checkpoint_file(path)
    assert _EXECUTED == []
    assert "_record_execution" in str(info.value)
    # Opting in runs the file's code, as documented.
    checkpoint = load_checkpoint_file(path, trusted=True)
    assert checkpoint["config"] == "payload ran" and _EXECUTED == ["payload ran"]


def test_os_system_payload_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil_os.pth"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "x": Evil()}, path)
    with pytest.raises(UntrustedCheckpointError, match="trusted=True"):
        load_checkpoint_file(path)
    assert not marker.exists()


def test_missing_and_corrupt_files_raise_value_errors(tmp_path):
    with pytest.raises(ValueError, match="not found.*nope.pth"):
        load_checkpoint_file(tmp_path / "nope.pth")
    good = tmp_path / "good.pth"
    torch.save({"model": {"w": torch.randn(64, 64)}}, good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated.pth"):
        load_checkpoint_file(truncated)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(CheckpointError, match="garbage.safetensors"):
        load_checkpoint_file(garbage)
    not_a_dict = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], not_a_dict)
    with pytest.raises(CheckpointError, match="expected a dict"):
        load_checkpoint_file(not_a_dict)


def test_safetensors_roundtrip(tmp_path):
    from safetensors.torch import save_file

    weights = {"a.weight": torch.randn(4, 4), "a.bias": torch.randn(4)}
    path = tmp_path / "w.safetensors"
    save_file(weights, str(path))
    loaded = extract_model_state_dict(load_checkpoint_file(path))
    torch.testing.assert_close(loaded, weights)


@pytest.mark.parametrize("key", ["model", "state_dict", None])
def test_extract_unwraps_and_strips_prefixes(key):
    inner = {"module.a.weight": torch.zeros(2), "module.a.bias": torch.ones(2)}
    checkpoint = {key: inner, "epoch": 1} if key else inner
    assert set(extract_model_state_dict(checkpoint)) == {"a.weight", "a.bias"}


def test_extract_without_state_dict_raises():
    with pytest.raises(CheckpointError, match="no state dict"):
        extract_model_state_dict({"epoch": 3, "config": {"a": 1}})


def test_load_pretrained_file_applies_filter_and_drops_other_classifier(tmp_path):
    source = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 10))
    path = tmp_path / "w.pth"
    torch.save({"model": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    target = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    target.pretrained_cfg = {"classifier": "1", "first_conv": None}
    calls = []

    def filter_fn(state_dict, model):
        calls.append(model)
        return state_dict

    load_pretrained_file(target, path, filter_fn)
    assert calls == [target]
    torch.testing.assert_close(target[0].weight, source[0].weight)
    assert target[1].weight.shape == (3, 8)
    # A checkpoint of the wrong model is an error naming the keys.
    torch.save({"model": {"other.weight": torch.zeros(1)}}, path)
    with pytest.raises(CheckpointError, match="missing keys"):
        load_pretrained_file(target, path)


# ------------------------------------------------------------------------------------------------------------------
# another variant's weights: a short summary before anything is loaded
# ------------------------------------------------------------------------------------------------------------------
def test_shape_mismatch_is_summarised_and_leaves_the_model_untouched(tmp_path):
    import timm

    import linvit.models  # noqa: F401  (registers the models)

    source = timm.create_model("flatten_pvt_v2_b0", num_classes=7)  # the full registered variant
    path = tmp_path / "b0.pth"
    torch.save(source.state_dict(), path)
    model = timm.create_model("flatten_pvt_v2_b1", num_classes=3, depths=(1, 1, 1, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_pretrained_file(model, path)
    message = str(info.value)
    assert "flatten_pvt_v2_b1 (FlattenPvtV2)" in message
    assert "shape mismatches (stages.0.patch_embed.proj.weight: file (32, 3, 7, 7) vs model (64, 3, 7, 7)" in message
    assert "unexpected keys ['stages.0.blocks.1." in message  # b0 has two blocks per stage, this model one
    assert "The file fits flatten_pvt_v2_b0" in message  # the registered variant it was saved from
    assert len(message) < 1000
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "a failed load changed weights"


def test_non_strict_load_skips_what_does_not_fit(tmp_path):
    source = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 10))
    path = tmp_path / "w.pth"
    torch.save(source.state_dict(), path)
    target = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 10), torch.nn.Linear(10, 2))
    target[1] = torch.nn.Linear(8, 5)
    before = target[1].weight.clone()
    load_pretrained_file(target, path, strict=False)
    torch.testing.assert_close(target[0].weight, source[0].weight)
    assert torch.equal(target[1].weight, before)


# ------------------------------------------------------------------------------------------------------------------
# pickle protocols 4-5: the safe loader cannot read them, so they are refused as untrusted (naming the opt-in)
# ------------------------------------------------------------------------------------------------------------------
def test_protocol_5_file_is_refused_with_the_opt_in_and_loads_when_trusted(tmp_path):
    state = {"weight": torch.arange(4.0)}
    path = tmp_path / "p5.pth"
    torch.save(state, path, pickle_protocol=5)
    with pytest.raises(UntrustedCheckpointError) as info:
        load_checkpoint_file(path)
    message = str(info.value)
    assert "pickle protocol 5" in message and "trusted=True" in message and "Nothing from it was executed" in message
    assert "names no objects beyond tensors" in message
    torch.testing.assert_close(load_checkpoint_file(path, trusted=True)["weight"], state["weight"])


def test_protocol_4_file_with_a_foreign_object_names_it(tmp_path):
    path = tmp_path / "p4.pth"
    torch.save({"weight": torch.zeros(2), "cfg": types.SimpleNamespace(lr=0.1)}, path, pickle_protocol=4)
    with pytest.raises(UntrustedCheckpointError, match=r"(?s)protocol 4.*types\.SimpleNamespace.*trusted=True"):
        load_checkpoint_file(path)
