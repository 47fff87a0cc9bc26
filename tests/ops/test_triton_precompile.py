"""The parallel warm-up of the autotuned kernels' tile configurations (`triton_precompile`): which compiles it asks
for, once per autotune key, and that a failure only warns. The compiles themselves need a GPU's runtime: the GPU
tier's autotuned cases run through it."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


class _Kernel:
    """Records the warm-ups asked of it, as a @triton.jit function's ``warmup`` would take them."""

    def __init__(self, error: Exception | None = None):
        self.calls, self.error = [], error

    def warmup(self, grid, **kwargs):
        if self.error is not None:
            raise self.error
        self.calls.append((grid, kwargs["N_BUCKET"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"]))


def _launch(kernel, name="output", tokens=4096, dtype=torch.bfloat16, tuned=True):
    from linvit.ops.linear_attention.triton_geometry import Launch

    qkv = torch.zeros(2, tokens, 24, dtype=dtype)
    return Launch(name, kernel, (2, 3, 1), {"qkv_ptr": qkv, "N": tokens}, {"H": 2, "D": 4, "MAP": 0}, lambda _: (),
                  tuned=tuned)  # fmt: skip


@pytest.fixture
def precompile(monkeypatch):
    from linvit.ops.linear_attention import triton_precompile

    if triton_precompile.AsyncCompileMode is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    monkeypatch.setattr(triton_precompile, "_warmed", set())
    return triton_precompile.precompile


def test_every_tile_configuration_of_a_new_key_is_warmed_once(precompile):
    from linvit.ops.linear_attention.triton_geometry import TILE_CONFIGS

    tuned, untuned = _Kernel(), _Kernel()
    launches = [_launch(tuned), _launch(untuned, name="sum_grads", tuned=False)]
    precompile(launches)
    assert sorted(call[2:] for call in tuned.calls) == sorted(TILE_CONFIGS)
    assert all(call[:2] == ((2, 3, 1), 4096) for call in tuned.calls) and untuned.calls == []
    precompile(launches)  # the same key: compiled already
    assert len(tuned.calls) == len(TILE_CONFIGS)
    precompile([_launch(tuned, tokens=8192)])  # another N bucket: another key
    precompile([_launch(tuned, dtype=torch.float16)])  # another dtype: another key
    assert len(tuned.calls) == 3 * len(TILE_CONFIGS)


def test_a_failed_warm_up_warns_and_leaves_it_to_the_autotuner(precompile):
    with pytest.warns(RuntimeWarning, match="one after another"):
        precompile([_launch(_Kernel(error=RuntimeError("no driver")))])


def test_fake_tensors_are_left_to_the_compiler_that_traces_them(precompile):
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernel = _Kernel()
    with FakeTensorMode():
        launch = _launch(kernel)
    precompile([launch])
    assert kernel.calls == []
