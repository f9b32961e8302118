"""A retry loop's storage: the rows a step sends back round its loop, and the rows it
gave up on (:mod:`lowtide.spark.operators.retry` writes them, the loop source
:mod:`lowtide.spark.sources.loop_source` reads the first back into the step).

Layout of a retry directory::

    loop/<batch>-<partition>.arrow             rows waiting for their next attempt: one
                                               Arrow IPC file per task of the step that
                                               failed them, named by its micro-batch and
                                               partition (zero-padded, so names sort)
    dead_letter/<batch>-<partition>.parquet    rows given up, with their error

A file is written whole under a temporary name and renamed into place, so a reader
never sees half of one. A task run again (a Spark retry, or the batch re-run after a
restart from the checkpoint) has the same rows (rule 5) and writes the same file under
the same name: each row is there once. The loop source deletes the loop files it has
committed; dead letters stay.

>>> import pyarrow as pa, tempfile
>>> d = tempfile.mkdtemp()
>>> write_rows(d, LOOP_DIR, 7, 1, [pa.record_batch({"x": [1, 2]})])
'000000000007-00001.arrow'
>>> empty = pa.record_batch({"x": pa.array([], pa.int64())})
>>> write_rows(d, LOOP_DIR, 7, 2, [empty])
>>> loop_files(d), read_loop_file(d, "000000000007-00001.arrow").num_rows
(['000000000007-00001.arrow'], 2)
>>> drop_loop_files(d, "000000000007-00001.arrow"); loop_files(d)
[]
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOP_DIR = "loop"
DEAD_DIR = "dead_letter"
_EXT = {LOOP_DIR: ".arrow", DEAD_DIR: ".parquet"}


def file_name(kind: str, batch_id: int, partition: int) -> str:
    """The name of the file a task of micro-batch ``batch_id`` writes (sortable)."""
    return f"{batch_id:012d}-{partition:05d}{_EXT[kind]}"


def write_rows(directory: str, kind: str, batch_id: int, partition: int,
               batches: list[Any]) -> str | None:
    """Write ``batches`` (Arrow record batches of one schema) as the task's file of
    ``kind`` (``LOOP_DIR`` or ``DEAD_DIR``), atomically; None when they hold no row."""
    import pyarrow as pa

    rows = [b for b in batches if b.num_rows]
    if not rows:
        return None
    table = pa.Table.from_batches(rows)
    folder = Path(directory, kind)
    folder.mkdir(parents=True, exist_ok=True)
    name = file_name(kind, batch_id, partition)
    tmp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
    if kind == LOOP_DIR:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, tmp)
    with open(tmp, "rb+") as f:  # durable before it is visible: its acks may follow
        os.fsync(f.fileno())
    os.replace(tmp, folder / name)
    return name


def loop_files(directory: str) -> list[str]:
    """The loop files present, in name (batch, partition) order."""
    folder = Path(directory, LOOP_DIR)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".arrow"
                  and not p.name.startswith("."))


def read_loop_file(directory: str, name: str) -> Any:
    """The rows of one loop file, as a pyarrow Table."""
    import pyarrow as pa

    with pa.memory_map(str(Path(directory, LOOP_DIR, name))) as source:
        return pa.ipc.open_file(source).read_all()


def drop_loop_files(directory: str, upto: str) -> None:
    """Delete the loop files named ``upto`` or before (read and committed)."""
    for name in loop_files(directory):
        if name <= upto:
            Path(directory, LOOP_DIR, name).unlink(missing_ok=True)


@dataclass(frozen=True)
class RetryCounts:
    """A retry directory at a glance: rows waiting in loop files not yet read back
    (those read and not yet committed included), rows given up."""

    waiting_rows: int
    given_up_rows: int


def retry_counts(directory: str) -> RetryCounts:
    """Count the rows of ``directory``'s loop files and dead letters (file footers
    only for the dead letters)."""
    import pyarrow.parquet as pq

    waiting = 0
    for name in loop_files(directory):
        try:
            waiting += read_loop_file(directory, name).num_rows
        except FileNotFoundError:  # committed and deleted meanwhile
            continue
    dead = Path(directory, DEAD_DIR)
    given_up = sum(pq.ParquetFile(p).metadata.num_rows
                   for p in sorted(dead.glob("*.parquet"))) if dead.is_dir() else 0
    return RetryCounts(waiting, given_up)


__all__ = ["DEAD_DIR", "LOOP_DIR", "RetryCounts", "drop_loop_files", "file_name",
           "loop_files", "read_loop_file", "retry_counts", "write_rows"]
