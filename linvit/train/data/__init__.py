"""The data side of training: Lightning DataModules and what they stand on.

- DataModules: :mod:`~linvit.train.data.datamodule_base` (the classification base), :mod:`~.datamodules` (digits,
  Fashion-MNIST, and the public names of them all), :mod:`~.timm_datamodules` (image folders and CIFAR through
  timm's transforms), :mod:`~.segmentation` (image/mask folders);
- datasets and sampling: :mod:`~.datasets` (arrays, seeded samples, stratified splits);
- image folders: :mod:`~.folder_scan` (layout and links), :mod:`~.image_folder` (tolerant reading),
  :mod:`~.check` (``linvit check-data``), :mod:`~.auto_size` (``img_size=auto``);
- :mod:`~.augment` (named, guarded transform steps), :mod:`~.options` (checked option values, worker counts),
  :mod:`~.worker_signals` (data workers that live through a SIGTERM), :mod:`~.hparams` (plain hyper-parameters).

The lowest room of :mod:`linvit.train`: it imports neither :mod:`linvit.train.modules` nor :mod:`linvit.train.runs`.
"""
