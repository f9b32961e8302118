"""The examples in the wire, service and bench docstrings (the project's doctest run covers
only the core)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "lowtide.wire.codec",
    "lowtide.wire.frames",
    "lowtide.wire.log",
    "lowtide.service.auth",
    "lowtide.service.engine.coordinator",
    "lowtide.service.engine.dedup",
    "lowtide.service.logs",
    "lowtide.service.progress",
    "lowtide.service.server.admission",
    "lowtide.service.server.history",
    "lowtide.service.web.view",
    "lowtide.bench.stats",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0
