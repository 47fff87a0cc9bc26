"""Property tests: linvit's commands on real artefacts that Hypothesis damages (docs/reliability.md, "Threat model").

Each property copies a real artefact (a trained run, exported weights, a weights file, images) into a sandbox of its
own, damages it with a strategy of ``artefact_mutations``, runs a command on it in this process and checks the promises
(``hostile_harness.Outcome.check``): exit 0 or one error line naming the file or key, no traceback, no process spawned,
nothing unpickled, no file opened in the sandbox that the command line does not name (a canary sits beside the
artefacts, and damaged configs name it), within a time limit. Where linvit recorded a checkpoint's SHA-256 when it wrote
it, any change to its bytes must be refused.

The default tier tries a few derandomized examples of each property (Hypothesis profile ``hostile-fast``), CI's slow
tier many random ones (``LINVIT_HYPOTHESIS_PROFILE=hostile-long``, see conftest.py). The failures Hypothesis found
are kept as ``@example``s: the classes of failure of issue 34, tried first in every run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from artefact_mutations import (
    CANARY,
    CANARY_NAME,
    YAML_INJECTIONS,
    apply_byte_edits,
    apply_config_edits,
    byte_edits,
    config_edits,
)
from hostile_harness import peak_memory_mib, run_command
from hypothesis import example, given
from hypothesis import strategies as st

MEMORY_GROWTH_MIB = 4096  # the peak a whole property may add to this process (the 1x1,000,000 PNG took 6.2 GB)


def _sandbox(real_artefacts: Path, *names: str) -> Path:
    """A fresh folder with copies of ``names`` from the artefacts and a canary file no command line names."""
    sandbox = Path(tempfile.mkdtemp(prefix="hostile-", dir=real_artefacts.parent))
    for name in names:
        source = real_artefacts / name
        if source.is_dir():
            shutil.copytree(source, sandbox / name)
        else:
            shutil.copy(source, sandbox / name)
    (sandbox / CANARY_NAME).write_bytes(b"a file no command line names")
    return sandbox


@pytest.fixture(autouse=True, scope="module")
def _memory_stays_bounded():
    before = peak_memory_mib()
    yield
    grown = peak_memory_mib() - before
    assert grown < MEMORY_GROWTH_MIB, f"the properties of this module raised the peak memory by {grown:.0f} MiB"


RUN_COMMANDS = st.sampled_from(["eval", "export"])


def _run_command_line(command: str, run: Path, sandbox: Path) -> list[str]:
    extra = ["--accelerator", "cpu"] if command == "eval" else ["--out", str(sandbox / "out")]
    return [command, str(run), *extra]


# ------------------------------------------------------------------------------------------------ a run's config.yaml
@given(command=RUN_COMMANDS, edits=config_edits, injection=st.none() | st.sampled_from(YAML_INJECTIONS))
@example(command="eval", edits=[(0.0, "add", "trainer", {"max_epochs": [1, 2]})], injection=None)
@example(command="eval", edits=[(0.0, "add", "data", {"mean": [float("nan")]})], injection=None)
@example(command="export", edits=[(0.0, "replace", "", 0)], injection=YAML_INJECTIONS[0])
@example(command="eval", edits=[(0.5, "add", "_partial_", True)], injection=None)
@example(command="eval", edits=[(0.5, "add", "_target_ ", "builtins.eval")], injection=None)
@example(command="eval", edits=[(0.0, "replace", "_target_", {})], injection=None)  # found: no data._target_
def test_a_damaged_run_config_is_refused_by_key(real_artefacts, command, edits, injection):
    sandbox = _sandbox(real_artefacts, "run")
    run = sandbox / "run"
    path = run / "config.yaml"
    canary = str(sandbox / CANARY_NAME)
    config, touched = apply_config_edits(yaml.safe_load(path.read_text()), edits, canary)
    text = yaml.safe_dump(config, allow_unicode=True)
    if injection is not None:
        text += injection.format(canary=canary)
        touched += ["evil", "anchor", "alias", "deep", "a", "b", "c"]
    path.write_text(text)
    outcome = run_command(_run_command_line(command, run, sandbox))
    outcome.check([str(path), "config.yaml", *touched], sandbox, allowed_opens=[run, sandbox / "out"])


# ------------------------------------------------------------------------------------------------ checkpoint bytes
@given(command=RUN_COMMANDS, edits=byte_edits)
@example(command="eval", edits=[("zero", 0.5, 4095, b"x")])  # 4 KB of a tensor zeroed: loaded silently before
@example(command="export", edits=[("flip", 0.7, 3, b"x")])
def test_damaged_checkpoint_bytes_are_never_used(real_artefacts, command, edits):
    sandbox = _sandbox(real_artefacts, "run")
    run = sandbox / "run"
    checkpoint = run / "checkpoints" / "best.ckpt"
    checkpoint.write_bytes(apply_byte_edits(checkpoint.read_bytes(), edits))
    outcome = run_command(_run_command_line(command, run, sandbox))
    outcome.check([str(checkpoint), "best.ckpt"], sandbox, allowed_opens=[run, sandbox / "out"])
    # linvit recorded the checkpoint's SHA-256 when the run wrote it: changed bytes are never used
    assert outcome.status not in (0, None), f"linvit {command} used a damaged checkpoint:\n{outcome.stderr[-1500:]}"


# ------------------------------------------------------------------------------------------------ exported weights
@given(edits=config_edits, weights_edits=st.none() | byte_edits)
@example(edits=[(0.0, "add", "model_args", {"trusted": True, "in_chans": 3})], weights_edits=None)
@example(edits=[(0.0, "add", "model_args", {"pretrained_cfg_overlay": {"file": CANARY}})], weights_edits=None)
@example(edits=[(0.0, "add", "model_args", {"allow_non_finite": True})], weights_edits=None)
@example(edits=[], weights_edits=[("flip", 0.9, 1, b"x")])
# found by hostile-hunt: a key holding a record separator (\x1e) split the one error line in two
@example(edits=[(0.0, "replace", "_target_", {"0\x1e0": None})], weights_edits=None)
def test_a_damaged_weights_folder_is_refused(real_artefacts, edits, weights_edits):
    sandbox = _sandbox(real_artefacts, "export", "images")
    folder = sandbox / "export"
    image = sandbox / "images" / "test" / "digit1" / "0.png"
    config_path, weights = folder / "config.json", folder / "model.safetensors"
    config, touched = apply_config_edits(json.loads(config_path.read_text()), edits, str(sandbox / CANARY_NAME))
    config_path.write_text(json.dumps(config, allow_nan=True))
    if weights_edits is not None:
        weights.write_bytes(apply_byte_edits(weights.read_bytes(), weights_edits))
    outcome = run_command(["predict", str(image), "--model", "linvit_nano", "--checkpoint", str(folder)])
    names = [str(config_path), "config.json", str(weights), "model.safetensors", *touched]
    outcome.check(names, sandbox, allowed_opens=[folder, image])
    original = json.loads((real_artefacts / "export" / "config.json").read_text())["sha256"]
    if weights_edits is not None and isinstance(config, dict) and config.get("sha256") == original:
        # config.json still records the weights' SHA-256 (an edit that removed it leaves nothing to check against)
        assert outcome.status not in (0, None), f"predict used damaged weights:\n{outcome.stderr[-1500:]}"


# ------------------------------------------------------------------------------------------------ convert's input
@given(edits=byte_edits)
@example(edits=[("truncate", 0.5, 0, b"x")])
def test_convert_names_a_damaged_source(real_artefacts, edits):
    sandbox = _sandbox(real_artefacts, "weights.pth")
    source = sandbox / "weights.pth"
    source.write_bytes(apply_byte_edits(source.read_bytes(), edits))
    out = sandbox / "out.safetensors"
    outcome = run_command(["convert", str(source), str(out)])
    outcome.check([str(source), "weights.pth"], sandbox, allowed_opens=[source, out, sandbox / "config.json"])


# ------------------------------------------------------------------------------------------------ images
IMAGES = [
    f"{split}/digit{label}/{number}.{suffix}"
    for split in ("train", "test")
    for label in (0, 1)
    for number, suffix in enumerate(("png", "jpg", "tif", "bmp", "gif", "png"))
]


@given(image=st.sampled_from(IMAGES), edits=byte_edits, command=st.sampled_from(["predict", "check-data"]))
@example(image="test/digit0/0.png", edits=[("truncate", 0.0, 0, b"x")], command="predict")  # a 0-byte file
@example(image="train/digit0/2.tif", edits=[("header", 0.0, 0, b"\xff")], command="check-data")
def test_damaged_images_are_named(real_artefacts, image, edits, command):
    sandbox = _sandbox(real_artefacts, "images")
    root = sandbox / "images"
    path = root / image
    path.write_bytes(apply_byte_edits(path.read_bytes(), edits))
    if command == "predict":
        outcome = run_command(["predict", str(path), "--model", "linvit_nano", "--topk", "1"])
        outcome.check([str(path), path.name], sandbox, allowed_opens=[path])
    else:
        outcome = run_command(["check-data", str(root), "--workers", "1"])
        outcome.check([str(root)], sandbox, allowed_opens=[root], report=True)
        assert outcome.status in (0, 1), f"check-data exit {outcome.status}:\n{outcome.stderr[-1500:]}"
        if outcome.status == 1:  # a report of problems: the damaged file among them
            assert path.name in outcome.stdout, f"check-data's report does not name {path}:\n{outcome.stdout}"


# ------------------------------------------------------------------------------------------------ timm.create_model
@given(edits=byte_edits)
@example(edits=[("flip", 0.9, 1, b"x")])
def test_local_dir_refuses_damaged_weights(real_artefacts, edits):
    import timm
    import torch

    import linvit  # noqa: F401

    sandbox = _sandbox(real_artefacts, "export")
    folder = sandbox / "export"
    path = folder / "model.safetensors"
    path.write_bytes(apply_byte_edits(path.read_bytes(), edits))
    try:
        model = timm.create_model(f"local-dir:{folder}", pretrained=True)
    except ValueError as error:  # linvit's CheckpointError, NonFiniteWeightsError
        assert str(path) in str(error) or "model.safetensors" in str(error), str(error)
        return
    for name, tensor in model.state_dict().items():
        assert torch.isfinite(tensor).all(), f"{name} is not finite after loading damaged weights"
    raise AssertionError(f"timm.create_model('local-dir:{folder}') used damaged weights (SHA-256 in config.json)")


# ------------------------------------------------------------------------------------------------ trust
class _RunsAShell:
    """Unpickling this runs a shell command (what a hostile weights file does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@given(edits=config_edits, command=st.sampled_from(["predict", "export"]))
@example(edits=[(0.0, "add", "model_args", {"trusted": True, "in_chans": 3})], command="predict")
@example(edits=[(0.0, "add", "model_args", {"trusted": True, "in_chans": 3})], command="export")
@example(edits=[(0.0, "add", "trusted", True)], command="predict")
@example(edits=[(0.0, "add", "model_args", {"checkpoint_path": CANARY})], command="export")
@example(edits=[(0.0, "replace", "_target_", {"0\x1e0": None})], command="predict")  # found by hostile-hunt
def test_no_file_beside_the_weights_can_widen_trust(real_artefacts, edits, command):
    import torch

    sandbox = _sandbox(real_artefacts, "export", "images")
    folder = sandbox / "export"
    weights, marker = folder / "weights.pth", sandbox / "code-ran"
    torch.save({"state_dict": _RunsAShell(marker)}, weights)
    config_path = folder / "config.json"
    config, touched = apply_config_edits(json.loads(config_path.read_text()), edits, str(sandbox / CANARY_NAME))
    config_path.write_text(json.dumps(config, allow_nan=True))
    image = sandbox / "images" / "test" / "digit1" / "0.png"
    if command == "predict":
        argv = ["predict", str(image), "--model", "linvit_nano", "--checkpoint", str(weights)]
    else:
        argv = ["export", "--model", "linvit_nano", "--checkpoint", str(weights), "--format", "pt2"]
        argv += ["--out", str(sandbox / "out.pt2")]
    outcome = run_command(argv)
    names = [str(weights), "weights.pth", str(config_path), "config.json", *touched]
    outcome.check(names, sandbox, allowed_opens=[folder, image, sandbox / "out.pt2"])
    assert not marker.exists(), "code from the weights file ran"
    assert outcome.status not in (0, None), "a pickle that runs code was loaded"


# ------------------------------------------------------------------------------------------------ train.py overrides
TRAIN_KEYS = [
    "trainer.max_epochs",
    "trainer.precision",
    "trainer.gradient_clip_val",
    "seed",
    "data.mean",
    "data.std",
    "data.img_size",
    "data.batch_size",
    "data.val_fraction",
    "model.optimizer.lr",
    "model.optimizer.weight_decay",
    "model.label_smoothing",
    "model.scheduler.warmup_epochs",
    "model.ema.decay",
    "model.model_kwargs.drop_path_rate",
    "ckpt_path",
    "trust_checkpoint",
]
FAST_RUN = ["data.img_size=32", "data.num_workers=0", "+trainer.fast_dev_run=1", "trainer.enable_progress_bar=false"]


def _override_value(value) -> str:
    """A value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, "nan" if value != value else repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(_override_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"k{index}:{_override_value(item)}" for index, item in enumerate(value.values())) + "}"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


HOSTILE_OVERRIDE_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.sampled_from(["", "nan", "ten", "${oc.env:HOME}", "/dev/zero", "/dev/stdin"]),
    ),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.just("k"), children, max_size=1)),
    max_leaves=4,
)


@given(key=st.sampled_from(TRAIN_KEYS), value=HOSTILE_OVERRIDE_VALUES)
@example(key="trainer.max_epochs", value=[1, 2])
@example(key="data.mean", value=[float("nan")])
@example(key="ckpt_path", value="/dev/zero")
@example(key="seed", value=None)  # found by the property tier: a TypeError from the DataModule's int(seed)
@example(key="trainer.precision", value=[""])  # found by the property tier: a traceback from Lightning's Trainer
@example(key="model.model_kwargs.drop_path_rate", value=-1.7976931348623157e308)  # found by CI: the model's ValueError
def test_a_hostile_training_option_is_named(real_artefacts, key, value):
    sandbox = _sandbox(real_artefacts)
    outcome = run_command(
        ["train", f"{key}={_override_value(value)}", *FAST_RUN, f"paths.output_dir={sandbox / 'run'}"]
    )
    outcome.check([key], sandbox, allowed_opens=[sandbox / "run"])
