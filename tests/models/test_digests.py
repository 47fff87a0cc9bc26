"""Checkpoint keys, their order and shapes, and the seeded initial weights of every family, guarded by digests.

A refactoring of the model code must not change what a model *is*: the state-dict keys (and their order, which
conversion scripts and `strict` loading reports follow), the shapes, and the weights that `torch.manual_seed(0)`
gives (the order in which modules draw from the generator). Each case below is hashed and compared with the digest
recorded before the shared backbone frame (issue 13) replaced the per-family plumbing.

Keys and shapes are checked for every registered model at full size on the meta device (no memory, no time); seeded
weights on small variants of each family (the same code paths, with every attention kind and stage layout).

The weight digests depend on PyTorch's CPU generator and initialisers, which a PyTorch upgrade may change: if only
the weight digests fail after an upgrade, re-record them at the same commit with the old and the new PyTorch (run
this file as a script: ``python tests/models/test_digests.py``) and check that the old one still matches.
"""

from __future__ import annotations

import hashlib

import pytest
import timm
import torch

import linvit.models  # noqa: F401  (registers the families)

# Small variants: the same layouts as the registered models, a fraction of the size.
SEEDED_CASES: dict[str, tuple[str, dict]] = {
    "linvit_nano": ("linvit_nano", {}),
    "linvit_nano_mixed": ("linvit_nano", {"attn_layers": ("linear", "hybrid", "softmax", "window")}),
    "linvit_nano_kernels": ("linvit_nano", {"attn_layers": ("favor", "elu", "taylor", "focused")}),
    "flatten_swin": (
        "flatten_swin_tiny_patch4_224",
        {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 2, 4), "num_classes": 10},
    ),
    "flatten_swin_mixed": (
        "flatten_swin_tiny_patch4_224",
        {
            "img_size": 96,
            "embed_dim": 16,
            "depths": (1, 2, 2, 1),
            "num_heads": (1, 2, 2, 2),
            "attn_layers": ("window", "focused", "window", "focused"),
        },
    ),
    "flatten_deit": ("flatten_deit_tiny_patch16_224", {"depth": 2, "num_classes": 10}),
    "flatten_deit_abs_pos": ("flatten_deit_tiny_patch16_224", {"depth": 2, "abs_pos_embed": True, "img_size": 96}),
    "flatten_pvt": (
        "flatten_pvt_tiny",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 1, 2, 1), "num_classes": 10},
    ),
    "flatten_pvt_v2": (
        "flatten_pvt_v2_b0",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 2, 1, 1), "num_classes": 10},
    ),
    "flatten_cswin": (
        "flatten_cswin_tiny_224",
        {"img_size": 64, "embed_dim": 16, "depths": (1, 2, 2, 1), "num_heads": (2, 2, 4, 4), "num_classes": 10},
    ),
    # options of issue 14: reduced keys (PVT), pooled keys (PVTv2-Li), stripe linear attention (CSwin)
    "flatten_pvt_reduced": (
        "flatten_pvt_tiny",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 1, 2, 1), "la_sr_ratios": "8421"},
    ),
    "flatten_pvt_v2_linear": (
        "flatten_pvt_v2_b0",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 2, 1, 1), "linear": True},
    ),
    "flatten_cswin_striped": (
        "flatten_cswin_tiny_224",
        {
            "img_size": 64,
            "embed_dim": 16,
            "depths": (1, 2, 2, 1),
            "num_heads": (2, 2, 4, 4),
            "la_split_size": "8-4-2-1",
        },
    ),
}

# Recorded at commit 44bfde3 (before the shared frame), torch 2.14.1 on the CPU: (keys and shapes, seeded weights).
SEEDED_DIGESTS: dict[str, tuple[str, str]] = {
    "flatten_cswin": ("42d467311bc73d63", "7c21499a3dd906ee"),
    "flatten_deit": ("563058ecb367a0ba", "7f2d3057dfc11865"),
    "flatten_deit_abs_pos": ("eac06e6bd7cca980", "f0a6853a19354141"),
    "flatten_pvt": ("3718fa98de7ac000", "d3ee790eda5874bd"),
    "flatten_pvt_v2": ("997f8c566506094c", "d0579d935fbc5c97"),
    "flatten_swin": ("24756c72c120c3f8", "b25a766a87760754"),
    "flatten_swin_mixed": ("d6de53a2edf71f35", "dd9982ce0f27455b"),
    "linvit_nano": ("f8ec941743ebf3f2", "96daa42fb34a01f0"),
    "linvit_nano_kernels": ("fbb5e99439195298", "c6b896817d3b8f3f"),
    "linvit_nano_mixed": ("93a4215f3fc1a9a2", "e7963f7ebed7bb52"),
    # recorded when issue 14 added the options (torch 2.14.1, CPU)
    "flatten_cswin_striped": ("4d6643d22dc9d949", "5912099c3b010446"),
    "flatten_pvt_reduced": ("babc3e4591940cbc", "a0af29a297290b03"),
    "flatten_pvt_v2_linear": ("52ebad66ada9870b", "4a155c7fdad7c8b0"),
}

