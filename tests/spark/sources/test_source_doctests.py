"""Every docstring example of the sources package runs (testpaths collect only the
core's): the label contract, record kinds, late policies, retention, metrics."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import lowtide.spark.sources as sources

MODULES = sorted(m.name for m in pkgutil.iter_modules(sources.__path__, "lowtide.spark.sources."))


def test_every_example_of_the_sources_package_passes() -> None:
    attempted = {}
    for name in MODULES:
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0, name
        attempted[name.rsplit(".", 1)[1]] = result.attempted
    assert all(attempted[m] for m in ("labels", "records", "lateness", "retention",
                                      "front_metrics", "ingest")), attempted
