"""linvit.layers: stem, conditional position encoding, downsampling and the transformer block.

Each fast (channels-last, view-based) layer is checked against a plain NCHW reference written out here.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from linvit.layers import ConvDownsample, ConvPosEnc, ConvStem, TransformerBlock, map_to_tokens, tokens_to_map
from linvit.ops.onednn import _onednn_op


def _reference_tokens_to_map(x, hw):
    b, n, c = x.shape
    return x.transpose(1, 2).reshape(b, c, hw[0], hw[1]).contiguous()


def _reference_map_to_tokens(x):
    b, c, h, w = x.shape
    return x.reshape(b, c, h * w).transpose(1, 2).contiguous()


def test_tokens_map_round_trip_is_a_view():
    x = torch.randn(2, 5 * 7, 6)
    m = tokens_to_map(x, (5, 7))
    torch.testing.assert_close(m, _reference_tokens_to_map(x, (5, 7)), rtol=0, atol=0)
    assert m.data_ptr() == x.data_ptr()  # no copy: the map is a channels-last view of the tokens
    assert m.is_contiguous(memory_format=torch.channels_last)
    back = map_to_tokens(m)
    assert back.data_ptr() == x.data_ptr()
    torch.testing.assert_close(back, x, rtol=0, atol=0)
    torch.testing.assert_close(map_to_tokens(m.contiguous()), _reference_map_to_tokens(m), rtol=0, atol=0)


@pytest.mark.parametrize("size", [(32, 32), (33, 51), (1, 1), (4, 7)])
@pytest.mark.parametrize("in_chans", [1, 3])
@pytest.mark.parametrize("stride", [4, 2])
def test_stem_any_size(size, in_chans, stride):
    stem = ConvStem(in_chans, 16, stride=stride).eval()
    out = stem(torch.randn(2, in_chans, *size))
    assert out.shape == (2, 16, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("stride", [8, 1, 2.0, True])
def test_stem_stride_is_two_or_four(stride):
    with pytest.raises(ValueError, match=r"stride \(stem_stride\) is 2 or 4, got"):
        ConvStem(3, 16, stride=stride)


def test_stem_matches_reference():
    torch.manual_seed(0)
    stem = ConvStem(3, 16).eval()
    x = torch.randn(1, 3, 37, 29)
    ref = F.conv2d(x, stem.conv1.weight, stride=2, padding=1)
    ref = F.gelu(F.batch_norm(ref, stem.norm1.running_mean, stem.norm1.running_var, stem.norm1.weight, stem.norm1.bias))
    ref = F.conv2d(ref, stem.conv2.weight, stride=2, padding=1)
    ref = F.batch_norm(ref, stem.norm2.running_mean, stem.norm2.running_var, stem.norm2.weight, stem.norm2.bias)
    torch.testing.assert_close(stem(x), ref, rtol=1e-4, atol=1e-5)


def _stem_with_statistics(in_chans: int = 3, stride: int = 4) -> ConvStem:
    """A stem whose BatchNorms hold running statistics and affine terms far from their initial 0/1."""
    torch.manual_seed(0)
    stem = ConvStem(in_chans, 16, stride=stride)
    for norm in (stem.norm1, stem.norm2):
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.2, 3.0)
        norm.weight.data.normal_()
        norm.bias.data.normal_()
    return stem.eval()


def _stem_reference(stem: ConvStem, x: torch.Tensor, first_stride: int = 2) -> torch.Tensor:
    ref = F.conv2d(x, stem.conv1.weight, stride=first_stride, padding=1)
    ref = F.gelu(F.batch_norm(ref, stem.norm1.running_mean, stem.norm1.running_var, stem.norm1.weight, stem.norm1.bias))
    ref = F.conv2d(ref, stem.conv2.weight, stride=2, padding=1)
    return F.batch_norm(ref, stem.norm2.running_mean, stem.norm2.running_var, stem.norm2.weight, stem.norm2.bias)


@pytest.mark.skipif(not _onednn_op("_convolution_pointwise"), reason="this torch has no oneDNN fused convolution")
@pytest.mark.parametrize("in_chans, stride", [(3, 4), (1, 4), (3, 2)])
def test_stem_in_eval_without_autograd_folds_its_norms_into_onednn_convolutions(in_chans, stride):
    stem = _stem_with_statistics(in_chans, stride)
    x = torch.randn(2, in_chans, 37, 29)
    with torch.no_grad():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = stem(x)
        expected = _stem_reference(stem, x, first_stride=stride // 2)
    ops = {event.key for event in prof.key_averages()}
    assert "mkldnn::_convolution_pointwise" in ops and not {"aten::native_batch_norm", "aten::gelu"} & ops
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_stem_in_training_mode_or_watched_keeps_its_norms():
    stem = _stem_with_statistics()
    x = torch.randn(2, 3, 16, 16)
    seen = []
    stem.norm1.register_forward_hook(lambda module, inputs, output: seen.append(output))
    with torch.no_grad():
        torch.testing.assert_close(stem(x), _stem_reference(stem, x), rtol=1e-4, atol=1e-5)
    assert len(seen) == 1
    stem = _stem_with_statistics()
    stem.norm2.train()  # the stem in eval mode, its last norm not: batch statistics there
    with torch.no_grad():
        out = stem(x)
    # batch statistics, not the running ones: each channel's mean over the batch is the norm's shift
    torch.testing.assert_close(out.mean(dim=(0, 2, 3)), stem.norm2.bias.detach(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("hw", [(5, 7), (1, 1), (8, 8)])
def test_conv_pos_enc_matches_reference(hw):
    torch.manual_seed(0)
    cpe = ConvPosEnc(12, 3)
    x = torch.randn(2, hw[0] * hw[1], 12)
    conv = F.conv2d(_reference_tokens_to_map(x, hw), cpe.proj.weight, cpe.proj.bias, padding=1, groups=12)
    torch.testing.assert_close(cpe(x, hw), x + _reference_map_to_tokens(conv), rtol=1e-5, atol=1e-6)


def test_conv_pos_enc_rejects_even_kernel():
    with pytest.raises(ValueError, match="odd"):
        ConvPosEnc(8, 4)


@pytest.mark.parametrize(("size", "expected"), [((8, 8), (4, 4)), ((7, 5), (4, 3)), ((2, 2), (1, 1)), ((1, 1), (1, 1))])
def test_downsample_matches_reference(size, expected):
    torch.manual_seed(0)
    down = ConvDownsample(8, 16)
    with torch.no_grad():
        down.norm.weight.normal_()
        down.norm.bias.normal_()
    x = torch.randn(2, 8, *size).contiguous(memory_format=torch.channels_last)
    normed = F.layer_norm(x.permute(0, 2, 3, 1).contiguous(), (8,), down.norm.weight, down.norm.bias, down.norm.eps)
    ref = F.conv2d(normed.permute(0, 3, 1, 2).contiguous(), down.conv.weight, down.conv.bias, stride=2, padding=1)
    out = down(x)
    assert out.shape == (2, 16, *expected)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attention", ["focused", "window", "softmax", "linear", "hybrid"])
def test_block_shapes_and_gradients(attention):
    torch.manual_seed(0)
    kwargs = {"pos_encoding": "none"} if attention in ("focused", "linear") else {}
    if attention in ("window", "hybrid"):
        kwargs["window_size"] = 3
    block = TransformerBlock(32, 2, attention=attention, attn_kwargs=kwargs)
    hw = (5, 7)
    x = torch.randn(2, hw[0] * hw[1], 32, requires_grad=True)
    out = block(x, hw)
    assert out.shape == x.shape
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    missing = [n for n, p in block.named_parameters() if p.grad is None]
    assert not missing, f"parameters without gradient: {missing}"


def test_block_is_identity_when_its_branches_are_zero():
    """With the CPE conv, attention output projection and MLP output zeroed, every residual branch adds nothing."""
    block = TransformerBlock(16, 2, attention="softmax")
    with torch.no_grad():
        for layer in (block.cpe.proj, block.attn.proj, block.mlp.fc2):
            layer.weight.zero_()
            layer.bias.zero_()
    x = torch.randn(1, 12, 16)
    torch.testing.assert_close(block(x, (3, 4)), x, rtol=0, atol=0)


def test_block_matches_written_out_reference():
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, attention="softmax").eval()
    hw = (3, 4)
    x = torch.randn(2, 12, 16)
    y = x + _reference_map_to_tokens(
        F.conv2d(_reference_tokens_to_map(x, hw), block.cpe.proj.weight, block.cpe.proj.bias, padding=1, groups=16)
    )
    y = y + block.attn(block.norm1(y), hw)
    y = y + block.mlp.fc2(F.gelu(block.mlp.fc1(block.norm2(y))))
    torch.testing.assert_close(block(x, hw), y, rtol=1e-5, atol=1e-6)


def test_block_without_cpe_and_drop_path_in_eval():
    block = TransformerBlock(16, 2, attention="softmax", cpe_kernel_size=None, drop_path=0.5).eval()
    assert block.cpe is None
    x = torch.randn(1, 6, 16)
    torch.testing.assert_close(block(x, (2, 3)), block(x, (2, 3)))  # drop path is off in eval: deterministic


def test_layers_build_on_meta_with_dtype():
    for module in (
        ConvStem(3, 16, device="meta", dtype=torch.float64),
        ConvPosEnc(8, device="meta", dtype=torch.float64),
        ConvDownsample(8, 16, device="meta", dtype=torch.float64),
        TransformerBlock(16, 2, attention="window", device="meta", dtype=torch.float64),
    ):
        tensors = list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]
        assert all(t.device.type == "meta" and t.dtype == torch.float64 for t in tensors), type(module).__name__


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_block_scripts():
    block = TransformerBlock(16, 2, attention="window", attn_kwargs={"window_size": 2}).eval()
    scripted = torch.jit.script(block)
    x = torch.randn(1, 15, 16)
    torch.testing.assert_close(scripted(x, (3, 5)), block(x, (3, 5)))


def test_unknown_attention_name_is_reported():
    with pytest.raises(ValueError, match="not_an_attention"):
        TransformerBlock(16, 2, attention="not_an_attention")


def test_block_custom_norm_and_act():
    block = TransformerBlock(16, 2, attention="softmax", norm_layer=nn.LayerNorm, act_layer=nn.ReLU)
    assert isinstance(block.mlp.act, nn.ReLU)
