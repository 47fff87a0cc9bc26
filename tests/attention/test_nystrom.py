"""NystromAttention: the module against the ops layer's reference, against softmax attention with m = N, its keys,
any map size, every parameter's gradient, and its argument checks."""

import pytest
import torch
from _module_testing import randomise, tokens

from linvit.attention import GlobalAttention, NystromAttention, create_attention
from linvit.ops import nystrom_attention_qkv


@pytest.mark.parametrize("hw", [(6, 6), (5, 9), (2, 11)])
@pytest.mark.parametrize("landmark_grid", [(2, 3), 4])
def test_module_equals_the_reference(hw, landmark_grid):
    module = randomise(NystromAttention(24, 3, landmark_grid=landmark_grid, conv_kernel_size=3, dtype=torch.float64))
    x = tokens(2, hw, 24)
    out = nystrom_attention_qkv(
        module.qkv(x), hw=hw, num_heads=3, landmark_grid=module.landmark_grid, conv_weight=module.conv.weight,
        backend="naive",
    )  # fmt: skip
    expected = module.proj(out)
    torch.testing.assert_close(module(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_as_many_landmarks_as_tokens_give_softmax_attention_with_the_same_weights():
    """The module with m = N and no skip is `GlobalAttention` (same `qkv.*` and `proj.*` keys)."""
    hw = (3, 5)
    softmax = randomise(GlobalAttention(16, 2, dtype=torch.float64)).eval()
    nystrom = NystromAttention(16, 2, landmark_grid=hw, pinv_iterations=30, conv_kernel_size=0, dtype=torch.float64)
    nystrom.load_state_dict(softmax.state_dict())
    x = tokens(2, hw, 16) * 2
    torch.testing.assert_close(nystrom(x, hw), softmax(x, hw), rtol=1e-8, atol=1e-8)


def test_state_dict_keys_and_shapes():
    module = NystromAttention(32, 4, conv_kernel_size=5)
    shapes = {key: tuple(value.shape) for key, value in module.state_dict().items()}
    assert shapes == {
        "qkv.weight": (96, 32), "qkv.bias": (96,), "proj.weight": (32, 32), "proj.bias": (32,),
        "conv.weight": (4, 1, 5, 5),
    }  # fmt: skip
    assert "conv.weight" not in NystromAttention(32, 4, conv_kernel_size=0).state_dict()
    assert "qkv.weight" not in NystromAttention(32, 4, with_projections=False).state_dict()


@pytest.mark.parametrize("hw", [(1, 1), (1, 7), (3, 2), (17, 13)])
def test_any_map_size_including_smaller_than_the_landmark_grid(hw):
    module = create_attention("nystrom", 16, 2).eval()
    out = module(torch.randn(2, hw[0] * hw[1], 16), hw)
    assert out.shape == (2, hw[0] * hw[1], 16) and torch.isfinite(out).all()


def test_every_parameter_gets_a_gradient():
    module = NystromAttention(16, 2, landmark_grid=2)
    module(torch.randn(2, 30, 16), (5, 6)).sum().backward()
    missing = [name for name, p in module.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


def test_naive_backend_module_equals_torch_backend():
    torch.manual_seed(0)
    fast = NystromAttention(16, 2, landmark_grid=(2, 3))
    slow = NystromAttention(16, 2, landmark_grid=(2, 3), backend="naive")
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 35, 16)
    torch.testing.assert_close(slow(x, (5, 7)), fast(x, (5, 7)), rtol=1e-5, atol=1e-6)


def test_bad_arguments_say_what_is_expected():
    with pytest.raises(ValueError, match="landmark_grid must be a positive int"):
        NystromAttention(16, 2, landmark_grid=(0, 4))
    with pytest.raises(ValueError, match="conv_kernel_size must be odd"):
        NystromAttention(16, 2, conv_kernel_size=4)
    with pytest.raises(ValueError, match="pinv_iterations must be >= 0"):
        NystromAttention(16, 2, pinv_iterations=-2)
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        NystromAttention(16, 3)
    with pytest.raises(ValueError, match="Unknown backend"):
        NystromAttention(16, 2, backend="fast")
    with pytest.raises(ValueError, match=r"hw=\(4, 4\) gives 16 tokens but x has N=15"):
        NystromAttention(16, 2)(torch.randn(1, 15, 16), (4, 4))
