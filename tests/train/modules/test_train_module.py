"""ImageClassifier: schedule, optimizer groups, lr scaling, EMA stepping, mixup, precision."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from linvit.train.modules.classification import ImageClassifier
from linvit.train.modules.recipe import WarmupCosine


def test_warmup_cosine_schedule():
    schedule = WarmupCosine(total_steps=110, warmup_steps=10, warmup_factor=0.01, min_factor=0.1, cosine=True)
    assert schedule(0) == pytest.approx(0.01)
    assert schedule(5) == pytest.approx(0.01 + 0.99 * 0.5)
    assert schedule(10) == pytest.approx(1.0)
    assert schedule(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the cosine
    assert schedule(110) == pytest.approx(0.1)
    values = [schedule(t) for t in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def _attach_fake_trainer(module, batch_size=32, world_size=4, accumulate=2, steps=100, epochs=10):
    module._trainer = SimpleNamespace(
        datamodule=SimpleNamespace(batch_size=batch_size),
        world_size=world_size,
        accumulate_grad_batches=accumulate,
        estimated_stepping_batches=steps,
        max_epochs=epochs,
        is_global_zero=True,
        train_dataloader=None,
    )


def test_optimizer_groups_lr_scaling_and_layer_decay():
    module = ImageClassifier(
        "test_vit",
        num_classes=3,
        model_kwargs={"img_size": 32},
        optimizer={"opt": "adamw", "lr": 1e-3, "lr_base_size": 1024, "weight_decay": 0.05, "layer_decay": 0.5},
        scheduler={"warmup_epochs": 2, "warmup_lr": 1e-6},
    )
    _attach_fake_trainer(module)  # effective batch 32 x 4 x 2 = 256
    assert module.effective_batch_size() == 256
    assert module.learning_rate() == pytest.approx(1e-3 * 256 / 1024)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    names = {id(p): n for n, p in module.model.named_parameters()}
    scales = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.ndim <= 1 or names[id(p)] in ("pos_embed", "cls_token"):
                assert group["weight_decay"] == 0.0, names[id(p)]
        scales.add(group.get("lr_scale", 1.0))
    assert len(scales) > 2 and max(scales) == 1.0  # layer-wise decay through group_matcher
    # the scheduler starts at the warm-up lr, each group scaled by its layer factor
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(1e-6 * group.get("lr_scale", 1.0), rel=1e-6)
    for _ in range(20):  # 2 warm-up epochs of 10 steps
        optimizer.step()
        scheduler.step()
    top = max(optimizer.param_groups, key=lambda g: g.get("lr_scale", 1.0))
    assert top["lr"] == pytest.approx(module.learning_rate(), rel=1e-3)


def test_unknown_options_are_rejected():
    with pytest.raises(TypeError, match="unknown scheduler option"):
        ImageClassifier("test_resnet", num_classes=3, scheduler={"warmup": 3})
    with pytest.raises(ValueError, match="sched"):
        ImageClassifier("test_resnet", num_classes=3, scheduler={"sched": "step"})


def _loader(n=16, classes=4, size=16):
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(n, 3, size, size, generator=generator)
    return DataLoader(TensorDataset(images, torch.arange(n) % classes), batch_size=4)


def test_ema_updates_once_per_optimizer_step_with_accumulation():
    module = ImageClassifier("test_resnet", num_classes=4, ema={"enabled": True, "decay": 0.9}, label_smoothing=0.1)
    steps = []
    update = module.model_ema.update
    module.model_ema.update = lambda model, step=None: (steps.append(step), update(model, step=step))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=_loader())
    assert trainer.global_step == 2 and steps == [1, 2]
    ema = dict(module.model_ema.module.named_parameters())
    assert any(not torch.equal(p, ema[n]) for n, p in module.model.named_parameters())
    assert all(not p.requires_grad for p in module.model_ema.parameters())
    assert "val_ema/acc1" in trainer.callback_metrics and "val/acc5" in trainer.callback_metrics


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_mixup_cutmix_step_under_precision(precision):
    pl.seed_everything(0)
    module = ImageClassifier(
        "test_vit",
        num_classes=4,
        model_kwargs={"img_size": 16, "patch_size": 4},
        label_smoothing=0.1,
        mixup={"mixup_alpha": 0.8, "cutmix_alpha": 1.0},
        scheduler={"warmup_epochs": 0.5},
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        precision=precision,
        fast_dev_run=2,
        gradient_clip_val=1.0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=_loader())
    loss = float(trainer.callback_metrics["train/loss_step"])
    assert math.isfinite(loss) and loss > 0


def test_the_warm_up_is_capped_at_a_share_of_the_run():
    """One epoch of 55 steps with warmup_epochs=1: 54 steps of warm-up before; 6 with max_warmup_fraction=0.1."""
    for fraction, warmup in ((None, 54), (0.1, 6)):
        module = ImageClassifier(
            "test_resnet", num_classes=3, scheduler={"warmup_epochs": 1, "max_warmup_fraction": fraction}
        )
        _attach_fake_trainer(module, steps=55, epochs=1)
        schedule = module.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]
        assert schedule.warmup_steps == warmup and schedule.total_steps == 55
