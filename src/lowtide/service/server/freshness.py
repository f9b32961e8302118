"""The server's SLA watch: on each metrics refresh, the sinks' windows later than the
SLA are logged (one line each, naming what holds them back), counted in the metrics
and listed in the status (``freshness``: the open windows with their ETA, and the
latest late windows), where a Spark listener turns them into ``onWindowLate`` events."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.service.freshness import Freshness, OpenWindow, Sla
from lowtide.service.logs import LogBudget
from lowtide.service.server.metrics import ServerMetrics

log = logging.getLogger("lowtide.service.freshness")

#: late windows the status keeps (the latest)
RECENT = 50


class SlaWatch:
    def __init__(self, sla: Sla) -> None:
        self.freshness = Freshness(sla)
        self.late: deque[dict[str, Any]] = deque(maxlen=RECENT)

    def check(self, status: dict[str, Any], graph: SegmentGraph, now_ms: int,
              metrics: ServerMetrics, budget: LogBudget) -> list[OpenWindow]:
        """Report the windows that became late since the last check (a few log lines a
        minute per sink, with a count of the rest: ``budget``)."""
        late = self.freshness.late(status, graph, now_ms)
        for w in late:
            budget.warn(log, ("late", w.sink), "window later than its SLA",
                        detail=w.describe(), sink=w.sink,
                        fix="see `lowtide status` (freshness): a lagging or dead front, a "
                            "slow batch, or stuck items hold it")
            self.late.append({**w.as_dict(), "text": w.describe()})
        open_now = self.freshness.open_windows(status, graph, now_ms)
        metrics.sla(len(late), max((w.late_ms for w in open_now), default=0))
        return late

    def document(self, status: dict[str, Any], graph: SegmentGraph) -> dict[str, Any]:
        sla = self.freshness.sla
        now = int(status.get("now_ms", 0))
        return {"sla_ms": sla.sla_ms, "window_ms": sla.window_ms,
                "open": [w.as_dict() for w in self.freshness.open_windows(status, graph, now)],
                "late": list(self.late)}
