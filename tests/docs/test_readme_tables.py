"""README tables against what generates them: `linvit models --markdown`, the accuracy benchmark's RESULTS.md, the
config groups on disk, and the files of a run directory.

The MACs table had drifted from `linvit models --markdown` (linvit_tiny 4.52 vs 4.30 GMACs at 224; flatten_swin_tiny
98.96 vs 96.12 at 1024) without any test noticing.
"""

from __future__ import annotations

import re

import pytest
from readme import REPO, markdown_table, readme_text

MODELS_HEADER = "| model | params (M) |"


def _models_rows() -> list[list[str]]:
    return markdown_table(MODELS_HEADER)[1:]


def test_models_table_lists_every_model_with_its_parameters_and_published_accuracy():
    """The cheap columns, in the default tier (parameters on the meta device, the top-1 from the cfgs)."""
    from linvit.commands.models import linvit_model_names, model_params, published_top1

    rows = _models_rows()
    names = [row[0].strip("`") for row in rows]
    assert names == linvit_model_names(), "run `linvit models --markdown` and paste its table into README.md"
    for name, row in zip(names, rows):
        assert row[1] == f"{model_params(name) / 1e6:.1f}", name
        top1 = published_top1(name)
        assert row[4] == (f"{top1:.1f}" if top1 is not None else "—"), name


@pytest.mark.slow  # counts the MACs of every model at 224 and 1024: ~1.5 min on 2 cores
def test_models_table_is_what_linvit_models_markdown_prints(capsys):
    from linvit.cli import main as linvit_main

    assert linvit_main(["models", "--markdown"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    text = readme_text().splitlines()
    start = text.index(next(line for line in text if line.startswith(MODELS_HEADER)))
    assert text[start : start + len(printed)] == printed, "paste the output of `linvit models --markdown`"


@pytest.mark.slow
def test_the_note_under_the_models_table_counts_the_384_models_at_384():
    from linvit.commands.models import model_macs

    note = re.search(r"at their native\s+384 they count ([\d.]+) and ([\d.]+) GMACs", readme_text())
    assert note, "the note under the models table"
    for name, stated in zip(("flatten_swin_base_patch4_384", "flatten_cswin_base_384"), note.groups()):
        assert f"{model_macs(name, (384,))[0] / 1e9:.1f}" == stated, name


def test_accuracy_table_is_the_benchmark_results():
    """Each README row restates a row of benchmarks/accuracy/RESULTS.md (written by its run, never by hand)."""
    results = (REPO / "benchmarks" / "accuracy" / "RESULTS.md").read_text()
    written = {row[0]: row for row in markdown_table("| run |", results)[1:]}
    rows = markdown_table("| recipe |")[1:]
    assert rows
    for row in rows:
        recipe = re.match(r"`([^`]+)`", row[0]).group(1)
        for cell, model in ((row[1], "linvit_nano"), (row[2], "efficientvit_b0")):
            name = f"{recipe.removesuffix('_linvit_nano')}_{model}"
            source = written[name]
            top1, ema, minutes = re.fullmatch(r"([\d.]+%) \(EMA ([\d.]+%)\), ([\d.]+ min)", cell).groups()
            assert (top1, ema, minutes) == (source[2], source[3], source[5]), name


def test_folder_accuracy_table_is_the_benchmark_results():
    """Each cell of the README's folder table is a mean of RESULTS.md's seeds table, or (marked "seed 0") a row of
    its first table, and its rule cell the `best.ckpt` rule of those runs ("X / Y" where the two models' differ):
    the README restates the benchmark, never a number of its own."""
    results = (REPO / "benchmarks" / "accuracy" / "RESULTS.md").read_text()
    first = {row[0]: row for row in markdown_table("| run |", results)[1:]}
    means = {row[0]: row[3] for row in markdown_table("| run | seeds |", results)[1:]}
    rows = markdown_table("| folder set |")[1:]
    assert len(rows) >= 5
    for row in rows:
        folder_set = re.match(r"`([^`]+)`", row[0]).group(1)
        rules = []
        for cell, model in ((row[1], "linvit_nano"), (row[2], "resnet18")):
            run = f"folder_{folder_set}_{model}"
            value, seed0 = re.fullmatch(r"(?:\*\*)?([\d.]+%)( \(seed 0\))?(?:\*\*)?", cell).groups()
            assert value == (first[run][2] if seed0 else means[run]), run
            rules.append(first[run][-1])
        assert row[3] == (rules[0] if rules[0] == rules[1] else " / ".join(rules)), folder_set


def test_the_checkpoint_rule_figures_are_the_benchmark_rules_table():
    """The README's figures for the within-one-error rule restate RESULTS.md's checkpoint rules table."""
    results = (REPO / "benchmarks" / "accuracy" / "RESULTS.md").read_text()
    table = markdown_table("| run (seeds) |", results)
    column = table[0].index("within one error")
    rule = {row[0].split(" (")[0]: row[column] for row in table[1:]}
    text = " ".join(readme_text().split())
    for folder_set in ("digits_3x40", "digits_10", "fashion_mnist_3x40", "wallpapers_11x60"):
        linvit_nano, resnet18 = rule[f"{folder_set}_linvit_nano"], rule[f"{folder_set}_resnet18"]
        pair = f"`{folder_set}`( reads)?( \\(seed 0\\))? {linvit_nano} / {resnet18}%"
        assert re.search(pair, text), pair
    mean_row = next(row for row in table if row[0] == "mean (runs)")
    highest, within = (float(mean_row[table[0].index(name)].split()[0]) for name in ("highest", "within one error"))
    assert f"gains {within - highest:.2f} points" in text


def test_config_groups_table_names_the_options_on_disk():
    from linvit.train.runs.hydra_app import config_dir

    rows = {row[0].strip("`"): row[1] for row in markdown_table("| group | options |")[1:]}
    for group, options in rows.items():
        on_disk = {path.stem for path in (config_dir() / group).glob("*.yaml")}
        named = set(re.findall(r"`([a-z0-9_]+)`", re.sub(r"\([^()]*\)", "", options)))  # not in the comments
        assert named <= on_disk, f"{group}: the README names {sorted(named - on_disk)}, which are not configs"
        if group.rstrip("/") in ("data", "trainer", "logger", "experiment"):
            assert on_disk <= named, f"{group}: {sorted(on_disk - named)} missing from the README's table"
