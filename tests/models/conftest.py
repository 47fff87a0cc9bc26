"""Fixtures of the FLatten families' tests."""

from __future__ import annotations

import sys
import types

import pytest


@pytest.fixture
def fake_yacs(monkeypatch):
    """`yacs.config.CfgNode` stand-in, so the saved file pickles a config object as the authors' files do."""

    class CfgNode(dict):
        pass

    CfgNode.__module__ = "yacs.config"
    CfgNode.__qualname__ = "CfgNode"
    package, module = types.ModuleType("yacs"), types.ModuleType("yacs.config")
    module.CfgNode = CfgNode
    package.config = module
    monkeypatch.setitem(sys.modules, "yacs", package)
    monkeypatch.setitem(sys.modules, "yacs.config", module)
    return CfgNode
