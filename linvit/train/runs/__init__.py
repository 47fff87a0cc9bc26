"""Runs: the training entry and what a run leaves behind.

- :mod:`~linvit.train.runs.hydra_app` (``train.py``, ``linvit train``) and :mod:`~.run` (build from the config, fit,
  test, export), the only modules of :mod:`linvit` that import Hydra; :mod:`~.config_types` (the config's types,
  checked first), :mod:`~.model_configs` (one model config per registered model);
- :mod:`~.run_dir` (one process per run directory), :mod:`~.run_identity` (the task's name);
- :mod:`~.saved_run` (a run's objects built again without Hydra, old ``_target_`` names included), :mod:`~.export`
  (checkpoints found, read safely and exported as timm weights).

The top room of :mod:`linvit.train`: it imports :mod:`linvit.train.data` and :mod:`linvit.train.modules`.
"""
