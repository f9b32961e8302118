"""The examples in the producer-side modules' docstrings (testpaths collect only the
core's)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", [
    "lowtide.spark.sources.labels",
    "lowtide.spark.sources.records",
    "lowtide.spark.sources.lateness",
    "lowtide.spark.sources.retention",
    "lowtide.spark.sources.front_metrics",
])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
