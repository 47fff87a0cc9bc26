"""Checkpoints from elsewhere: another model's file, a truncated file, a pickle that would run code.

Nothing may execute code from a checkpoint by default; every refusal names the explicit opt-in.
"""

import datetime
import pickle
from pathlib import Path

import pytest
import timm
import torch
from _families import create_shallow, smallest_variant_per_family
from safetensors.torch import save_file

import linvit  # noqa: F401
from linvit.io import CheckpointError, UntrustedCheckpointError, load_pretrained_file
from linvit.train.runs.hydra_app import config_dir

CONFIGS = config_dir()  # the configs linvit ships (linvit/configs)


class _Payload:
    """Unpickling this creates a marker file: proof that loading ran code named by the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _write_payload_checkpoint(path: Path, marker: Path, protocol: int = 2) -> Path:
    checkpoint = {"state_dict": {"layer.weight": torch.zeros(2)}, "hyper_parameters": _Payload(marker)}
    torch.save(checkpoint, path, pickle_protocol=protocol)
    return path


@pytest.fixture
def small_model():
    return timm.create_model("flatten_pvt_v2_b0", num_classes=3, depths=(1, 1, 1, 1))


def test_another_models_checkpoint_lists_missing_and_unexpected_keys(tmp_path, small_model):
    other = timm.create_model("flatten_deit_tiny_patch16_224", num_classes=3, depth=1)
    torch.save(other.state_dict(), tmp_path / "deit.pth")
    with pytest.raises(CheckpointError, match=r"(?s)does not match.*missing keys \[.+\].*unexpected keys \[.+\]"):
        load_pretrained_file(small_model, tmp_path / "deit.pth")


def test_a_checkpoint_of_another_size_summarises_shape_mismatches(tmp_path, small_model):
    bigger = timm.create_model("flatten_pvt_v2_b1", num_classes=3, depths=(1, 1, 1, 1))
    torch.save(bigger.state_dict(), tmp_path / "b1.pth")
    with pytest.raises(CheckpointError, match=r"(?s)shape.*\(64, 3, 7, 7\).*\(32, 3, 7, 7\)") as info:
        load_pretrained_file(small_model, tmp_path / "b1.pth")
    assert len(str(info.value)) < 2000, "the summary should be short"


def test_a_truncated_checkpoint_is_a_clear_error(tmp_path, small_model):
    torch.save(small_model.state_dict(), tmp_path / "full.pth")
    data = (tmp_path / "full.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=r"(?s)cut\.pth.*(truncated|corrupt)"):
        load_pretrained_file(small_model, tmp_path / "cut.pth")


def test_a_pickle_that_runs_code_is_refused_and_names_the_opt_in(tmp_path, small_model):
    marker = tmp_path / "code_ran"
    path = _write_payload_checkpoint(tmp_path / "evil.pth", marker)
    with pytest.raises(UntrustedCheckpointError, match=r"trusted=True"):
        load_pretrained_file(small_model, path)
    assert not marker.exists(), "loading executed code from the checkpoint"


def test_a_protocol_5_pickle_is_refused_and_names_the_opt_in(tmp_path, small_model):
    marker = tmp_path / "code_ran"
    path = _write_payload_checkpoint(tmp_path / "evil5.pth", marker, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        with pytest.raises(UntrustedCheckpointError, match=r"trusted=True"):
            load_pretrained_file(small_model, path)
    finally:
        assert not marker.exists(), "loading executed code from the checkpoint"


def test_timm_pretrained_file_goes_through_the_safe_loader(tmp_path):
    marker = tmp_path / "code_ran"
    path = _write_payload_checkpoint(tmp_path / "evil.pth", marker)
    with pytest.raises(UntrustedCheckpointError):
        timm.create_model("flatten_pvt_v2_b0", pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    assert not marker.exists()


# -- every family, every kind of bad file, through timm.create_model ------------------------------------------------
def _bad_file(kind: str, name: str, folder: Path, marker: Path) -> tuple[Path, type, str]:
    """A bad weight file of one kind for model ``name``, the error it must raise and a pattern its message matches."""
    weights = create_shallow(name).state_dict()
    path = folder / f"{kind}.pth"
    if kind == "zero_bytes":
        path.write_bytes(b"")
        return path, CheckpointError, r"empty \(0 bytes\)"
    if kind in ("truncated", "truncated_safetensors"):
        if kind == "truncated":
            torch.save(weights, path)
        else:
            path = path.with_suffix(".safetensors")
            save_file(weights, str(path))
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
        return path, CheckpointError, r"truncated"
    if kind == "text":
        path.write_text("Not Found\n")
        return path, CheckpointError, r"text, not a checkpoint \(it starts with 'Not Found'\)"
    if kind == "list":
        torch.save(list(weights.values()), path)
        return path, CheckpointError, r"holds a list, expected a dict"
    if kind == "missing":
        return path, CheckpointError, r"not found"
    if kind == "no_tensors":
        torch.save({"epoch": 3, "config": {"lr": 0.1}}, path)
        return path, CheckpointError, r"no state dict"
    if kind == "another_family":
        other = "linvit_nano" if not name.startswith("linvit") else "flatten_pvt_v2_b0"
        torch.save(create_shallow(other).state_dict(), path)
        return path, CheckpointError, r"does not match|no weights .* can use"
    if kind == "runs_code":
        _write_payload_checkpoint(path, marker)
        return path, UntrustedCheckpointError, r"trusted=True"
    raise AssertionError(kind)


BAD_FILE_KINDS = [
    "zero_bytes",
    "truncated",
    "truncated_safetensors",
    "text",
    "list",
    "missing",
    "no_tensors",
    "another_family",
    "runs_code",
]


@pytest.mark.parametrize("kind", BAD_FILE_KINDS)
@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_every_family_names_a_bad_weight_file_in_a_short_error(tmp_path, name, kind):
    marker = tmp_path / "code_ran"
    path, error, pattern = _bad_file(kind, name, tmp_path, marker)
    with pytest.raises(error, match=pattern) as info:
        create_shallow(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    message = str(info.value)
    assert str(path) in message, f"the error does not name the file: {message}"
    assert len(message) < 1200, f"the error should be short, got {len(message)} characters"
    assert not marker.exists(), "loading executed code from the file"


@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_every_family_loads_a_trusted_pickle_when_asked(tmp_path, name):
    torch.manual_seed(0)
    weights = create_shallow(name).state_dict()
    path = tmp_path / "trusted.pth"
    torch.save({"model": weights, "saved_on": datetime.date(2024, 1, 2)}, path)  # a global the safe loader refuses
    with pytest.raises(UntrustedCheckpointError, match=r"datetime\.date"):
        create_shallow(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    model = create_shallow(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, trusted=True)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[key], msg=key)
    with pytest.raises(TypeError, match=r"trusted must be True or False"):
        create_shallow(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, trusted="yes")


# -- the training entry ---------------------------------------------------------------------------------------------
def _compose(tmp_path: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                f"paths.output_dir={tmp_path / 'run'}",
                "model.model_name=linvit_nano",
                "data.img_size=16",
                "+trainer.limit_train_batches=1",
                "+trainer.limit_val_batches=1",
                "trainer.max_epochs=1",
                "trainer.num_sanity_val_steps=0",
                "trainer.enable_progress_bar=false",
                "logger=none",
                "callbacks.learning_curves=null",
                "callbacks.model_summary=null",
                "test=false",
                "export.enabled=false",
                *overrides,
            ],
        )


def test_own_training_checkpoints_load_with_weights_only(tmp_path):
    from hydra.utils import instantiate

    cfg = _compose(tmp_path)
    model, data = instantiate(cfg.model), instantiate(cfg.data)
    checkpoint = {"hyper_parameters": dict(model.hparams), "datamodule_hyper_parameters": dict(data.hparams)}
    torch.save(checkpoint, tmp_path / "hparams.ckpt")
    torch.load(tmp_path / "hparams.ckpt", weights_only=True)


def test_resuming_from_a_strangers_checkpoint_runs_no_code(tmp_path):
    from linvit.train.runs.run import train

    marker = tmp_path / "code_ran"
    path = _write_payload_checkpoint(tmp_path / "evil.ckpt", marker)
    with pytest.raises(Exception) as info:  # noqa: PT011  (the message is checked below, after the marker)
        train(_compose(tmp_path, f"ckpt_path={path}"))
    assert not marker.exists(), "resuming executed code from the checkpoint"
    assert "trust_checkpoint" in str(info.value)
