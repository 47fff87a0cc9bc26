"""`linvit viz attention|rank` write their PNGs and report clear errors."""

import pytest

from linvit.cli import main


@pytest.fixture
def photo_file(tmp_path):
    data = pytest.importorskip("skimage.data", reason="real photos need scikit-image: pip install 'linvit[photos]'")
    from PIL import Image

    path = tmp_path / "coffee.png"
    Image.fromarray(data.coffee()[::5, ::5]).save(path)
    return path


def test_viz_attention_and_rank(tmp_path, photo_file, capsys):
    out = tmp_path / "attention.png"
    args = ["viz", "attention", str(photo_file), "--model", "test_convnext", "--query", "0.5,0.3", "-o", str(out)]
    assert main(args) == 0
    assert out.is_file() and "softmax" in capsys.readouterr().out
    out = tmp_path / "rank.png"
    args = ["viz", "rank", str(photo_file), "--model", "test_convnext", "--grids", "3,5", "--head-dim", "4"]
    assert main([*args, "-o", str(out)]) == 0
    assert out.is_file() and "focused + DWC: [9, 25]" in capsys.readouterr().out


def test_viz_errors(tmp_path, photo_file, capsys):
    out = str(tmp_path / "x.png")
    assert main(["viz", "attention", str(tmp_path / "none.png"), "--model", "test_convnext", "-o", out]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["viz", "attention", str(photo_file), "--model", "test_convnext", "--query", "1", "-o", out]) == 2
    assert "y,x" in capsys.readouterr().err
    assert main(["viz", "rank", str(photo_file), "--model", "test_convnext", "--level", "9", "-o", out]) == 2
    assert "level 9" in capsys.readouterr().err
    assert main(["viz", "rank", str(photo_file), "--model", "nonexistent_net", "-o", out]) == 2
    assert "Unknown model" in capsys.readouterr().err
