"""The Lightning module for image classification with any timm (or linvit) model.

Recipe pieces, each one config key away: timm's optimizer factory (weight-decay exemptions from
``no_weight_decay``, layer-wise lr decay from ``group_matcher``), linear lr scaling with the effective batch,
per-step warm-up + cosine schedule, label smoothing, timm mixup/cutmix, model EMA (evaluated beside the raw
weights), top-1/top-5 from torchmetrics. Gradient clipping, precision and accumulation come from the Trainer.
"""

from __future__ import annotations

import logging
from typing import Any

import timm
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from timm.utils import ModelEmaV3
from torchmetrics.classification import MulticlassAccuracy

from linvit.models import check_model_name
from linvit.train.data.auto_recipe import capped_warmup_steps, too_few_steps_advice
from linvit.train.data.hparams import make_hparams_plain
from linvit.train.modules.recipe import WarmupCosine, merge_options

_log = logging.getLogger(__name__)

OPTIMIZER_DEFAULTS: dict[str, Any] = {
    "opt": "adamw",
    "lr": 1e-3,
    "lr_base_size": None,  # None: ``lr`` is absolute; N: ``lr`` is per N images, scaled by the effective batch
    "weight_decay": 0.05,
    "momentum": 0.9,
    "layer_decay": None,
    "filter_bias_and_bn": True,
}
SCHEDULER_DEFAULTS: dict[str, Any] = {
    "sched": "cosine",  # "cosine" or "constant" (after warm-up)
    "warmup_epochs": 1.0,
    "max_warmup_fraction": None,  # None: warmup_epochs as given; f: at most this share of the run's optimizer steps
    "warmup_lr": 1e-6,
    "min_lr": 1e-5,
}
MIXUP_DEFAULTS: dict[str, Any] = {
    "mixup_alpha": 0.0,
    "cutmix_alpha": 0.0,
    "cutmix_minmax": None,
    "prob": 1.0,
    "switch_prob": 0.5,
    "mode": "batch",
}
EMA_DEFAULTS: dict[str, Any] = {"enabled": False, "decay": 0.9998, "warmup": True, "evaluate": True}


