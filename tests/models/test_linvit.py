"""The linvit family: sizes, any resolution, custom attention layouts, input errors and the timm API details.

timm's own checks (forward, backward, cfgs, TorchScript, FX, features, intermediates, pruning) run on every linvit
model in tests/test_timm_suite.py; this file covers what those do not.
"""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

import linvit.models  # noqa: F401
from linvit.utils import count_macs, count_params

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")

NAMES = ("linvit_nano", "linvit_tiny", "linvit_small", "linvit_base")


def _nano(**kwargs):
    torch.manual_seed(0)
    return timm.create_model("linvit_nano", **kwargs)


def test_all_variants_registered_with_cfgs():
    assert set(timm.list_models("linvit_*")) == set(NAMES)
    for name in NAMES:
        cfg = timm.get_pretrained_cfg(name)
        assert cfg.license == "apache-2.0"
        assert "2308.00442" in cfg.paper_ids
        assert not (cfg.url or cfg.hf_hub_id or cfg.file), "no linvit weights are published yet"


def test_tiny_matches_the_swin_t_budget():
    model = timm.create_model("linvit_tiny", device="meta")
    assert 25e6 <= count_params(model) <= 31e6
    model = timm.create_model("linvit_tiny")
    assert 3.8e9 <= count_macs(model, (3, 224, 224)) <= 5.0e9


def test_sizes_grow_through_the_family():
    params = [count_params(timm.create_model(n, device="meta")) for n in NAMES]
    assert params == sorted(params)
    assert params[0] <= 5e6, "linvit_nano should stay a few M parameters"


def test_nano_macs_at_small_input():
    model = _nano(in_chans=1, num_classes=10)
    assert count_macs(model, (1, 32, 32)) < 50e6


@pytest.mark.parametrize("size", [(333, 517), (32, 32), (31, 17), (64, 96)])
def test_any_input_size(size):
    model = _nano().eval()
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        logits = model(x)
        maps = model.forward_intermediates(x, intermediates_only=True)
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()
    for i, feature in enumerate(maps):
        stride = 4 * 2**i
        expected = [math.ceil(size[0] / stride), math.ceil(size[1] / stride)]
        assert list(feature.shape[-2:]) == expected, f"stage {i}: {feature.shape} for input {size}"


def test_tiny_resolution_reaches_one_by_one():
    """32x32 input: stride-32 output is 1x1 and the whole network still trains (digits use this)."""
    model = _nano(in_chans=1, num_classes=10)
    x = torch.randn(4, 1, 32, 32)
    maps = model.forward_intermediates(x, intermediates_only=True)
    assert [tuple(m.shape[-2:]) for m in maps] == [(8, 8), (4, 4), (2, 2), (1, 1)]
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_nano_learns_a_small_batch():
    """From scratch, greyscale 32x32: the loss on a fixed batch falls well below chance within a few steps."""
    model = _nano(in_chans=1, num_classes=4)
    x = torch.randn(16, 1, 32, 32)
    y = torch.arange(16) % 4
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    first = None
    for _ in range(30):
        loss = F.cross_entropy(model(x), y)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.3 * first


def test_features_only_nchw_strides():
    model = timm.create_model("linvit_nano", features_only=True).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    assert model.feature_info.channels() == [32, 64, 128, 256]
    with torch.no_grad():
        maps = model(torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(1, 32, 16, 24), (1, 64, 8, 12), (1, 128, 4, 6), (1, 256, 2, 3)]


def test_a_stride_two_stem_halves_every_stage_stride_with_the_same_weights():
    """stem_stride=2 (the small-image stem): strides 2/4/8/16, same parameters, so the recorded stride matters."""
    model = _nano(in_chans=1, num_classes=10, stem_stride=2).eval()
    assert [info["reduction"] for info in model.feature_info] == [2, 4, 8, 16]
    x = torch.randn(2, 1, 32, 28)
    with torch.no_grad():
        maps = model.forward_intermediates(x, intermediates_only=True)
        assert [tuple(m.shape[-2:]) for m in maps] == [(16, 14), (8, 7), (4, 4), (2, 2)]
        wide = _nano(in_chans=1, num_classes=10).eval()
        assert model.state_dict().keys() == wide.state_dict().keys()
        wide.load_state_dict(model.state_dict())
        assert not torch.allclose(wide(x), model(x))  # same weights, another network
    features = timm.create_model("linvit_nano", features_only=True, stem_stride=2)
    assert features.feature_info.reduction() == [2, 4, 8, 16]


def test_features_only_out_indices():
    model = timm.create_model("linvit_nano", features_only=True, out_indices=(1, 3)).eval()
    assert model.feature_info.reduction() == [8, 32]
    with torch.no_grad():
        maps = model(torch.randn(1, 3, 64, 64))
    assert [m.shape[1] for m in maps] == [64, 256]


