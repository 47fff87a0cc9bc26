"""The largest size and batch under a budget: the search on known functions, then on a model's dry runs."""

import pytest

from linvit.memory import estimate_memory
from linvit.memory.fit import _LARGEST, _largest_step, largest_batch, largest_size


def _search(peak, budget, anchor=8):
    calls = []

    def counted(n):
        calls.append(n)
        return peak(n)

    return _largest_step(counted, budget, float, anchor), calls


@pytest.mark.parametrize("budget", [1000, 12_345, 400_000])
def test_linear_peak_is_found_in_a_few_steps(budget):
    (found, runs, capped), calls = _search(lambda n: 100 + 7 * n, budget)
    assert found == (budget - 100) // 7 and not capped
    assert runs == len(set(calls)) <= 4  # 1, the anchor, and the two around the linear fit's answer


def test_curved_peak_is_found_by_bisection():
    def peak(n):
        return 50 + n * n  # not linear: the fit overshoots, the bisection settles it

    (found, _, _), _ = _search(peak, 10_000)
    assert peak(found) <= 10_000 < peak(found + 1)


def test_nothing_fits_and_everything_fits():
    assert _search(lambda n: 10 + n, 5)[0][0] == 0
    found, _, capped = _search(lambda n: 1, 10)[0]
    assert found == _LARGEST and capped


def test_largest_size_fits_and_the_next_step_does_not():
    budget = estimate_memory("linvit_nano", 1024, 768).peak_bytes
    fit = largest_size("linvit_nano", budget, aspect=(1024, 768))
    assert fit.estimate.peak_bytes <= budget and not fit.capped
    assert (fit.estimate.height, fit.estimate.width) == (1024, 768)  # 256 px steps, no stage padded
    larger = estimate_memory("linvit_nano", 1024 + 256, 768 + 256)
    assert larger.peak_bytes > budget
    assert fit.dry_runs <= 5


def test_largest_batch():
    two = estimate_memory("linvit_nano", 256, 256, batch=2)
    three = estimate_memory("linvit_nano", 256, 256, batch=3)
    fit = largest_batch("linvit_nano", (two.peak_bytes + three.peak_bytes) // 2, 256, 256)
    assert fit.estimate.batch == 2


def test_a_budget_below_the_smallest_input():
    fit = largest_size("linvit_nano", 1024, aspect=(1, 1))
    assert fit.estimate is None and fit.dry_runs == 1
