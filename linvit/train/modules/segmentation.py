"""Lightning module for semantic segmentation on any linvit/timm backbone (cross-entropy, mIoU from torchmetrics).

The model is :func:`linvit.dense.create_segmentation_model` (backbone + FPN / UPerNet head); this module trains it
beside the classifier of :mod:`linvit.train.modules.classification`, with the same recipe helpers
(:mod:`linvit.train.modules.recipe`). Hydra: ``configs/model/seg_*.yaml`` sets
``_target_: linvit.train.modules.segmentation.SegmentationModule``; ``train.py`` instantiates it with the DataModule
from ``configs/data/seg_*.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor
from torchmetrics.classification import MulticlassJaccardIndex

from linvit.dense.seg_folder import IGNORE_INDEX
from linvit.dense.segmentation import create_segmentation_model
from linvit.train.modules.recipe import WarmupCosine, merge_options

__all__ = ["SegmentationModule"]

OPTIMIZER_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.01, "backbone_lr_mult": 1.0, "betas": (0.9, 0.999)}
SCHEDULER_DEFAULTS: dict[str, Any] = {"warmup_fraction": 0.05, "min_lr_ratio": 0.01}


class SegmentationModule(LightningModule):
    """Semantic segmentation: ``create_segmentation_model(backbone, num_classes, head, ...)`` + CE loss + mIoU.

    Args:
        backbone: timm model name (``linvit_nano``, ``convnext_atto``, ...).
        num_classes: classes (from the DataModule: ``${data.num_classes}``).
        in_chans: image channels (``${data.in_chans}``; the backbones take 3).
        head: ``"fpn"`` (Semantic FPN) or ``"upernet"``.
        channels: head width.
        pretrained, checkpoint: backbone weights (timm default / a local file).
        backbone_kwargs: extra ``timm.create_model`` arguments (``drop_path_rate``, ...).
        optimizer: AdamW ``lr``, ``weight_decay``, ``betas``, ``backbone_lr_mult`` (backbone lr = lr × mult).
        scheduler: ``warmup_fraction`` of all steps, ``min_lr_ratio``; warm-up + cosine per step.
        ignore_index: mask value excluded from loss and metric.
        class_names: names for the per-class IoU logged at validation and test end; default: the DataModule's
            ``class_names`` (what the run trains on), else the class indices.
    """

    def __init__(
        self,
        backbone: str,
        num_classes: int,
        in_chans: int = 3,
        head: str = "fpn",
        channels: int = 128,
        pretrained: bool = False,
        checkpoint: str | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        ignore_index: int = IGNORE_INDEX,
        class_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.optimizer_cfg = merge_options(OPTIMIZER_DEFAULTS, optimizer, "optimizer")
        self.scheduler_cfg = merge_options(SCHEDULER_DEFAULTS, scheduler, "scheduler")
        self.num_classes = int(num_classes)
        self.ignore_index = int(ignore_index)
        self._given_class_names = list(class_names) if class_names else None
        self.class_names = self._given_class_names or [str(i) for i in range(self.num_classes)]
        self.model = create_segmentation_model(
            backbone,
            self.num_classes,
            head=head,
            channels=channels,
            pretrained=pretrained,
            checkpoint=checkpoint,
            in_chans=in_chans,
            **dict(backbone_kwargs or {}),
        )
        self.metrics = torch.nn.ModuleDict()
        for split in ("val", "test"):
            for name, average in (("miou", "macro"), ("iou", "none")):
                self.metrics[f"{split}_{name}"] = MulticlassJaccardIndex(
                    self.num_classes, ignore_index=self.ignore_index, average=average
                )

    def setup(self, stage: str) -> None:
        # the labels of the data this run trains on (not those of another task's config)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        names = getattr(datamodule, "class_names", None)
        if self._given_class_names is None and names and len(names) == self.num_classes:
            self.class_names = [str(name) for name in names]

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def _loss(self, logits: Tensor, masks: Tensor) -> Tensor:
        if bool((masks != self.ignore_index).any()):
            return F.cross_entropy(logits.float(), masks, ignore_index=self.ignore_index)
        return logits.sum() * 0.0  # a crop of only ignored pixels: no signal, but keep the graph

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        images, masks = batch
        loss = self._loss(self(images), masks)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(images))
        return loss

    def _evaluate(self, batch: Any, split: str) -> None:
        images, masks = batch
        logits = self(images)
        loss = self._loss(logits, masks)
        predictions = logits.argmax(1)
        miou, per_class = self.metrics[f"{split}_miou"], self.metrics[f"{split}_iou"]
        miou.update(predictions, masks)
        per_class.update(predictions, masks)
        self.log(f"{split}/loss", loss, prog_bar=split == "val", on_epoch=True, batch_size=len(images), sync_dist=True)
        self.log(f"{split}/mIoU", miou, prog_bar=split == "val", on_epoch=True, batch_size=len(images))

    def _log_per_class(self, split: str) -> None:
        per_class = self.metrics[f"{split}_iou"]
        for name, value in zip(self.class_names, per_class.compute()):
            self.log(f"{split}/IoU_{name}", value)
        per_class.reset()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_per_class("val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_per_class("test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(images).argmax(1)

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optimizer_cfg
        lr, backbone_lr = float(cfg["lr"]), float(cfg["lr"]) * float(cfg["backbone_lr_mult"])
        groups: dict[str, dict[str, Any]] = {}
        for name, parameter in self.model.named_parameters():
            if not parameter.requires_grad:
                continue
            part = "backbone" if name.startswith("backbone.") else "head"
            decay = "no_decay" if parameter.ndim <= 1 else "decay"  # norms and biases: no weight decay
            group = groups.setdefault(
                f"{part}_{decay}",
                {
                    "params": [],
                    "lr": backbone_lr if part == "backbone" else lr,
                    "weight_decay": 0.0 if decay == "no_decay" else float(cfg["weight_decay"]),
                },
            )
            group["params"].append(parameter)
        optimizer = torch.optim.AdamW(list(groups.values()), lr=lr, betas=tuple(cfg["betas"]))
        total = max(1, int(self.trainer.estimated_stepping_batches) if self.trainer is not None else 1)
        warmup = min(int(round(self.scheduler_cfg["warmup_fraction"] * total)), total - 1)
        # warm-up from 1 / (warmup + 1) of the lr: the first step already moves the weights
        schedule = WarmupCosine(
            total, warmup, 1.0 / (warmup + 1), float(self.scheduler_cfg["min_lr_ratio"]), cosine=True
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
