"""Who reads an ingest log, and deleting what all of them have committed.

Each consumer (a query reading the log; by default named after its ingest segment)
registers before its first read and records what it committed, in
``<log dir>/consumers/<name>.json`` (``{"<front>": next offset}``), written whole
(temporary file, then rename). A commit only moves forward.

:func:`retain` deletes the whole log files of a front whose records every registered
consumer has committed; the file being written is never deleted. With no consumer
registered nothing is deleted: a log nobody reads yet is kept. A consumer that
registers after its records were deleted fails on read (``RecordsDeleted``) instead of
skipping them.

>>> import tempfile
>>> from lowtide.spark.sources.ingest import IngestWriter, log_files
>>> d = tempfile.mkdtemp()
>>> w = IngestWriter(d, front=0, fsync="never", rotate_bytes=1)
>>> for t in range(3):
...     _ = w.append([b"x"], time=t)
>>> register_consumer(d, "a", {0: 0}); register_consumer(d, "b", {0: 0})
>>> commit_consumer(d, "a", {0: 3}); commit_consumer(d, "b", {0: 2})
>>> retain(d), log_files(d, 0)
({0: 2}, [2])
>>> log_status(d)[0]["complete_offset"]
2
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from lowtide.spark.sources.ingest import (
    IngestReader,
    index_path,
    list_fronts,
    log_files,
    log_path,
)
from lowtide.spark.sources.joins import join_requests, release_join

__all__ = ["commit_consumer", "consumers", "log_status", "register_consumer",
           "release_consumer", "retain"]

CONSUMERS = "consumers"


def _path(directory: str | os.PathLike[str], consumer: str) -> Path:
    if not consumer or "/" in consumer or consumer.startswith("."):
        raise ValueError(f"consumer name {consumer!r}: use letters, digits, - and _")
    return Path(directory) / CONSUMERS / f"{consumer}.json"


def _write(path: Path, offsets: dict[int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps({str(f): o for f, o in sorted(offsets.items())}))
    os.replace(temporary, path)


def _read(path: Path) -> dict[int, int]:
    return {int(f): int(o) for f, o in json.loads(path.read_text()).items()}


def consumers(directory: str | os.PathLike[str]) -> dict[str, dict[int, int]]:
    """Every registered consumer and its committed offsets per front."""
    folder = Path(directory) / CONSUMERS
    if not folder.is_dir():
        return {}
    return {p.stem: _read(p) for p in sorted(folder.glob("*.json"))}


def register_consumer(
    directory: str | os.PathLike[str], consumer: str, offsets: dict[int, int]
) -> None:
    """``consumer`` will read from ``offsets``; a registered consumer keeps its commits."""
    path = _path(directory, consumer)
    if not path.exists():
        _write(path, offsets)


def commit_consumer(
    directory: str | os.PathLike[str], consumer: str, offsets: dict[int, int]
) -> None:
    """``consumer`` has committed every record below ``offsets`` (it never reads them
    again, across restarts)."""
    path = _path(directory, consumer)
    merged = _read(path) if path.exists() else {}
    for front, offset in offsets.items():
        merged[front] = max(merged.get(front, 0), offset)
    _write(path, merged)


def release_consumer(directory: str | os.PathLike[str], consumer: str) -> None:
    """``consumer`` reads no more (its query was detached from the pipeline, rule 16):
    its commits no longer hold what :func:`retain` may delete, and the fronts that joined
    it stop sending into its segment (:mod:`~lowtide.spark.sources.joins`)."""
    _path(directory, consumer).unlink(missing_ok=True)
    for segment, name in join_requests(directory).items():
        if name == consumer:
            release_join(directory, segment)


def _committed_by_all(directory: str | os.PathLike[str], front: int) -> int | None:
    """The offset below which every consumer committed ``front`` (None: no consumer)."""
    committed = consumers(directory)
    if not committed:
        return None
    return min(offsets.get(front, 0) for offsets in committed.values())


def retain(directory: str | os.PathLike[str]) -> dict[int, int]:
    """Delete the log files every consumer committed; returns, per front, the first
    offset still stored."""
    out = {}
    for front in list_fronts(directory):
        keep_from = _committed_by_all(directory, front)
        bases = log_files(directory, front)
        for base, next_base in itertools.pairwise(bases):
            if keep_from is None or next_base > keep_from:
                break
            index_path(directory, front, base).unlink(missing_ok=True)  # readers stop here
            log_path(directory, front, base).unlink(missing_ok=True)
        out[front] = IngestReader(directory, front).start_offset()
    return out


def log_status(directory: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Per front: the offsets stored, what each consumer committed, and the offset
    below which every consumer committed (``complete_offset``)."""
    committed = consumers(directory)
    out = {}
    for front in list_fronts(directory):
        reader = IngestReader(directory, front)
        out[front] = {
            "start_offset": reader.start_offset(),
            "end_offset": reader.end_offset(),
            "files": len(log_files(directory, front)),
            "committed": {name: offsets.get(front, 0) for name, offsets in committed.items()},
            "complete_offset": _committed_by_all(directory, front),
        }
    return out
