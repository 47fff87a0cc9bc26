"""The hyper-parameters a training checkpoint carries, checked before a LightningModule is built from them: only the
module's own constructor arguments, nothing callable, and model arguments a file may set (see
:mod:`linvit.utils.saved_config` and :mod:`linvit.io.allowed_config`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from linvit.io.allowed_config import constructor_arguments
from linvit.utils.saved_config import check_model_arguments, check_targets, refusal

__all__ = ["check_classifier_hparams", "check_segmenter_hparams"]


def _check_hparam_keys(hparams: Mapping[str, Any], module_cls: type, source: str | Path, opt_in: str) -> None:
    """Only the LightningModule's own constructor arguments (what ``save_hyperparameters`` records)."""
    allowed = constructor_arguments(module_cls, exclude=frozenset())  # its `pretrained`: the caller sets it False
    for key in hparams:
        if key not in allowed:
            raise refusal(source, f"hyper_parameters.{key} (not an argument of {module_cls.__name__})", opt_in)


def check_classifier_hparams(hparams: Mapping[str, Any], source: str | Path, opt_in: str = "--trusted") -> None:
    """Check an ``ImageClassifier`` checkpoint's hyper-parameters: no callables, only the classifier's own
    arguments, a registered model created with plain creation arguments that load nothing. (The classifier's
    ``pretrained`` flag is the caller's to override: the weights come from the file.)"""
    from linvit.train.modules.classification import ImageClassifier

    check_targets(hparams, source, opt_in, prefix="hyper_parameters", allowed=frozenset())
    _check_hparam_keys(hparams, ImageClassifier, source, opt_in)
    check_model_arguments(
        str(hparams.get("model_name")), hparams.get("model_kwargs"), source, opt_in, "hyper_parameters.model_kwargs"
    )


def check_segmenter_hparams(hparams: Mapping[str, Any], source: str | Path, opt_in: str = "--trusted") -> None:
    """Check a ``SegmentationModule`` checkpoint's hyper-parameters as :func:`check_classifier_hparams` does."""
    from linvit.train.modules.segmentation import SegmentationModule

    check_targets(hparams, source, opt_in, prefix="hyper_parameters", allowed=frozenset())
    _check_hparam_keys(hparams, SegmentationModule, source, opt_in)
    check_model_arguments(
        str(hparams.get("backbone")), hparams.get("backbone_kwargs"), source, opt_in, "hyper_parameters.backbone_kwargs"
    )
