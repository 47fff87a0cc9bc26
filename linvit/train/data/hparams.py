"""Keep Lightning hyper-parameters plain Python, so checkpoints load with ``torch.load(weights_only=True)``."""

from __future__ import annotations

from typing import Any


def plain(value: Any) -> Any:
    """``value`` with omegaconf containers (Hydra passes ListConfig/DictConfig) turned into lists and dicts."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


def make_hparams_plain(module: Any) -> None:
    """Call right after ``self.save_hyperparameters()``: rewrites ``module.hparams`` in place."""
    for key, value in list(module.hparams.items()):
        module.hparams[key] = plain(value)
