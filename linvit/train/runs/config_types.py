"""One typed check of the whole composed training config, before anything is built or started.

A value of the wrong type given on the command line (``trainer.max_epochs=ten``, ``model.optimizer.lr=abc``) or in a
config file otherwise travels into Lightning, timm or torch and fails there, deep inside, with a message that names
no key (``'>' not supported between 'int' and 'str'``), or only once training has begun. :data:`CONFIG_TYPES` says
which type each number and switch of ``train.yaml`` and its groups wants; :func:`check_config_types` checks every one
of them that the config holds at once and raises :class:`ConfigTypeError` naming the key, the value and the type
wanted. (Ranges and data options are their owners' to check: the DataModules name ``data.batch_size=1.5``.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_TYPES", "ConfigTypeError", "ConfigValueError", "Wanted", "check_config_types"]


class ConfigTypeError(ValueError):
    """A config value has the wrong type (the message names the key, the value and the type wanted)."""


class ConfigValueError(ValueError):
    """A config value of the right type that the class it builds refused (``drop_path_rate=-1``), or that disagrees
    with another section (``model.num_classes`` against the data's): the class's own message, which names it."""


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
    """A finite int or float: NaN and infinities make no sense as a rate, a size, a count or a statistic."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(low: int, high: int, each: Callable[[Any], bool] = _is_number) -> Callable[[Any], bool]:
    """A list of ``low`` to ``high`` values that each pass ``each``."""
    return lambda value: isinstance(value, list) and low <= len(value) <= high and all(map(each, value))


INTEGER = Wanted("an integer", _is_int)
POSITIVE_INTEGER = Wanted("an integer above 0", lambda value: _is_int(value) and value > 0)
NUMBER = Wanted("a finite number", _is_number)
SWITCH = Wanted("true or false", lambda value: isinstance(value, bool))
INTEGER_OR_FRACTION = Wanted("an integer (batches) or a number in [0, 1] (a fraction)", _is_number)
TEXT = Wanted("a text", lambda value: isinstance(value, str))
CHANNEL_MEANS = Wanted("a list of 1 to 4 finite numbers (one, or one per channel)", _numbers(1, 4))
CHANNEL_STDS = Wanted(
    "a list of 1 to 4 finite numbers above 0 (one, or one per channel)",
    _numbers(1, 4, lambda value: _is_number(value) and value > 0),
)
RANGE = Wanted("a list of two finite numbers", _numbers(2, 2))
IMAGE_SIZE = Wanted(
    "auto, an integer or a list of two integers (height, width)",
    lambda value: value == "auto" or _is_int(value) or _numbers(2, 2, _is_int)(value),
)
WORKERS = Wanted("auto or an integer", lambda value: value == "auto" or _is_int(value))
AUTO_OR_INTEGER = WORKERS
AUTO_OR_SWITCH = Wanted("auto, true or false", lambda value: value == "auto" or isinstance(value, bool))
AUTO_OR_NUMBER = Wanted("auto or a finite number", lambda value: value == "auto" or _is_number(value))
AUTO_OR_RANGE = Wanted("auto or a list of two finite numbers", lambda value: value == "auto" or RANGE.accepts(value))
# Lightning's precision names (lightning.fabric.connector._PRECISION_INPUT), as text or as the numbers it also takes
_PRECISIONS = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
               "32-true", "64-true", "64", "32", "16", "bf16")  # fmt: skip
PRECISION = Wanted(
    "one of " + ", ".join(_PRECISIONS[2:8]) + " (or 16, 32, 64)",
    lambda value: (isinstance(value, str) and value in _PRECISIONS) or (_is_int(value) and value in (16, 32, 64)),
)
NUMBER_OR_SWITCH = Wanted("a finite number or true/false", lambda value: isinstance(value, bool) or _is_number(value))

