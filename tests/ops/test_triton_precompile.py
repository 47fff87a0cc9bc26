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


class _Compiled:
    """What a @triton.jit function's ``warmup`` returns: a compiled kernel that reports its spills once loaded."""

    def __init__(self, spills: int | None):
        self.spills, self.n_spills = spills, None

    def _init_handles(self):
        if self.spills is None:
            raise RuntimeError("out of resources: shared memory")
        self.n_spills = self.spills


class _SpillingKernel:
    """Compiles each BLOCK_N to a kernel that spills as ``spills`` says; records the arguments of each warm-up."""

    def __init__(self, spills: dict[int, int | None]):
        self.spills, self.calls = spills, []

    def warmup(self, grid, **kwargs):
        self.calls.append(kwargs)
        return _Compiled(self.spills[kwargs["BLOCK_N"]])


def _configs(*blocks):
    import triton

    return [triton.Config({"BLOCK_N": block}, num_warps=4, num_stages=1) for block in blocks]


def test_the_autotune_space_leaves_out_the_configurations_that_spill():
    from linvit.ops.linear_attention.triton_precompile import spill_free

    qkv = torch.zeros(2, 64, 24)
    kernel = _SpillingKernel({16: 0, 32: 0, 64: 368})
    prune = spill_free(kernel)
    # as triton.autotune calls it: named (positional) arguments, then the keywords of the launch, grid and warmup too
    kept = prune(_configs(16, 32, 64), {}, qkv_ptr=qkv, N=64, H=2, N_BUCKET=64, grid=(2, 3, 1), warmup=False)
    assert [config.kwargs["BLOCK_N"] for config in kept] == [16, 32]
    assert all("grid" not in call and "warmup" not in call and call["qkv_ptr"] is qkv for call in kernel.calls)
    assert {(call["num_warps"], call["num_stages"]) for call in kernel.calls} == {(4, 1)}


def test_where_every_configuration_spills_the_least_spilling_stay():
    from linvit.ops.linear_attention.triton_precompile import spill_free

    prune = spill_free(_SpillingKernel({16: 8, 32: 8, 64: 368}))
    kept = prune(_configs(16, 32, 64), {}, qkv_ptr=torch.zeros(2, 64, 24), grid=(1,), warmup=False)
    assert [config.kwargs["BLOCK_N"] for config in kept] == [16, 32]


def test_a_configuration_whose_spills_cannot_be_read_is_left_to_the_autotuner():
    from linvit.ops.linear_attention.triton_precompile import spill_free

    prune = spill_free(_SpillingKernel({16: 0, 32: None, 64: 368}))  # 32: does not load (the autotuner says why)
    kept = prune(_configs(16, 32, 64), {}, qkv_ptr=torch.zeros(2, 64, 24), grid=(1,), warmup=False)
    assert [config.kwargs["BLOCK_N"] for config in kept] == [16, 32]


def test_while_torch_compile_traces_every_configuration_stays():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from linvit.ops.linear_attention.triton_precompile import spill_free

    kernel = _SpillingKernel({16: 0, 32: 0, 64: 368})
    with FakeTensorMode():
        qkv = torch.zeros(2, 64, 24)
    kept = spill_free(kernel)(_configs(16, 32, 64), {}, qkv_ptr=qkv, grid=(1,), warmup=False)
    assert len(kept) == 3 and kernel.calls == []


class _TunableSpillingKernel(_SpillingKernel):
    """A _SpillingKernel that `triton.autotune` can wrap (it reads the parameter names and the function)."""

    arg_names = ["qkv_ptr", "N", "H", "D", "MAP", "N_BUCKET", "BLOCK_N"]

    @staticmethod
    def fn():
        pass


def test_the_launched_autotuner_is_pruned_already_and_kept_per_autotune_key(monkeypatch):
    """The autotuner each launch runs holds the spill-free configurations and no pruning of its own: torch's
    ``wrap_triton`` reruns an autotuner's ``prune_configs_by`` itself and builds a new autotuner, with an empty cache,
    from its result on every call, so every call autotuned again (1.5 s per forward call on an H200). One autotuner
    per autotune key, so its cache lasts; under fake tensors (torch.compile tracing) the whole space, apart."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from linvit.ops.linear_attention import triton as triton_backend

    monkeypatch.setattr(triton_backend, "_tuned_kernels", {})
    kernel = _TunableSpillingKernel({16: 0, 32: 0, 64: 368})
    tuned = triton_backend._tuned(_launch(kernel))
    assert tuned.early_config_prune is None and tuned.perf_model is None
    assert {config.kwargs["BLOCK_N"] for config in tuned.configs} == {16, 32}
    assert triton_backend._tuned(_launch(kernel)) is tuned
    assert triton_backend._tuned(_launch(kernel, dtype=torch.float16)) is not tuned
    assert triton_backend._tuned(_launch(kernel, tokens=8192)) is not tuned
    with FakeTensorMode():
        traced = triton_backend._tuned(_launch(kernel))
    assert traced is not tuned and {config.kwargs["BLOCK_N"] for config in traced.configs} == {16, 32, 64}
