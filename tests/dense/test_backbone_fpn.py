"""FeatureBackbone (NCHW, channels, strides, padding, checkpoints) and the FPN neck."""

import pytest
import torch

from linvit.dense import FPN, FeatureBackbone, create_feature_backbone


@pytest.mark.parametrize("name", ["test_convnext", "test_resnet"])
def test_backbone_reports_channels_and_strides(name):
    backbone = create_feature_backbone(name)
    features = backbone(torch.randn(2, 3, 64, 96))
    assert [f.shape[1] for f in features] == backbone.channels
    for feature, stride in zip(features, backbone.strides):
        assert feature.shape[0] == 2 and feature.dim() == 4
        assert feature.shape[-2:] == (64 // stride, 96 // stride)


def test_nhwc_backbone_comes_back_nchw():
    # timm's Swin returns NHWC from features_only; the wrapper permutes to NCHW
    backbone = create_feature_backbone(
        "swin_tiny_patch4_window7_224",
        img_size=(64, 64),
        embed_dim=24,
        depths=(1, 1, 1, 1),
        num_heads=(1, 1, 1, 1),
        window_size=2,
    )
    assert backbone.channels_last_output
    features = backbone(torch.randn(1, 3, 64, 64))
    assert [f.shape[1] for f in features] == backbone.channels == [24, 48, 96, 192]
    raw = backbone.model(torch.randn(1, 3, 64, 64))
    assert raw[0].shape[-1] == 24  # really NHWC underneath


def test_pad_to_stride_crops_back_and_matches_unpadded_on_multiples():
    backbone = create_feature_backbone("test_convnext", pad_to_stride=True).eval()
    odd = backbone(torch.randn(1, 3, 50, 70))
    assert [tuple(f.shape[-2:]) for f in odd] == [(13, 18), (7, 9), (4, 5), (2, 3)]
    x = torch.randn(1, 3, 64, 64)
    plain = FeatureBackbone(backbone.model).eval()
    for a, b in zip(backbone(x), plain(x)):
        torch.testing.assert_close(a, b)


def test_unknown_model_names_close_matches():
    with pytest.raises(ValueError, match="resnet18"):
        create_feature_backbone("resnet_18")


@pytest.mark.parametrize("name", ["test_convnext", "linvit_nano"])
def test_checkpoint_with_lightning_prefix_loads(tmp_path, name):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = timm.create_model(name, num_classes=5)
    with torch.no_grad():  # non-trivial values everywhere (zero-initialised tables included)
        for parameter in source.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    state = {f"model.{k}": v.clone().contiguous() for k, v in source.state_dict().items()}
    path = tmp_path / "weights.safetensors"
    save_file(state, str(path))
    backbone = create_feature_backbone(name, checkpoint=path).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = source.eval().forward_intermediates(x, intermediates_only=True)
        for a, b in zip(backbone(x), expected):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="not found"):
        create_feature_backbone("test_convnext", checkpoint=tmp_path / "missing.pth")


def _reference_fpn(fpn, features):
    """Straightforward per-level loop, coarse to fine, written independently of FPN.forward."""
    laterals = [conv(f) for conv, f in zip(fpn.lateral_convs, features)]
    out = [None] * len(laterals)
    running = laterals[-1]
    out[-1] = fpn.output_convs[-1](running)
    for i in range(len(laterals) - 2, -1, -1):
        h, w = laterals[i].shape[-2:]
        rows = (torch.arange(h) * running.shape[-2] // h).long()
        cols = (torch.arange(w) * running.shape[-1] // w).long()
        running = laterals[i] + running[..., rows, :][..., cols]
        out[i] = fpn.output_convs[i](running)
    return out


@pytest.mark.parametrize("size", [(64, 64), (50, 70)])
def test_fpn_matches_reference_and_shapes(size):
    backbone = create_feature_backbone("test_convnext")
    fpn = FPN(backbone.channels, out_channels=16, num_extra_levels=1)
    features = backbone(torch.randn(1, 3, *size))
    outputs = fpn(features)
    assert len(outputs) == len(features) + 1
    for feature, output in zip(features, outputs):
        assert output.shape == (1, 16, *feature.shape[-2:])
    assert outputs[-1].shape[-2:] == tuple((s + 1) // 2 for s in outputs[-2].shape[-2:])
    for a, b in zip(outputs, _reference_fpn(fpn, features)):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="levels"):
        fpn(features[:2])


def test_fpn_gradients_reach_every_parameter():
    backbone = create_feature_backbone("test_convnext")
    fpn = FPN(backbone.channels, 8)
    sum(o.sum() for o in fpn(backbone(torch.randn(1, 3, 32, 32)))).backward()
    assert all(p.grad is not None for p in fpn.parameters())
