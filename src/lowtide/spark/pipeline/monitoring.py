"""Progress in Spark's own tools: lowtide's figures in a query's
``StreamingQueryProgress``, and a ``StreamingQueryListener`` that turns them into
"window complete" and "segment stuck" events.

Observed metrics (``df.observe``) are the one place of a progress report that a
query's plan fills in, but Spark fixes their expressions when the query starts:
a literal or a session variable keeps its value of that moment in every later
batch (measured, PySpark 4.2). What moves is read at run time instead: a driver
thread (:class:`ProgressPublisher`) copies the tracker's figures into JVM system
properties every ``interval_s``, and the observed metrics read them with
``java_method('java.lang.System', 'getProperty', ...)`` while the batch's rows pass
(the largest value seen in the batch: min times only move forward, so that is the
latest; for the lag and the stuck windows it is the batch's worst). Tasks read the
properties of their own JVM, which is the driver's in local mode only: on a cluster
the executors' JVMs have none and the metrics are null there; the listener, which
asks the tracker from the driver, works everywhere.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from lowtide.core.graph import SegmentGraph
from lowtide.spark.pipeline.status import PipelineStatus, status_of
from lowtide.spark.tracking.column import TRACK_COL

__all__ = [
    "METRICS_NAME",
    "CompletenessListener",
    "ProgressMetrics",
    "ProgressPublisher",
    "SegmentStuck",
    "WindowComplete",
]

METRICS_NAME = "lowtide"
#: what a Pipeline's queries sample (1 row in 256): about 0.1 us a row instead of
#: 20 us for reading every row (BENCHMARKS.md, "Cost of the observed metrics")
PROGRESS_SAMPLE_BITS = 8
_STUCK = re.compile(r"segment (['\"])(?P<segment>.*)\1, slots \[(?P<start>\d+), (?P<end>\d+)\): "
                    r"(?P<what>.*)")


@dataclass(frozen=True)
class ProgressMetrics:
    """lowtide's observed metrics for one query: ``observe(df)`` on the DataFrame a
    sink writes, then ``build(pipeline)`` and ``start()`` the publisher that feeds
    them. ``key`` names the query among those of this driver (pipeline name and sink)."""

    key: str
    sink: str
    segments: tuple[str, ...]
    interval_s: float = 0.25
    #: read the figures on 1 row in 2**sample_bits (by the low bits of its ack id in
    #: ``lt_track``): each read is a reflective JVM call per figure, tens of
    #: microseconds per row for all of them (BENCHMARKS.md); 0: every row
    sample_bits: int = 0

    @classmethod
    def of(cls, pipeline_name: str, graph: SegmentGraph, sink: str,
           sample_bits: int = 0) -> ProgressMetrics:
        return cls(f"{pipeline_name}.{sink}", sink, tuple(graph.names),
                   sample_bits=sample_bits)

    def figures(self) -> tuple[str, ...]:
        """The metric names, as ``lastProgress["observedMetrics"]["lowtide"]`` shows them."""
        per_segment = tuple(f"min_time.{s}" for s in self.segments)
        return ("sink_min_time", "global_min_time", "sink_lag_ms", "stuck_windows",
                "fronts_refused", "fronts_waiting", *per_segment)

    def property_of(self, figure: str) -> str:
        return f"lowtide.{self.key}.{figure}"

    def observe(self, df: Any, name: Any = METRICS_NAME) -> Any:
        """``df`` with lowtide's figures as its observed metrics ``name`` (a string,
        or a ``pyspark.sql.Observation`` for a batch DataFrame)."""
        from pyspark.sql import functions as F

        sampled = None
        if self.sample_bits and TRACK_COL in df.columns:
            # CASE WHEN evaluates its value only where the condition holds
            mask = (1 << self.sample_bits) - 1
            sampled = F.col(TRACK_COL).bitwiseAND(mask) == 0

        def read(figure: str) -> Any:
            prop = F.java_method(F.lit("java.lang.System"), F.lit("getProperty"),
                                 F.lit(self.property_of(figure)))
            # a property not (yet) published reads as the string "null": ANSI's cast
            # would fail the query; try_cast makes it a null figure
            value = prop.try_cast("long")
            return F.max(value if sampled is None else F.when(sampled, value)).alias(figure)

        return df.observe(name, *(read(f) for f in self.figures()))

    def values(self, status: PipelineStatus) -> dict[str, int]:
        """The figures of a tracker status (a figure it lacks is left out)."""
        by_name = {s.segment: s for s in status.segments}
        out = {"global_min_time": status.global_min, "stuck_windows": len(status.stuck),
               "fronts_refused": status.fronts_refused,
               "fronts_waiting": len(status.waiting_fronts)}
        sink = by_name.get(self.sink)
        if sink is not None:
            out["sink_min_time"] = sink.min_time
            if sink.lag_ms is not None:
                out["sink_lag_ms"] = sink.lag_ms
        for name in self.segments:
            if name in by_name:
                out[f"min_time.{name}"] = by_name[name].min_time
        return out

    def build(self, pipeline: Any) -> ProgressPublisher:
        return ProgressPublisher(self, pipeline)


class ProgressPublisher:
    """A driver thread that copies a pipeline's figures into the JVM's system
    properties, where :meth:`ProgressMetrics.observe`'s metrics read them."""

    def __init__(self, metrics: ProgressMetrics, pipeline: Any) -> None:
        self.metrics = metrics
        self._pipeline = pipeline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: dict[str, int] = {}

    def publish(self) -> None:
        """Copy the tracker's current figures once: those that changed (each is a
        Py4J call: 40-60 us of the driver's Python CPU, measured)."""
        handle = self._pipeline.tracker
        status = status_of(handle.status(), handle.grid, graph=handle.graph)
        system = self._pipeline.spark.sparkContext._jvm.java.lang.System
        for figure, value in self.metrics.values(status).items():
            if self._published.get(figure) != value:
                system.setProperty(self.metrics.property_of(figure), str(value))
                self._published[figure] = value

    def start(self) -> ProgressPublisher:
        self._thread = threading.Thread(target=self._run, name="lowtide-progress", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            # a tracker or JVM going away means the query stops next: keep quiet till then
            with contextlib.suppress(Exception):
                self.publish()
            self._stop.wait(self.metrics.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


@dataclass(frozen=True)
class WindowComplete:
    """Every row of ``segment`` with a time in [start_ms, end_ms) has left it (the sink:
    is committed)."""

    query_id: str
    segment: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class SegmentStuck:
    """A tracking window of ``segment`` stays incomplete past its bound: ``what`` says
    how many items are missing or extra; ``text`` is the tracker's line."""

    query_id: str
    segment: str
    start_slot: int
    end_slot: int
    what: str
    text: str


def _stuck_event(query_id: str, text: str) -> SegmentStuck:
    m = _STUCK.fullmatch(text)
    if m is None:
        return SegmentStuck(query_id, "", 0, 0, text, text)
    return SegmentStuck(query_id, m["segment"], int(m["start"]), int(m["end"]), m["what"], text)


class CompletenessListener(StreamingQueryListener):
    """A ``StreamingQueryListener`` for one tracked query: on each of its progress (and
    idle) events it asks the tracker and calls ``onWindowComplete`` for every window of
    ``window_ms`` that the sink completed since the last call (from ``since_ms``'s
    window, or else from what the first call saw), and ``onSegmentStuck`` once for
    every newly stuck window. Override
    those two (and any of Spark's own ``on...`` methods) and register it like any
    listener: ``spark.streams.addListener(MyListener(query, window_ms=2000))``."""

    def __init__(self, query: Any, window_ms: int | None = None,
                 segment: str | None = None, since_ms: int | None = None) -> None:
        super().__init__()
        self.query = query
        self.segment = segment or query.sink
        grid = query.pipeline.grid
        self.window_ms = window_ms or grid.delta_ms * grid.window_slots
        self._done_ms = None if since_ms is None else since_ms // self.window_ms * self.window_ms
        self._stuck_seen: set[str] = set()
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        if str(event.progress.id) == self.query.id:
            self.check()

    def onQueryIdle(self, event: Any) -> None:
        if str(event.id) == self.query.id:
            self.check()

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onWindowComplete(self, event: WindowComplete) -> None:
        """Override: a window of the segment is complete."""

    def onSegmentStuck(self, event: SegmentStuck) -> None:
        """Override: a tracking window is stuck (items lost or duplicated)."""

    def check(self) -> None:
        """Ask the tracker and call the event methods for what changed since the last
        call (progress events call it; so may you)."""
        doc = self.query.pipeline.tracker.status()
        with self._lock:
            completed = self._completed(doc)
            stuck = [t for t in doc.get("stuck", []) if t not in self._stuck_seen]
            self._stuck_seen.update(stuck)
        for start_ms in completed:
            self.onWindowComplete(WindowComplete(self.query.id, self.segment, start_ms,
                                                 start_ms + self.window_ms))
        for text in stuck:
            self.onSegmentStuck(_stuck_event(self.query.id, text))

    def _completed(self, doc: dict[str, Any]) -> list[int]:
        """Starts of the windows completed since the last call (none on the first call
        that sees the segment move: it sets where counting starts)."""
        slot = next((int(s["min_time"]) for s in doc.get("segments", [])
                     if s["segment"] == self.segment), 0)
        if slot <= 0:
            return []
        done_ms = self.query.pipeline.grid.slot_start_ms(slot) // self.window_ms * self.window_ms
        if self._done_ms is None:
            self._done_ms = done_ms
        starts = list(range(self._done_ms, done_ms, self.window_ms))
        self._done_ms = max(self._done_ms, done_ms)
        return starts
