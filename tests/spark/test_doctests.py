"""The examples in the Spark layer's docstrings (testpaths only collect the core's)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", [
    "lowtide.spark.tracking.column",
    "lowtide.spark.tracking.key_ranges",
    "lowtide.spark.sources.ingest",
    "lowtide.spark.sources.generator",
    "lowtide.spark.operators.windows",
])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
