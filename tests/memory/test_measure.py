"""Predicted against measured: every family within 15% of the peak a real run reaches (CPU, peak RSS).

Default tier: each family's smallest model at 224×224, inference and training, all measured in one child process
that runs while the dry runs are computed. Slow tier: 224, 512 and 1024 (the table in docs/memory.md).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from timm.models import model_entrypoint

from linvit.commands.models import linvit_model_names
from linvit.memory import estimate_memory
from linvit.memory.measure import measure_runs
from linvit.memory.sweep import compare

TOLERANCE = 0.15
# each family's smallest model (linvit.memory.sweep.family_models computes it; listed here to spare the tests
# building every model); test_every_family_is_covered keeps the list complete
FAMILIES = {
    "flatten_cswin": "flatten_cswin_tiny_224",
    "flatten_deit": "flatten_deit_tiny_patch16_224",
    "flatten_pvt": "flatten_pvt_tiny",
    "flatten_pvt_v2": "flatten_pvt_v2_b0",
    "flatten_swin": "flatten_swin_tiny_patch4_224",
    "linvit": "linvit_nano",
}
CASES = [(model, train) for model in FAMILIES.values() for train in (False, True)]
SIZE = 224


def test_every_family_is_covered():
    families = {model_entrypoint(name).__module__.rsplit(".", 1)[1] for name in linvit_model_names()}
    assert families == set(FAMILIES)


@pytest.fixture(scope="module")
def measurements():
    runs = [{"model": model, "height": SIZE, "width": SIZE, "train": train} for model, train in CASES]
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(measure_runs, runs, timeout=900)


@pytest.mark.parametrize("model, train", CASES, ids=[f"{m}-{'train' if t else 'infer'}" for m, t in CASES])
def test_prediction_within_15_percent_of_measured(model, train, measurements):
    predicted = estimate_memory(model, SIZE, SIZE, train=train).peak_bytes
    measured = measurements.result()[CASES.index((model, train))].peak_bytes
    assert abs(predicted / measured - 1) <= TOLERANCE, f"predicted {predicted} bytes, measured {measured}"


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(FAMILIES.values()))
def test_full_sweep_within_15_percent(model):
    rows = compare([model], [224, 512, 1024])
    wrong = [(row.size, row.train, f"{row.error:+.1%}") for row in rows if abs(row.error) > TOLERANCE]
    assert wrong == []
