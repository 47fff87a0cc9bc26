"""timm builds and checks models on the meta device; the float32 guards must not ask autocast about "meta"."""

import torch

from linvit.attention import ATTENTION_NAMES, create_attention, linear_attention


def test_every_attention_runs_on_the_meta_device():
    for name in ATTENTION_NAMES:
        options = {"pos_size": (7, 9)} if name == "focused" else {}
        module = create_attention(name, 32, 2, device="meta", **options)
        out = module(torch.zeros(1, 7 * 9, 32, device="meta"), (7, 9))
        assert out.shape == (1, 63, 32) and out.device.type == "meta", name


def test_linear_core_runs_on_the_meta_device():
    q = torch.zeros(1, 2, 10, 4, device="meta")
    assert linear_attention(q, q, q).shape == (1, 2, 10, 4)