_DROP_RATES = ("drop_rate", "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "pos_drop_rate")
_MODEL_KWARGS = ("model.model_kwargs", "model.backbone_kwargs")

CONFIG_TYPES: dict[str, Wanted] = {
    # the run
    "seed": INTEGER.or_null(),
    "train": SWITCH,
    "auto.target_steps": INTEGER,
    "auto.min_epochs": INTEGER,
    "auto.epochs": INTEGER,
    "auto.lr_batch": POSITIVE_INTEGER.or_null(),
    "auto.small_image_stem": SWITCH,
    "test": SWITCH,
    "resume": SWITCH,
    "trust_checkpoint": SWITCH,
    "export.enabled": SWITCH,
    "export.ema": SWITCH,
    # Lightning's Trainer
    "trainer.max_epochs": AUTO_OR_INTEGER.or_null(),
    "trainer.precision": PRECISION.or_null(),
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
    "model.num_classes": AUTO_OR_INTEGER,  # ${data.num_classes}: a folder's count, chosen before the model is built
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
    "model.scheduler.max_warmup_fraction": NUMBER.or_null(),
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
    # the DataModules (their own checks name ranges: a batch size of 0, a fraction above 1)
    "data.num_classes": AUTO_OR_INTEGER,
    "data.in_chans": INTEGER,
    "data.img_size": IMAGE_SIZE.or_null(),
    "data.batch_size": AUTO_OR_INTEGER,
    "data.eval_batch_size": INTEGER.or_null(),
    "data.num_workers": WORKERS,
    "data.pin_memory": SWITCH,
    "data.persistent_workers": SWITCH,
    "data.drop_last": AUTO_OR_SWITCH,
    "data.download": SWITCH,
    "data.augment": SWITCH,
    "data.check": SWITCH,
    "data.seed": INTEGER.or_null(),
    "data.split_seed": INTEGER,
    "data.val_size": INTEGER,
    "data.val_fraction": NUMBER,
    "data.test_fraction": NUMBER,
    "data.re_prob": AUTO_OR_NUMBER,
    "data.color_jitter": NUMBER.or_null(),
    "data.hflip": NUMBER_OR_SWITCH,
    "data.crop_pct": AUTO_OR_NUMBER.or_null(),
    "data.scale": AUTO_OR_RANGE,
    "data.scale_range": RANGE,
    "data.mean": CHANNEL_MEANS,
    "data.std": CHANNEL_STDS,
    "data.root": TEXT.or_null(),
    "data.data_dir": TEXT.or_null(),
}
"""Dotted config key -> the type its value must have (keys a config does not hold are not checked)."""


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    return f"{value!r} ({type(value).__name__})"


def _select_plain(config: Mapping[str, Any], key: str) -> Any:
    """``config[a][b]`` for ``key="a.b"`` in plain containers (no interpolation is resolved), else _ABSENT."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _select(cfg: Any, key: str) -> Any:
    """The value at ``key`` as plain data (lists as lists), _ABSENT when the config does not hold it (or holds an
    interpolation that does not resolve: the config's own error says more)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not OmegaConf.is_config(cfg):
        return _select_plain(cfg, key)
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException:
        return _ABSENT


def check_config_types(cfg: Any, types: dict[str, Wanted] | None = None, source: str | Path | None = None) -> None:
    """Raise :class:`ConfigTypeError` for the values of ``cfg`` (a composed OmegaConf config, or the plain dict of a
    saved run's ``config.yaml`` read from ``source``) whose type is not the one :data:`CONFIG_TYPES` (or ``types``)
    wants, naming each key, its value and the type wanted (one line). A list where a number is wanted, a number
    where a list is wanted and NaN/Inf where a number is wanted are all of the wrong type. A mapping is wrong
    wherever a value is wanted."""
    wrong = []
    for key, wanted in (CONFIG_TYPES if types is None else types).items():
        value = _select(cfg, key)
        if value is _ABSENT or wanted.accepts(value):
            continue
        wrong.append(f"{key}={_describe(value)} must be {wanted.name}")
    if wrong:
        where = f" in '{source}'" if source is not None else ""
        fix = "Fix that file." if source is not None else "Fix the override or the config file that sets it."
        raise ConfigTypeError(f"Config value of the wrong type{where}: {'; '.join(wrong)}. {fix}")


_ABSENT = object()
