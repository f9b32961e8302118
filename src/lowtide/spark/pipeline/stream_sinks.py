"""Where a tracked stream goes: the sinks of :class:`.stream.Stream`, each of which
starts the query (``foreach_batch``, ``write_parquet``, ``write_table``, ``to_null``,
``to_console``, ``foreach_complete``, PySpark's ``writeStream`` builder), and the
``foreachBatch`` function each tracked sink runs (:func:`sink_function`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lowtide.spark.pipeline.write_stream import TrackedStreamWriter
from lowtide.spark.sinks import ParquetSink, TrackedForeachBatch, console_writer
from lowtide.spark.sinks.foreach import OnFailure
from lowtide.spark.sinks.ordered import CompleteRanges
from lowtide.spark.sinks.tables import TableConfig, TableWriter, check_feeds
from lowtide.spark.tracking.transport import TrackerRef

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline
    from lowtide.spark.pipeline.query import TrackedQuery


class StreamSinks:
    """The sinks of a :class:`.stream.Stream` (its ``pipeline`` starts the query)."""

    pipeline: Pipeline

    def foreach_batch(
        self,
        fn: Callable[[Any, int], Any],
        *,
        checkpoint: str,
        name: str = "sink",
        keep_tracking_columns: bool = False,
        trigger: str | None = None,
        query_name: str | None = None,
    ) -> TrackedQuery:
        """``fn(df, batch_id)`` commits the batch; receipt is acked after it returns."""
        return self.pipeline._start(
            self, ("foreach", fn, keep_tracking_columns, None), name, checkpoint, trigger,
            query_name,
        )

    def foreach_complete(self, fn: Callable[[Any, Any, Any], Any], *, checkpoint: str,
                         name: str = "sink", trigger: str | None = None,
                         query_name: str | None = None) -> TrackedQuery:
        """``fn(df, t_from, t_to)`` once per completed range of global time, in order,
        with every row of ``[t_from, t_to)`` sorted by (``lt_time``, ``lt_ack``); see
        :mod:`lowtide.spark.sinks.ordered` (``ordered_writer``: Parquet or Delta)."""
        ranges = CompleteRanges(fn, f"{checkpoint.rstrip('/')}/complete")
        query = self.foreach_batch(ranges.stage, checkpoint=checkpoint, name=name,
                                   keep_tracking_columns=True, trigger=trigger,
                                   query_name=query_name)
        ranges.start(self.pipeline.tracker_ref, name, lambda: query.isActive)
        return query

    def to_console(
        self, *, checkpoint: str, name: str = "sink", num_rows: int = 20, truncate: bool = True,
        trigger: str | None = None, query_name: str | None = None,
    ) -> TrackedQuery:
        return self.foreach_batch(
            console_writer(num_rows, truncate), checkpoint=checkpoint, name=name,
            trigger=trigger, query_name=query_name,
        )

    @property
    def writeStream(self) -> TrackedStreamWriter:
        """PySpark's builder: ``.format(...).option(...).outputMode("append")
        .trigger(...).queryName(...).start()`` / ``.toTable(path)`` /
        ``.foreachBatch(fn)``; see :mod:`lowtide.spark.pipeline.write_stream`."""
        return TrackedStreamWriter(self)

    def write_parquet(
        self,
        path: str,
        *,
        checkpoint: str,
        name: str = "sink",
        keep_tracking_columns: bool = False,
        trigger: str | None = None,
        query_name: str | None = None,
    ) -> TrackedQuery:
        """Parquet files ``part-<query>-<batch>-<partition>.parquet`` under ``path``,
        written by the batch's tasks, published by the driver; acked after publication
        (:mod:`lowtide.spark.sinks.parquet`)."""
        options = {"path": path, "keepTrackingColumns": str(keep_tracking_columns).lower()}
        return self.pipeline._start(
            self, ("writer", options), name, checkpoint, trigger, query_name
        )

    def to_null(
        self, *, checkpoint: str, name: str = "sink", trigger: str | None = None,
        query_name: str | None = None, trace_file: str | None = None,
    ) -> TrackedQuery:
        """Drop the rows. Ending in a tracked operator, the query writes to Spark's
        ``noop`` sink and each task of the operator acks its rows as received by the
        sink right after its own batch (it hands them to the sink in the same task, and
        nothing is committed), so the sink costs nothing; otherwise a ``foreachBatch``
        acks the rows from one aggregation job per batch in the JVM (no Python pass),
        after the rows' untracked steps ran.
        ``trace_file``: whoever acks the sink appends ``<batch> <ack start ns> <acks
        confirmed ns> <rows>`` (the operator's tasks: one line per task attempt)."""
        return self.pipeline._start(
            self, ("foreach", None, False, trace_file), name, checkpoint, trigger, query_name
        )

    def write_table(self, path: str, *, checkpoint: str, format: str = "delta",
                    name: str = "sink", feeds: tuple[str, ...] = (), trigger: str | None = None,
                    query_name: str | None = None,
                    writers: tuple[str, ...] = ()) -> TrackedQuery:
        """A Delta (or ``format="parquet"``) table that keeps ``lt_time``/``lt_ack``,
        publishes its completeness (``lowtide.spark.complete_below(path)``) and, for
        each ingest segment in ``feeds``, is the front of the query that reads it with
        ``read_stream``. ``writers``: the sink names of every tracked query writing
        this table (its completeness is their minimum). See
        :mod:`lowtide.spark.sinks.tables`."""
        config = TableConfig(path, format, tuple(feeds), tuple(writers))
        if feeds:  # readers' segments must be tracked before the first batch
            try:
                graph = self.pipeline.tracker.graph
            except RuntimeError:
                graph = None
            check_feeds(graph, tuple(feeds))
        writer = config.build(lambda: self.pipeline.tracker_ref, name)
        query = self.foreach_batch(writer, checkpoint=checkpoint, name=name,
                                   keep_tracking_columns=True, trigger=trigger,
                                   query_name=query_name)
        writer.start()
        return query



def sink_function(sink: tuple[Any, ...], ref: TrackerRef, sink_name: str, wait_s: float,
                  on_failure: OnFailure) -> Any:
    """The ``foreachBatch`` function of a tracked sink (``sink``: what a method above
    passed to the pipeline): it acks the batch, and a tracker that does not confirm
    within ``wait_s`` (``hold_wait_s``) stops the query with one line (``on_failure``)."""
    if sink[0] == "foreach":
        if isinstance(sink[1], TableWriter):  # its feeds' acks wait the same
            sink[1].wait_for_tracker(wait_s, on_failure)
        return TrackedForeachBatch(sink[1], ref, sink_name, keep_tracking_columns=sink[2],
                                   trace_file=sink[3], wait_s=wait_s, on_failure=on_failure)
    return ParquetSink(sink[1]["path"], ref, sink_name,  # write_parquet
                       keep_tracking_columns=sink[1]["keepTrackingColumns"] == "true",
                       wait_s=wait_s, on_failure=on_failure)
