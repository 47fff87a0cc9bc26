"""Nyströmformer and Linformer as stage attentions: by name in every family that takes any attention, per stage in
`linvit_*` models (also through Hydra), as the hybrid's global branch, and under bf16/fp16 autocast in a model."""

from __future__ import annotations

import pytest
import timm
import torch
from hydra.utils import instantiate
from train_helpers import compose

import linvit.models  # noqa: F401  (registers the models)
from linvit.attention import HybridAttention, LinformerAttention, NystromAttention

LEARNED = {"name": "linformer", "projection": "learned", "projected_size": 2}
HYBRID_NYSTROM = {"name": "hybrid", "global_branch": "nystrom", "global_options": {"landmark_grid": 2}}


def _nano(**kwargs):
    torch.manual_seed(0)
    return timm.create_model("linvit_nano", depths=(1, 1, 2, 1), **kwargs).eval()


def test_linvit_stages_take_them_by_name_and_by_spec():
    model = _nano(attn_layers=("nystrom", "linformer", LEARNED, HYBRID_NYSTROM), img_size=64)
    assert model.attn_layers == ("nystrom", "linformer", "linformer", "hybrid")
    first = [stage.blocks[0].attn for stage in model.stages]
    assert [type(attn) for attn in first] == [NystromAttention, LinformerAttention, LinformerAttention, HybridAttention]
    assert first[1].projection == "pool" and first[1].key_projection is None
    assert first[2].pos_size == (4, 4) and first[2].key_projection.shape == (4, 16)  # stride 16 at 64×64
    assert isinstance(first[3].global_attn, NystromAttention)
    with torch.no_grad():
        for size in ((64, 64), (70, 50)):  # the learned projections resized to the other grid
            out = model(torch.randn(1, 3, *size))
            assert out.shape == (1, 1000) and torch.isfinite(out).all()


def test_hydra_per_stage_choice():
    overrides = [
        "model=linvit_nano",
        "model.attn_layers=[nystrom,{name:linformer,projection:learned},"
        "{name:hybrid,global_branch:linformer,global_options:{projected_size:3}},window]",
    ]
    classifier = instantiate(compose(overrides).model, _convert_="all")
    attentions = [stage.blocks[0].attn for stage in classifier.model.stage_modules()]
    assert isinstance(attentions[0], NystromAttention)
    assert isinstance(attentions[1], LinformerAttention) and attentions[1].projection == "learned"
    assert attentions[2].global_attn.projected_size == (3, 3)
    assert classifier.hparams["model_kwargs"]["attn_layers"][1] == {"name": "linformer", "projection": "learned"}


FAMILIES = {
    "flatten_swin_tiny_patch4_224": {"embed_dim": 16, "depths": (1, 1, 2, 1), "num_heads": (1, 2, 2, 4)},
    "flatten_pvt_tiny": {"embed_dims": (16, 32, 40, 64), "depths": (1, 1, 1, 1)},
    "flatten_pvt_v2_b0": {"embed_dims": (16, 32, 40, 64), "depths": (1, 1, 1, 1)},
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_that_takes_any_attention_takes_them(name):
    torch.manual_seed(0)
    layers = ("focused", "nystrom", LEARNED, "linformer")
    model = timm.create_model(name, **FAMILIES[name], img_size=64, attn_layers=layers).eval()
    assert model.attn_layers == ("focused", "nystrom", "linformer", "linformer")
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 50, 70))).all()


def test_families_that_cannot_build_them_say_so():
    with pytest.raises(ValueError, match="FlattenDeiT cannot build 'nystrom'"):
        timm.create_model("flatten_deit_tiny_patch16_224", depth=1, attn_layers="nystrom")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_model_with_them_runs_forward_and_backward_under_autocast(dtype):
    """As tests/reliability/test_numerics.py for the default layouts: finite, and close to float32 (features within
    5% / 1%, gradient cosine above 0.95 / 0.99 for bf16 / fp16), with images scaled up to std 16."""
    layers = ("nystrom", LEARNED, HYBRID_NYSTROM, {"name": "linformer", "projected_size": 2})
    model = _nano(attn_layers=layers, num_classes=0, img_size=64)  # maps 16², 8², 4², 2²
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    for scale in (1.0, 16.0):
        results = []
        for precision in (None, dtype):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=precision or torch.float32, enabled=precision is not None):
                features = model.forward_features(x * scale)
            features.float().pow(2).mean().backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            assert torch.isfinite(features).all() and torch.isfinite(grads).all(), (precision, scale)
            results.append((features.detach().float(), grads))
        (reference, reference_grads), (features, grads) = results
        error = ((features - reference).norm() / reference.norm()).item()
        cosine = torch.nn.functional.cosine_similarity(grads, reference_grads, dim=0).item()
        assert error < (0.05 if dtype == torch.bfloat16 else 0.01), f"x{scale}: features off by {error:.3g}"
        assert cosine > (0.95 if dtype == torch.bfloat16 else 0.99), f"x{scale}: gradient cosine {cosine:.4f}"
