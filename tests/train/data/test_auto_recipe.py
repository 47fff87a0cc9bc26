"""`auto` training values sized to the user's folder: class count, batch, drop_last, epochs, warm-up, augmentation.

Before: 3 classes x 40 images with batch 128 and drop_last took one optimizer step per epoch (20 in the run) and
stayed at chance; a 1-epoch run on 7,951 images spent 54 of its 55 steps in warm-up; data.num_classes had to be
given by hand although the class folders say it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from PIL import Image

from linvit.train.data import auto_recipe
from linvit.train.data.auto_recipe import (
    auto_augmentation,
    auto_batch_lr,
    auto_batch_size,
    auto_drop_last,
    auto_max_epochs,
    auto_stem_stride,
    capped_warmup_steps,
    steps_per_epoch,
    too_few_steps_advice,
)
from linvit.train.data.datamodules import ImageFolderDataModule


def _folder(root: Path, per_class: dict[str, int], splits=("train", "val"), size=28) -> Path:
    rng = np.random.default_rng(0)
    for split in splits:
        for name, count in per_class.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for index in range(count):
                Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), "L").save(
                    root / split / name / f"{index}.png"
                )
    return root


@pytest.mark.parametrize(
    "images, processes, batch",
    [(40, 1, 8), (120, 1, 8), (1000, 1, 64), (7951, 1, 128), (1_281_167, 1, 128), (1000, 2, 32), (120, 4, 8)],
)
def test_the_batch_leaves_enough_steps_per_epoch(images, processes, batch):
    chosen = auto_batch_size(images, processes).value
    assert chosen == batch
    assert chosen & (chosen - 1) == 0 and 8 <= chosen <= 128  # a power of two in range
    if images >= 64 * processes:  # room for 8 steps of the smallest batch
        assert steps_per_epoch(images, chosen * processes, drop_last=False) >= 8


def test_drop_last_drops_only_a_negligible_share():
    assert auto_drop_last(120, 8).value is True  # nothing to drop
    assert auto_drop_last(7951, 128).value is True  # 15 images, 0.2%
    dropped = auto_drop_last(108, 8)  # 4 images, 3.7% of a small set: kept
    assert dropped.value is False and "3.7%" in dropped.reason
    assert auto_drop_last(107, 8, even_batches=True).value is True  # a batch of 3 cannot be mixed up
    assert auto_drop_last(33, 8).value is True  # a batch of 1: BatchNorm refuses it
    assert auto_drop_last(5, 8).value is True  # a set smaller than one batch: the loader never drops it
    assert steps_per_epoch(5, 8, drop_last=True) == 1 and steps_per_epoch(108, 8, drop_last=False) == 14


def test_epochs_reach_the_target_steps_within_bounds():
    assert auto_max_epochs(15).value == 67  # 3 x 40 images at batch 8: 1,005 steps
    assert auto_max_epochs(39).value == 50  # 5,000 images at batch 128: 1,000 steps would be 26 epochs
    assert auto_max_epochs(62, min_epochs=0).value == 17  # 7,951 images at batch 128, by the steps alone
    assert auto_max_epochs(10_000).value == 50 and auto_max_epochs(10_000, min_epochs=0).value == 1
    assert auto_max_epochs(1).value == auto_recipe.MAX_AUTO_EPOCHS
    assert auto_max_epochs(1, min_epochs=1000).value == auto_recipe.MAX_AUTO_EPOCHS
    assert auto_max_epochs(15, target_steps=150, min_epochs=0).value == 10
    epochs, reason = auto_max_epochs(15)
    assert epochs * 15 >= auto_recipe.TARGET_STEPS and "auto.target_steps" in reason
    epochs, reason = auto_max_epochs(39)
    assert epochs == auto_recipe.MIN_AUTO_EPOCHS and "auto.min_epochs=50" in reason and "1950 optimizer steps" in reason


def test_a_short_run_is_not_all_warm_up():
    # one epoch of 55 steps with warmup_epochs=1: 55 configured, 6 taken (10%)
    assert capped_warmup_steps(55, 55, 0.1) == 6
    assert capped_warmup_steps(55, 55, None) == 54  # uncapped: all but the last step, as before
    assert capped_warmup_steps(20, 1000, 0.1) == 20  # a warm-up under the cap is as configured
    assert capped_warmup_steps(5, 1, 0.1) == 0


def test_augmentation_is_gentler_for_small_images_and_small_sets():
    light, medium, full = auto_augmentation(32, 120), auto_augmentation(224, 1_000), auto_augmentation(224, 50_000)
    assert [c.value["re_prob"] for c in (light, medium, full)] == [0.0, 0.1, 0.25]
    assert light.value["scale"][0] > medium.value["scale"][0] > full.value["scale"][0]
    assert full.value["auto_augment"] == "rand-m9-mstd0.5-inc1" and "m3" in light.value["auto_augment"]
    photos = auto_augmentation(224, 300).value  # a few hundred photos: light as well, evaluated on a centre crop
    assert {**photos, "crop_pct": None} == {**light.value, "crop_pct": None} and photos["crop_pct"] == 0.875
    assert "light" in light.reason and "32 px" in light.reason
    # small images take the light tier however many there are (Fashion-MNIST's 28 px: benchmarks/accuracy/NOTES.md)
    assert auto_augmentation(32, 50_000).value == light.value and auto_augmentation(63, 5_000).value == light.value
    assert auto_augmentation(64, 5_000).value == full.value and auto_augmentation(64, 1_999).value == medium.value
    # evaluation: small images whole (85.50 vs 83.40% for linvit_nano on Fashion-MNIST), photos on a centre crop
    assert [auto_augmentation(size, 5_000).value["crop_pct"] for size in (28, 63, 64, 224)] == [1.0, 1.0, 0.875, 0.875]


@pytest.mark.parametrize(
    "batch, optimizer, factor",
    [(128, "adamw", 1.0), (8, "adamw", 0.25), (32, "lamb", 0.5), (512, "adam", 2.0), (8, "sgd", 1 / 16),
     (64, "momentum", 0.5)],
)  # fmt: skip
def test_the_lr_follows_the_auto_batch_by_timms_rule(batch, optimizer, factor):
    choice = auto_batch_lr(2e-3, batch, 128, optimizer)
    assert choice.value == pytest.approx(2e-3 * factor)
    assert ("sqrt" in choice.reason) == (optimizer != "sgd" and optimizer != "momentum")


def test_too_few_steps_warns_naming_the_options():
    assert too_few_steps_advice(auto_recipe.FEW_LEARNING_STEPS) is None
    advice = too_few_steps_advice(20)
    assert "20 optimizer steps" in advice and "trainer.max_epochs" in advice and "data.batch_size" in advice


def test_the_datamodule_counts_classes_and_training_images(tmp_path, caplog):
    root = _folder(tmp_path, {"a": 20, "b": 20, "c": 10})
    data = ImageFolderDataModule(
        root,
        num_classes="auto",
        img_size=32,
        batch_size="auto",
        drop_last="auto",
        crop_pct="auto",
        num_workers=0,
        test_fraction=0.1,
    )
    with caplog.at_level(logging.INFO, logger="linvit.train.data.auto"):
        assert data.choose_num_classes() == 3
        assert data.training_images() == 50 - (2 + 2 + 1)  # the test share held out of train does not train
        assert data.choose_batch_size() == (8, False)  # 45 images: 5 left over (11%) are kept
    assert "data.num_classes=auto: 3" in caplog.text and "data.batch_size=auto: 8" in caplog.text
    assert data.hparams["num_classes"] == 3 and data.hparams_initial["batch_size"] == 8
    with caplog.at_level(logging.INFO, logger="linvit.train.data.auto"):
        chosen = data.choose_augmentation()  # 32-px images: the light tier, evaluated whole
    assert chosen["crop_pct"] == 1.0 == data.crop_pct and data.hparams["crop_pct"] == 1.0
    assert "data.crop_pct=1.0" in caplog.text and "evaluated whole" in caplog.text
    data.setup("fit")
    assert len(data.train_set) == 45 and data.num_classes == 3


def test_explicit_values_win_and_a_wrong_class_count_is_refused(tmp_path):
    root = _folder(tmp_path, {"a": 3, "b": 3})
    data = ImageFolderDataModule(root, num_classes=2, img_size=32, batch_size=5, drop_last=True, re_prob=0.3)
    assert data.choose_num_classes() == 2 and data.choose_batch_size() == (5, True) and data.choose_augmentation() == {}
    assert data.re_prob == 0.3
    wrong = ImageFolderDataModule(root, num_classes=5, img_size=32)
    with pytest.raises(ValueError, match=r"data.num_classes=5 but .*train has 2 class folders.*data.num_classes=2"):
        wrong.choose_num_classes()


def _train(overrides, run_dir, callbacks=None):
    from train_helpers import FAST, TINY_TIMM, compose

    from linvit.train.runs.run import train

    fast = [o for o in FAST if not o.startswith(("data.img_size", "data.batch_size"))]
    overrides = [*overrides, *TINY_TIMM, *fast, "export.enabled=false", "data.pin_memory=false"]
    return train(compose(overrides, run_dir), callbacks=callbacks)


def test_a_run_with_every_auto_value_saves_the_numbers(tmp_path, caplog):
    root = _folder(tmp_path / "data", {"a": 12, "b": 12, "c": 12}, size=20)
    overrides = ["data=imagefolder", f"data.root={root}", "+trainer.limit_val_batches=1", "test=false"]
    overrides += ["auto.target_steps=20", "auto.min_epochs=1"]
    with caplog.at_level(logging.INFO):
        _train(overrides, tmp_path / "run")
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    data, model, trainer = saved["data"], saved["model"], saved["trainer"]
    assert data["num_classes"] == model["num_classes"] == 3
    assert data["batch_size"] == 8 and data["drop_last"] is True  # 33 training images: a batch of 1 left over
    assert trainer["max_epochs"] == 5  # 4 steps per epoch, at least 20 steps
    assert model["optimizer"]["lr"] == pytest.approx(2e-3 * (8 / 128) ** 0.5)  # AdamW's 2e-3 is for a batch of 128
    assert data["re_prob"] == 0.0 and data["scale"] == [0.5, 1.0]
    for key in ("data.num_classes", "data.batch_size", "data.drop_last", "trainer.max_epochs", "augmentation"):
        assert f"{key}=auto" in caplog.text
    assert "model.optimizer.lr for the auto batch: 0.0005" in caplog.text
    assert "optimizer steps" in caplog.text  # 20 steps: the few-steps warning


def test_linvit_eval_rebuilds_an_auto_run_from_its_saved_numbers(tmp_path, capsys):
    import json

    from linvit.cli import main as linvit_main

    root = _folder(tmp_path / "data", {"a": 12, "b": 12, "c": 12}, size=20)
    _train(["data=imagefolder", f"data.root={root}", "+trainer.fast_dev_run=1", "test=false"], tmp_path / "run")
    assert linvit_main(["eval", str(tmp_path / "run"), "--json", "--accelerator", "cpu"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["test/acc1"] <= 1.0


def test_a_class_count_that_disagrees_is_one_error_naming_both(tmp_path):
    from linvit.train.runs.config_types import ConfigValueError

    root = _folder(tmp_path / "data", {"a": 2, "b": 2})
    with pytest.raises(ConfigValueError, match=r"data.num_classes=3 but .* has 2 class folders"):
        _train(["data=imagefolder", f"data.root={root}", "data.num_classes=3", "+trainer.fast_dev_run=1"], tmp_path)


def test_max_epochs_auto_on_data_of_a_known_size_is_its_recipe(tmp_path):
    from train_helpers import compose

    from linvit.train.runs.run import _choose_auto_values

    cfg = compose([])
    assert cfg.trainer.max_epochs == "auto"
    _choose_auto_values(cfg, SimpleNamespace(batch_size=64))  # digits: no folder to count
    assert cfg.trainer.max_epochs == auto_recipe.EPOCHS_OF_KNOWN_DATA


def test_a_resumed_auto_run_matches_the_uninterrupted_one_and_keeps_its_choices(tmp_path, caplog):
    import torch
    from lightning.pytorch import Callback

    class StopAfterFirstEpoch(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = trainer.current_epoch == 0

    root = _folder(tmp_path / "data", {"a": 12, "b": 12, "c": 12}, size=20)
    overrides = ["data=imagefolder", f"data.root={root}", "+trainer.limit_val_batches=1", "test=false"]
    # 33 images: batch 8, the last image dropped, 4 steps x 2 epochs
    overrides += ["auto.target_steps=8", "auto.min_epochs=1"]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    _train(overrides, straight)
    _train(overrides, interrupted, callbacks=[StopAfterFirstEpoch()])
    _train(overrides, interrupted)  # resume: true finds checkpoints/last.ckpt

    def weights(run):
        checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        return checkpoint["global_step"], checkpoint["state_dict"]

    (step_a, weights_a), (step_b, weights_b) = weights(straight), weights(interrupted)
    assert step_a == step_b == 8
    for key in weights_a:
        torch.testing.assert_close(weights_b[key], weights_a[key], rtol=1e-5, atol=1e-6, msg=key)

    # the folder grows: chosen again, 69 images would ask for 1 epoch of 8 steps; the run keeps what it chose
    _folder(tmp_path / "more", {"a": 36})
    for index, path in enumerate(sorted((tmp_path / "more" / "train" / "a").iterdir())):
        path.rename(root / "train" / "a" / f"more_{index}.png")
    with caplog.at_level(logging.INFO):
        _train(overrides, interrupted)
    assert "trainer.max_epochs=auto: 2 (as the run chose when it began: resuming)" in caplog.text
    saved = [yaml.safe_load((run / "config.yaml").read_text()) for run in (straight, interrupted)]
    assert saved[0]["data"] == saved[1]["data"]
    assert saved[0]["model"]["optimizer"]["lr"] == saved[1]["model"]["optimizer"]["lr"] == pytest.approx(5e-4)
    assert saved[0]["trainer"]["max_epochs"] == saved[1]["trainer"]["max_epochs"] == 2


@pytest.mark.parametrize(
    "overrides, lr",
    [([], 2e-3 * (16 / 128) ** 0.5), (["data.batch_size=16"], 2e-3), (["auto.lr_batch=null"], 2e-3),
     (["model.optimizer.lr_base_size=256"], 2e-3), (["auto.lr_batch=16", "model.optimizer.lr=1e-3"], 1e-3)],
)  # fmt: skip
def test_only_an_auto_batch_scales_the_lr(tmp_path, overrides, lr):
    from train_helpers import compose

    from linvit.train.runs.run import _choose_auto_values, _instantiate_plain

    root = _folder(tmp_path / "data", {"a": 80, "b": 80})  # 144 to train (10% held out): batch 16
    cfg = compose(["data=imagefolder", f"data.root={root}", *overrides], tmp_path / "run")
    _choose_auto_values(cfg, _instantiate_plain(cfg.data, "data"))
    assert cfg.data.batch_size == 16
    assert cfg.model.optimizer.lr == pytest.approx(lr)


def test_the_stem_stride_follows_the_input_size():
    assert [auto_stem_stride(side).value for side in (16, 32, 64, 96, 127, 128, 224)] == [2, 2, 2, 2, 2, 4, 4]
    assert auto_stem_stride([64, 160]).value == 2 and auto_stem_stride((128, 160)).value == 4  # the shorter side


def _stem_choice(tmp_path, overrides, run_dir=None):
    from train_helpers import compose

    from linvit.train.runs.run import _choose_stem_stride, _instantiate_plain

    root = _folder(tmp_path / "data", {"a": 4, "b": 4})
    cfg = compose(["data=imagefolder", f"data.root={root}", "data.img_size=32", *overrides], run_dir or tmp_path)
    _choose_stem_stride(cfg, _instantiate_plain(cfg.data, "data"))
    return cfg.model.model_kwargs.get("stem_stride")


@pytest.mark.parametrize(
    "overrides, stride",
    [([], 2), (["data.img_size=64"], 2), (["data.img_size=128"], 4), (["+model.model_kwargs.stem_stride=4"], 4),
     (["auto.small_image_stem=false"], None), (["model=timm", "model.model_name=convnext_atto"], None),
     (["model=flatten_pvt_tiny"], None)],
)  # fmt: skip
def test_folder_data_of_small_images_gives_linvit_a_stride_two_stem(tmp_path, overrides, stride):
    """Only linvit's own models, only where nothing set it: ConvNeXt's stem_stride is timm's, not this rule's."""
    assert _stem_choice(tmp_path, overrides) == stride


def test_data_with_its_own_recipe_keeps_the_models_stem(tmp_path):
    from train_helpers import compose

    from linvit.train.runs.run import _choose_stem_stride

    cfg = compose([], tmp_path)  # digits at 32 px: the tuned recipe of `python train.py`
    _choose_stem_stride(cfg, SimpleNamespace(batch_size=64))
    assert "stem_stride" not in cfg.model.model_kwargs


@pytest.mark.parametrize("trained", [None, 2, 4, 3, "2"])
def test_a_run_that_loads_a_checkpoint_builds_the_stem_it_was_trained_with(tmp_path, trained):
    """A checkpoint of a run from before the rule (no stem_stride: the stride-4 stem) keeps its stem; the weights fit
    either, so a new choice would give another network without a word."""
    import torch

    kwargs = {"img_size": 32} if trained is None else {"img_size": 32, "stem_stride": trained}
    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"model_name": "linvit_nano", "model_kwargs": kwargs}, "state_dict": {}}, path)
    assert _stem_choice(tmp_path, [f"ckpt_path={path}"]) == (trained if trained in (2, 4) else None)


def test_the_chosen_stem_is_recorded_where_the_run_is_rebuilt_from(tmp_path, capsys):
    """config.yaml, the checkpoint and config.json say stem_stride=2 (what `linvit eval`, `export` and `predict`
    rebuild the model from), and `linvit eval` runs on it."""
    import json

    import torch
    from train_helpers import FAST, compose

    from linvit.cli import main as linvit_main
    from linvit.train.runs.run import train

    root = _folder(tmp_path / "data", {"a": 12, "b": 12}, size=20)
    fast = [o for o in FAST if not o.startswith(("data.img_size", "data.batch_size"))]
    run = tmp_path / "run"
    train(compose(["data=imagefolder", f"data.root={root}", "+trainer.fast_dev_run=1", *fast], run))
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["model_kwargs"]["stem_stride"] == 2
    assert json.loads((run / "config.json").read_text())["model_args"]["stem_stride"] == 2
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["model_kwargs"]["stem_stride"] == 2
    capsys.readouterr()
    assert linvit_main(["eval", str(run), "--json", "--accelerator", "cpu"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["test/acc1"] <= 1.0
