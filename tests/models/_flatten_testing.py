"""Checks every FLatten model family's tests run the same way (models with stages in `stages` and a timm
`ClassifierHead` at `head`); each test file builds its own small model and calls these."""

from __future__ import annotations

import fnmatch

import pytest
import timm
import torch
from torch import nn


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Seeded N(0, 0.3²) parameters: outputs far from a fresh model's, so that a wrong weight mapping shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


def save_authors_checkpoint(path, model: nn.Module, config, max_accuracy: float) -> None:
    """A training checkpoint in the authors' layout: weights under "model" beside the optimizer and scheduler states,
    the accuracy, the epoch and their pickled yacs config (`config`, built from the `fake_yacs` class)."""
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": {"state": {}, "param_groups": [{"lr": 5e-4, "params": [0]}]},
            "lr_scheduler": {"last_epoch": 299},
            "max_accuracy": max_accuracy,
            "epoch": 299,
            "config": config,
        },
        path,
    )


def assert_same_outputs(model: nn.Module, reference: nn.Module, img_size: int, batch: int = 2) -> None:
    """linvit's model and the authors' (same weights) give the same logits in float64 on a seeded batch."""
    x = torch.randn(batch, 3, img_size, img_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference.double()(x)
        actual = model.double()(x)
    assert expected.abs().max() > 0.1  # a meaningful comparison, not two near-zero outputs
    torch.testing.assert_close(actual, expected, atol=1e-9, rtol=1e-9)


def assert_every_parameter_gets_a_gradient(model: nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []


def assert_grad_checkpointing_keeps_outputs(model: nn.Module, x: torch.Tensor) -> None:
    expected = model(x)
    model.set_grad_checkpointing(True)
    torch.testing.assert_close(model(x), expected)


def assert_classifier_api(model: nn.Module, num_features: int, variant: str) -> None:
    """`model` has 7 classes; its head is reset, re-created in float64, and its decay/group patterns all match."""
    assert model.get_classifier().out_features == 7
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, num_features)
    model.to(torch.float64)
    model.reset_classifier(0)
    model.reset_classifier(2)  # the new head follows the model's dtype even though the old one had no parameters
    assert model.get_classifier().weight.dtype == torch.float64
    names = [name for name, _ in model.named_parameters()]
    for pattern in model.no_weight_decay():
        assert any(fnmatch.fnmatch(name, pattern) for name in names), pattern
    assert len(timm.models.group_parameters(model, model.group_matcher())) > 2
    with pytest.raises(TypeError):
        timm.create_model(variant, not_an_argument=1)


def assert_torchscript_matches_eager(model: nn.Module, x: torch.Tensor, *args) -> None:
    scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(x, *args), model(x, *args))


def assert_fx_feature_extraction_matches_eager(model: nn.Module, x: torch.Tensor) -> None:
    """torchvision's FX extractor (with timm's leaf modules) gives stage 1 and the logits as eager does."""
    from timm.models import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor

    tracer_kwargs = {"leaf_modules": list(get_notrace_modules()), "autowrap_functions": list(get_notrace_functions())}
    extractor = create_feature_extractor(
        model, return_nodes={"stages.1": "s1", "head.fc": "logits"}, tracer_kwargs=tracer_kwargs
    )
    with torch.no_grad():
        traced = extractor(x)
        torch.testing.assert_close(traced["logits"], model(x))
        torch.testing.assert_close(
            traced["s1"], model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
        )
