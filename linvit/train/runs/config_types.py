"""One typed check of the whole composed training config, before anything is built or started.

A value of the wrong type given on the command line (``trainer.max_epochs=ten``, ``model.optimizer.lr=abc``) or in a
config file otherwise travels into Lightning, timm or torch and fails there, deep inside, with a message that names
no key (``'>' not supported between 'int' and 'str'``), or only once training has begun. :data:`CONFIG_TYPES` says
which type each number and switch of ``train.yaml`` and its groups wants; :func:`check_config_types` checks every one
of them that the config holds at once and raises :class:`ConfigTypeError` naming the key, the value and the type
wanted. (Ranges and data options are their owners' to check: the DataModules name ``data.batch_size=1.5``.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CONFIG_TYPES", "ConfigTypeError", "Wanted", "check_config_types"]


class ConfigTypeError(ValueError):
    """A config value has the wrong type (the message names the key, the value and the type wanted)."""


@dataclass(frozen=True)
class Wanted:
    """A type a config value must have: its name in messages and the test of a value."""

    name: str
    accepts: Callable[[Any], bool]

    def or_null(self) -> Wanted:
        return Wanted(f"{self.name} or null", lambda value: value is None or self.accepts(value))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


INTEGER = Wanted("an integer", _is_int)
NUMBER = Wanted("a number", _is_number)
SWITCH = Wanted("true or false", lambda value: isinstance(value, bool))
INTEGER_OR_FRACTION = Wanted("an integer (batches) or a number in [0, 1] (a fraction)", _is_number)

_DROP_RATES = ("drop_rate", "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "pos_drop_rate")
_MODEL_KWARGS = ("model.model_kwargs", "model.backbone_kwargs")

CONFIG_TYPES: dict[str, Wanted] = {
    # the run
    "seed": INTEGER.or_null(),
    "train": SWITCH,
    "test": SWITCH,
    "resume": SWITCH,
    "trust_checkpoint": SWITCH,
    "export.enabled": SWITCH,
    "export.ema": SWITCH,
    # Lightning's Trainer
    "trainer.max_epochs": INTEGER.or_null(),
    "trainer.min_epochs": INTEGER.or_null(),
    "trainer.max_steps": INTEGER,
    "trainer.min_steps": INTEGER.or_null(),
    "trainer.num_nodes": INTEGER,
    "trainer.accumulate_grad_batches": INTEGER,
    "trainer.check_val_every_n_epoch": INTEGER.or_null(),
    "trainer.log_every_n_steps": INTEGER.or_null(),
    "trainer.num_sanity_val_steps": INTEGER.or_null(),
    "trainer.gradient_clip_val": NUMBER.or_null(),
    "trainer.val_check_interval": INTEGER_OR_FRACTION.or_null(),
    "trainer.limit_train_batches": INTEGER_OR_FRACTION.or_null(),
    "trainer.limit_val_batches": INTEGER_OR_FRACTION.or_null(),
    "trainer.limit_test_batches": INTEGER_OR_FRACTION.or_null(),
    "trainer.enable_progress_bar": SWITCH.or_null(),
    "trainer.enable_model_summary": SWITCH.or_null(),
    "trainer.enable_checkpointing": SWITCH.or_null(),
    "trainer.sync_batchnorm": SWITCH,
    # the models (ImageClassifier, SegmentationModule)
    "model.num_classes": INTEGER,
    "model.in_chans": INTEGER,
    "model.pretrained": SWITCH,
    "model.channels": INTEGER,
    "model.ignore_index": INTEGER,
    "model.label_smoothing": NUMBER,
    "model.optimizer.lr": NUMBER,
    "model.optimizer.lr_base_size": INTEGER.or_null(),
    "model.optimizer.weight_decay": NUMBER,
    "model.optimizer.layer_decay": NUMBER.or_null(),
    "model.optimizer.momentum": NUMBER.or_null(),
    "model.optimizer.backbone_lr_mult": NUMBER,
    "model.scheduler.warmup_epochs": NUMBER,
    "model.scheduler.warmup_lr": NUMBER,
    "model.scheduler.min_lr": NUMBER,
    "model.scheduler.warmup_fraction": NUMBER,
    "model.scheduler.min_lr_ratio": NUMBER,
    "model.mixup.mixup_alpha": NUMBER,
    "model.mixup.cutmix_alpha": NUMBER,
    "model.mixup.prob": NUMBER,
    "model.mixup.switch_prob": NUMBER,
    "model.ema.enabled": SWITCH,
    "model.ema.decay": NUMBER,
    "model.ema.warmup": SWITCH,
    "model.ema.evaluate": SWITCH,
    **{f"{kwargs}.{rate}": NUMBER for kwargs in _MODEL_KWARGS for rate in _DROP_RATES},
    **{f"{kwargs}.in_chans": INTEGER for kwargs in _MODEL_KWARGS},
    **{f"{kwargs}.num_classes": INTEGER for kwargs in _MODEL_KWARGS},
}
"""Dotted config key -> the type its value must have (keys a config does not hold are not checked)."""


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    return f"{value!r} ({type(value).__name__})"


def check_config_types(cfg: Any, types: dict[str, Wanted] | None = None) -> None:
    """Raise :class:`ConfigTypeError` for the values of ``cfg`` (a composed OmegaConf config) whose type is not the
    one :data:`CONFIG_TYPES` (or ``types``) wants, naming each key, its value and the type wanted (one line)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    wrong = []
    for key, wanted in (CONFIG_TYPES if types is None else types).items():
        try:
            value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
        except OmegaConfBaseException:  # an interpolation that does not resolve: the config's own error says more
            continue
        if value is _ABSENT or OmegaConf.is_config(value) or wanted.accepts(value):
            continue
        wrong.append(f"{key}={_describe(value)} must be {wanted.name}")
    if wrong:
        raise ConfigTypeError(
            f"Config value of the wrong type: {'; '.join(wrong)}. Fix the override or the config file that sets it."
        )


_ABSENT = object()
