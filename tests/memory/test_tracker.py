"""AllocationTracker: live storage bytes op by op, against counts written out by hand and the CPU allocator's own."""

import pytest
import timm
import torch

from linvit.memory import AllocationTracker, estimate_memory
from linvit.memory.workload import fresh_size_caches, make_optimizer, run_workload
from linvit.memory.workspace import cpu_workspace_bytes

FLOAT = 4


def test_live_bytes_follow_storages_not_tensors():
    with AllocationTracker() as tracker:
        a = torch.empty(1000)
        b = a.view(10, 100)  # a view: same storage
        a.add_(1)  # in place: no new storage
        c = a * 2
        assert tracker.live_bytes == 2000 * FLOAT
        del a  # b still holds the storage
        assert tracker.live_bytes == 2000 * FLOAT
        del b
        assert tracker.live_bytes == 1000 * FLOAT
        d = torch.cat([c, c, c])  # 4000 floats live at once
        del c, d
        assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 4000 * FLOAT


def test_adopted_tensors_count_and_their_views_do_not():
    weights = torch.ones(250)
    with AllocationTracker() as tracker:
        tracker.adopt([weights, weights[:10]])
        assert tracker.live_bytes == 250 * FLOAT
        head = weights[:10]
        total = head.sum()
        assert tracker.live_bytes == 250 * FLOAT + total.untyped_storage().nbytes()


def test_workspace_counts_towards_the_peak_but_is_not_live():
    aten = torch.ops.aten

    def workspace(func, args, kwargs, out):
        return 10_000 if func is aten.mul.Tensor else 0

    with AllocationTracker(workspace=workspace) as tracker:
        x = torch.empty(100)
        y = x * x
        assert tracker.live_bytes == 200 * FLOAT
    assert tracker.peak_bytes == 200 * FLOAT + 10_000
    del x, y


def test_scopes_record_their_own_peak_and_what_they_leave():
    with AllocationTracker() as tracker:
        kept = torch.empty(100)
        with tracker.scope("inner") as inner:
            temporary = torch.empty(1000)
            kept2 = torch.empty(50)
            del temporary
        with tracker.scope("named only", peak=False) as named:
            torch.empty(5000)
    assert (inner.start_bytes, inner.peak_bytes, inner.end_bytes) == (400, 4600, 600)
    assert named.peak_bytes == named.start_bytes  # peak=False: only names the stretch
    assert tracker.peak_bytes == 600 + 20000 and tracker.peak_label == "named only"
    del kept, kept2


def test_block_rounding():
    with AllocationTracker(block_bytes=512) as tracker:
        x = torch.empty(1)
        y = torch.empty(129)  # 516 bytes: two blocks
        assert tracker.live_bytes == 512 + 1024
    del x, y


FAMILIES = [
    "linvit_nano",
    "flatten_pvt_v2_b0",
    "flatten_deit_tiny_patch16_224",
    "flatten_swin_tiny_patch4_224",
    "flatten_cswin_tiny_224",
    "flatten_pvt_tiny",
]


# training runs the forward too, so every family trains here; one inference case checks the no_grad path
CASES = [(name, True) for name in FAMILIES] + [("linvit_nano", False)]
# CSwin (17 s) in the slow tier: the default tier must stay under 15 minutes
PARAMS = [
    pytest.param(name, train, marks=[pytest.mark.slow] if name.startswith("flatten_cswin") else [])
    for name, train in CASES
]


@pytest.mark.parametrize("model_name, train", PARAMS, ids=[f"{m}-{'train' if t else 'infer'}" for m, t in CASES])
def test_dry_run_sees_what_a_real_run_dispatches(model_name, train):
    """The dry run on fake tensors and the same workload on real tensors give the tracker the same allocations.

    Training differs by AdamW's 4-byte step counters at most: ``torch.tensor(0.0)`` allocates outside the
    dispatcher on real tensors (the dry run sees it, the real run's tracker does not)."""
    height, width = 64, 96
    predicted = estimate_memory(model_name, height, width, train=train)
    torch.manual_seed(0)
    model = timm.create_model(model_name)
    images = torch.randn(1, 3, height, width)
    optimizer = make_optimizer(model) if train else None
    with fresh_size_caches(), AllocationTracker(workspace=cpu_workspace_bytes) as tracker:
        tracker.adopt([*model.parameters(), *model.buffers(), images])
        run_workload(model, images, train=train, optimizer=optimizer)
    step_counters = 4 * len(list(model.parameters())) if train else 0
    assert 0 <= predicted.peak_bytes - tracker.peak_bytes <= step_counters
