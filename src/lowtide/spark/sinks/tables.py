"""Tracked table sinks (Delta Lake, Parquet) that keep the labels, publish their
completeness where readers look, and feed the tracked queries that read them.

``stream.write_table(path, checkpoint=..., format="delta", feeds=("silver",))`` is a
``foreachBatch`` sink (:class:`lowtide.spark.sinks.TrackedForeachBatch` acks its rows as
received after the write) whose rows keep ``lt_time`` (slot) and ``lt_ack`` (32-bit id):
the labels ``Pipeline.read_stream`` takes. Per batch, :class:`TableWriter`

1. sends the batch's rows into every reader segment it ``feeds`` (the ingest segments
   of the queries that read the table), one keyed batch, before the rows are written,
   as any front does (children before their parent's receipt, rule 2);
2. writes the rows: Delta, an append made idempotent by ``txnAppId``/``txnVersion``
   (a batch re-run after a restart is skipped, not duplicated); Parquet, one file per
   batch written aside and renamed into the folder (a re-run finds it there);
3. returns, and the sink's receipts are acked.

Each reader segment has a front owned by this sink (:func:`bridge_front`) that
heartbeats with the sink segment's min time: once that is ``t``, every row below ``t``
was received here, and its send into the readers went in the same atomic batch, so no
row below ``t`` can still come. The tracker then bounds the downstream query by the
upstream one: the last sink's min time means complete through every query.

Completeness, published without the tracker (:mod:`lowtide.spark.sinks.completeness`
reads it): the sink segment's min time as last announced, which only counts rows whose
receipts followed their commit. Delta: in the commit's ``userMetadata`` of each batch,
in the same transaction as the batch's rows (so a version's value holds for that
version). It is the value known when the batch starts: one batch behind, and an idle
stream publishes nothing new. Parquet: ``_lowtide_manifest.json`` in the folder,
rewritten (atomically) on every min time update and after every batch.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.service.clock import wall_ms
from lowtide.spark.sources.log_source import ensure_front
from lowtide.spark.tracking.column import ACK_COL, TIME_COL, AckAccumulator, as_u64
from lowtide.spark.tracking.transport import TrackerRef, batch_key, connect

TABLE_FORMATS = ("delta", "parquet")
#: the key commit info and manifests carry lowtide's completeness under
META_KEY = "lowtide"
MANIFEST = "_lowtide_manifest.json"  # leading "_": Spark's file source skips it
STAGING = "_lowtide_staging"


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
    function."""

    path: str
    format: str = "delta"
    feeds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.format not in TABLE_FORMATS:
            raise ValueError(f"table format {self.format!r}: use one of {TABLE_FORMATS}")

    def build(self, ref_of: Callable[[], TrackerRef], segment: str) -> TableWriter:
        return TableWriter(self, ref_of, segment)


class TableWriter:
    """The ``foreachBatch`` function of a tracked table sink (runs on the driver); see
    the module docstring. ``ref_of`` gives the pipeline's tracker once it runs."""

    def __init__(self, config: TableConfig, ref_of: Callable[[], TrackerRef],
                 segment: str) -> None:
        self.config, self.segment = config, segment
        self._ref_of = ref_of
        self._ref: TrackerRef | None = None
        self._lock = threading.Lock()
        self.complete_below = 0  # the sink segment's latest min time
        self._beaten = 0  # the latest heartbeat of the bridge fronts
        self.committed_batch: int | None = None
        self._cancel: Callable[[], None] | None = None

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
            for reader in self.config.feeds:
                ensure_front(agent, bridge_front(self.segment, reader), reader, now)
            self._ref = ref
        self._cancel = agent.on_update(self._on_update, self.segment)
        return ref

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
        if self.config.format == "parquet":
            self._write_manifest()

    def stop(self) -> None:
        """Stop following the sink's min time (the bridge fronts stay where they are)."""
        if self._cancel is not None:
            self._cancel()
            self._cancel = None

    def metadata(self, batch_id: int) -> dict[str, Any]:
        ref = self._ref
        assert ref is not None
        return {"complete_below": self.complete_below,
                "complete_below_ms": self.complete_below * ref.grid.delta_ms,
                "wall_ms": wall_ms(), "graph": ref.graph.fingerprint(),
                "segment": self.segment, "batch": batch_id}

    def __call__(self, df: Any, batch_id: int) -> None:
        ref = self.start()
        query = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        self._feed(ref, df, str(query), batch_id)
        meta = json.dumps({META_KEY: self.metadata(batch_id)})
        if self.config.format == "delta":
            (df.write.format("delta").mode("append").option("txnAppId", str(query))
             .option("txnVersion", batch_id).option("userMetadata", meta)
             .save(self.config.path))
        else:
            write_parquet_batch(df, Path(self.config.path), batch_id)
        self.committed_batch = batch_id
        if self.config.format == "parquet":
            self._write_manifest()

    def _feed(self, ref: TrackerRef, df: Any, query: str, batch_id: int) -> None:
        """Send the batch's rows into every reader segment, before they are written."""
        if not self.config.feeds:
            return
        from pyspark.sql import functions as F

        rows = (df.groupBy(TIME_COL).agg(F.bit_xor(ACK_COL).alias("x"),
                                         F.count(F.lit(1)).alias("n")).collect())
        if not rows:
            return
        times = np.array([r[0] for r in rows], np.int64)
        xors = as_u64(np.array([r[1] for r in rows], np.int64))
        counts = np.array([r[2] for r in rows], np.int64)
        acc = AckAccumulator()
        for reader in self.config.feeds:
            acc.add_reduced(ref.graph.index(reader), times, xors, counts)
        key = batch_key(query, batch_id, f"<table>{self.segment}", 0)
        connect(ref).send_batch(key, acc.build(ref.grid.window_slots))

    def _write_manifest(self) -> None:
        if self._ref is None:
            return
        with self._lock:
            doc = {META_KEY: self.metadata(self.committed_batch if self.committed_batch
                                           is not None else -1)}
            folder = Path(self.config.path)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{MANIFEST}.{uuid.uuid4().hex}"
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, folder / MANIFEST)


def write_parquet_batch(df: Any, folder: Path, batch_id: int) -> None:
    """One Parquet file per batch, ``part-<batch>.parquet``: written aside, renamed in
    (a reader never sees half of it); a batch re-run after a restart finds its file
    and writes nothing. Local (POSIX) folders: renames must be atomic."""
    final = folder / f"part-{batch_id:010d}.parquet"
    if final.exists():
        return
    stage = folder / STAGING / f"batch-{batch_id}"
    df.coalesce(1).write.mode("overwrite").parquet(str(stage))
    parts = sorted(stage.glob("part-*.parquet"))
    if len(parts) != 1:
        raise RuntimeError(f"expected one Parquet file in {stage}, found {len(parts)}")
    os.replace(parts[0], final)


__all__ = [
    "MANIFEST",
    "META_KEY",
    "TABLE_FORMATS",
    "TableConfig",
    "TableWriter",
    "bridge_front",
    "check_feeds",
    "write_parquet_batch",
]
