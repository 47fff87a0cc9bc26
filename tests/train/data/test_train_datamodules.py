"""DataModules: splits, samplers, image decoding, and one fast_dev_run of each through the real configs."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from train_helpers import compose

from linvit.train.data.datamodules import (
    CIFARDataModule,
    DigitsDataModule,
    FashionMNISTDataModule,
    ImageFolderDataModule,
)
from linvit.train.data.datasets import FASHION_MNIST_DIR, EpochSeededSampler, load_fashion_mnist_arrays
from linvit.train.runs.run import train

HAVE_FASHION = (Path(FASHION_MNIST_DIR) / "t10k-images-idx3-ubyte.gz").is_file()


def test_epoch_seeded_sampler_depends_only_on_seed_and_epoch():
    a, b = EpochSeededSampler(50, seed=3), EpochSeededSampler(50, seed=3)
    list(a)  # consuming an epoch changes nothing
    a.set_epoch(2), b.set_epoch(2)
    assert list(a) == list(b)
    assert sorted(index for index, _ in a) == list(range(50))
    assert len({seed for _, seed in a}) == 50  # a seed per sample
    b.set_epoch(3)
    assert list(a) != list(b)
    assert {key[0]: key[1] for key in a} != {key[0]: key[1] for key in b}  # the same sample, another epoch's seed


def test_resumed_sampler_hands_out_what_the_uninterrupted_one_had_left():
    uninterrupted = EpochSeededSampler(50, seed=3)
    uninterrupted.set_epoch(4)
    resumed = EpochSeededSampler(50, seed=3, resume_epoch=4, resume_skip=12)
    assert list(resumed) == list(uninterrupted)[12:]  # before any set_epoch: Lightning iterates first on resume
    resumed.set_epoch(4)
    assert list(resumed) == list(uninterrupted)  # the skip serves one pass only
    late = EpochSeededSampler(50, seed=3, resume_epoch=4, resume_skip=12)
    late.set_epoch(5)
    assert len(list(late)) == 50  # another epoch: nothing skipped


def test_seeded_samples_make_augmentation_a_function_of_the_key():
    from linvit.train.data.datasets import SeededSamples

    class Noisy(torch.utils.data.Dataset):
        report_bad_files = "forwarded"

        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.rand(3) + index

    samples = SeededSamples(Noisy())
    torch.manual_seed(0)
    first = samples[(2, 77)]
    state = torch.get_rng_state()
    torch.rand(5)  # whatever the process drew in between
    torch.testing.assert_close(samples[(2, 77)], first)
    assert not torch.equal(samples[(2, 78)], first)
    torch.manual_seed(0)
    samples[(1, 5)]
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is left as it was
    assert samples.report_bad_files == "forwarded" and len(samples) == 4


def test_digits_split_is_disjoint_stratified_and_resized():
    dm = DigitsDataModule(img_size=20, in_chans=3, batch_size=8)
    dm.setup("fit")
    sizes = len(dm.train_set), len(dm.val_set), len(dm.test_set)
    assert sum(sizes) == 1797 and sizes[2] == 360
    train = {bytes(x.numpy()) for x in dm.train_set.images}
    test = {bytes(x.numpy()) for x in dm.test_set.images}
    assert len(train & test) < 5  # digits has a few duplicate images, the split none of the same indices
    assert torch.bincount(dm.test_set.labels).min() >= 34  # every class in the test split
    image, label = dm.test_set[0]
    assert image.shape == (3, 20, 20) and image.dtype == torch.float32 and 0 <= int(label) < 10
    assert torch.equal(image[0], image[2])  # grey replicated


def test_fashion_mnist_missing_names_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install -y --no-install-recommends dataset-fashion-mnist"):
        load_fashion_mnist_arrays(tmp_path, "train")
    dm = FashionMNISTDataModule(root=tmp_path)
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        dm.prepare_data()


def _write_image_folder(root: Path, classes=("cat", "dog"), per_class=3) -> None:
    rng = np.random.default_rng(0)
    formats = [("png", "RGBA"), ("jpg", "L"), ("bmp", "RGB"), ("tiff", "P"), ("webp", "RGB")]
    for split in ("train", "val"):
        for c in classes:
            folder = root / split / c
            folder.mkdir(parents=True)
            for i in range(per_class):
                ext, mode = formats[i % len(formats)]
                pixels = rng.integers(0, 255, (13 + i, 17, 4), dtype=np.uint8)
                Image.fromarray(pixels, "RGBA").convert(mode).save(folder / f"{i}.{ext}")
            (folder / "notes.txt").write_text("not an image")


def test_image_folder_decodes_any_format_and_mode(tmp_path):
    _write_image_folder(tmp_path)
    dm = ImageFolderDataModule(root=tmp_path, num_classes=2, img_size=16, batch_size=2)
    dm.setup("fit")
    assert dm.class_names == ["cat", "dog"] and len(dm.val_set) == 6
    assert len(dm.train_set) == 4 and len(dm.test_set) == 2  # no test folder: one image per class held out
    for i in range(len(dm.val_set)):
        image, _ = dm.val_set[i]
        assert image.shape == (3, 16, 16)
    grey = ImageFolderDataModule(root=tmp_path, num_classes=2, img_size=16, in_chans=1, mean=[0.5], std=[0.5])
    grey.setup("fit")
    assert grey.train_set[0][0].shape == (1, 16, 16)
    with pytest.raises(ValueError, match="data.num_classes=2"):
        wrong = ImageFolderDataModule(root=tmp_path, num_classes=5, img_size=16)
        wrong.setup("fit")


def _fake_cifar10(root: Path) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 255, (8, 3072), dtype=np.uint8), "labels": list(range(8))}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)


def _fast_dev_run(overrides, tmp_path, tiny_overrides):
    cfg = compose([*tiny_overrides, *overrides, "+trainer.fast_dev_run=2", "export.enabled=false"], tmp_path)
    metrics = train(cfg)
    assert 0.0 <= metrics["test/acc1"] <= 1.0
    assert np.isfinite(metrics["train/loss_epoch"])
    return metrics


def test_fast_dev_run_digits(tmp_path, tiny_overrides):
    _fast_dev_run(["data=digits"], tmp_path, tiny_overrides)


@pytest.mark.skipif(not HAVE_FASHION, reason="apt-get install -y --no-install-recommends dataset-fashion-mnist")
def test_fast_dev_run_fashion_mnist(tmp_path, tiny_overrides):
    _fast_dev_run(["data=fashion_mnist", "data.persistent_workers=false"], tmp_path, tiny_overrides)


def test_fast_dev_run_imagefolder_with_randaugment_mixup(tmp_path, tiny_overrides):
    _write_image_folder(tmp_path / "data", per_class=4)
    overrides = ["data=imagefolder", f"data.root={tmp_path / 'data'}", "data.num_classes=2", "data.batch_size=4"]
    overrides += ["data.persistent_workers=false", "data.pin_memory=false", "model.mixup.mixup_alpha=0.8"]
    overrides += ["model.mixup.cutmix_alpha=1.0"]
    _fast_dev_run(overrides, tmp_path, tiny_overrides)


def test_fast_dev_run_cifar10(tmp_path, tiny_overrides, monkeypatch):
    import torchvision.datasets.cifar

    _fake_cifar10(tmp_path / "data")
    # the fake files have other checksums than the real archive
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)
    overrides = ["data=cifar10", f"data.root={tmp_path / 'data'}", "data.batch_size=4", "data.pin_memory=false"]
    overrides += ["data.persistent_workers=false", "data.download=false", "data.val_size=10"]
    _fast_dev_run(overrides, tmp_path, tiny_overrides)


def test_cifar_without_files_says_how_to_get_them(tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["data=cifar100", f"data.root={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="data.download=true"):
        instantiate(cfg.data).prepare_data()


def test_augmented_batches_do_not_depend_on_data_workers_or_the_random_state():
    """Per-sample seeds make the augmented batches of an epoch one function of (seed, epoch): with or without data
    workers, whatever the process drew before, and for a sampler resumed mid-epoch."""
    from torch.utils.data import DataLoader

    from linvit.train.data.datasets import ArrayImageDataset, SeededSamples

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (24, 8, 8), generator=generator, dtype=torch.uint8).numpy()
    dataset = SeededSamples(ArrayImageDataset(images, np.arange(24) % 3, img_size=12, augment=True))

    def batches(workers, skip=0):
        sampler = EpochSeededSampler(24, seed=5, resume_epoch=1, resume_skip=skip)
        torch.manual_seed(workers + skip)  # a different history of the process's random state each time
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers)
        return [images for images, _ in loader]

    reference = batches(0)
    for got, expected in zip(batches(2), reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for got, expected in zip(batches(0, skip=8), reference[2:], strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.equal(reference[0], reference[1])


def test_timm_datamodules_record_their_transform_options_defaults_included(tmp_path):
    """The transform options live in TimmTransformDataModule; the subclasses' hyper-parameters still hold all of
    them, with each class's defaults (what hparams.yaml and the checkpoints recorded before)."""
    folder = ImageFolderDataModule(root=tmp_path, num_classes=3, img_size="auto", re_prob=0.0)
    assert folder.hparams["img_size"] == "auto" and folder.hparams["re_prob"] == 0.0
    assert folder.hparams["scale"] == (0.08, 1.0) and folder.hparams["crop_pct"] == 0.875
    assert folder.hparams["auto_augment"] == "rand-m9-mstd0.5-inc1" and folder.hparams["check"] is False
    cifar = CIFARDataModule(crop_pct=0.9)
    assert cifar.hparams["scale"] == (0.6, 1.0) and cifar.hparams["crop_pct"] == 0.9 and cifar.crop_pct == 0.9
    assert cifar.hparams["interpolation"] == "bicubic" and cifar.hparams["val_size"] == 5000
