"""LinformerAttention: both projections against the ops layer's reference and against softmax attention with an
identity projection, the resize of the learned projection to other grids, its keys and its argument checks."""

import pytest
import torch
from _module_testing import randomise, tokens

from linvit.attention import GlobalAttention, LinformerAttention, create_attention, resize_token_projection
from linvit.ops import linformer_attention_qkv


@pytest.mark.parametrize("hw", [(4, 4), (5, 9)])
def test_learned_module_equals_the_reference_at_its_grid_and_resized_at_others(hw):
    module = randomise(LinformerAttention(24, 3, projection="learned", projected_size=(2, 3), pos_size=(4, 4)))
    module = module.double()
    x = tokens(2, hw, 24)
    expected = module.proj(
        linformer_attention_qkv(
            module.qkv(x), hw=hw, num_heads=3, backend="naive",
            key_projection=resize_token_projection(module.key_projection, (4, 4), hw),
            value_projection=resize_token_projection(module.value_projection, (4, 4), hw),
        )
    )  # fmt: skip
    torch.testing.assert_close(module(x, hw), expected, rtol=1e-10, atol=1e-10)


def test_pooled_module_equals_the_reference():
    module = randomise(LinformerAttention(24, 3, projected_size=(2, 3), dtype=torch.float64))
    x = tokens(2, (5, 7), 24)
    out = linformer_attention_qkv(module.qkv(x), hw=(5, 7), num_heads=3, pool_grid=(2, 3), backend="naive")
    expected = module.proj(out)
    torch.testing.assert_close(module(x, (5, 7)), expected, rtol=1e-10, atol=1e-10)


def test_identity_projections_give_softmax_attention_with_the_same_weights():
    """Learned E = F = I (k = N), and pooling to a grid as large as the map, are `GlobalAttention`."""
    hw = (3, 5)
    softmax = randomise(GlobalAttention(16, 2, dtype=torch.float64)).eval()
    x = tokens(2, hw, 16) * 2
    learned = LinformerAttention(16, 2, projection="learned", projected_size=hw, pos_size=hw, dtype=torch.float64)
    learned.load_state_dict(
        {**softmax.state_dict(), "key_projection": torch.eye(15), "value_projection": torch.eye(15)}
    )
    torch.testing.assert_close(learned(x, hw), softmax(x, hw))
    pooled = LinformerAttention(16, 2, projected_size=hw, dtype=torch.float64)
    pooled.load_state_dict(softmax.state_dict())
    torch.testing.assert_close(pooled(x, hw), softmax(x, hw))


def test_the_resize_keeps_an_average_an_average():
    """A row that averages the training grid averages any other grid: bicubic keeps it constant and the N₀/N
    factor keeps its sum at one (without the factor it would sum to N/N₀)."""
    mean_rows = torch.full((3, 16), 1 / 16, dtype=torch.float64)  # three rows, each the mean over a 4×4 grid
    for grid in ((6, 7), (2, 2), (4, 4), (9, 3)):
        resized = resize_token_projection(mean_rows, (4, 4), grid)
        assert resized.shape == (3, grid[0] * grid[1])
        torch.testing.assert_close(resized, torch.full_like(resized, 1 / (grid[0] * grid[1])))
    assert resize_token_projection(mean_rows, (4, 4), (4, 4)) is mean_rows


def test_set_pos_size_stores_the_resized_projections():
    torch.manual_seed(0)
    module = LinformerAttention(16, 2, projection="learned", projected_size=3, pos_size=(4, 4))
    module.key_projection.requires_grad_(False)
    x = torch.randn(2, 42, 16)
    on_the_fly = module(x, (6, 7))
    old = module.value_projection.detach().clone()
    module.set_pos_size((6, 7))
    assert module.pos_size == (6, 7) and module.key_projection.shape == (9, 42)
    assert not module.key_projection.requires_grad and module.value_projection.requires_grad
    torch.testing.assert_close(module.value_projection, resize_token_projection(old, (4, 4), (6, 7)))
    torch.testing.assert_close(module(x, (6, 7)), on_the_fly)
    pooled = LinformerAttention(16, 2)
    pooled.set_pos_size((6, 7))  # nothing to resize
    assert pooled.pos_size is None and pooled.key_projection is None


def test_state_dict_keys_and_shapes():
    learned = LinformerAttention(32, 4, projection="learned", projected_size=(4, 2), pos_size=(7, 9))
    shapes = {key: tuple(value.shape) for key, value in learned.state_dict().items()}
    assert shapes == {
        "qkv.weight": (96, 32), "qkv.bias": (96,), "proj.weight": (32, 32), "proj.bias": (32,),
        "key_projection": (8, 63), "value_projection": (8, 63),
    }  # fmt: skip
    assert set(LinformerAttention(32, 4).state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


@pytest.mark.parametrize("projection", ["pool", "learned"])
@pytest.mark.parametrize("hw", [(1, 1), (1, 7), (3, 2), (17, 13)])
def test_any_map_size(projection, hw):
    module = create_attention("linformer", 16, 2, projection=projection, pos_size=(5, 5), projected_size=4).eval()
    out = module(torch.randn(2, hw[0] * hw[1], 16), hw)
    assert out.shape == (2, hw[0] * hw[1], 16) and torch.isfinite(out).all()


def test_every_parameter_gets_a_gradient_and_dropout_acts_in_training():
    module = LinformerAttention(16, 2, projection="learned", pos_size=(4, 4), projected_size=2, attn_drop=0.5)
    x = torch.randn(2, 30, 16)
    module(x, (5, 6)).sum().backward()
    missing = [name for name, p in module.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    module.eval()
    torch.testing.assert_close(module(x, (5, 6)), module(x, (5, 6)))
    assert not torch.allclose(module.train()(x, (5, 6)), module.eval()(x, (5, 6)))


def test_bad_arguments_say_what_is_expected():
    with pytest.raises(ValueError, match="projection='learned' needs pos_size=\\(h, w\\)"):
        LinformerAttention(16, 2, projection="learned")
    with pytest.raises(ValueError, match="Unknown projection 'random'; valid ones are pool, learned"):
        LinformerAttention(16, 2, projection="random")
    with pytest.raises(ValueError, match="projected_size must be a positive int"):
        LinformerAttention(16, 2, projected_size=(4, -1))
    with pytest.raises(ValueError, match="pos_size must be a positive int"):
        LinformerAttention(16, 2, projection="learned", pos_size=(0, 3))
    with pytest.raises(ValueError, match=r"hw=\(4, 4\) gives 16 tokens but x has N=15"):
        LinformerAttention(16, 2)(torch.randn(1, 15, 16), (4, 4))
