"""``stream.writeStream``: PySpark's ``DataStreamWriter`` for tracked streams.

::

    query = (windows.writeStream.format("parquet").option("path", "/out")
             .option("checkpointLocation", "/ckpt").outputMode("append")
             .trigger(processingTime="1 second").queryName("clicks").start())
    backfill = (windows.writeStream.format("delta")
                .option("checkpointLocation", "/ckpt2").trigger(availableNow=True)
                .toTable("/tables/clicks"))
    backfill.awaitTermination()          # ends once every window is complete
    debug = stream.writeStream.foreachBatch(fn).option("checkpointLocation", c).start()

It dispatches to the stream's sink methods (:meth:`Stream.write_parquet`,
``write_table``, ``foreach_batch``, ``to_console``, ``to_null``) and returns their
:class:`TrackedQuery`. What does not fit an exact query is refused in one line, when
it is called: ``update`` but for a changelog (``speculative()``), ``complete`` (coming:
the whole table as of the min time), continuous and
real-time triggers (micro-batch only), ``partitionBy``, catalog table names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lowtide.spark.operators.speculative import SpeculativeSpec
from lowtide.spark.operators.speculative_apply import SpeculativeApplySpec
from lowtide.spark.operators.speculative_fold import writes_changelog
from lowtide.spark.operators.speculative_running import writes_grouped_changelog
from lowtide.spark.operators.speculative_sessions import writes_session_changelog
from lowtide.spark.pipeline.dag import PipelineShapeError

if TYPE_CHECKING:
    from lowtide.spark.pipeline.query import TrackedQuery
    from lowtide.spark.pipeline.stream import Stream

FORMATS = ("parquet", "delta", "console", "noop")
BACKFILL_TRIGGER = "100 milliseconds"
#: the options each sink takes besides checkpointLocation (keys as Spark users write them)
OPTIONS = {"parquet": ("path", "keepTrackingColumns", "lowtide.sink"),
           "delta": ("path", "feeds", "lowtide.sink"),
           "console": ("numRows", "truncate", "lowtide.sink"),
           "noop": ("lowtide.sink",),
           "foreachBatch": ("keepTrackingColumns", "lowtide.sink")}
MODES = {"complete": "the whole result table as of the min time is coming"}


def refuse(what: str) -> PipelineShapeError:
    return PipelineShapeError(f"writeStream: {what}")


@dataclass(frozen=True)
class TrackedStreamWriter:
    """The builder; each method returns a new one, ``start``/``toTable`` start it."""

    stream: Stream
    source: str | None = None
    opts: dict[str, str] = field(default_factory=dict)
    processing_time: str | None = None
    until_complete: bool = False
    query_name: str | None = None
    batch_fn: Callable[[Any, int], Any] | None = None

    def format(self, source: str) -> TrackedStreamWriter:
        if source.lower() not in FORMATS:
            raise refuse(f"format({source!r}) is not a tracked sink: use one of "
                         f"{', '.join(FORMATS)}, or foreachBatch(fn) for any other")
        return replace(self, source=source.lower())

    def option(self, key: str, value: Any) -> TrackedStreamWriter:
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return replace(self, opts={**self.opts, key: text})

    def options(self, **options: Any) -> TrackedStreamWriter:
        out = self
        for key, value in options.items():
            out = out.option(key, value)
        return out

    def outputMode(self, outputMode: str) -> TrackedStreamWriter:
        """``append`` (each exact result once, when it is final); ``update`` for a
        changelog (``.agg(...).speculative()``, ``stateful(...).speculative()``);
        ``complete`` is refused, saying what is coming."""
        mode = outputMode.lower()
        if mode in MODES:
            raise refuse(f"outputMode({outputMode!r}): {MODES[mode]}; today use 'append': "
                         "each result once, when it is final (the table as of the min time "
                         "is its rows with lt_time below complete_below)")
        last = self.stream.steps[-1] if self.stream.steps else None
        speculative = isinstance(last, SpeculativeSpec | SpeculativeApplySpec) \
            or writes_changelog(last) or writes_session_changelog(last) \
            or writes_grouped_changelog(last)
        if mode == "update" and not speculative:
            raise refuse("outputMode('update') writes early results: end the window with "
                         ".agg(...).speculative() (a changelog; or stateful(...)"
                         ".speculative()), or use 'append'")
        if mode == "append" and speculative:
            raise refuse("speculative() writes a changelog: outputMode('update') "
                         "(its final rows alone: lowtide.spark.sinks.changelog.finals)")
        if mode not in ("append", "update"):
            raise refuse(f"outputMode({outputMode!r}): use 'append' or 'update'")
        return self

    def trigger(self, *, processingTime: str | None = None, once: bool | None = None,
                availableNow: bool | None = None, continuous: str | None = None,
                realTime: str | None = None) -> TrackedStreamWriter:
        """``processingTime="1 second"``, or a backfill, ``availableNow=True`` (or
        ``once=True``, the same here: one micro-batch completes no window): micro-batches
        until the sink is complete up to what the fronts had promised when the first
        batch ended, then the query stops (:meth:`TrackedQuery.stop_when_complete`)."""
        if continuous is not None or realTime is not None:
            raise refuse("continuous and real-time triggers run no Python data source nor "
                         "mapInArrow: lowtide runs micro-batches (processingTime=...)")
        given = [k for k, v in (("processingTime", processingTime), ("once", once),
                                ("availableNow", availableNow)) if v]
        if len(given) != 1:
            raise refuse("trigger() takes one of processingTime=, once=True, availableNow=True")
        if processingTime:
            return replace(self, processing_time=processingTime, until_complete=False)
        # back to back while there are rows; no-data batches (the windows' timers) not
        # faster than this
        return replace(self, processing_time=BACKFILL_TRIGGER, until_complete=True)

    def queryName(self, queryName: str) -> TrackedStreamWriter:
        return replace(self, query_name=queryName)

    def partitionBy(self, *cols: str) -> TrackedStreamWriter:
        raise refuse("partitionBy() is not supported by the tracked sinks yet: write with "
                     "foreachBatch(fn) and partition there")

    def foreachBatch(self, func: Callable[[Any, int], Any]) -> TrackedStreamWriter:
        """``func(df, batch_id)`` commits each batch (make it idempotent per batch id);
        receipt is acked after it returns."""
        return replace(self, batch_fn=func, source=None)

    def foreach(self, f: Any) -> TrackedStreamWriter:
        raise refuse("foreach() (row by row) is not tracked: use foreachBatch(fn)")

    def start(self, path: str | None = None, format: str | None = None,
              outputMode: str | None = None, queryName: str | None = None,
              **options: Any) -> TrackedQuery:
        """Start the query (``path``: the parquet or delta sink's)."""
        w = self._with(path, format, outputMode, queryName, options)
        return w._launch(w.source or ("foreachBatch" if w.batch_fn else "parquet"))

    def toTable(self, tableName: str, format: str | None = None,
                outputMode: str | None = None, queryName: str | None = None,
                **options: Any) -> TrackedQuery:
        """A Delta (default) or Parquet table at the path ``tableName`` that keeps the
        labels and publishes its completeness (:meth:`Stream.write_table`)."""
        if "/" not in tableName and ":" not in tableName:
            raise refuse(f"toTable({tableName!r}): tracked tables are written by path "
                         "(toTable('/data/clicks')), not through the catalog yet")
        w = self._with(tableName, format or self.source or "delta", outputMode, queryName,
                       options)
        if w.source not in ("delta", "parquet"):
            raise refuse(f"toTable() writes delta or parquet, not {w.source!r}")
        return w._launch("table")

    def _with(self, path: str | None, format: str | None, mode: str | None,
              name: str | None, options: dict[str, Any]) -> TrackedStreamWriter:
        w = self.options(**options)
        w = w.format(format) if format else w
        w = w.outputMode(mode) if mode else w
        w = w.queryName(name) if name else w
        return w.option("path", path) if path is not None else w

    def _launch(self, kind: str) -> TrackedQuery:
        opts = dict(self.opts)
        checkpoint = opts.pop("checkpointLocation", None)
        if not checkpoint:
            raise refuse("option('checkpointLocation', dir) is required: the query's "
                         "progress and state live there")
        allowed = OPTIONS["delta" if kind == "table" else kind]
        unknown = sorted(set(opts) - set(allowed))
        if unknown:
            raise refuse(f"option {unknown[0]!r} is not one the {kind} sink takes "
                         f"({', '.join(allowed)})")
        query = self._sink(kind, opts, checkpoint)
        if self.until_complete:
            query.stop_when_complete()
        return query

    def _sink(self, kind: str, opts: dict[str, str], checkpoint: str) -> TrackedQuery:
        s, keep = self.stream, opts.get("keepTrackingColumns", "false") == "true"
        common: dict[str, Any] = {"checkpoint": checkpoint, "trigger": self.processing_time,
                                  "name": opts.get("lowtide.sink", "sink")}
        if kind == "table":
            feeds = tuple(f for f in opts.get("feeds", "").split(",") if f)
            return s.write_table(opts["path"], format=self.source or "delta", feeds=feeds,
                                 query_name=self.query_name, **common)
        if kind in ("parquet", "delta") and "path" not in opts:
            raise refuse(f"the {kind} sink needs a path: start(path) or option('path', ...)")
        if kind == "delta":
            return s.write_table(opts["path"], query_name=self.query_name, **common)
        if kind == "parquet":
            return s.write_parquet(opts["path"], keep_tracking_columns=keep,
                                   query_name=self.query_name, **common)
        if kind == "foreachBatch":
            assert self.batch_fn is not None
            return s.foreach_batch(self.batch_fn, keep_tracking_columns=keep,
                                   query_name=self.query_name, **common)
        if kind == "console":
            return s.to_console(num_rows=int(opts.get("numRows", "20")),
                                truncate=opts.get("truncate", "true") == "true",
                                query_name=self.query_name, **common)
        return s.to_null(query_name=self.query_name, **common)
