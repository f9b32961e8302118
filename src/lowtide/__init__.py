"""lowtide: exact progress tracking for streaming pipelines.

``lowtide.Pipeline`` describes a tracked PySpark pipeline, ``lowtide.Front`` labels
records where they enter; see docs/spark.md. They load on first use, so the core
imports without pyspark. Every error lowtide raises on purpose is a
``lowtide.LowtideError`` (and keeps its builtin parent, e.g. ``ValueError``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["Front", "LowtideError", "Pipeline", "apply_changelog", "read_complete"]
__version__ = "0.2.0.dev0"  # the one place: pyproject.toml reads it; see CHANGELOG.md


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``table[name]`` on first use
    (and keeps it), so importing a package costs only what is used."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(package)
        value = getattr(importlib.import_module(table[name]), name)
        setattr(module, name, value)
        return value

    return __getattr__


__getattr__ = lazy_exports(__name__, {
    "Front": "lowtide.spark.sources.front",
    "LowtideError": "lowtide.core.errors",
    "Pipeline": "lowtide.spark.pipeline.builder",
    "apply_changelog": "lowtide.spark.sinks.changelog",
    "read_complete": "lowtide.spark.sinks.cuts",
})
