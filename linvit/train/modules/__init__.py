"""The LightningModules and the callbacks they train with.

- :mod:`~linvit.train.modules.classification` (``ImageClassifier``), :mod:`~.segmentation`
  (``SegmentationModule``) and :mod:`~.recipe` (the optimizer options and schedule they share);
- callbacks: :mod:`~.callbacks` (per-step reseeding, learning curves, atomic checkpoints, save on SIGTERM),
  :mod:`~.fault_tolerance` (crash-safe checkpoint files, the non-finite loss guard), :mod:`~.logged_metrics`
  (metrics.csv and epoch means that survive a resume).

Imports :mod:`linvit.train.data` (plain hyper-parameters, the workers' SIGTERM switch), never :mod:`linvit.train.runs`.
"""
