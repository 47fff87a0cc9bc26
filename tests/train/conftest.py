"""Fixtures of the training tests."""

from __future__ import annotations

import pytest
from train_helpers import FAST, TINY_TIMM


@pytest.fixture
def tiny_overrides():
    return [*TINY_TIMM, *FAST]
