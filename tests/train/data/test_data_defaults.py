"""ImageFolder defaults that fit the data: a held-out, recorded test split; `auto` input size and worker count.

Before: without a test folder the val split (which also chose best.ckpt) was tested, silently; 28-px digits were
trained at 224 px with 8 workers on 2 cores (5.4 min per epoch instead of seconds).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from linvit.train.data.auto_size import MAX_AUTO_SIZE, auto_img_size, model_stride, round_to_multiple
from linvit.train.data.datamodules import ImageFolderDataModule
from linvit.train.data.datasets import held_out_per_class
from linvit.train.data.options import available_cores, capped_workers
from linvit.train.data.timm_datamodules import TEST_SPLIT_FILE


def _folder(root: Path, per_class: dict[str, int], size=(28, 28), splits=("train", "val")) -> Path:
    rng = np.random.default_rng(0)
    for split in splits:
        for name, count in per_class.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for index in range(count):
                pixels = rng.integers(0, 256, (size[1], size[0]), dtype=np.uint8)
                Image.fromarray(pixels, "L").save(root / split / name / f"{index}.png")
    return root


def test_held_out_per_class_is_stratified_seeded_and_keeps_every_class_in_training():
    labels = [0] * 20 + [1] * 10 + [2] * 2 + [3]
    rest, held = held_out_per_class(labels, 0.1, seed=0)
    assert set(rest).isdisjoint(held) and len(rest) + len(held) == len(labels)
    held_labels = [labels[i] for i in held]
    assert held_labels.count(0) == 2 and held_labels.count(1) == 1 and held_labels.count(2) == 1
    assert 3 not in held_labels  # a class of one image stays in training
    assert {labels[i] for i in rest} == {0, 1, 2, 3}
    again, _ = held_out_per_class(labels, 0.1, seed=0)
    other, _ = held_out_per_class(labels, 0.1, seed=1)
    assert np.array_equal(again, rest) and not np.array_equal(other, rest)


def _with_trainer(datamodule, run_dir: Path):
    datamodule.trainer = SimpleNamespace(is_global_zero=True, default_root_dir=str(run_dir))
    return datamodule


def test_without_a_test_folder_a_seeded_test_split_is_held_out_of_train_and_recorded(tmp_path, caplog):
    root = _folder(tmp_path / "data", {"cat": 10, "dog": 10})
    options = {"root": root, "num_classes": 2, "img_size": 16, "batch_size": 2, "num_workers": 0}
    datamodule = _with_trainer(ImageFolderDataModule(**options), tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        datamodule.setup("fit")
    train = {datamodule.train_set.dataset.samples[i][0] for i in datamodule.train_set.indices}
    test = {datamodule.test_set.dataset.samples[i][0] for i in datamodule.test_set.indices}
    assert len(test) == 2 and len(train) == 18 and train.isdisjoint(test)
    assert sorted(Path(p).parent.name for p in test) == ["cat", "dog"]
    # the test split is evaluated like val (no augmentation), and it is recorded: the file and the checkpoint state
    assert datamodule.test_set.dataset.transform is not datamodule.train_set.dataset.transform
    listed = (tmp_path / "run" / TEST_SPLIT_FILE).read_text().splitlines()
    assert listed[0].startswith("# test split of") and sorted(str(root / p) for p in listed[1:]) == sorted(test)
    state = datamodule.state_dict()["test_split"]
    assert state["images"] == 2 and state["split_seed"] == 0 and len(state["sha256"]) == 64
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "held out of train" in message and TEST_SPLIT_FILE in message
    # the same seed gives the same split (linvit eval rebuilds it from the run's config)
    again = ImageFolderDataModule(**options)
    again.setup("test")
    assert {again.test_set.dataset.samples[i][0] for i in again.test_set.indices} == test
    assert len(datamodule.test_dataloader()) == 1 and len(datamodule.skipped_files()) == 0


def test_a_test_folder_is_used_as_it_is(tmp_path):
    root = _folder(tmp_path, {"cat": 3, "dog": 3}, splits=("train", "val", "test"))
    datamodule = ImageFolderDataModule(root=root, num_classes=2, img_size=16)
    datamodule.setup("fit")
    assert len(datamodule.train_set) == 6 and datamodule.test_set.root == str(root / "test")


def test_test_fraction_0_tests_on_val_and_says_that_it_is_optimistic(tmp_path, caplog):
    root = _folder(tmp_path, {"cat": 3, "dog": 3})
    datamodule = ImageFolderDataModule(root=root, num_classes=2, img_size=16, test_fraction=0)
    with caplog.at_level(logging.WARNING):
        datamodule.setup("fit")
    assert datamodule.test_set is datamodule.val_set and len(datamodule.train_set) == 6
    assert any("optimistic" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="data.test_fraction"):
        ImageFolderDataModule(root=root, num_classes=2, test_fraction=1.5)


def test_round_to_the_model_stride():
    assert [round_to_multiple(side, 32) for side in (8, 28, 40, 50, 100, 1000)] == [32, 32, 32, 64, 96, MAX_AUTO_SIZE]
    assert round_to_multiple(28, 16) == 32 and round_to_multiple(20, 14) == 14 and round_to_multiple(300, 14) == 224


def test_auto_img_size_from_the_median_image(tmp_path):
    _folder(tmp_path / "digits", {"a": 5}, size=(28, 28), splits=("train",))
    assert auto_img_size(tmp_path / "digits" / "train", 32) == (32, 28)
    _folder(tmp_path / "photos", {"a": 3}, size=(400, 300), splits=("train",))
    _folder(tmp_path / "photos", {"b": 2}, size=(20, 20), splits=("train",))
    assert auto_img_size(tmp_path / "photos" / "train", 32) == (MAX_AUTO_SIZE, 300)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="data.img_size=N"):
        auto_img_size(tmp_path / "empty")


def test_model_stride():
    assert model_stride("linvit_nano", {"img_size": "auto", "drop_path_rate": 0.0}) == 32
    assert model_stride("test_vit") == 16  # patch 16
    assert model_stride("no_such_model") == 32


def test_auto_workers_is_one_per_core_up_to_8():
    assert capped_workers("auto") == min(8, available_cores())
    assert capped_workers(0) == 0
    with pytest.raises(ValueError, match="data.num_workers"):
        capped_workers("many")


def test_the_imagefolder_config_defaults_to_auto(tmp_path):
    """Through train(): 28-px images train a linvit_nano at 32 px, and the saved config holds the number."""
    import yaml
    from train_helpers import FAST, compose

    from linvit.train.runs.run import train

    root = _folder(tmp_path / "digits", {"a": 4, "b": 4})
    data = ["data=imagefolder", f"data.root={root}", "data.num_classes=2", "data.batch_size=4"]
    assert (compose(data).data.img_size, compose(data).data.num_workers) == ("auto", "auto")
    fast = [o for o in FAST if not o.startswith("data.img_size")]  # data.num_workers=0 among them
    train(compose([*data, *fast, "+trainer.fast_dev_run=1", "export.enabled=false", "data.pin_memory=false"], tmp_path))
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["data"]["img_size"] == 32 and saved["model"]["model_kwargs"]["img_size"] == 32
    assert saved["task_name"] == "digits_linvit_nano"


def test_eval_of_a_run_saved_before_test_fraction_existed_tests_on_val_as_it_did(tmp_path, capsys):
    """Such a run trained on every train image: holding a share of them out now would test on training images."""
    import json

    import yaml
    from train_helpers import FAST, TINY_TIMM, compose

    from linvit.cli import main as linvit_main
    from linvit.train.runs.run import train

    root = _folder(tmp_path / "data", {"a": 4, "b": 4})
    run = tmp_path / "run"
    overrides = ["data=imagefolder", f"data.root={root}", "data.num_classes=2", "data.batch_size=4", *TINY_TIMM, *FAST]
    overrides += ["trainer.max_epochs=1", "+trainer.limit_train_batches=1", "export.enabled=false", "test=false"]
    train(compose(overrides, run))
    config = yaml.safe_load((run / "config.yaml").read_text())
    del config["data"]["test_fraction"]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    results = {}
    for split in ("test", "val"):
        assert linvit_main(["eval", str(run), "--split", split, "--json", "--accelerator", "cpu"]) == 0
        results[split] = json.loads(capsys.readouterr().out)[f"{split}/loss"]
    assert results["test"] == results["val"]
