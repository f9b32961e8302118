"""Progress in Spark's own tools: lowtide's figures in a query's
``StreamingQueryProgress``, and a ``StreamingQueryListener`` that turns them into
"window complete" and "segment stuck" events.

Observed metrics (``df.observe``) are the one place of a progress report that a
query's plan fills in, but Spark fixes their expressions when the query starts (a
literal or a session variable keeps its value of that moment in every later batch).
lowtide's metrics hold no aggregate: each reads its figure from a map in the driver's
JVM where Spark computes the metrics, on the driver
(:mod:`lowtide.spark.pipeline.progress_delivery`). The rows pay nothing for them,
in local mode and on a cluster alike.

The figures are the tracker's at most ``interval_s`` (0.5 s) before Spark collected
the batch's metrics, at its end: the latest min times, the lag and the stuck windows
then, each front's late records (``late``, a JSON text).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from lowtide.spark.pipeline.progress_delivery import ProgressPublisher, figure_columns
from lowtide.spark.pipeline.status import PipelineStatus
from lowtide.spark.tracking.transport import TrackerRef

__all__ = [
    "METRICS_NAME",
    "CompletenessListener",
    "ProgressMetrics",
    "ProgressPublisher",
    "SegmentStuck",
    "WindowComplete",
]

METRICS_NAME = "lowtide"
#: what each front did with late records (the FrontLate wire message's counts)
LATE_COUNTS = ("late_clamped", "late_rejected", "late_raised", "out_of_range")
_STUCK = re.compile(r"segment (['\"])(?P<segment>.*)\1, slots \[(?P<start>\d+), (?P<end>\d+)\): "
                    r"(?P<what>.*)")


@dataclass(frozen=True)
class ProgressMetrics:
    """lowtide's observed metrics for one query: ``observe(df)`` on the DataFrame a
    sink writes (and, in local mode, ``build(pipeline).start()`` the publisher that
    feeds them). ``tracker``: ``Built.ref`` or ``pipe.tracker.ref``."""

    tracker: TrackerRef
    sink: str
    #: how old the figures may be (the publisher's period; each copy asks the tracker
    #: for its status: about 1.3 ms of the driver's CPU, two thirds of a point of the
    #: window bench's CPU ratio at 0.25 s)
    interval_s: float = 0.5

    @classmethod
    def of(cls, tracker: TrackerRef, sink: str) -> ProgressMetrics:
        return cls(tracker, sink)

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.tracker.graph.names)

    def figures(self) -> tuple[str, ...]:
        """The metric names, as ``lastProgress["observedMetrics"]["lowtide"]`` shows them."""
        per_segment = tuple(f"min_time.{s}" for s in self.segments)
        return ("sink_min_time", "global_min_time", "sink_lag_ms", "stuck_windows",
                "fronts_refused", "fronts_waiting", "late_clamped", "late_rejected",
                *per_segment, "late")

    def observe(self, df: Any, name: Any = METRICS_NAME) -> Any:
        """``df`` with lowtide's figures as its observed metrics ``name`` (a string,
        or a ``pyspark.sql.Observation`` for a batch DataFrame); ``build(pipeline)
        .start()`` the publisher that feeds them (a :class:`TrackedQuery` does)."""
        from pyspark.sql import functions as F

        *numbers, late = figures = self.figures()
        *columns, late_column = figure_columns(self, df.sparkSession, figures)
        # a figure's expressions are planned and evaluated again in every micro-batch
        # (on the driver, as each task ends): as few as give its value and type
        longs = [c.try_cast("long").alias(f) for c, f in zip(columns, numbers, strict=True)]
        return df.observe(name, *longs, F.when(late_column != "null", late_column).alias(late))

    def values(self, status: PipelineStatus) -> dict[str, Any]:
        """The figures of a tracker status (a figure it lacks is left out); ``late``:
        per front, its late records' counts, as a JSON text."""
        by_name = {s.segment: s for s in status.segments}
        late = {str(f): {c: int(counts.get(c, 0)) for c in LATE_COUNTS}
                for f, counts in sorted(status.late.items(), key=lambda kv: int(kv[0]))}
        out: dict[str, Any] = {
            "global_min_time": status.global_min, "stuck_windows": len(status.stuck),
            "fronts_refused": status.fronts_refused,
            "fronts_waiting": len(status.waiting_fronts),
            "late_clamped": sum(c["late_clamped"] for c in late.values()),
            "late_rejected": sum(c["late_rejected"] for c in late.values()),
            "late": json.dumps(late)}
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