# Recorded at commit 44bfde3: keys, order and shapes of every registered model at its full size.
REGISTERED_DIGESTS: dict[str, str] = {
    "flatten_cswin_base_224": "b1fbaa463be75786",
    "flatten_cswin_base_384": "b61b3c7040761485",
    "flatten_cswin_small_224": "b102e3d6ebe46836",
    "flatten_cswin_tiny_224": "8bc82fbff3251afb",
    "flatten_deit_small_patch16_224": "ccc1ba28a07e036c",
    "flatten_deit_tiny_patch16_224": "bacc67b50a76cbb1",
    "flatten_pvt_large": "995ae45c6261921c",
    "flatten_pvt_medium": "b693a0dffb3df83a",
    "flatten_pvt_small": "a62ee546fe9b1433",
    "flatten_pvt_tiny": "b2b017509bbe6849",
    "flatten_pvt_v2_b0": "756e340c957cd69e",
    "flatten_pvt_v2_b1": "8a691331dfa5e4c0",
    "flatten_pvt_v2_b2": "9afdf802aa2d321d",
    "flatten_pvt_v2_b3": "209f68947160402b",
    "flatten_pvt_v2_b4": "30f602ee53260a1f",
    "flatten_pvt_v2_b5": "c6bdddaca2185b84",  # issue 14
    "flatten_swin_base_patch4_224": "a6423dd595de44b9",
    "flatten_swin_base_patch4_384": "892e549a30fe6315",
    "flatten_swin_small_patch4_224": "3538d79a09eec253",
    "flatten_swin_tiny_patch4_224": "148c1aaf79ace29b",
    "linvit_base": "e6256864bf9b8318",
    "linvit_nano": "f8ec941743ebf3f2",
    "linvit_small": "a61073706cfee0f8",
    "linvit_tiny": "85cb0b6ef304fecc",
}


def keys_digest(model: torch.nn.Module) -> str:
    """sha256 of the state dict's keys in order, with each tensor's shape and dtype."""
    lines = [f"{key}:{tuple(value.shape)}:{value.dtype}" for key, value in model.state_dict().items()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every state-dict tensor's bytes, in key order."""
    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def seeded_model(case: str) -> torch.nn.Module:
    name, kwargs = SEEDED_CASES[case]
    torch.manual_seed(0)
    return timm.create_model(name, **kwargs)


def registered_model(name: str) -> torch.nn.Module:
    return timm.create_model(name, device="meta")


@pytest.mark.parametrize("case", sorted(SEEDED_CASES))
def test_seeded_weights_and_keys_unchanged(case):
    model = seeded_model(case)
    expected_keys, expected_weights = SEEDED_DIGESTS[case]
    assert keys_digest(model) == expected_keys, f"{case}: the state-dict keys, their order or shapes changed"
    assert weights_digest(model) == expected_weights, f"{case}: the seeded initial weights changed"


@pytest.mark.parametrize("name", sorted(timm.list_models(["linvit_*", "flatten_*"])))
def test_registered_keys_unchanged(name):
    assert name in REGISTERED_DIGESTS, f"{name} is a new model: record its digest (python {__file__})"
    assert keys_digest(registered_model(name)) == REGISTERED_DIGESTS[name], f"{name}: keys, order or shapes changed"


if __name__ == "__main__":  # prints the tables above for the current code
    print("SEEDED_DIGESTS = {")
    for case in sorted(SEEDED_CASES):
        model = seeded_model(case)
        print(f"    {case!r}: ({keys_digest(model)!r}, {weights_digest(model)!r}),")
    print("}")
    print("REGISTERED_DIGESTS = {")
    for name in sorted(timm.list_models(["linvit_*", "flatten_*"])):
        print(f"    {name!r}: {keys_digest(registered_model(name))!r},")
    print("}")
