"""How a tracked table sink writes a batch and publishes its writer's record, per format
(:mod:`lowtide.spark.sinks.completeness` reads them).

Both formats start a writer the same way (:meth:`declare`): its record goes into the
table before any of its rows, and it learns its *floor*, the highest completeness the
table had announced by then. A writer never writes a row below its floor (the sink
refuses the batch: :class:`RowsBelowTable`) and never publishes below it: what a reader
was told stays true when a writer joins late or a query reruns from a new checkpoint.

* Delta: the declaration is an empty commit (made once per query with ``txnAppId``
  ``<query>:lowtide-declare``); each batch is an append made idempotent by ``txnAppId``
  (the query's id) and ``txnVersion`` (the batch), carrying the writer's record in its
  ``userMetadata``, in the batch's own transaction. The floor is replayed from the log
  (:mod:`lowtide.spark.sinks.delta_log`), which the writer then follows commit by
  commit, saving the replayed state every hundred versions for readers.
* Parquet: one file per batch, named and recorded by :mod:`lowtide.spark.sinks.batches`
  (a re-run batch whose file holds exactly its rows is not written again); the manifest
  is read, changed and replaced under a lock file, every writer's record in it. Local
  (POSIX) folders only: renames must be atomic and ``flock`` must work.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from lowtide.service.clock import wall_ms
from lowtide.spark.sinks.batches import BatchFiles, BatchRewritten
from lowtide.spark.sinks.completeness import (
    MANIFEST,
    Record,
    TableState,
    manifest_state,
    replay,
)
from lowtide.spark.sinks.delta_log import META_KEY, STATE_EVERY, save_state

STAGING = "_lowtide_staging"
LOCK = "_lowtide_manifest.lock"


class RowsBelowTable(RuntimeError):
    """A batch has rows below what the table announced before this writer joined."""


def check_floor(path: str, writer: str, min_time: int, floor: int) -> None:
    """One line, raised before a row is written or fed to a reader."""
    if min_time < floor:
        raise RowsBelowTable(
            f"writer {writer!r} of table {path} has rows at slot {min_time}, below slot "
            f"{floor} that the table had announced complete before this run joined (a "
            "rerun from a new checkpoint that re-reads old input, or a writer the others "
            "did not declare): write them to another table, start the source after what "
            "the table holds, or declare every writer with write_table(writers=...)")


class DeltaTable:
    def __init__(self, path: str) -> None:
        self.path = path
        self.table = Path(path)
        self.state: TableState | None = None  # replayed up to this writer's last commit

    def declare(self, df: Any, query: str, record: Record) -> int:
        """Commit ``record`` (raised to what the table announced) before any row of this
        query; returns the writer's floor."""
        before = replay(self.table) if (self.table / "_delta_log").is_dir() else TableState()
        record = replace(record, complete_below=max(record.complete_below, before.announced))
        (df.limit(0).write.format("delta").mode("append")
         .option("txnAppId", f"{query}:lowtide-declare").option("txnVersion", 0)
         .option("userMetadata", json.dumps({META_KEY: record.doc()})).save(self.path))
        self.state = replay(self.table, state=before)
        return self.state.announced

    def publish(self, record: Record, floor: int | None) -> int:
        """Nothing between batches: a record is published in its batch's commit."""
        return floor or 0

    def write(self, df: Any, query: str, batch_id: int, record: Record) -> None:
        """Append the batch; Delta skips a batch its query committed already (the same
        ``txnVersion``): only if that commit's rows have this batch's digest. Then
        follow the log, saving its replayed state now and then."""
        assert self.state is not None, "declare first"
        earlier = self.state.records.get(record.writer)
        if earlier is not None and (earlier.query, earlier.batch) == (query, batch_id) \
                and earlier.digest != record.digest:
            raise BatchRewritten.of(query, batch_id, self.path)
        (df.write.format("delta").mode("append").option("txnAppId", query)
         .option("txnVersion", batch_id)
         .option("userMetadata", json.dumps({META_KEY: record.doc()})).save(self.path))
        saved = self.state.scanned // STATE_EVERY
        self.state = replay(self.table, state=self.state)
        if self.state.scanned // STATE_EVERY > saved:
            save_state(self.table, self.state.scanned, self.state.doc())


class ParquetTable:
    def __init__(self, path: str) -> None:
        self.folder = Path(path)

    def declare(self, df: Any, query: str, record: Record) -> int:
        return self.publish(record, floor=None)

    def publish(self, record: Record, floor: int | None) -> int:
        """Put ``record`` (raised to ``floor``) into the manifest under the lock; with
        ``floor=None`` (a declaration) the floor is what the table announced so far.
        Returns the floor."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with _locked(self.folder / LOCK):
            state = manifest_state(self.folder)
            floor = state.announced if floor is None else floor
            state.apply(replace(record, complete_below=max(record.complete_below, floor)))
            doc = {"writers": {w: r.doc() for w, r in state.records.items()},
                   "announced": state.announced, "retired": sorted(state.retired)}
            current = state.completeness()
            if current is not None:  # the top-level fields: the table's completeness
                doc.update({k: v for k, v in asdict(current).items() if k != "writers"})
            _replace_text(self.folder / MANIFEST, json.dumps({META_KEY: doc}))
        return floor

    def write(self, df: Any, query: str, batch_id: int, record: Record) -> None:
        """One Parquet file per batch, ``part-<query>-<batch>.parquet``: written aside,
        renamed in (a reader never sees half of it), recorded with its rows' digest."""
        files = BatchFiles(self.folder, query, batch_id)
        if files.committed(record.digest):
            return
        stage = self.folder / STAGING / f"{query}-{batch_id}"
        df.coalesce(1).write.mode("overwrite").parquet(str(stage))
        parts = sorted(stage.glob("part-*.parquet"))
        if len(parts) != 1:
            raise RuntimeError(f"expected one Parquet file in {stage}, found {len(parts)}")
        files.publish([(parts[0], "")], record.digest)


def retire_writer(path: str, writer: str, spark: Any = None) -> None:
    """Take ``writer``, stopped for good, out of the completeness of the table at
    ``path`` (until it publishes again): the table's completeness no longer waits for
    it. A Delta table's retirement is a commit (``spark``: a session with Delta)."""
    record = Record(writer, 0, 0, wall_ms(), "", writer, -2, retired=True)
    if not (Path(path) / "_delta_log").is_dir():
        ParquetTable(path).publish(record, floor=0)
        return
    if spark is None:
        raise ValueError(f"{path} is a Delta table: retire_writer(path, writer, spark=...)")
    (spark.read.format("delta").load(path).limit(0).write.format("delta").mode("append")
     .option("txnAppId", f"lowtide-retire:{writer}:{uuid.uuid4().hex}")
     .option("txnVersion", 0).option("userMetadata", json.dumps({META_KEY: record.doc()}))
     .save(path))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _replace_text(path: Path, text: str) -> None:
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = ["LOCK", "STAGING", "DeltaTable", "ParquetTable", "RowsBelowTable", "check_floor",
           "retire_writer"]
