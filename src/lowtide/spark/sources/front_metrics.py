"""Prometheus metrics of the fronts in a producer process: what each front labelled,
wrote, clamped, rejected or refused as late, and what it still has in flight.

The producer exposes them with its own registry or server (e.g.
``prometheus_client.start_http_server``); values are read from ``Front.status()`` on
each scrape, so the fronts keep no metrics state of their own.

>>> from prometheus_client import CollectorRegistry, generate_latest
>>> class Stub:
...     def status(self):
...         return {"front": 1, "labelled": 5, "written": 4, "late_clamped": 1,
...                 "late_rejected": 0, "late_raised": 0, "out_of_range": 0, "in_flight": 1,
...                 "last_heartbeat": 7}
>>> registry = CollectorRegistry()
>>> _ = FrontCollector([Stub()], registry)
>>> text = generate_latest(registry).decode()
>>> 'lowtide_front_records_total{front="1",outcome="late_clamped"} 1.0' in text
True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["OUTCOMES", "FrontCollector"]

OUTCOMES = ("labelled", "written", "late_clamped", "late_rejected", "late_raised",
            "out_of_range")


class FrontCollector:
    """Collects ``fronts``' counts into ``registry`` (``lowtide_front_*`` series)."""

    def __init__(self, fronts: Sequence[Any], registry: CollectorRegistry) -> None:
        self.fronts = list(fronts)
        registry.register(self)

    def collect(self) -> Iterator[Any]:
        records = CounterMetricFamily(
            "lowtide_front_records", "records a front was given, by what became of them",
            labels=["front", "outcome"])
        in_flight = GaugeMetricFamily(
            "lowtide_front_in_flight_records",
            "records labelled and acked but not yet confirmed written", labels=["front"])
        heartbeat = GaugeMetricFamily(
            "lowtide_front_heartbeat_slot", "the front's last promise (a time slot)",
            labels=["front"])
        for front in self.fronts:
            status = front.status()
            name = str(status["front"])
            for outcome in OUTCOMES:
                records.add_metric([name, outcome], status[outcome])
            in_flight.add_metric([name], status["in_flight"])
            heartbeat.add_metric([name], status["last_heartbeat"])
        yield from (records, in_flight, heartbeat)
