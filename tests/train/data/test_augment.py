"""Training augmentation: every op of every default policy at its extreme magnitudes, and failures that name the op.

Pillow 13 refuses posterize with 0 bits, which timm's RandAugment `rand-m9-mstd0.5-inc1` (the default of
data=imagefolder, cifar10, cifar100 and the ImageNet recipe) asks for about 4 times in 2000 images, inside a data
worker, with a traceback that did not point at the augmentation.
"""

from __future__ import annotations

import copy

import numpy as np
import PIL
import pytest
import torch
from PIL import Image
from timm.data.auto_augment import AugmentOp, RandAugment
from train_helpers import compose

from linvit.train.data.augment import AugmentationError, guard_transform, posterize_any_bits
from linvit.train.data.image_folder import PilLoader, TolerantImageFolder

PILLOW_13 = int(PIL.__version__.split(".")[0]) >= 13
DATA_WITH_AUTO_AUGMENT = ["imagefolder", "cifar10", "cifar100"]


def _photo(size=(40, 30), mode="RGB") -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB").convert(mode)


@pytest.mark.skipif(not PILLOW_13, reason="Pillow < 13 still takes 0 bits")
def test_timm_posterize_at_full_magnitude_fails_under_pillow_13_without_the_guard():
    op = AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)
    with pytest.raises(ValueError, match="bits"):
        op(_photo())


def test_posterize_with_0_bits_is_black_as_before_pillow_13():
    image = _photo()
    black = posterize_any_bits(image, 0)
    assert black.size == image.size and black.mode == image.mode and not np.asarray(black).any()
    assert np.array_equal(np.asarray(posterize_any_bits(image, 3)), np.asarray(image) & 0b11100000)
    assert posterize_any_bits(image, 8) is image


def _default_train_transform(data: str):
    """The training transform a data config builds, with its default auto-augment policy."""
    from hydra.utils import instantiate

    cfg = compose([f"data={data}", "data.img_size=32"])
    datamodule = instantiate(cfg.data)
    assert datamodule.auto_augment, f"data={data} has no default auto-augment policy"
    return datamodule._timm_transform(True), datamodule.auto_augment


def _ops(transform) -> list:
    return [op for step in transform.steps for op in getattr(step, "ops", [])]


@pytest.mark.parametrize("data", DATA_WITH_AUTO_AUGMENT)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_every_op_of_the_default_policy_runs_at_its_extreme_magnitudes(data, mode):
    """Deterministic: each op of the policy at magnitude 0 and at the highest the policy can draw (mstd clips at 10)."""
    transform, policy = _default_train_transform(data)
    ops = _ops(transform)
    assert {op.name for op in ops} >= {"PosterizeIncreasing", "SolarizeIncreasing", "Rotate"}, policy
    image = _photo(mode=mode).convert("RGB")
    for op in ops:
        for magnitude in (0.0, float(op.magnitude_max or 10)):
            fixed = copy.copy(op)
            fixed.prob, fixed.magnitude, fixed.magnitude_std = 1.0, magnitude, 0
            result = fixed(image)
            assert result.size == image.size, (op.name, magnitude)


def test_the_whole_default_pipeline_on_many_draws():
    transform, _ = _default_train_transform("imagefolder")
    image = _photo((64, 48))
    for seed in range(200):
        torch.manual_seed(seed)
        np.random.seed(seed)
        import random

        random.seed(seed)
        out = transform(image)
        assert out.shape == (3, 32, 32) and torch.isfinite(out).all()


def _failing_pipeline():
    from torchvision import transforms

    solarize = AugmentOp("Solarize", prob=1.0, magnitude=5)
    return guard_transform(transforms.Compose([transforms.Resize(24), RandAugment([solarize], num_layers=1)]))


def test_a_failing_op_is_named_with_its_arguments_and_the_image():
    pipeline = _failing_pipeline()
    with pytest.raises(AugmentationError) as caught:
        pipeline(_photo().convert("F"))  # solarize has no lookup table for 32-bit float images
    message = str(caught.value)
    assert "RandAugment" in message and "op Solarize(" in message and "F 32x24 image" in message, message
    assert "step 2 of 2" in message


def test_an_augmentation_error_in_a_data_worker_names_the_file_and_the_op(tmp_path):
    from torch.utils.data import DataLoader

    folder = tmp_path / "train" / "cat"
    folder.mkdir(parents=True)
    _photo().save(folder / "tabby.tiff")
    dataset = TolerantImageFolder(str(tmp_path / "train"), transform=_failing_pipeline(), loader=_FloatLoader())
    with pytest.raises(AugmentationError) as caught:
        next(iter(DataLoader(dataset, batch_size=1, num_workers=1)))
    message = str(caught.value)
    assert "tabby.tiff" in message and "op Solarize(" in message and "RandAugment" in message, message


class _FloatLoader(PilLoader):
    """Opens images as 32-bit float (mode F): a mode on which timm's solarize op fails."""

    def __init__(self):
        super().__init__("F")

    def convert(self, image):
        return image.convert("L").convert("F")
