"""Training with Lightning + Hydra, in three rooms that import one way, ``data <- modules <- runs``:

- :mod:`linvit.train.data`: the DataModules (classification, segmentation), their datasets, image-folder scanning
  and checking, augmentation guards, the data options, and the DataLoader whose workers live through a SIGTERM;
- :mod:`linvit.train.modules`: the LightningModules (classification: :mod:`~linvit.train.modules.classification`;
  semantic segmentation: :mod:`~linvit.train.modules.segmentation`), their shared recipe pieces and the callbacks
  they train with (reseeding, curves, crash-safe checkpoints, SIGTERM save, non-finite loss guard, logged metrics);
- :mod:`linvit.train.runs`: the Hydra entry, run directories and their identity, resume, saved runs and export.

``python train.py`` and ``linvit train`` (the Hydra app of :mod:`linvit.train.runs.hydra_app`, ``train.yaml`` of the
configs the package ships as ``linvit/configs``) build four objects from the config, each by ``_target_``
through ``hydra.utils.instantiate``, and run ``Trainer.fit``, ``Trainer.test`` and the export
(:func:`linvit.train.runs.run.train`):

- ``cfg.data``: any ``LightningDataModule``;
- ``cfg.model``: any ``LightningModule``;
- ``cfg.callbacks.*`` and ``cfg.logger.*``: every entry with a ``_target_`` (set an entry to ``null`` to drop it);
- ``cfg.trainer``: ``lightning.pytorch.Trainer`` (``accelerator``, ``devices``, ``strategy``, ``precision`` ...).

The contract between data and model configs, which a new task (e.g. segmentation) follows to plug in its own
DataModule and LightningModule through ``configs/data/<name>.yaml``, ``configs/model/<name>.yaml`` and
``configs/experiment/<name>.yaml``:

1. The data config declares what the model must be built for as plain keys: ``num_classes``, ``in_chans`` and
   ``img_size``. The model config reads them by interpolation (``num_classes: ${data.num_classes}``,
   ``in_chans: ${data.in_chans}``, ``img_size: ${data.img_size}``), never the other way round, so that
   ``data=... model=...`` combine freely and a command-line override of ``data.num_classes`` reaches the model.
2. The DataModule's ``batch_size`` is per device; the effective batch is
   ``batch_size x trainer.devices x trainer.num_nodes x trainer.accumulate_grad_batches``.
3. The LightningModule logs ``val/loss`` and the metric named by ``callbacks.model_checkpoint.monitor``
   (``val/acc1`` for classification; a segmentation module sets e.g. ``monitor: val/miou`` in its experiment).
4. Checkpoints go to ``${paths.output_dir}/checkpoints`` (``best.ckpt``, ``last.ckpt``); a rerun in the same
   ``paths.output_dir`` resumes from ``last.ckpt`` (``resume: true``), ``ckpt_path=...`` resumes from any file.
5. Export (``export.enabled``) applies to models whose checkpoint holds a timm model under ``model.`` and the
   data's preprocessing (:class:`~linvit.train.data.datamodules.ClassificationDataModule`); set
   ``export.enabled=false`` for other tasks.

Nothing here needs Hydra except :mod:`linvit.train.runs.run` and :mod:`linvit.train.runs.hydra_app`; a saved run's
objects are built again without it (:mod:`linvit.train.runs.saved_run`).
"""

from linvit._lazy import lazy_exports

# name -> the module defining it; imported on first use (PEP 562), so that the Hydra entry
# (linvit.train.runs.hydra_app) answers `linvit train --help` without importing torch and Lightning
_EXPORTS = {
    "CIFARDataModule": "data.datamodules",
    "ClassificationDataModule": "data.datamodules",
    "DigitsDataModule": "data.datamodules",
    "FashionMNISTDataModule": "data.datamodules",
    "ImageFolderDataModule": "data.datamodules",
    "SegmentationDataModule": "data.segmentation",
    "ImageClassifier": "modules.classification",
    "SegmentationModule": "modules.segmentation",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("linvit.train", _EXPORTS)
