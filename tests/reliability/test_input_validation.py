"""Bad input fails at the model's entry with a clear TypeError/ValueError that names the fix, never deep inside.

``check_image_batch`` (linvit/models/_validation.py) is tested directly, then every model family through its
smallest registered variant (every registered name under ``-m slow``).
"""

import warnings

import pytest
import timm
import torch
from _families import linvit_model_names, smallest_variant_per_family

import linvit  # noqa: F401  (registers the models)
from linvit.io import model_family
from linvit.models._validation import check_image_batch, min_size_pair


# -- the function -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "x, error, pattern",
    [
        (torch.randn(3, 8, 8), ValueError, r"4-D image batch.*got a 3-D tensor of shape \[3, 8, 8\].*unsqueeze\(0\)"),
        (torch.randn(2, 2, 3, 8, 8), ValueError, r"got a 5-D tensor.*flatten\(0, 1\)"),
        (torch.zeros(1, 3, 8, 8, dtype=torch.uint8), TypeError, r"floating-point.*torch\.uint8.*x\.float\(\)"),
        (torch.randn(1, 1, 8, 8), ValueError, r"built for 3 input channels, got 1.*in_chans=1"),
        (torch.randn(1, 8, 8, 3), ValueError, r"channels-last.*permute\(0, 3, 1, 2\)"),
        (torch.randn(1, 3, 4, 16), ValueError, r"at least 8x8 \(H x W\), got 4x16.*resize or pad"),
        (torch.randn(8, 8, 3).numpy(), TypeError, r"expects a torch\.Tensor.*got ndarray"),
    ],
)
def test_check_image_batch_names_what_was_given_expected_and_the_fix(x, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        check_image_batch(x, 3, min_size=(8, 8), model_name="linvit_tiny")
    assert str(info.value).startswith("linvit_tiny ")


@pytest.mark.parametrize(
    "dtype, pattern",
    [
        (torch.float16, r"float32 weights but got a torch\.float16 input.*x\.float\(\).*model\.half\(\).*autocast"),
        (torch.bfloat16, r"float32 weights but got a torch\.bfloat16 input.*x\.float\(\).*model\.bfloat16\(\)"),
        (torch.float64, r"float32 weights but got a torch\.float64 input.*x\.float\(\).*model\.double\(\)"),
    ],
)
def test_an_input_of_another_dtype_than_the_weights_names_both_and_the_fixes(dtype, pattern):
    with pytest.raises(TypeError, match=pattern):
        check_image_batch(torch.randn(1, 3, 8, 8, dtype=dtype), 3, weight_dtype=torch.float32, model_name="m")


def test_autocast_lets_a_low_precision_input_into_a_float_model():
    x = torch.randn(1, 3, 8, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert check_image_batch(x, 3, weight_dtype=torch.float32) is x


def test_check_image_batch_passes_good_input_through():
    x = torch.randn(2, 3, 8, 9, dtype=torch.bfloat16)
    assert check_image_batch(x, 3, min_size=min_size_pair(8)) is x
    assert min_size_pair(None) is None and min_size_pair((4, 6)) == (4, 6)


class _Entry(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return check_image_batch(x, 3, (4, 4), "entry") * 2


def test_check_image_batch_is_torchscript_and_fx_safe():
    x = torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(_Entry())
        traced = torch.jit.trace(_Entry(), x)
    assert torch.equal(scripted(x), x * 2) and torch.equal(traced(x), x * 2)
    with pytest.raises(torch.jit.Error, match="4-D image batch"):
        scripted(x[0])
    graph = torch.fx.symbolic_trace(_Entry())  # plain torch.fx, no timm leaf registry
    assert torch.equal(graph(x), x * 2)
    from timm.models import create_feature_extractor

    extractor = create_feature_extractor(_Entry(), return_nodes={"mul": "out"})
    assert torch.equal(extractor(x)["out"], x * 2)


def test_check_image_batch_exports_and_compiles():
    x = torch.randn(1, 3, 8, 8)
    exported = torch.export.export(_Entry(), (x,))
    assert torch.equal(exported.module()(x), x * 2)
    compiled = torch.compile(_Entry(), backend="eager")
    assert torch.equal(compiled(x), x * 2)
    with pytest.raises(ValueError, match="in_chans=1"):
        compiled(torch.randn(1, 1, 8, 8))


# -- every family -------------------------------------------------------------------------------------------------
# Families whose entry does not check its input yet; strict=False so that adopting the check turns them green.
NOT_CHECKING_YET: dict[str, str] = {}  # every family checks its input now


def _params(names: list[str]) -> list:
    params = []
    for name in names:
        reason = NOT_CHECKING_YET.get(model_family(name) or "")
        marks = [pytest.mark.xfail(strict=False, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


_models: dict[str, torch.nn.Module] = {}


def _model(name: str) -> torch.nn.Module:
    if name not in _models:
        _models.clear()  # one at a time: keep memory small
        _models[name] = timm.create_model(name, pretrained=False, num_classes=5).eval()
    return _models[name]


def _assert_clear_entry_errors(name: str) -> None:
    model = _model(name)
    in_chans = 3
    with pytest.raises(ValueError, match=rf"(?s){in_chans} input channels.*got 1.*in_chans=1"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"(?s)4-D.*\[3, 32, 32\].*unsqueeze\(0\)"):
        model(torch.randn(3, 32, 32))
    with pytest.raises(TypeError, match=r"(?s)float.*uint8"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"(?s)in_chans=1"):
        model.forward_features(torch.randn(1, 1, 32, 32))


def _assert_layout_and_dtype_errors(name: str) -> None:
    model = _model(name)
    with pytest.raises(ValueError, match=r"(?s)channels-last.*x\.permute\(0, 3, 1, 2\)"):
        model(torch.randn(1, 64, 64, 3))
    with pytest.raises(TypeError, match=r"(?s)float32 weights.*float16 input.*x\.float\(\).*model\.half\(\)"):
        model(torch.randn(1, 3, 64, 64, dtype=torch.float16))


def _assert_an_empty_batch_gives_empty_outputs(name: str) -> None:
    model = _model(name)
    empty = torch.randn(0, 3, 224, 224)
    with torch.no_grad():
        assert model(empty).shape == (0, 5)
        full = model.forward_intermediates(torch.randn(1, 3, 224, 224), intermediates_only=True)
        taps = model.forward_intermediates(empty, intermediates_only=True)
    assert [tuple(t.shape) for t in taps] == [(0, *t.shape[1:]) for t in full]


@pytest.mark.parametrize("name", _params(smallest_variant_per_family()))
def test_every_family_rejects_bad_input_at_its_entry(name):
    _assert_clear_entry_errors(name)


@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_every_family_names_channels_last_and_dtype_mismatches(name):
    _assert_layout_and_dtype_errors(name)


@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_every_family_takes_an_empty_batch(name):
    _assert_an_empty_batch_gives_empty_outputs(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(linvit_model_names()))
def test_every_registered_model_rejects_bad_input_at_its_entry(name):
    _assert_clear_entry_errors(name)
    _assert_layout_and_dtype_errors(name)
    _assert_an_empty_batch_gives_empty_outputs(name)
