"""Nyströmformer and Linformer in the operator suite (linvit.bench): built by their suite names with the modules'
defaults, and measurable forward and forward+backward (no timed assertions)."""

from __future__ import annotations

import pytest
import torch

from linvit.attention import LinformerAttention, NystromAttention
from linvit.bench.cases import OPERATORS, operator_cases
from linvit.bench.operators import build_operator, operator_callable


@pytest.mark.parametrize("name,kind", [("linvit_nystrom", NystromAttention), ("linvit_linformer", LinformerAttention)])
def test_the_suite_builds_and_runs_them(name, kind):
    assert name in OPERATORS
    assert isinstance(build_operator(name, 32, 2, (8, 8)), kind)
    for case in operator_cases([8], [(2, 16)], [name]):  # fwd and fwdbwd
        run, info = operator_callable(case, torch.device("cpu"), "fp32")
        run()
        assert info["tokens"] == 64
