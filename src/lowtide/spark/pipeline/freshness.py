"""Windows later than their SLA, as listener events: ``Pipeline(sla="30 seconds")``
makes the tracker watch every sink's windows (``sla_window``, 1 s by default); a
:class:`FreshnessListener` turns each late one into ``onWindowLate`` (once per window),
next to the completeness events of
:class:`~lowtide.spark.pipeline.monitoring.CompletenessListener`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowtide.spark.pipeline.monitoring import CompletenessListener

__all__ = ["FreshnessListener", "WindowLate"]


@dataclass(frozen=True)
class WindowLate:
    """The sink's window [start_ms, end_ms) was not complete ``late_ms`` past its SLA;
    ``held_by`` names what held it (front, segment, batch); ``text`` is the line the
    tracker logged; ``eta_ms`` its estimate then (None: a dead front holds it)."""

    query_id: str
    sink: str
    start_ms: int
    end_ms: int
    late_ms: int
    eta_ms: int | None
    held_by: str
    text: str


class FreshnessListener(CompletenessListener):
    """A :class:`CompletenessListener` that also calls :meth:`onWindowLate` for every
    window of the tracker's sinks that became later than the pipeline's SLA (the
    tracker needs ``sla=``: ``Pipeline(spark, name, sla="30 seconds")`` or ``lowtide
    serve --sla-s 30``)."""

    def __init__(self, query: Any, window_ms: int | None = None,
                 segment: str | None = None, since_ms: int | None = None) -> None:
        super().__init__(query, window_ms, segment, since_ms)
        self._late_seen: set[tuple[str, int]] = set()

    def onWindowLate(self, event: WindowLate) -> None:
        """Override: a window is later than its SLA."""

    def check(self) -> None:
        super().check()
        doc = self.query.pipeline.tracker.status()
        for w in (doc.get("freshness") or {}).get("late", []):
            key = (w["sink"], int(w["start_ms"]))
            with self._lock:
                if key in self._late_seen:
                    continue
                self._late_seen.add(key)
            self.onWindowLate(WindowLate(self.query.id, w["sink"], int(w["start_ms"]),
                                         int(w["end_ms"]), int(w["late_ms"]), w["eta_ms"],
                                         w["held_by"], w["text"]))
