import os
import sys
import time
from pathlib import Path

import pytest

# Benchmarks and tests share small multi-op kernels; a spinning OpenMP wait policy makes them crawl on shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Without a GPU the Triton kernels are tested through Triton's CPU interpreter, which must be switched on before any
# kernel is defined (`triton.jit` reads it at decoration). On a CUDA machine the same tests run the compiled kernels.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # The tests run in pytest-xdist's worker processes (`-n auto` in pyproject's addopts); each takes its share of the
    # cores, so that the workers' torch threads together do not outnumber them.
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if _workers > 1:
        _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, _cores // _workers))
except ImportError:  # pragma: no cover - torch is a dependency
    pass

# Test file names repeat across folders (tests/attention/test_export.py, tests/commands/test_export.py), so pytest
# imports them with --import-mode=importlib, which puts no test folder on sys.path. Helper modules that live beside
# their tests (e.g. tests/train/train_helpers.py) stay importable by name through this.
_TESTS = Path(__file__).resolve().parent
for _folder in sorted(p for p in _TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
    sys.path.insert(0, str(_folder))
sys.path.insert(0, str(_TESTS))
# The repository root, for what lives beside the package and is not installed (benchmarks/, train.py): plain `pytest`
# does not put the working directory on sys.path, `python -m pytest` does.
sys.path.insert(0, str(_TESTS.parent))


# CI (.ci/run) is killed at a hard time limit, and a slow or busy machine can reach it inside the slow tier: a killed
# run reports nothing and lands nothing. So .ci/run gives that tier a deadline, LINVIT_TEST_DEADLINE (seconds since
# the epoch), early enough for the longest test to end before the limit. A test that would start after it is skipped
# with the reason below, and the summary counts what was left out. Unset (a developer's run), every test runs.
DEADLINE_REASON = "CI's time budget for this tier was spent before this test (LINVIT_TEST_DEADLINE); run it by hand"


def _deadline() -> float | None:
    value = os.environ.get("LINVIT_TEST_DEADLINE", "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise pytest.UsageError(
            f"LINVIT_TEST_DEADLINE={value!r} is not a number: give seconds since the epoch, as $(($(date +%s) + 3600))"
        ) from None


def pytest_configure(config):
    _deadline()  # a bad value stops the run once, before collection, instead of erroring every test


def pytest_runtest_setup(item):
    deadline = _deadline()
    if deadline is not None and time.time() > deadline:
        pytest.skip(DEADLINE_REASON)
