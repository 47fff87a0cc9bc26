"""A forward of FocusedLinearAttention enters `linvit/attention` once and `linvit/ops` once, and never climbs back up
from ops into attention (issue 21: the module holds the parameters, ops the computation)."""

import sys
from pathlib import Path

import pytest
import torch

from linvit.attention import FocusedLinearAttention

PACKAGE = Path(__file__).resolve().parents[2] / "linvit"


def _rooms_entered(module, x, hw) -> list[str]:
    """The rooms of linvit whose Python functions the forward calls, in order, consecutive repeats merged."""
    rooms: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if PACKAGE in path.parents:
            room = path.relative_to(PACKAGE).parts[0]
            if not rooms or rooms[-1] != room:
                rooms.append(room)

    sys.setprofile(profile)
    try:
        module(x, hw)
    finally:
        sys.setprofile(None)
    return rooms


@pytest.mark.parametrize(
    "kwargs,hw",
    [
        ({"pos_size": (6, 5)}, (6, 5)),  # global, learnable table
        ({"window_size": 4}, (6, 5)),  # windows with padding
        ({"pos_encoding": "conv"}, (6, 5)),
        ({"kernel": "relu", "pos_encoding": "none"}, (6, 5)),
        ({"kernel": "taylor", "pos_encoding": "none", "window_size": 4}, (9, 7)),
    ],
)
@pytest.mark.parametrize("grad", [False, True])
def test_focused_forward_enters_attention_once_then_ops_once(kwargs, hw, grad):
    module = FocusedLinearAttention(16, 2, **kwargs).eval()
    x = torch.randn(2, hw[0] * hw[1], 16)
    with torch.set_grad_enabled(grad):
        module(x, hw)  # warm: size caches filled, lazy imports done
        assert _rooms_entered(module, x, hw) == ["attention", "ops"]
