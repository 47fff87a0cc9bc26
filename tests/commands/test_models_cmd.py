"""`linvit models`: the list of registered linvit models, their sizes, MACs and the README table."""

import timm

from linvit.cli import main
from linvit.commands.models import linvit_model_names, model_macs, top1_in_texts
from linvit.utils import count_macs, count_params


def test_lists_every_linvit_model_with_params(capsys):
    assert main(["models", "--pattern", "linvit_*"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line.split()[0]: float(line.split()[1]) for line in lines[1:]}
    assert set(rows) == set(timm.list_models("linvit_*"))
    assert abs(rows["linvit_tiny"] - count_params(timm.create_model("linvit_tiny", device="meta")) / 1e6) < 0.01


def test_only_linvit_registered_models_are_listed():
    names = linvit_model_names()
    assert "linvit_nano" in names
    assert "resnet50" not in names and "swin_tiny_patch4_window7_224" not in names
    assert all(timm.models.model_entrypoint(n).__module__.startswith("linvit.") for n in names)


def test_unmatched_pattern_fails(capsys):
    assert main(["models", "--pattern", "no_such_model*"]) == 1
    assert "no linvit model matches" in capsys.readouterr().out


def test_fake_tensor_macs_equal_a_real_forward():
    real = count_macs(timm.create_model("linvit_nano").eval(), (3, 224, 224))
    fake_224, fake_320 = model_macs("linvit_nano", (224, 320))
    # equal up to the small softmax-attention products, which the flop counter sees or not depending on the SDPA
    # kernel the attention dispatches to (fused CPU kernel, math decomposition): within 1%
    assert abs(fake_224 - real) <= 0.01 * real
    assert fake_320 > fake_224


def test_macs_columns(capsys):
    assert main(["models", "--pattern", "linvit_nano", "--macs"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "GMACs@224" in out[0] and "GMACs@1024" in out[0]
    name, params, macs224, macs1024 = out[1].split()
    assert name == "linvit_nano"
    assert float(macs1024) > 15 * float(macs224)  # ~ (1024/224)^2 = 20.9x for a linear-cost model


def test_markdown_table(capsys):
    assert main(["models", "--pattern", "linvit_nano", "--markdown"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| model | params (M) | GMACs @224 | GMACs @1024 |")
    assert lines[2].startswith("| `linvit_nano` | 2.1 |")
    assert lines[2].rstrip().endswith("| — |")  # no published accuracy for linvit's own models


def test_published_top1_parsing():
    assert top1_in_texts(["FLatten-Swin-T: 29.2M params, 4.48G MACs, 82.1% ImageNet-1k top-1 (Swin-T 81.3)"]) == 82.1
    assert top1_in_texts(["ImageNet-1k top-1 83.5; weights: https://example.org"]) == 83.5
    assert top1_in_texts(["paper: 6.1M params, 1.1G MACs, 74.1% top-1"]) == 74.1
    assert top1_in_texts(["no accuracy here", ""]) is None
