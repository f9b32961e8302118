"""lowtide's Python data sources: registered with a session once, and the schema of
a source read without asking Spark (which would start a Python process for it)."""

from __future__ import annotations

import threading
from typing import Any

from lowtide.spark.operators.window_input import ReceivingSource
from lowtide.spark.sources.clock import ClockSource
from lowtide.spark.sources.generator import GenSource
from lowtide.spark.sources.log_replay import LogReplaySource
from lowtide.spark.sources.log_source import LogSource

_SOURCES = {ds.name(): ds for ds in (LogSource, LogReplaySource, GenSource, ReceivingSource)}
_REGISTERED: set[int] = set()
_REG_LOCK = threading.Lock()


def register_sources(spark: Any) -> None:
    """Register lowtide's Python data sources with ``spark`` (once per session)."""
    with _REG_LOCK:
        if id(spark) in _REGISTERED:
            return
        for ds in (LogSource, LogReplaySource, GenSource, ClockSource,
                   ReceivingSource):
            spark.dataSource.register(ds)
        _REGISTERED.add(id(spark))


def source_schema(fmt: str, options: dict[str, str]) -> Any:
    """The schema the source ``fmt`` gives with ``options``, computed here."""
    return _SOURCES[fmt](options).schema()
