"""`linvit extract`: images of different sizes in one call, safetensors keys/metadata, PCA PNGs, clear errors."""

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.cli import main
from linvit.dense import create_feature_backbone
from linvit.dense.extract import image_to_tensor, load_features, load_image, parse_size, unique_stems


@pytest.fixture
def two_images(tmp_path):
    rng = np.random.default_rng(0)
    first = tmp_path / "wide.png"
    second = tmp_path / "tall.jpg"
    Image.fromarray(rng.integers(0, 255, (40, 70, 3), dtype=np.uint8)).save(first)
    Image.fromarray(rng.integers(0, 255, (66, 34, 3), dtype=np.uint8)).save(second)
    return [str(first), str(second)]


def test_extract_mixed_sizes_native(tmp_path, two_images):
    out = tmp_path / "out"
    assert main(["extract", *two_images, "--model", "test_convnext", "-o", str(out), "--no-progress"]) == 0
    features, metadata = load_features(out / "features.safetensors")
    assert set(features) == {"wide", "tall"}
    assert metadata["model"] == "test_convnext" and metadata["strides"] == [4, 8, 16, 32]
    assert metadata["images"]["tall"]["input_size"] == [66, 34]
    # each image at its own size (ConvNeXt's unpadded stride-4 stem floors the sizes)
    for stem, source in zip(("wide", "tall"), two_images):
        levels = features[stem]
        image = load_image(source)
        assert [tuple(f.shape[1:]) for f in levels][0] == (image.shape[0] // 4, image.shape[1] // 4)
        assert [f.shape[0] for f in levels] == metadata["channels"]
        assert (out / f"{stem}_pca.png").is_file()
        with Image.open(out / f"{stem}_pca.png") as png:
            assert png.size[0] > png.size[1]  # one row: image + 4 levels


def test_extract_matches_backbone_forward_and_size_option(tmp_path, two_images):
    out = tmp_path / "sized"
    torch.manual_seed(123)
    args = ["extract", *two_images, "--model", "test_convnext", "-o", str(out), "--size", "32x48"]
    assert main([*args, "--no-png", "--no-progress", "--batch-size", "2"]) == 0
    features, metadata = load_features(out / "features.safetensors")
    assert metadata["images"]["wide"]["original_size"] == [40, 70]
    assert metadata["images"]["wide"]["input_size"] == [32, 48]
    torch.manual_seed(123)
    backbone = create_feature_backbone("test_convnext").eval()
    mean, std = metadata["mean"], metadata["std"]
    batch = torch.stack([image_to_tensor(load_image(p), mean, std, (32, 48)) for p in two_images])
    with torch.no_grad():
        expected = backbone(batch)
    for row, stem in enumerate(("wide", "tall")):
        for level, reference in zip(features[stem], expected):
            torch.testing.assert_close(level, reference[row], atol=1e-5, rtol=1e-4)
    assert not list(out.glob("*.png"))


def test_extract_errors(tmp_path, two_images, capsys):
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    assert main(["extract", str(tmp_path / "missing.png"), "--model", "test_convnext", "-o", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["extract", str(not_image), "--model", "test_convnext", "-o", str(tmp_path)]) == 2
    assert f"cannot read image '{not_image}'" in capsys.readouterr().err
    assert main(["extract", two_images[0], "--model", "linvit_tinyy", "-o", str(tmp_path)]) == 2
    assert "Unknown model" in capsys.readouterr().err
    assert main(["extract", two_images[0], "--model", "test_convnext", "--size", "12xa"]) == 2
    assert "HxW" in capsys.readouterr().err


def test_helpers():
    assert parse_size("1600x2560") == (1600, 2560) and parse_size("64") == (64, 64) and parse_size(None) is None
    assert unique_stems(["a/x.png", "b/x.png", "y.jpg", "skimage:astronaut"]) == ["x", "x-1", "y", "astronaut"]


def test_extract_real_photo_high_resolution(tmp_path):
    """A real 2560×1600 photo (KDE wallpaper) at native size through a small backbone."""
    from pathlib import Path

    photo = Path("/usr/share/wallpapers/Kite/contents/images/2560x1600.jpg")
    if not photo.is_file():
        pytest.skip("needs the KDE wallpapers: apt-get install -y --no-install-recommends plasma-workspace-wallpapers")
    out = tmp_path / "photo"
    assert main(["extract", str(photo), "--model", "test_convnext", "-o", str(out), "--no-progress"]) == 0
    features, _ = load_features(out / "features.safetensors")
    assert [tuple(f.shape[1:]) for f in features["2560x1600"]] == [(400, 640), (200, 320), (100, 160), (50, 80)]


def test_extract_skimage_photo(tmp_path):
    pytest.importorskip("skimage", reason="scikit-image photos need: pip install 'linvit[photos]'")
    out = tmp_path / "astro"
    assert main(["extract", "skimage:astronaut", "--model", "test_convnext", "-o", str(out), "--no-progress"]) == 0
    assert (out / "astronaut_pca.png").is_file()


def test_extract_linvit_nano_odd_size(tmp_path, two_images):
    """linvit's own backbone at sizes that are not multiples of its strides: maps are ceil(size / stride)."""
    out = tmp_path / "nano"
    assert main(["extract", two_images[0], "--model", "linvit_nano", "-o", str(out), "--no-progress", "--no-png"]) == 0
    features, metadata = load_features(out / "features.safetensors")
    assert metadata["strides"] == [4, 8, 16, 32]
    sizes = [tuple(f.shape[1:]) for f in features["wide"]]
    assert sizes == [(-(-40 // s), -(-70 // s)) for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(f).all() for f in features["wide"])


def test_extract_with_checkpoint(tmp_path, two_images):
    """--checkpoint loads the weights (a Lightning-style 'model.' prefix included) before extracting."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(7)
    source = timm.create_model("test_convnext", num_classes=3).eval()
    checkpoint = tmp_path / "trained.safetensors"
    save_file({f"model.{k}": v.contiguous() for k, v in source.state_dict().items()}, str(checkpoint))
    out = tmp_path / "ckpt"
    args = ["extract", two_images[0], "--model", "test_convnext", "--checkpoint", str(checkpoint), "-o", str(out)]
    assert main([*args, "--no-png", "--no-progress"]) == 0
    features, metadata = load_features(out / "features.safetensors")
    assert metadata["checkpoint"] == str(checkpoint)
    tensor = image_to_tensor(load_image(two_images[0]), metadata["mean"], metadata["std"])
    with torch.no_grad():
        expected = source.forward_intermediates(tensor[None], intermediates_only=True)
    for level, reference in zip(features["wide"], expected):
        torch.testing.assert_close(level, reference[0], atol=1e-5, rtol=1e-4)
