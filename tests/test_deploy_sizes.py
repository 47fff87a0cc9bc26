"""The sizes a ``.pt2`` program takes (issue 36): it runs at the size it was exported for (the model's native size, a
run's ``data.img_size``) and at every size its dynamic shapes claim, and the ONNX export is one file or names both.

A program checks its input against the guards its trace recorded (an op whose layout would differ at a map of one
token guards against it), so a dynamic program starts above the size where the last map has one token. The default
tier uses a two-convolution model of stride 32 (traced in a second); the slow tier linvit_nano as a run exports it.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn

from linvit.utils.deploy import StaticSizeWarning, _smallest_dynamic_size, export_program, program_sizes

TOLERANCE = 1e-4


class Stride32(nn.Module):
    """Two strided convolutions (4, then 8) and tokens: the last map of a hierarchical backbone, floor-sized, so that
    it holds two tokens a side from 64 px (a dynamic program starts there) and one below."""

    def __init__(self, native: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pretrained_cfg = {"input_size": (3, native, native)}  # as a run's model carries its data.img_size
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.down = nn.Conv2d(8, 16, 8, stride=8)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.down(self.stem(x)).permute(0, 2, 3, 1).flatten(1, 2)  # (B, N, C): asks whether N is 1
        return self.head(self.norm(tokens).mean(1))


def _export(model: nn.Module) -> tuple[torch.export.ExportedProgram, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StaticSizeWarning)
        program = export_program(model)
    return program, [str(w.message) for w in caught if issubclass(w.category, StaticSizeWarning)]


def _loaded(program: torch.export.ExportedProgram) -> nn.Module:
    """The program as a user gets it: saved as .pt2 and loaded back."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer).module()


def _assert_matches(loaded: nn.Module, model: nn.Module, size: tuple[int, int], batch: int = 2) -> None:
    x = torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(size[0] * 1000 + size[1]))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=TOLERANCE, rtol=0)


def _refused(loaded: nn.Module, size: tuple[int, int]) -> bool:
    try:
        loaded(torch.randn(1, 3, *size))
    except (AssertionError, RuntimeError):
        return True
    return False


def test_a_program_runs_at_its_export_size_and_from_the_smallest_size_it_claims():
    model = Stride32(native=64).eval()
    program, static = _export(model)
    sizes = program_sizes(program)
    assert static == [] and not sizes.static
    assert sizes == (64, None, 64, None)  # two tokens a side at stride 32 (floor): 64 px, no upper bound
    loaded = _loaded(program)
    for size in [(64, 64), (sizes[0], sizes[2]), (97, 200), (300, 64)]:  # export size, the Dims' min, others
        _assert_matches(loaded, model, size, batch=1 + size[1] % 3)
    assert _refused(loaded, (63, 64)), "below the claimed range: refused by the program's range check"


def test_a_model_below_its_dynamic_range_is_exported_static_at_its_size_and_says_so():
    model = Stride32(native=32).eval()  # the quick-start run's size: its last map is one token
    program, static = _export(model)
    assert len(static) == 1 and static[0].startswith("height and width static at the native size 32x32")
    assert "from 64x64 up" in static[0]
    sizes = program_sizes(program)
    assert sizes.static and sizes == (32, 32, 32, 32) and sizes.describe() == "height and width static at 32x32"
    loaded = _loaded(program)
    _assert_matches(loaded, model, (32, 32), batch=1)
    _assert_matches(loaded, model, (32, 32), batch=3)  # the batch stays dynamic
    assert _refused(loaded, (64, 64))


class _Guards:
    def __init__(self, guards, channels: int = 3) -> None:
        self._guards_code = guards
        self.channels = channels


def test_the_smallest_size_is_where_every_guard_holds(monkeypatch):
    import linvit.utils.deploy as deploy

    monkeypatch.setattr(deploy, "_input_shape", lambda program: (1, program.channels, 0, 0))
    # the last map of a stride-32 model padded to whole tokens: ceil(W / 32) != 1 and a product over both sides
    guards = [
        "(1 + (((-1) + L['x'].size()[3]) // 32)) != 1",
        "((1 + (((-1) + L['x'].size()[3]) // 32))*(1 + (((-1) + L['x'].size()[2]) // 32))) != 1",
        "1 < 3*L['x'].size()[3]*L['x'].size()[2]",
    ]
    assert _smallest_dynamic_size(_Guards(guards)) == (33, 33)
    assert _smallest_dynamic_size(_Guards(["(1 + (((-1) + L['image'].size()[2]) // 16)) != 1"])) == (17, 17)
    assert _smallest_dynamic_size(_Guards([])) == (1, 1)
    assert _smallest_dynamic_size(_Guards(["L['x'].size()[2] > 500"])) is None  # beyond the search: not vouched for


@pytest.mark.slow  # linvit_nano traced twice per size (~30 s each on 2 shared cores)
@pytest.mark.parametrize("native", [32, 64])
def test_linvit_nano_program_runs_at_a_runs_size(native):
    """linvit_nano as `linvit export <run> --format pt2` builds it for a run at ``native`` px (its pretrained cfg
    holds the run's input size): at 32 its last map is one token, below the dynamic range (33 up), so static, and at
    batch 1 (ops on one-token maps ask whether the batch is 1); at 64 dynamic from 33."""
    import timm

    import linvit  # noqa: F401

    model = timm.create_model("linvit_nano", num_classes=10, img_size=native).eval()
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, native, native)}
    program, static = _export(model)
    sizes = program_sizes(program)
    loaded = _loaded(program)
    _assert_matches(loaded, model, (native, native), batch=1)
    if native == 32:
        assert sizes == (32, 32, 32, 32) and "from 33x33 up" in static[0]
        assert static[0].startswith("batch 1, height and width static at the native size 32x32")
    else:
        assert static == [] and sizes == (33, None, 33, None)
        for size in [(33, 33), (40, 57), (96, 160)]:
            _assert_matches(loaded, model, size)