class ImageClassifier(LightningModule):
    """Image classification with ``timm.create_model(model_name, ...)``.

    Args:
        model_name: any name ``timm.list_models()`` knows after ``import linvit`` (e.g. ``linvit_nano``).
        num_classes, in_chans: from the DataModule (``${data.num_classes}``, ``${data.in_chans}``).
        model_kwargs: extra ``create_model`` arguments (``img_size``, ``drop_path_rate``, ...).
        pretrained: load the model's pretrained weights (needs them locally or the internet).
        optimizer: ``opt`` (timm name), ``lr``, ``lr_base_size``, ``weight_decay``, ``momentum``, ``layer_decay``,
            ``filter_bias_and_bn``, plus any keyword the timm optimizer takes (``betas``, ``eps``).
        scheduler: ``sched`` (cosine | constant), ``warmup_epochs`` (fractions allowed), ``max_warmup_fraction``
            (the warm-up at most this share of the run's optimizer steps, so a short run is not all warm-up; None:
            no cap), ``warmup_lr``, ``min_lr``.
        label_smoothing: label smoothing of the cross-entropy (also applied inside mixup targets).
        mixup: timm ``Mixup`` options; active when ``mixup_alpha`` or ``cutmix_alpha`` > 0.
        ema: ``enabled``, ``decay``, ``warmup`` (timm's decay warm-up), ``evaluate`` (validate/test EMA weights).
        attn_layers: the per-stage attention of a linvit family (``["focused", "focused", "hybrid", "window"]``,
            names from ``linvit.attention.ATTENTION_NAMES``), passed to ``create_model``; None keeps the model's.
    """

    def __init__(
        self,
        model_name: str,
        num_classes: int,
        in_chans: int = 3,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: bool = False,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        label_smoothing: float = 0.0,
        mixup: dict[str, Any] | None = None,
        ema: dict[str, Any] | None = None,
        attn_layers: Any = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        make_hparams_plain(self)
        import linvit  # noqa: F401  (registers linvit models with timm)

        self.optimizer_cfg = {**OPTIMIZER_DEFAULTS, **dict(optimizer or {})}
        self.scheduler_cfg = merge_options(SCHEDULER_DEFAULTS, scheduler, "scheduler")
        if self.scheduler_cfg["sched"] not in ("cosine", "constant"):
            raise ValueError(f"scheduler.sched must be 'cosine' or 'constant', got {self.scheduler_cfg['sched']!r}.")
        self.mixup_cfg = merge_options(MIXUP_DEFAULTS, mixup, "mixup")
        self.ema_cfg = merge_options(EMA_DEFAULTS, ema, "ema")
        self.label_smoothing = float(label_smoothing)
        self.num_classes = int(num_classes)

        check_model_name(model_name, "model.model_name")
        model_kwargs = dict(model_kwargs or {})
        if attn_layers is not None:  # recorded once, with the other model arguments (export and resume read those)
            model_kwargs["attn_layers"] = attn_layers
            self.hparams["model_kwargs"], self.hparams["attn_layers"] = model_kwargs, None
        self.model = timm.create_model(
            model_name, pretrained=pretrained, num_classes=num_classes, in_chans=in_chans, **model_kwargs
        )
        self.mixup_fn = None
        if self.mixup_cfg["mixup_alpha"] > 0 or self.mixup_cfg["cutmix_alpha"] > 0:
            from timm.data import Mixup

            self.mixup_fn = Mixup(
                **{k: v for k, v in self.mixup_cfg.items() if k not in ("prob", "mode")},
                prob=self.mixup_cfg["prob"],
                mode=self.mixup_cfg["mode"],
                label_smoothing=self.label_smoothing,
                num_classes=num_classes,
            )
        self.model_ema = None
        if self.ema_cfg["enabled"]:
            self.model_ema = SpawnableModelEma(
                self.model, decay=self.ema_cfg["decay"], use_warmup=self.ema_cfg["warmup"]
            )
            self.model_ema.requires_grad_(False)
            # The copy never runs forward in training; following the module's train/eval mode (Lightning sets
            # eval for validation) avoids Lightning's warning about submodules left in eval mode.
            self.model_ema.train(self.training)

        top5 = min(5, num_classes)
        self.metrics = torch.nn.ModuleDict()
        for split in ("val", "test"):
            for tag in ("", "_ema") if self.model_ema is not None and self.ema_cfg["evaluate"] else ("",):
                self.metrics[f"{split}{tag}_acc1"] = MulticlassAccuracy(num_classes, top_k=1, average="micro")
                self.metrics[f"{split}{tag}_acc5"] = MulticlassAccuracy(num_classes, top_k=top5, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # -- steps ------------------------------------------------------------------------------------------------
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        if self.mixup_fn is not None:
            images, soft_targets = self.mixup_fn(images, targets)
            logits = self.model(images)
            loss = torch.sum(-soft_targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        else:
            logits = self.model(images)
            loss = F.cross_entropy(logits.float(), targets, label_smoothing=self.label_smoothing)
        if not torch.isfinite(loss):
            _log.warning("non-finite training loss %s at step %d", loss.item(), self.global_step)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(targets))
        self.log("lr", self.optimizers().param_groups[0]["lr"], prog_bar=False, on_step=True, on_epoch=False)
        return loss

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> None:
        images, targets = batch
        models = [("", self.model)]
        if f"{split}_ema_acc1" in self.metrics:
            models.append(("_ema", self.model_ema.module))
        for tag, model in models:
            logits = model(images).float()
            loss = F.cross_entropy(logits, targets)
            prefix = f"{split}{tag}"
            self.metrics[f"{prefix}_acc1"](logits, targets)
            self.metrics[f"{prefix}_acc5"](logits, targets)
            kwargs = {"on_step": False, "on_epoch": True, "batch_size": len(targets), "sync_dist": True}
            self.log(f"{prefix}/loss", loss, prog_bar=split == "val" and not tag, **kwargs)
            self.log(f"{prefix}/acc1", self.metrics[f"{prefix}_acc1"], prog_bar=split == "val", **kwargs)
            self.log(f"{prefix}/acc5", self.metrics[f"{prefix}_acc5"], **kwargs)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model(images).softmax(-1)

    # -- EMA --------------------------------------------------------------------------------------------------
    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer step, then the EMA update: once per optimizer step, also under gradient accumulation.

        Here and not in ``on_train_batch_end``: Lightning calls the callbacks' ``on_train_batch_end`` (a checkpoint
        every n steps, a SIGTERM save) before the module's, so they would save weights one EMA update behind.
        """
        super().optimizer_step(*args, **kwargs)
        if self.model_ema is not None:
            # Lightning counts this optimizer step once the hook returns: the EMA's step is the count after it
            self.model_ema.update(self.model, step=self.global_step + 1)

    # -- optimisation -----------------------------------------------------------------------------------------
    def effective_batch_size(self) -> int:
        """Images per optimizer step over all devices and nodes, with gradient accumulation."""
        trainer = self.trainer
        datamodule = getattr(trainer, "datamodule", None)
        batch_size = getattr(datamodule, "batch_size", None)
        if batch_size is None:
            batch_size = trainer.train_dataloader.batch_size if trainer.train_dataloader is not None else 1
        return int(batch_size) * trainer.world_size * trainer.accumulate_grad_batches

    def learning_rate(self) -> float:
        """``optimizer.lr``, scaled linearly by ``effective batch / lr_base_size`` when ``lr_base_size`` is set."""
        lr = float(self.optimizer_cfg["lr"])
        base = self.optimizer_cfg.get("lr_base_size")
        return lr * self.effective_batch_size() / float(base) if base else lr

    def configure_optimizers(self) -> dict[str, Any]:
        from timm.optim import create_optimizer_v2

        options = {k: v for k, v in self.optimizer_cfg.items() if k not in ("lr", "lr_base_size")}
        lr = self.learning_rate()
        optimizer = create_optimizer_v2(self.model, lr=lr, **options)
        for group in optimizer.param_groups:  # layer decay: timm stores the per-group factor as lr_scale
            group["lr"] = lr * group.get("lr_scale", 1.0)
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        max_epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        steps_per_epoch = max(1, total_steps // max_epochs)
        configured = int(round(self.scheduler_cfg["warmup_epochs"] * steps_per_epoch))
        warmup_steps = capped_warmup_steps(configured, total_steps, self.scheduler_cfg["max_warmup_fraction"])
        schedule = WarmupCosine(
            total_steps=total_steps,
            warmup_steps=max(0, warmup_steps),
            warmup_factor=self.scheduler_cfg["warmup_lr"] / lr if lr > 0 else 1.0,
            min_factor=self.scheduler_cfg["min_lr"] / lr if lr > 0 else 1.0,
            cosine=self.scheduler_cfg["sched"] == "cosine",
        )
        if self.trainer.is_global_zero:
            _log.info(
                "optimizer %s, lr %.3g (effective batch %d), %d steps (%d warm-up)",
                self.optimizer_cfg["opt"],
                lr,
                self.effective_batch_size(),
                total_steps,
                warmup_steps,
            )
            advice = too_few_steps_advice(total_steps) if not self._shortened_on_purpose() else None
            if advice:
                _log.warning(advice)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _shortened_on_purpose(self) -> bool:
        """A run cut short by the trainer's own options (fast_dev_run, limit_train_batches, max_steps): a test or a
        check, not a training run to warn about."""
        trainer = self.trainer
        limit = getattr(trainer, "limit_train_batches", 1.0)
        return bool(getattr(trainer, "fast_dev_run", False)) or limit != 1.0 or getattr(trainer, "max_steps", -1) > 0


class SpawnableModelEma(ModelEmaV3):
    """timm's ``ModelEmaV3`` that survives ``ddp_spawn`` (``trainer=ddp_sim``).

    Its stochastic-rounding ``torch.Generator`` does not: torch sends the generator's state through shared memory, and
    the spawned process fails to map it (``RuntimeError: unable to resize file <filename not specified>``). Pickled
    here as its device and state bytes, and rebuilt on loading.
    """

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key, value in state.items():
            if isinstance(value, torch.Generator):
                state[key] = _GeneratorState(str(value.device), value.get_state().numpy().tobytes())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for key, value in state.items():
            if isinstance(value, _GeneratorState):
                state[key] = value.rebuild()
        super().__setstate__(state)


class _GeneratorState:
    """A ``torch.Generator`` as plain bytes (pickles without shared memory)."""

    def __init__(self, device: str, state: bytes):
        self.device, self.state = device, state

    def rebuild(self) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.set_state(torch.frombuffer(bytearray(self.state), dtype=torch.uint8))
        return generator
