"""Progress in Spark's own tools: lowtide's figures in a query's
``StreamingQueryProgress``, and a ``StreamingQueryListener`` that turns them into
"window complete" and "segment stuck" events.

Observed metrics (``df.observe``) are the one place of a progress report that a
query's plan fills in, but Spark fixes their expressions when the query starts (a
literal or a session variable keeps its value of that moment in every later batch)
and evaluates them in the tasks, on the executors (an expression the driver would
evaluate, outside an aggregate, must be deterministic: measured, PySpark 4.2). So
the tasks ask the tracker themselves: an Arrow UDF whose closure carries the
:class:`~lowtide.spark.tracking.transport.TrackerRef` (the same the tracked operators
use) fetches the tracker's status at most once per ``interval_s`` per Python worker
and puts the figures, as one JSON text, on the first row of each Arrow batch (the
other rows get a null: one lookup per batch, not per row). The metrics take the
largest figure seen in the batch (min times only move forward, so that is the
latest; for the lag and the stuck windows it is the batch's worst) and the latest
late-record counts. This works wherever the tasks reach the tracker, on a cluster
too; a task that cannot reach it within ``timeout_s`` leaves the figures null and
the batch goes on.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.streaming.listener import StreamingQueryListener

from lowtide.service.clock import wall_ms
from lowtide.spark.pipeline.status import PipelineStatus, status_of
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.transport import TrackerRef, connect

__all__ = [
    "METRICS_NAME",
    "CompletenessListener",
    "ProgressMetrics",
    "SegmentStuck",
    "WindowComplete",
]

log = logging.getLogger("lowtide.spark.monitoring")

METRICS_NAME = "lowtide"
#: the column the figures pass in between the UDF and the observation (dropped after)
PROGRESS_COL = "lt_progress"
#: what each front did with late records (the FrontLate wire message's counts)
LATE_COUNTS = ("late_clamped", "late_rejected", "late_raised", "out_of_range")
_STUCK = re.compile(r"segment (['\"])(?P<segment>.*)\1, slots \[(?P<start>\d+), (?P<end>\d+)\): "
                    r"(?P<what>.*)")


@dataclass(frozen=True)
class ProgressMetrics:
    """lowtide's observed metrics for one query: ``observe(df)`` on the DataFrame a
    sink writes. ``tracker`` is where the tasks ask (``Built.ref``, or
    ``pipe.tracker.ref``); its graph names the segments."""

    tracker: TrackerRef
    sink: str
    #: how old the figures a task reports may be (per Python worker)
    interval_s: float = 1.0
    #: how long a task waits for the tracker's answer before leaving the figures null
    timeout_s: float = 2.0

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

    def schema(self) -> Any:
        """The type of the figures' JSON text (``late``: per front, its counts)."""
        from pyspark.sql import types as T

        counts = T.StructType([T.StructField(c, T.LongType()) for c in LATE_COUNTS])
        return T.StructType(
            [T.StructField(f, T.LongType()) for f in self.figures()[:-1]]
            + [T.StructField("late", T.MapType(T.StringType(), counts)),
               T.StructField("fetched_ms", T.LongType())])

    def observe(self, df: Any, name: Any = METRICS_NAME) -> Any:
        """``df`` with lowtide's figures as its observed metrics ``name`` (a string,
        or a ``pyspark.sql.Observation`` for a batch DataFrame)."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.functions import arrow_udf

        metrics = self

        def figures(rows: pa.Array) -> pa.Array:
            return figures_column(metrics, len(rows))

        udf = arrow_udf(figures, "string").asNondeterministic()
        anchor = F.col(TRACK_COL) if TRACK_COL in df.columns else F.lit(0)
        got = F.col(PROGRESS_COL)
        aggregates = [F.max(got.getField(f)).alias(f) for f in self.figures()[:-1]]
        aggregates.append(F.max_by(got.getField("late"), got.getField("fetched_ms")).alias("late"))
        with_figures = df.withColumn(PROGRESS_COL, F.from_json(udf(anchor), self.schema()))
        return with_figures.observe(name, *aggregates).drop(PROGRESS_COL)

    def values(self, status: PipelineStatus) -> dict[str, Any]:
        """The figures of a tracker status (a figure it lacks is left out)."""
        by_name = {s.segment: s for s in status.segments}
        late = {str(f): {c: int(counts.get(c, 0)) for c in LATE_COUNTS}
                for f, counts in status.late.items()}
        out: dict[str, Any] = {
            "global_min_time": status.global_min, "stuck_windows": len(status.stuck),
            "fronts_refused": status.fronts_refused,
            "fronts_waiting": len(status.waiting_fronts),
            "late_clamped": sum(c["late_clamped"] for c in late.values()),
            "late_rejected": sum(c["late_rejected"] for c in late.values()),
            "late": late}
        sink = by_name.get(self.sink)
        if sink is not None:
            out["sink_min_time"] = sink.min_time
            if sink.lag_ms is not None:
                out["sink_lag_ms"] = sink.lag_ms
        for name in self.segments:
            if name in by_name:
                out[f"min_time.{name}"] = by_name[name].min_time
        return out

    def fetch(self) -> str | None:
        """The figures now, as the JSON text the observation parses (None: the tracker
        did not answer within ``timeout_s``)."""
        ref = self.tracker
        try:
            doc = connect(ref).status(timeout_s=self.timeout_s)  # type: ignore[attr-defined]
        except Exception as exc:  # the batch goes on, with null figures
            log.debug("no progress figures", extra={"url": ref.url, "error": repr(exc)})
            return None
        status = status_of(doc, ref.grid, graph=ref.graph)
        return json.dumps({**self.values(status), "fetched_ms": wall_ms()})


#: per Python worker: (url, sink) -> (monotonic time fetched, figures)
_fetched: dict[tuple[str, str], tuple[float, str | None]] = {}
_fetch_lock = threading.Lock()


def figures_column(metrics: ProgressMetrics, rows: int) -> pa.Array:
    """The UDF's answer for an Arrow batch of ``rows``: the figures (fetched at most
    once per ``interval_s`` in this process) on its first row, nulls after."""
    key = (metrics.tracker.url, metrics.sink)
    with _fetch_lock:
        at, text = _fetched.get(key, (float("-inf"), None))
        if time.monotonic() - at >= metrics.interval_s:
            text = metrics.fetch()
            _fetched[key] = (time.monotonic(), text)
    if rows == 0:
        return pa.nulls(0, pa.string())
    return pa.concat_arrays([pa.array([text], pa.string()), pa.nulls(rows - 1, pa.string())])


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
