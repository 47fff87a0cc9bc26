"""The slow tier's deadline in CI (tests/conftest.py): past it a test is skipped and says why; before it, or unset,
every test runs; a value that is not a time is a usage error, not a silent run of everything."""

import time

import conftest
import pytest


def test_a_test_after_the_deadline_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setenv("LINVIT_TEST_DEADLINE", str(time.time() - 1))
    with pytest.raises(pytest.skip.Exception, match="time budget"):
        conftest.pytest_runtest_setup(None)


@pytest.mark.parametrize("seconds_left", [None, 3600], ids=["unset", "an_hour_left"])
def test_a_test_before_the_deadline_or_without_one_runs(monkeypatch, seconds_left):
    monkeypatch.delenv("LINVIT_TEST_DEADLINE", raising=False)
    if seconds_left is not None:
        monkeypatch.setenv("LINVIT_TEST_DEADLINE", str(time.time() + seconds_left))
    conftest.pytest_runtest_setup(None)  # no skip


def test_an_empty_deadline_is_unset(monkeypatch):
    monkeypatch.setenv("LINVIT_TEST_DEADLINE", " ")
    conftest.pytest_runtest_setup(None)  # no skip


def test_a_deadline_that_is_not_a_time_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("LINVIT_TEST_DEADLINE", "90min")
    with pytest.raises(pytest.UsageError, match="seconds since the epoch"):
        conftest.pytest_runtest_setup(None)
