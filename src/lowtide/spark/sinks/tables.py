"""Tracked table sinks (Delta Lake, Parquet) that keep the labels, publish their
completeness where readers look, and feed the tracked queries that read them.

``stream.write_table(path, checkpoint=..., format="delta", feeds=("silver",))`` is a
``foreachBatch`` sink (:class:`lowtide.spark.sinks.TrackedForeachBatch` acks its rows as
received after the write) whose rows keep ``lt_time`` (slot) and ``lt_ack`` (32-bit id):
the labels ``Pipeline.read_stream`` takes. Per batch, :class:`TableWriter`

1. on its first batch, declares the writer in the table and learns its floor
   (:mod:`lowtide.spark.sinks.table_formats`); refuses a batch with rows below it;
2. sends the batch's rows into every reader segment it ``feeds`` (the ingest segments
   of the queries that read the table), one keyed batch, before the rows are written,
   as any front does (children before their parent's receipt, rule 2);
3. writes the rows: Delta, an append made idempotent by ``txnAppId``/``txnVersion``;
   Parquet, one file per batch named after the query, written aside and renamed in (a
   re-run batch whose file holds exactly its rows is not written again);
4. returns, and the sink's receipts are acked.

Each reader segment has a front owned by this sink (:func:`bridge_front`) that
heartbeats with the sink segment's min time: once that is ``t``, every row below ``t``
was received here, and its send into the readers went in the same atomic batch, so no
row below ``t`` can still come. The tracker then bounds the downstream query by the
upstream one: the last sink's min time means complete through every query. Two writers
feeding one reader are two fronts of its segment: the reader waits for both.

Completeness, published without the tracker (:mod:`lowtide.spark.sinks.completeness`
reads it): each writer's record is its sink segment's min time as last announced,
which only counts rows whose receipts followed their commit, with the writers it
declares (``writers=``, default: itself); the table's completeness is the minimum over
every declared writer. Delta: a record in the commit's ``userMetadata`` of each batch,
in the same transaction as the batch's rows (so a version's value holds for that
version); the value known when the batch starts: one batch behind, and an idle stream
publishes nothing new. Parquet: ``_lowtide_manifest.json`` in the folder, updated under
a lock on every min time update and after every batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.service.clock import wall_ms
from lowtide.spark.sinks.batches import digest
from lowtide.spark.sinks.completeness import Record
from lowtide.spark.sinks.foreach import OnFailure, send_sink_acks
from lowtide.spark.sinks.table_formats import DeltaTable, ParquetTable, check_floor
from lowtide.spark.sources.log_source import ensure_front
from lowtide.spark.tracking.column import ACK_COL, TIME_COL, AckAccumulator, as_u64
from lowtide.spark.tracking.transport import HOLD_WAIT_S, TrackerRef, connect

TABLE_FORMATS = ("delta", "parquet")


def bridge_front(segment: str, reader: str) -> int:
    """The id of the front through which sink ``segment`` feeds reader ``reader``:
    stable across restarts (it is re-registered by its owner name), far from the small
    ids producers use."""
    import hashlib

    digest = hashlib.sha256(f"lowtide-table:{segment}->{reader}".encode()).digest()
    return (int.from_bytes(digest[:8], "little") >> 2) | (1 << 61)


def check_feeds(graph: Any, feeds: tuple[str, ...]) -> None:
    """One-line error, where the sink is described, for readers the tracker lacks."""
    missing = [f for f in feeds if graph is None or f not in graph]
    if missing:
        raise ValueError(
            f"write_table feeds {', '.join(map(repr, missing))}, which the tracker does not "
            "track: start it with every query's plan first, pipe.start_tracker(pipe.plan("
            "(upstream, 'bronze'), (downstream, 'gold')).graph)")


@dataclass(frozen=True)
class TableConfig:
    """Where and how a tracked table sink writes; ``.build()`` gives its foreachBatch
    function. ``writers``: the sink segments of every tracked writer of the table (this
    one included; empty: this one alone)."""

    path: str
    format: str = "delta"
    feeds: tuple[str, ...] = ()
    writers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.format not in TABLE_FORMATS:
            raise ValueError(f"table format {self.format!r}: use one of {TABLE_FORMATS}")

    def build(self, ref_of: Callable[[], TrackerRef], segment: str) -> TableWriter:
        if self.writers and segment not in self.writers:
            raise ValueError(f"write_table(name={segment!r}) is not among writers="
                             f"{self.writers}: list every writer of {self.path}, this one too")
        return TableWriter(self, ref_of, segment)


class TableWriter:
    """The ``foreachBatch`` function of a tracked table sink (runs on the driver); see
    the module docstring. ``ref_of`` gives the pipeline's tracker once it runs."""

    def __init__(self, config: TableConfig, ref_of: Callable[[], TrackerRef],
                 segment: str) -> None:
        self.config, self.segment = config, segment
        self.table = (DeltaTable(config.path) if config.format == "delta"
                      else ParquetTable(config.path))
        self._ref_of = ref_of
        self._ref: TrackerRef | None = None
        self._lock = threading.Lock()
        self.complete_below = 0  # the sink segment's latest min time
        self.floor: int | None = None  # None until declared in the table
        self._beaten = 0  # the latest heartbeat of the bridge fronts
        self.committed_batch: int | None = None
        self._query = ""  # the writing query's id, known at its first batch
        self._cancel: Callable[[], None] | None = None
        self.wait_s: float = HOLD_WAIT_S
        self.on_failure: OnFailure | None = None

    def wait_for_tracker(self, wait_s: float, on_failure: OnFailure | None) -> None:
        """How long the feeds' acks wait for the tracker, and whom a tracker that does
        not confirm them in time is reported to (the query's sink sets both)."""
        self.wait_s, self.on_failure = wait_s, on_failure

    def start(self) -> TrackerRef:
        """Register the bridge fronts at the sink's min time and follow it (once)."""
        with self._lock:
            if self._ref is not None:
                return self._ref
            ref = self._ref_of()
            check_feeds(ref.graph, self.config.feeds)
            agent: Any = connect(ref)
            now = agent.min_time_at(self.segment, wall_ms())
            self.complete_below = self._beaten = now
            self._register_bridges(agent, ref, now)
            self._ref = ref
        self._cancel = agent.on_update(self._on_update, self.segment)
        return ref

    def _register_bridges(self, agent: Any, ref: TrackerRef, now: int) -> None:
        """The bridge front of every declared writer on this tracker into each reader,
        at that writer's sink min time, lowest first: the reader's segment waits for
        all of them, and one starting later is not refused for being behind."""
        writers = [w for w in self.config.writers if w != self.segment and w in ref.graph]
        starts = sorted([(now, self.segment),
                         *((agent.min_time_at(w, wall_ms()), w) for w in writers)])
        for reader in self.config.feeds:
            for t, writer in starts:
                ensure_front(agent, bridge_front(writer, reader), reader, t)

    def _on_update(self, update: Any) -> None:
        """On the agent's thread: a new min time of the sink segment."""
        with self._lock:
            if update.time <= self.complete_below:
                return
            self.complete_below = update.time
        if self.config.feeds and update.time > self._beaten:
            agent: Any = connect(self._ref)  # type: ignore[arg-type]
            for reader in self.config.feeds:
                agent.heartbeat(bridge_front(self.segment, reader), update.time)
            self._beaten = update.time
        self._publish()

    def stop(self) -> None:
        """Stop following the sink's min time (the bridge fronts stay where they are)."""
        if self._cancel is not None:
            self._cancel()
            self._cancel = None

    def record(self, batch_id: int, query: str = "", rows_digest: str = "") -> Record:
        """This writer's record now: its sink's min time, never below its floor."""
        ref = self._ref
        assert ref is not None
        t = max(self.complete_below, self.floor or 0)
        return Record(self.segment, t, t * ref.grid.delta_ms, wall_ms(),
                      ref.graph.fingerprint(), self.segment, batch_id, query,
                      self.config.writers or (self.segment,), rows_digest)

    def __call__(self, df: Any, batch_id: int) -> None:
        ref = self.start()
        query = str(df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId"))
        self._query = query
        times, xors, counts = label_sums(df)
        if self.floor is None:
            self.floor = self.table.declare(df, query, self.record(-1, query))
        if len(times):
            check_floor(self.config.path, self.segment, int(times.min()), self.floor)
        self._feed(ref, query, batch_id, times, xors, counts)
        record = self.record(batch_id, query, digest(times, xors, counts))
        self.table.write(df, query, batch_id, record)
        self.committed_batch = batch_id
        self._publish()

    def _feed(self, ref: TrackerRef, query: str, batch_id: int, times: np.ndarray,
              xors: np.ndarray, counts: np.ndarray) -> None:
        """Send the batch's rows into every reader segment, before they are written."""
        if not self.config.feeds or not len(times):
            return
        acc = AckAccumulator()
        for reader in self.config.feeds:
            acc.add_reduced(ref.graph.index(reader), times, xors, counts)
        send_sink_acks(ref, f"<table>{self.segment}", query, batch_id,
                       acc.build(ref.grid.window_slots), wait_s=self.wait_s,
                       on_failure=self.on_failure, what=f"table sink {self.segment!r}'s feeds")

    def _publish(self) -> None:
        """This writer's record now (once declared): Parquet, into the manifest."""
        if self.floor is None:
            return
        with self._lock:
            batch = -1 if self.committed_batch is None else self.committed_batch
            self.table.publish(self.record(batch, self._query), self.floor)


def label_sums(df: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per slot of the batch's rows: (slots, XOR of the 32-bit acks as uint64, count),
    from one aggregation in the JVM."""
    from pyspark.sql import functions as F

    rows = (df.groupBy(TIME_COL).agg(F.bit_xor(ACK_COL).alias("x"),
                                     F.count(F.lit(1)).alias("n")).collect())
    return (np.array([r[0] for r in rows], np.int64),
            as_u64(np.array([r[1] for r in rows], np.int64)),
            np.array([r[2] for r in rows], np.int64))


__all__ = [
    "TABLE_FORMATS",
    "TableConfig",
    "TableWriter",
    "bridge_front",
    "check_feeds",
    "label_sums",
]