def test_custom_attention_layout():
    layout = ("focused", "focused", "hybrid", "softmax")
    model = _nano(attn_layers=layout).eval()
    assert model.attn_layers == layout
    kinds = [type(stage.blocks[0].attn).__name__ for stage in model.stages]
    assert kinds == ["FocusedLinearAttention", "FocusedLinearAttention", "HybridAttention", "GlobalAttention"]
    with torch.no_grad():
        assert model(torch.randn(1, 3, 70, 50)).shape == (1, 1000)


def test_single_attention_name_for_every_stage():
    model = _nano(attn_layers="linear")
    assert model.attn_layers == ("linear",) * 4


def test_window_stages_alternate_shifted_windows():
    model = _nano(depths=(1, 1, 3, 2))
    shifts = [block.attn.shift_size for block in model.stages[2].blocks]
    assert shifts == [(0, 0), (4, 4), (0, 0)]


def test_attention_layout_length_is_checked():
    with pytest.raises(ValueError, match="one entry per stage"):
        _nano(attn_layers=("focused", "window"))


def test_unknown_keyword_raises_type_error():
    with pytest.raises(TypeError):
        timm.create_model("linvit_nano", not_an_argument=1)


def test_no_parameter_depends_on_the_input_size():
    a = timm.create_model("linvit_nano", img_size=224, device="meta").state_dict()
    b = timm.create_model("linvit_nano", img_size=1024, device="meta").state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert not any("positional_encoding" in k for k in a)


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        (torch.randn(3, 32, 32), ValueError, "4-D"),
        (torch.randn(1, 1, 32, 32), ValueError, "in_chans=1"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), TypeError, "float"),
    ],
)
def test_bad_input_is_explained(bad, error, words):
    model = _nano().eval()
    with pytest.raises(error, match=words):
        model(bad)
    with pytest.raises(error, match=words):
        model.forward_intermediates(bad)


def test_grad_checkpointing_keeps_outputs_and_gradients():
    model = _nano(drop_path_rate=0.0).train()
    x = torch.randn(2, 3, 40, 56)
    out = model(x)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    out2 = model(x)
    out2.sum().backward()
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-5, msg=n)


def test_in_chans_one_and_reset_classifier():
    model = _nano(in_chans=1, num_classes=10)
    assert model.stem.conv1.weight.shape[1] == 1
    model.reset_classifier(3)
    assert model.get_classifier().out_features == 3
    assert model.global_pool == "avg"
    model.reset_classifier(0, "")
    with torch.no_grad():
        assert model(torch.randn(1, 1, 64, 64)).shape == (1, 256, 2, 2)


def test_forward_head_pre_logits():
    model = _nano().eval()
    with torch.no_grad():
        features = model.forward_features(torch.randn(1, 3, 64, 64))
        assert features.shape == (1, 256, 2, 2)
        assert model.forward_head(features, pre_logits=True).shape == (1, 256)


def test_group_matcher_and_no_weight_decay():
    from timm.models import group_parameters

    model = _nano()
    fine = group_parameters(model, model.group_matcher(coarse=False))
    coarse = group_parameters(model, model.group_matcher(coarse=True))
    assert len(fine) > len(coarse) > 1
    names = dict(model.named_parameters())
    skipped = model.no_weight_decay()
    assert skipped and all(n in names for n in skipped)
    assert not any(n.endswith(".weight") and names[n].ndim > 1 for n in skipped)


def test_torchscript_matches_eager_on_odd_size():
    model = _nano().eval()
    scripted = torch.jit.script(model)
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x), rtol=1e-4, atol=1e-5)


def test_fx_trace_matches_eager():
    from timm.models import create_feature_extractor  # torchvision's, with timm's (and linvit's) leaf modules

    model = _nano().eval()
    extractor = create_feature_extractor(model, return_nodes={"stages.1": "s1", "head.fc": "logits"})
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        out = extractor(x)
        torch.testing.assert_close(out["logits"], model(x), rtol=1e-4, atol=1e-5)
        assert out["s1"].shape == (1, 64, 8, 10)


def test_bf16_autocast_is_finite():
    model = _nano().eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(1, 3, 64, 64) * 8)
    assert torch.isfinite(out.float()).all()


def test_pruned_model_keeps_running_on_its_last_kept_stage():
    """prune_intermediate_layers without prune_norm: the final norm, sized for the dropped last stage, must go."""
    model = timm.create_model("linvit_nano").eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
        assert model.prune_intermediate_layers([1], prune_norm=False) == [1]
        final, taps = model.forward_intermediates(x, indices=[1])
        torch.testing.assert_close(taps[0], expected)
        assert final.shape == model(x).shape == expected.shape  # the head was pruned too: the map itself
        assert model.num_features == model.head_hidden_size == expected.shape[1]
