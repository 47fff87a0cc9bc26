"""The rules behind the ``auto`` training values of folder data: batch size, ``drop_last``, epochs, augmentation.

A recipe sized for ImageNet (batch 128, 20 epochs, RandAugment m9, crops down to 8% of the image) gave a 3-class,
40-images-per-class folder one optimizer step per epoch and an accuracy at chance. These rules size the run to the
data instead; each returns the value and the reason, which the training log prints (one line each).

- batch size: at most 1/8 of the training images (at least 8 steps per epoch), a power of two between 8 and 128;
- ``drop_last``: only when the last, incomplete batch is at most 2% of the training images or under a quarter of a
  batch;
- epochs: enough whole epochs for ``target_steps`` optimizer steps (default 1,000) and at least ``min_epochs`` (50),
  at most 300 (data that is not a folder, whose recipe is tuned to it: ``auto.epochs``, 20). 1,000 steps alone gave
  5,000 Fashion-MNIST images 26 epochs, and both linvit_nano and resnet18 underfit: 52 epochs gained each of them
  3.2-3.4 points of test top-1;
- warm-up: as configured, at most ``scheduler.max_warmup_fraction`` of the run's optimizer steps (10%);
- learning rate, with an auto batch: ``model.optimizer.lr`` is the rate for ``auto.lr_batch`` images (128, the batch
  the model configs' 2e-3 was tuned at); another batch scales it by the square root of the ratio for adaptive
  optimizers (Adam, AdamW, LAMB, ...) and linearly for others: timm train.py's ``--lr-base-scale`` rule. A 3-class,
  40-per-class Fashion-MNIST folder (batch 8) reached 86.7% with 2e-3 and 94.3% with 5e-4;
- augmentation: gentler for small images (< 64 px, however many) and few images (< 2,000), where heavy
  augmentation keeps a small set, or the detail of a small image, from being learnt; and small images are evaluated
  whole (``crop_pct`` 1.0), larger ones on ImageNet's centre crop (0.875);
- the stem of linvit's own models (``auto.small_image_stem``): stride 2 for inputs under 128 px, where a stride-4
  stem would leave the first stage a map under 32x32 (strides 2/4/8/16, the CIFAR variants' answer to small images:
  a 32-px image is a 16x16 map instead of 8x8, a 64-px one 32x32 instead of 16x16); stride 4 otherwise. linvit_nano
  on 5,000 28-px Fashion-MNIST images: 85.50 -> 87.55% (resnet18 88.45%), at 2.1x the training time; on 64-px crops
  of photos (``wallpapers_11x60``, mean of three seeds): 91.58 -> 92.67% (resnet18 92.06%), at 2.1x.

Every explicit value wins: these only replace the value ``auto``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

MIN_AUTO_BATCH = 8
MAX_AUTO_BATCH = 128
MIN_STEPS_PER_EPOCH = 8
MAX_DROPPED_SHARE = 0.02
TARGET_STEPS = 1000
MIN_AUTO_EPOCHS = 50
MAX_AUTO_EPOCHS = 300
EPOCHS_OF_KNOWN_DATA = 20  # trainer.max_epochs=auto for data that is not a folder (digits, CIFAR): their recipe's
FEW_LEARNING_STEPS = 200  # fewer optimizer steps than this: a model trained from scratch has hardly begun
SMALL_IMAGE = 64
STEM_MAP_SIDE = 32  # the smallest first-stage map a stride-4 stem may leave before the stride-2 stem is chosen
FEW_IMAGES = 2000


class Choice(NamedTuple):
    """An ``auto`` value and why it was chosen (for the log)."""

    value: Any
    reason: str


def auto_batch_size(train_images: int, processes: int = 1) -> Choice:
    """Images per device per step: the largest power of two with at least 8 steps per epoch, within [8, 128].

    ``processes``: devices x nodes x gradient accumulation, which multiply the batch into the optimizer's.
    """
    processes = max(1, int(processes))
    per_step = max(1, train_images // MIN_STEPS_PER_EPOCH) // processes
    batch = 2 ** int(math.log2(per_step)) if per_step >= 1 else 1
    batch = min(MAX_AUTO_BATCH, max(MIN_AUTO_BATCH, batch))
    effective = batch * processes
    reason = (
        f"{train_images} training images: at most 1/{MIN_STEPS_PER_EPOCH} of them per optimizer step, a power of "
        f"two from {MIN_AUTO_BATCH} to {MAX_AUTO_BATCH}; {steps_per_epoch(train_images, effective, False)} steps per "
        "epoch"
    )
    return Choice(batch, reason + (f" (x{processes} processes/accumulation)" if processes > 1 else ""))


def auto_drop_last(train_images: int, effective_batch: int, even_batches: bool = False) -> Choice:
    """Drop the last, incomplete batch only when it holds at most 2% of the training images, or is under a quarter of
    a batch (a stub of a step; BatchNorm refuses a batch of one), or has an odd size and ``even_batches`` (mixup and
    cutmix need one)."""
    left = train_images % effective_batch if train_images >= effective_batch else 0
    share = left / max(1, train_images)
    if left == 0:
        return Choice(True, "the batches fill the training set: nothing to drop")
    if share <= MAX_DROPPED_SHARE:
        return Choice(True, f"the last batch of {left} images is {100 * share:.1f}% of the training set")
    if left < max(2, effective_batch // 4):
        return Choice(True, f"the last batch of {left} image(s) is under a quarter of a batch")
    if even_batches and left % 2:
        return Choice(True, f"mixup/cutmix need even batches: the last one, of {left} images, is dropped")
    return Choice(False, f"the last batch of {left} images is {100 * share:.1f}% of the training set: kept")


def auto_batch_lr(lr: float, effective_batch: int, lr_batch: int, optimizer: str) -> Choice:
    """``lr`` (the rate for ``lr_batch`` images) for ``effective_batch`` images per optimizer step: scaled by
    ``sqrt(effective_batch / lr_batch)`` for adaptive optimizers (timm names holding "ada" or "lamb"), linearly for
    the others (SGD, momentum)."""
    adaptive = any(part in optimizer.lower() for part in ("ada", "lamb"))
    ratio = effective_batch / lr_batch
    factor = math.sqrt(ratio) if adaptive else ratio
    rule = f"sqrt({effective_batch}/{lr_batch})" if adaptive else f"{effective_batch}/{lr_batch}"
    reason = (
        f"model.optimizer.lr={lr:g} is the rate for a batch of {lr_batch} (auto.lr_batch); x {rule} for {optimizer}"
    )
    return Choice(lr * factor, reason)


def steps_per_epoch(train_images: int, effective_batch: int, drop_last: bool) -> int:
    """Optimizer steps in one pass over ``train_images`` (the loaders never drop a set smaller than a batch)."""
    if drop_last and train_images >= effective_batch:
        return train_images // effective_batch
    return max(1, math.ceil(train_images / effective_batch))


def auto_max_epochs(steps: int, target_steps: int = TARGET_STEPS, min_epochs: int = MIN_AUTO_EPOCHS) -> Choice:
    """Whole epochs for at least ``target_steps`` optimizer steps at ``steps`` per epoch and at least ``min_epochs``,
    at most 300."""
    target_steps, min_epochs = max(1, int(target_steps)), max(0, int(min_epochs))
    for_steps = math.ceil(target_steps / max(1, steps))
    epochs = min(MAX_AUTO_EPOCHS, max(1, for_steps, min_epochs))
    bound = f"auto.target_steps={target_steps}" if for_steps >= min_epochs else f"auto.min_epochs={min_epochs}"
    reason = f"{epochs * steps} optimizer steps at {steps} per epoch ({bound}"
    reason += f", at most {MAX_AUTO_EPOCHS} epochs)" if epochs == MAX_AUTO_EPOCHS else ")"
    return Choice(epochs, reason)


def capped_warmup_steps(configured: int, total_steps: int, max_share: float | None) -> int:
    """The warm-up in optimizer steps: as configured, at most ``max_share`` of the run (None: no cap), and always
    fewer steps than the run has."""
    steps = max(0, int(configured))
    if max_share is not None:
        steps = min(steps, math.ceil(float(max_share) * total_steps))
    return max(0, min(steps, total_steps - 1))


def auto_augmentation(img_size: int, train_images: int) -> Choice:
    """RandAugment, random-resized-crop scale and random erasing for the image size and count, and the evaluation
    crop for the size: ``{key: value}``.

    light (small images, or under 500 images): RandAugment m3, crops of at least 50%, no erasing; medium (few images
    of at least 64 px): m6, crops of at least 25%, erasing 0.1; full (otherwise): timm's ImageNet recipe, m9, crops
    from 8%, erasing 0.25. Small images take the light tier however many there are: a crop of a quarter of a 28-px
    image keeps a few pixels of the object, and on 5,000 Fashion-MNIST images the medium tier left linvit_nano and
    resnet18 underfitting (benchmarks/accuracy/NOTES.md).
    """
    small, few = img_size < SMALL_IMAGE, train_images < FEW_IMAGES
    if small or train_images < 500:
        tier, values = "light", {"auto_augment": "rand-m3-mstd0.5-inc1", "scale": [0.5, 1.0], "re_prob": 0.0}
    elif few:
        tier, values = "medium", {"auto_augment": "rand-m6-mstd0.5-inc1", "scale": [0.25, 1.0], "re_prob": 0.1}
    else:
        tier, values = "full", {"auto_augment": "rand-m9-mstd0.5-inc1", "scale": [0.08, 1.0], "re_prob": 0.25}
    # evaluation: small images are whole objects (the MNIST and CIFAR convention: no crop); larger ones are photos
    # with background, ImageNet's centre crop of 87.5%. linvit_nano's best checkpoint on 5,000 Fashion-MNIST images:
    # 83.40% with the crop, 85.50% without (resnet18 88.20 -> 88.40%)
    values["crop_pct"] = 1.0 if small else 0.875
    why = f"{img_size} px ({'under' if small else 'at least'} {SMALL_IMAGE}), {train_images} training images "
    why += f"({'under' if few else 'at least'} {FEW_IMAGES}): {tier}"
    why += ", evaluated whole" if small else ", evaluated on a centre crop"
    return Choice(values, why)


def auto_stem_stride(img_size: int | list[int] | tuple[int, ...]) -> Choice:
    """The stem stride of a linvit model for inputs of ``img_size`` (a side or (height, width)): 2 where a stride-4
    stem would leave the first stage a map under 32x32 (inputs under 128 px), 4 otherwise."""
    side = min(img_size) if isinstance(img_size, (list, tuple)) else img_size
    limit = 4 * STEM_MAP_SIDE
    if side < limit:
        return Choice(2, f"{side}-px inputs (under {limit}): stages at strides 2/4/8/16")
    return Choice(4, f"{side}-px inputs (at least {limit}): stages at strides 4/8/16/32")


def too_few_steps_advice(total_steps: int) -> str | None:
    """A warning for a run of fewer optimizer steps than a model learns in, naming the options; None if enough."""
    if total_steps >= FEW_LEARNING_STEPS:
        return None
    return (
        f"this run takes {total_steps} optimizer steps: a model trained from scratch learns little in fewer than "
        f"~{FEW_LEARNING_STEPS}. Set trainer.max_epochs=auto (folder data: auto.target_steps and auto.min_epochs) or "
        "a larger trainer.max_epochs, or a smaller data.batch_size (or data.batch_size=auto)."
    )
