"""EagerViewStrides: views under FakeTensorMode get the strides eager PyTorch gives them."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from linvit.memory.fake import EagerViewStrides

VIEWS = {
    "tokens to map": lambda t: t.transpose(1, 2).reshape(1, 64, 16, 32),
    "map to tokens": lambda t: t.transpose(1, 2).reshape(1, 64, 16, 32).flatten(2).transpose(1, 2),
    "unsqueeze": lambda t: t.transpose(1, 2).unsqueeze(0),
    "select and view": lambda t: t[0].t().reshape(64, 16, 32)[None],
    "expand": lambda t: t[:, :1].expand(1, 512, 64),
}


def test_views_have_eager_strides_under_fake_tensors():
    real = torch.randn(1, 512, 64)
    eager = {name: view(real).stride() for name, view in VIEWS.items()}
    with FakeTensorMode(allow_non_fake_inputs=True), EagerViewStrides():
        fake = torch.empty(1, 512, 64)
        fixed = {name: view(fake).stride() for name, view in VIEWS.items()}
    # "tokens to map" is the case the mode exists for: FakeTensorMode alone (torch 2.14) gives the size-1 batch
    # dimension the stride 512·64 where eager gives 64, and oneDNN's convolution copies its input for the latter
    assert fixed == eager
