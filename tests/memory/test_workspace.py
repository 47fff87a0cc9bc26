"""The CPU workspace rules against the allocator's own record of each kernel (torch.profiler's allocation events).

A PyTorch whose kernels allocate otherwise fails here first, naming the case whose rule no longer holds.
"""

import pytest
import torch
import torch.nn.functional as F
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from linvit.memory.workspace import cpu_workspace_bytes

aten = torch.ops.aten


def _allocated_besides_output(fn) -> int:
    """Peak bytes the CPU allocator holds while ``fn`` runs, beyond what it returns (its inputs exist before)."""
    fn()  # first call: one-time allocations (oneDNN's caches) out of the way
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = []

    def walk(nodes):
        for node in nodes:
            if node.tag == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak - out.untyped_storage().nbytes()


def _tokens_as_map(batch, channels, height, width):
    """(B, C, H, W) as a view of (B, H·W, C) tokens, as a block hands tokens to a convolution."""
    tokens = torch.randn(batch, height * width, channels)
    return tokens.transpose(1, 2).reshape(batch, channels, height, width)


def _nhwc(*shape):
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


# case: (input, groups, output channels, kernel, stride), as the families' convolutions come
CONVOLUTIONS = {
    "depthwise, dense NHWC": (lambda: _nhwc(2, 128, 64, 64), 128, 128, 3, 1),
    "depthwise, dense NCHW": (lambda: torch.randn(1, 128, 64, 64), 128, 128, 3, 1),
    "depthwise, token view of batch 1": (lambda: _tokens_as_map(1, 128, 64, 64), 128, 128, 3, 1),
    "depthwise, token view of batch 2": (lambda: _tokens_as_map(2, 128, 64, 64), 128, 128, 3, 1),
    "depthwise 5x5, transposed": (lambda: torch.randn(1, 64, 128, 64).transpose(1, 2), 128, 128, 5, 1),
    "dense, NHWC": (lambda: _nhwc(1, 64, 64, 64), 1, 128, 3, 1),
    "dense, NHWC, stride 2": (lambda: _nhwc(1, 128, 64, 64), 1, 256, 3, 2),
    "dense, NCHW": (lambda: torch.randn(1, 64, 64, 64), 1, 128, 3, 1),
    "dense, NCHW, stride 2": (lambda: torch.randn(1, 128, 64, 64), 1, 256, 3, 2),
    "patch merging 2x2, token view": (lambda: _tokens_as_map(1, 64, 128, 128), 1, 128, 2, 2),
    "image, 7x7 stride 4": (lambda: torch.randn(1, 3, 256, 256), 1, 32, 7, 4),
    "image, 4x4 patches": (lambda: torch.randn(1, 3, 256, 256), 1, 96, 4, 4),
}


@pytest.mark.parametrize("case", sorted(CONVOLUTIONS))
def test_convolution_rule_matches_the_allocator(case):
    make_input, groups, out_channels, kernel, stride = CONVOLUTIONS[case]
    images = make_input()
    weight = torch.randn(out_channels, images.shape[1] // groups, kernel, kernel)
    bias = torch.randn(out_channels)
    padding = kernel // 2 if stride == 1 else 0

    def convolve():
        return F.conv2d(images, weight, bias, stride=stride, padding=padding, groups=groups)

    with torch.no_grad():
        measured = _allocated_besides_output(convolve)
        out = convolve()
    args = (images, weight, bias, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], groups)
    predicted = cpu_workspace_bytes(aten.convolution.default, args, {}, out)
    # within 10% of the input's bytes: the rules count tensors, the allocator also rounds and keeps small buffers
    assert abs(predicted - measured) <= 0.1 * images.numel() * 4, (case, predicted, measured)


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
def test_layer_norm_rule_matches_the_allocator(contiguous):
    tokens = torch.randn(1, 96, 128, 128).permute(0, 2, 3, 1)  # channels last, as Swin's stem hands it on
    if contiguous:
        tokens = tokens.contiguous()
    weight, bias = torch.ones(96), torch.zeros(96)
    with torch.no_grad():
        measured = _allocated_besides_output(lambda: F.layer_norm(tokens, (96,), weight, bias))
        out = aten.native_layer_norm.default(tokens, [96], weight, bias, 1e-5)
    predicted = cpu_workspace_bytes(aten.native_layer_norm.default, (tokens, [96], weight, bias, 1e-5), {}, out)
    # the mean and rstd outputs (one float per token each) are what the profiler sees beyond the normalised output
    statistics = 2 * 128 * 128 * 4
    assert abs(predicted + statistics - measured) <= 0.1 * tokens.numel() * 4, (predicted, measured)


def test_other_ops_and_devices_hold_no_workspace():
    x = torch.randn(4, 4)
    assert cpu_workspace_bytes(aten.mm.default, (x, x), {}, x @ x) == 0
    meta = torch.empty(1, 8, 16, 16, device="meta")
    weight = torch.empty(8, 8, 3, 3, device="meta")
    args = (meta, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert cpu_workspace_bytes(aten.convolution.default, args, {}, meta) == 0
