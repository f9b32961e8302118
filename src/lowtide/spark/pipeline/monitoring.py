"""Progress in Spark's own tools: lowtide's figures in a query's
``StreamingQueryProgress``, and a ``StreamingQueryListener`` that turns them into
"window complete" and "segment stuck" events.

Observed metrics (``df.observe``) are the one place of a progress report that a
query's plan fills in, but Spark fixes their expressions when the query starts (a
literal or a session variable keeps its value of that moment in every later batch)
and evaluates them in the tasks (an expression outside an aggregate, which the driver
would evaluate, must be deterministic: measured, PySpark 4.2). What moves is read at
run time, where the tasks run (:mod:`lowtide.spark.pipeline.progress_delivery`):

* tasks in the driver's JVM (local mode): a driver thread copies the tracker's
  figures into JVM system properties every ``interval_s``; the tasks read them with
  ``java_method('java.lang.System', 'getProperty', ...)`` on 1 row in
  ``2**sample_bits`` (a reflective call per figure);
* tasks on executors (a cluster: other JVMs, without those properties): an Arrow UDF
  whose closure carries the :class:`~lowtide.spark.tracking.transport.TrackerRef`
  asks the tracker, at most once a second per Python worker, and puts the figures on
  the first row of each Arrow batch (every row crosses into Python once more; at load
  30 on 2 cores no slower than the sampled reads: BENCHMARKS.md).

The metrics take the largest figure seen in the batch (min times only move forward,
so that is the latest; for the lag and the stuck windows it is the batch's worst) and
the latest ``late`` (each front's late records, a JSON text).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from lowtide.spark.pipeline.progress_delivery import (
    PROGRESS_COL,
    ProgressPublisher,
    figures_udf,
    tasks_share_driver_jvm,
)
from lowtide.spark.pipeline.status import PipelineStatus
from lowtide.spark.tracking.column import TRACK_COL
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
#: what a Pipeline's queries sample (1 row in 256): about 0.1 us a row instead of
#: 20 us for reading every row (BENCHMARKS.md, "Cost of the observed metrics")
PROGRESS_SAMPLE_BITS = 8
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
    #: read the figures on 1 row in 2**sample_bits (by the low bits of its ack id in
    #: ``lt_track``), where tasks read the driver's properties; 0: every row
    sample_bits: int = 0
    #: how old the figures may be in local mode (the publisher's period)
    interval_s: float = 0.25
    #: how long a task on an executor waits for the tracker before leaving them null
    timeout_s: float = 2.0
    #: True: the tasks ask the tracker; False: they read the driver's properties;
    #: None: by the session's master (local: properties)
    tasks_ask: bool | None = None

    @classmethod
    def of(cls, tracker: TrackerRef, sink: str, sample_bits: int = 0) -> ProgressMetrics:
        return cls(tracker, sink, sample_bits)

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.tracker.graph.names)

    def figures(self) -> tuple[str, ...]:
        """The metric names, as ``lastProgress["observedMetrics"]["lowtide"]`` shows them."""
        per_segment = tuple(f"min_time.{s}" for s in self.segments)
        return ("sink_min_time", "global_min_time", "sink_lag_ms", "stuck_windows",
                "fronts_refused", "fronts_waiting", "late_clamped", "late_rejected",
                *per_segment, "late")

    def property_of(self, figure: str) -> str:
        return f"lowtide.{self.tracker.url}.{self.sink}.{figure}"

    def observe(self, df: Any, name: Any = METRICS_NAME) -> Any:
        """``df`` with lowtide's figures as its observed metrics ``name`` (a string,
        or a ``pyspark.sql.Observation`` for a batch DataFrame)."""
        from pyspark.sql import functions as F

        asks = self.tasks_ask
        if asks is None:
            asks = not tasks_share_driver_jvm(df.sparkSession)
        if asks:
            df = df.withColumn(PROGRESS_COL, figures_udf(self, df))
            got = F.col(PROGRESS_COL)

            def read(figure: str) -> Any:
                return got.getField(figure)
        else:
            read = self._property_reader(df)
        aggregates = [F.max(read(f)).alias(f) for f in self.figures()[:-1]]
        aggregates.append(F.max_by(read("late"), read("fetched_ms")).alias("late"))
        observed = df.observe(name, *aggregates)
        return observed.drop(PROGRESS_COL) if asks else observed

    def _property_reader(self, df: Any) -> Any:
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
            value = prop if figure == "late" else prop.try_cast("long")
            value = F.when(value != "null", value) if figure == "late" else value
            return value if sampled is None else F.when(sampled, value)

        return read

    def schema(self) -> Any:
        """The type of the figures' JSON text, as tasks that ask the tracker get it."""
        from pyspark.sql import types as T

        return T.StructType(
            [T.StructField(f, T.LongType()) for f in self.figures()[:-1]]
            + [T.StructField("late", T.StringType()), T.StructField("fetched_ms", T.LongType())])

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
