"""lowtide: exact progress tracking for streaming pipelines.

``lowtide.Front`` and ``lowtide.Pipeline`` are loaded on first use, so the core
imports without pyspark.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Front", "Pipeline"]

_LAZY = {
    "Front": ("lowtide.spark.front", "Front"),
    "Pipeline": ("lowtide.spark.pipeline", "Pipeline"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lowtide' has no attribute {name!r}")
