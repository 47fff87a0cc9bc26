"""An ONNX export is one file; weights over ONNX's 2 GB go to ``<name>.data`` beside it, and the command names both.

Without a 2 GB model: a small graph saved with its weights outside (as the exporter saves a large one) stands for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra (pip install 'linvit[onnx]')")

from linvit.utils.deploy import _save_onnx, onnx_data_file  # noqa: E402


def _graph() -> onnx.ModelProto:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), name="weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["image", "weight"], ["logits"])],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 64])],
        [weight],
    )
    return helper.make_model(graph)


def _save(path: Path, external: bool) -> None:
    options = {"save_as_external_data": True, "location": f"{path.name}.data", "size_threshold": 0} if external else {}
    onnx.save_model(_graph(), str(path), **options)


def test_onnx_data_file_names_the_weights_file_only_when_the_graph_uses_it(tmp_path):
    one = tmp_path / "one.onnx"
    _save(one, external=False)
    assert onnx_data_file(one) is None
    one.with_name("one.onnx.data").write_bytes(b"left by an earlier export")  # beside, but not this file's
    assert onnx_data_file(one) is None
    two = tmp_path / "two.onnx"
    _save(two, external=True)
    assert onnx_data_file(two) == tmp_path / "two.onnx.data"


class _LargeProgram:
    """An ONNXProgram whose weights pass 2 GB: asked for one file, it writes the graph and ``<name>.data``."""

    def save(self, path, external_data: bool) -> None:
        assert external_data is False  # linvit asks for one file; the exporter splits only when it must
        _save(Path(path), external=True)


def test_a_large_export_moves_both_files_into_place(tmp_path):
    path = tmp_path / "model.onnx"
    _save_onnx(_LargeProgram(), path, force=False)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["model.onnx", "model.onnx.data"]
    assert onnx_data_file(path) == tmp_path / "model.onnx.data"
    loaded = onnx.load(str(path))  # the graph finds its weights beside it
    assert loaded.graph.initializer[0].dims == [64, 64]


@pytest.mark.parametrize("large", [False, True])
def test_the_export_command_says_one_file_or_names_both(tmp_path, capsys, monkeypatch, large):
    import linvit.utils.deploy as deploy
    from linvit.cli import main as linvit_main

    def export_onnx(model, path, **options):  # the command's call, without minutes of tracing
        _save(Path(path), external=large)
        return Path(path)

    monkeypatch.setattr(deploy, "export_onnx", export_onnx)
    out = tmp_path / "nano.onnx"
    assert linvit_main(["export", "--model", "linvit_nano", "--format", "onnx", "--out", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    if large:
        assert first.endswith(f"{out} and {out}.data (weights over ONNX's 2 GB: keep both)"), first
    else:
        assert first.endswith(f"{out} (one file)"), first


def test_export_help_says_one_file_and_names_the_data_file(capsys):
    from linvit.cli import main as linvit_main

    with pytest.raises(SystemExit):
        linvit_main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one ONNX file" in text and "<file>.data" in text
