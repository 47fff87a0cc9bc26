"""Model arguments are checked at creation, in every family: a ValueError naming the argument and the value as
given, instead of a failure later inside a convolution, a training forward or timm's feature wrapper."""

from __future__ import annotations

import re

import pytest
import torch
from _families import create_shallow, smallest_variant_per_family

BAD_ARGUMENTS = [
    ("features_only_out_indices_out_of_range", {"features_only": True, "out_indices": (-99,)}, "out_indices=(-99,)"),
    ("features_only_last_n_out_of_range", {"features_only": True, "out_indices": 99}, "out_indices=99"),
    ("features_only_empty_out_indices", {"features_only": True, "out_indices": ()}, "out_indices=()"),
    ("in_chans_zero", {"in_chans": 0}, "in_chans=0"),
    ("in_chans_negative", {"in_chans": -3}, "in_chans=-3"),
    ("in_chans_fraction", {"in_chans": 2.5}, "in_chans=2.5"),
    ("num_classes_negative", {"num_classes": -1}, "num_classes=-1"),
    ("drop_path_rate_above_one", {"drop_path_rate": 1.5}, "drop_path_rate=1.5"),
    ("drop_path_rate_negative", {"drop_path_rate": -0.1}, "drop_path_rate=-0.1"),
    ("drop_rate_one", {"drop_rate": 1.0}, "drop_rate=1.0"),
    ("img_size_zero", {"img_size": 0}, "img_size=0"),
]


@pytest.mark.parametrize("kwargs, named", [(k, n) for _, k, n in BAD_ARGUMENTS], ids=[i for i, _, _ in BAD_ARGUMENTS])
@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_every_family_names_a_bad_argument_at_creation(name, kwargs, named):
    with pytest.raises(ValueError, match=re.escape(named)) as error:
        create_shallow(name, **kwargs)
    assert str(error.value).startswith(f"{name}: "), str(error.value)


@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_forward_intermediates_names_indices_out_of_range(name):
    model = create_shallow(name).eval()
    with pytest.raises(ValueError, match=re.escape("indices=[-99]")):
        model.forward_intermediates(torch.randn(1, 3, 64, 64), indices=[-99])


def test_the_frame_checks_a_model_built_from_its_class():
    from linvit.models.linvit import LinViT

    with pytest.raises(ValueError, match=r"LinViT: in_chans=0 is not valid: it must be a positive integer"):
        LinViT(in_chans=0)


@pytest.mark.parametrize("name", smallest_variant_per_family())
def test_good_arguments_still_create(name):
    model = create_shallow(name, features_only=True, out_indices=(-1,), in_chans=1, drop_path_rate=0.5)
    assert len(model(torch.randn(1, 1, 64, 64))) == 1
