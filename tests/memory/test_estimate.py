"""estimate_memory: the dry run's breakdown per stage, its state, and its hygiene."""

import math

import pytest
import timm
import torch

from linvit.memory import estimate_memory


@pytest.fixture(scope="module")
def nano_inference():
    return estimate_memory("linvit_nano", 200, 328)


def test_stages_follow_feature_info(nano_inference):
    model = timm.create_model("linvit_nano", device="meta")
    assert [stage.name for stage in nano_inference.stages] == [info["module"] for info in model.feature_info]
    for stage, info in zip(nano_inference.stages, model.feature_info):
        reduction = info["reduction"]
        # each stage's map: the input divided by its stride, rounded up (the stem pads)
        assert stage.grid == (math.ceil(200 / reduction), math.ceil(328 / reduction))
        assert stage.tokens == stage.grid[0] * stage.grid[1]
        # an inference stage leaves its output: (B, C, h, w) floats
        assert stage.kept_bytes == info["num_chs"] * stage.tokens * 4
    labels = [stage.attention for stage in nano_inference.stages]
    assert labels[0].startswith("focused linear") and labels[-1].startswith("window softmax 8×8")


def test_state_and_peak(nano_inference):
    model = timm.create_model("linvit_nano", device="meta")
    assert nano_inference.parameter_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert nano_inference.input_bytes == 3 * 200 * 328 * 4
    assert nano_inference.optimizer_bytes == 0
    assert nano_inference.peak_bytes == max(stage.peak_bytes for stage in nano_inference.stages)
    assert nano_inference.peak_at == nano_inference.stages[0].name
    assert nano_inference.activation_bytes > 0


def test_training_holds_adamw_state_and_saves_activations(nano_inference):
    training = estimate_memory("linvit_nano", 200, 328, train=True)
    parameters = len(list(timm.create_model("linvit_nano", device="meta").parameters()))
    # two moments per parameter, and one fp32 step counter per parameter tensor
    assert training.optimizer_bytes == 2 * training.parameter_bytes + 4 * parameters
    assert training.peak_bytes > nano_inference.peak_bytes + training.optimizer_bytes
    # what the stages keep for backward: far more than their outputs
    for stage, inference_stage in zip(training.stages, nano_inference.stages):
        assert stage.kept_bytes > 4 * inference_stage.kept_bytes
    assert training.peak_at in ("backward", "optimizer step") or training.peak_at.startswith("stages.")


def test_activations_grow_with_batch_and_pixels():
    two = estimate_memory("flatten_pvt_v2_b0", 256, 256, batch=2)
    four = estimate_memory("flatten_pvt_v2_b0", 256, 256, batch=4)
    two_large = estimate_memory("flatten_pvt_v2_b0", 512, 512, batch=2)
    assert four.activation_bytes == pytest.approx(2 * two.activation_bytes, rel=0.1)
    assert two_large.activation_bytes == pytest.approx(4 * two.activation_bytes, rel=0.1)


def test_a_single_token_map_costs_the_cpu_convolution_a_copy():
    """At batch 1 a (1, N, C) -> (1, C, H, W) view has a batch stride oneDNN does not take as dense: PVTv2's
    depthwise convolution then copies its input twice over, and batch 1 needs nearly what batch 2 does."""
    one = estimate_memory("flatten_pvt_v2_b0", 256, 256)
    two = estimate_memory("flatten_pvt_v2_b0", 256, 256, batch=2)
    assert one.activation_bytes > 0.9 * two.activation_bytes


def test_bf16_autocast_halves_activations_not_weights():
    fp32 = estimate_memory("flatten_pvt_v2_b0", 512, 512)
    bf16 = estimate_memory("flatten_pvt_v2_b0", 512, 512, dtype="bf16")
    assert bf16.parameter_bytes == fp32.parameter_bytes
    assert bf16.activation_bytes == pytest.approx(fp32.activation_bytes / 2, rel=0.1)


def test_bf16_autocast_keeps_half_precision_copies_of_the_weights():
    """Autocast caches its casts of leaf tensors that require grad, under no_grad too: a small map's inference in
    bf16 holds a bf16 copy of every weight of the model by its end."""
    fp32 = estimate_memory("flatten_deit_tiny_patch16_224", 224, 224)
    bf16 = estimate_memory("flatten_deit_tiny_patch16_224", 224, 224, dtype="bf16")
    assert bf16.activation_bytes > fp32.activation_bytes + 0.4 * fp32.parameter_bytes


def test_a_dry_run_leaves_nothing_fake_behind():
    """The window masks a dry run builds go to a private cache: a real run of that size afterwards is real."""
    estimate_memory("flatten_swin_tiny_patch4_224", 448, 448)
    model = timm.create_model("flatten_swin_tiny_patch4_224", num_classes=10).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 448, 448))
    assert type(out) is torch.Tensor and torch.isfinite(out).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the simulation used where no GPU is present")
def test_cuda_without_a_gpu_is_simulated_and_says_so():
    cuda = estimate_memory("linvit_nano", 128, 128, train=True, device="cuda")
    cpu = estimate_memory("linvit_nano", 128, 128, train=True)
    assert any("no GPU here" in note for note in cuda.notes) and not cpu.notes
    # 512-byte blocks and AdamW's multi-tensor temporaries: more than the CPU's count, by a little
    assert cpu.peak_bytes < cuda.peak_bytes < 1.5 * cpu.peak_bytes


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch": 0}, "batch must be a positive integer"),
        ({"height": -1}, "height must be a positive integer"),
        ({"dtype": "int8"}, "Unknown dtype 'int8'"),
        ({"device": "mps"}, "device must be 'cpu' or 'cuda'"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    arguments = {"model": "linvit_nano", "height": 64, "width": 64, **kwargs}
    with pytest.raises(ValueError, match=match):
        estimate_memory(**arguments)
