"""HybridAttention with a Nyström or Linformer global branch: exact window softmax plus an approximation of global
softmax. In the approximations' exact limits (m = N, identity projection) the hybrid is window softmax plus global
softmax, computed here from the materialised N×N attention."""

import pytest
import torch
from _module_testing import randomise
from _op_testing import softmax_attention

from linvit.attention import HybridAttention, LinformerAttention, NystromAttention, create_attention


def _window_plus_global_softmax(hybrid, x, hw):
    qkv = hybrid.qkv(x)
    return hybrid.proj(hybrid.local_attn(qkv, hw) + softmax_attention(qkv, hybrid.num_heads))


@pytest.mark.parametrize("hw", [(5, 6), (9, 4)])
def test_exact_limits_give_window_softmax_plus_global_softmax(hw):
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    nystrom = HybridAttention(
        16, 2, window_size=4, shift_size=2, global_branch="nystrom",
        global_options={"landmark_grid": hw, "pinv_iterations": 30, "conv_kernel_size": 0}, dtype=torch.float64,
    )  # fmt: skip
    nystrom = randomise(nystrom).eval()
    torch.testing.assert_close(nystrom(x, hw), _window_plus_global_softmax(nystrom, x, hw), rtol=1e-8, atol=1e-8)
    linformer = HybridAttention(
        16, 2, window_size=4, shift_size=2, global_branch="linformer", pos_size=hw,
        global_options={"projection": "learned", "projected_size": hw}, dtype=torch.float64,
    )  # fmt: skip
    linformer = randomise(linformer).eval()
    with torch.no_grad():
        linformer.global_attn.key_projection.copy_(torch.eye(hw[0] * hw[1]))
        linformer.global_attn.value_projection.copy_(torch.eye(hw[0] * hw[1]))
    torch.testing.assert_close(linformer(x, hw), _window_plus_global_softmax(linformer, x, hw))


def test_global_branches_share_one_qkv_and_keep_their_keys():
    nystrom = create_attention("hybrid", 16, 2, global_branch="nystrom", global_options={"landmark_grid": 3})
    assert isinstance(nystrom.global_attn, NystromAttention) and nystrom.global_attn.qkv is None
    assert nystrom.global_attn.landmark_grid == (3, 3)
    assert {key for key in nystrom.state_dict() if key.startswith("global_attn.")} == {"global_attn.conv.weight"}
    learned = create_attention(
        "hybrid", 16, 2, global_branch="linformer", pos_size=(7, 8), global_options={"projection": "learned"}
    )
    assert isinstance(learned.global_attn, LinformerAttention) and learned.global_attn.pos_size == (7, 8)
    assert learned.state_dict()["global_attn.key_projection"].shape == (256, 56)
    assert "global_branch=linformer" in repr(learned)


def test_bad_branches_say_what_is_expected():
    with pytest.raises(
        ValueError, match="Unknown global_branch 'performer'; valid ones are linear, nystrom, linformer"
    ):
        HybridAttention(16, 2, global_branch="performer")
    with pytest.raises(ValueError, match="global_options=.* are for the 'nystrom' and 'linformer' branches"):
        HybridAttention(16, 2, global_options={"landmark_grid": 4})
    with pytest.raises(TypeError, match="landmark_grids"):
        HybridAttention(16, 2, global_branch="nystrom", global_options={"landmark_grids": 4})
