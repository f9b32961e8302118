"""A front's records into a directory of JSON-lines or Parquet files (no pyspark), for
Spark's file source.

``FilesProducerConfig(directory, format="parquet").build(front).send(records)``:
``front.label(records)`` (send-acks first), then one file per batch with the label
columns ``lt_time``/``lt_ack`` (:mod:`lowtide.spark.sources.labels`), written under a
hidden temporary name (Spark's file source skips names starting with ``.``), synced,
and renamed to its final name; then ``front.written(batch)``. A file is visible whole
or not at all; a failed write leaves the batch in flight at the front (its segment
stops there: fail closed). A list of bytes becomes a ``value`` column (Parquet only:
JSON has no bytes type). File names carry the front and the batch's first sequence
number, so fronts sharing a directory never collide.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.spark.sources import records as rec
from lowtide.spark.sources.front import Front, Labelled
from lowtide.spark.sources.labels import ACK_COLUMN, TIME_COLUMN

__all__ = ["FILE_FORMATS", "FilesFrontProducer", "FilesProducerConfig"]

FILE_FORMATS = {"parquet": "parquet", "json": "json"}


@dataclass(frozen=True)
class FilesProducerConfig:
    directory: Path
    format: str = "parquet"
    prefix: str = "part"

    def build(self, front: Front) -> FilesFrontProducer:
        if self.format not in FILE_FORMATS:
            raise ValueError(f"format must be one of {sorted(FILE_FORMATS)}, "
                             f"got {self.format!r}")
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        return FilesFrontProducer(self, front)


class FilesFrontProducer:
    def __init__(self, config: FilesProducerConfig, front: Front) -> None:
        self.config = config
        self.front = front
        self.directory = Path(config.directory)

    def _table(self, batch: Labelled) -> Any:
        import pyarrow as pa

        k = rec.kind(batch.records)
        if k == "arrow":
            return (pa.Table.from_batches([batch.records])
                    if isinstance(batch.records, pa.RecordBatch) else batch.records)
        if k == "pandas":
            return pa.Table.from_pandas(batch.records, preserve_index=False)
        if self.config.format == "json":
            raise TypeError("JSON files hold columns, not bytes: pass a table or a "
                            "DataFrame, or use format='parquet'")
        return pa.table({"value": pa.array(batch.records, pa.binary()),
                         TIME_COLUMN: batch.times, ACK_COLUMN: batch.acks})

    def send(self, records: Any) -> Labelled:
        """Label, write one file (temporary name, sync, rename), then let the front
        heartbeat past it; returns the labelled batch (``.rejected``: late records)."""
        batch = self.front.label(records)
        if len(batch) == 0:
            self.front.written(batch)
            return batch
        name = (f"{self.config.prefix}-{self.front.front:05d}-{batch.first_seq:020d}."
                f"{FILE_FORMATS[self.config.format]}")
        final, temporary = self.directory / name, self.directory / f".{name}.tmp"
        try:
            self._write(self._table(batch), temporary)
            os.rename(temporary, final)
        finally:
            temporary.unlink(missing_ok=True)
        _sync_directory(self.directory)
        self.front.written(batch)
        return batch

    def _write(self, table: Any, path: Path) -> None:
        if self.config.format == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path)
        else:
            path.write_text("".join(line + "\n" for line in rec.json_lines(table)))
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _sync_directory(directory: Path) -> None:
    """Make the rename durable before the front promises past the file."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
