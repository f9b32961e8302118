"""Consistent cuts at a min time, without markers (Gearpump's checkpoint at a min clock).

Once every tracked sink of a pipeline is complete below ``T`` (each table's published
completeness, :mod:`.completeness`, or each sink segment's min time), the rows below
``T`` in all of them form a consistent cut: every row below ``T`` that any query will
ever write is written, and each sink only appends, so no later commit adds or removes
one. A cut needs no marker in the data and no pause: it is read off the outputs.

* :func:`read_complete` reads one output as of ``T``: a Delta table at the first version
  whose published completeness reached ``T``, a Parquet folder from the files holding
  rows below ``T``; the rows below ``T`` only.
* :func:`cut` names, for every sink, the committed batches and files that hold its rows
  below ``T`` (a manifest: ``lowtide cut --as-of T``); backfills and restores start
  there, with a replay by time from ``T`` (``Pipeline.replay``).

A cut at a ``T`` some sink has not reached is refused (:class:`CutRefused`), with that
sink and how far it is complete. Times are slots: a timestamp is rounded up to one
(:func:`slot_of_ms`), as ``wait_until_complete`` does.

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> try:
...     sink_cut(folder, 5)
... except CutRefused as e:
...     print(str(e).split(":")[0])
cut at slot 5 refused
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lowtide.core.errors import LowtideError
from lowtide.spark.sinks.completeness import Record, TableState, complete_below
from lowtide.spark.sinks.delta_log import META_KEY
from lowtide.spark.tracking.column import TIME_COL

__all__ = ["Cut", "CutFile", "CutRefused", "SinkCut", "cut", "delta_ms_of", "read_complete",
           "sink_cut", "slot_of_ms"]

_BATCH_FILE = re.compile(r"^part-(?P<query>.+)-(?P<batch>\d{10})(?:-\d+)?\.parquet$")


class CutRefused(LowtideError, ValueError):
    """A cut at a time some sink has not reached (or cannot show it has)."""


@dataclass(frozen=True)
class CutFile:
    """A file of a sink with rows below the cut: its path (relative to the sink), the
    batch that committed it (query id and batch, or the Delta version) and how many of
    its rows are below the cut."""

    file: str
    rows: int
    query: str | None = None
    batch: int | None = None
    version: int | None = None


@dataclass(frozen=True)
class SinkCut:
    """One sink's share of a cut."""

    path: str
    format: str  # "delta" | "parquet"
    complete_below: int  # the sink's completeness the cut relies on (slot, >= the cut)
    version: int | None  # Delta: the version read
    files: tuple[CutFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def batches(self) -> list[dict[str, Any]]:
        """The committed batches holding rows below the cut (query, batch, version)."""
        seen = sorted({(f.query or "", -1 if f.batch is None else f.batch,
                        -1 if f.version is None else f.version) for f in self.files})
        return [{"query": q or None, "batch": None if b < 0 else b,
                 "version": None if v < 0 else v} for q, b, v in seen]


@dataclass(frozen=True)
class Cut:
    """Every sink's rows below slot ``as_of``: a consistent cut of the pipeline."""

    as_of: int
    delta_ms: int
    sinks: tuple[SinkCut, ...]

    def doc(self) -> dict[str, Any]:
        ms = self.as_of * self.delta_ms
        return {"as_of_slot": self.as_of, "as_of_ms": ms,
                "as_of": datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(),
                "sinks": [{"path": s.path, "format": s.format, "version": s.version,
                           "complete_below": s.complete_below, "rows": s.rows,
                           "batches": s.batches(), "files": [asdict(f) for f in s.files]}
                          for s in self.sinks]}


def slot_of_ms(ms: int | datetime, delta_ms: int) -> int:
    """The first slot whose rows are all at or after ``ms`` (a datetime, or ms since the
    epoch): a cut there holds every row before ``ms``."""
    value = ms if isinstance(ms, int) else round(ms.timestamp() * 1000)
    return -(-value // delta_ms)


def _refuse(path: str, slot: int, why: str) -> CutRefused:
    return CutRefused(f"cut at slot {slot} refused: {path} {why}")


def _check_reached(path: str, slot: int, complete: int | None, writer: str = "") -> int:
    if complete is None:
        raise _refuse(path, slot, "publishes no completeness (a tracked table: write_table; "
                                  "a write_parquet output: pass its sink's min time)")
    if complete < slot:
        held = f" (writer {writer!r} holds it back)" if writer else ""
        raise _refuse(path, slot, f"is complete below slot {complete} only{held}: wait for "
                                  "it, or cut earlier")
    return complete


def _delta_as_of(table: Path, slot: int) -> SinkCut:
    """The first version whose published completeness reached ``slot``, and the files
    live at that version, from the JSON commits (add, remove, lowtide's records)."""
    log = table / "_delta_log"
    versions = sorted(int(p.stem) for p in log.glob("*.json") if p.stem.isdigit())
    if not versions or versions[0] != 0:
        raise _refuse(str(table), slot, "has no commit 0 in its log any more (cleaned up)")
    state, live = TableState(), {}
    for v in versions:
        actions = [json.loads(line) for line in (log / f"{v:020d}.json").read_text()
                   .splitlines() if line.strip()]
        record = None
        for a in actions:
            doc = _lowtide_doc(a.get("commitInfo", {}).get("userMetadata"))
            if doc is not None:
                record = Record.of(doc)
                state.apply(record, v)
        for a in actions:
            if "add" in a:
                live[a["add"]["path"]] = (v, record)
            elif "remove" in a:
                live.pop(a["remove"]["path"], None)
        now = state.completeness()
        if now is not None and now.complete_below >= slot:
            files = [CutFile(name, n, r.query if r else None, r.batch if r else None, version)
                     for name, (version, r) in sorted(live.items())
                     if (n := _rows_below(table / unquote(name), slot))]
            return SinkCut(str(table), "delta", now.complete_below, v, tuple(files))
    now = state.completeness()
    _check_reached(str(table), slot, None if now is None else now.complete_below,
                   "" if now is None else now.writer)
    raise AssertionError("unreachable")  # pragma: no cover


def _lowtide_doc(meta: str | None) -> dict[str, Any] | None:
    """lowtide's record in a commit's user metadata (other writers' need not be JSON)."""
    try:
        doc = json.loads(meta) if meta else None
    except ValueError:
        return None
    inner = doc.get(META_KEY) if isinstance(doc, dict) else None
    return inner if isinstance(inner, dict) else None


def _rows_below(file: Path, slot: int) -> int:
    """How many rows of a Parquet file have ``lt_time < slot`` (its statistics first)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(file)
    meta = pf.metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if TIME_COL not in names:
        raise CutRefused(f"{file} has no {TIME_COL} column: not a file of a tracked output "
                         "that keeps its labels")
    col = names.index(TIME_COL)
    stats = [meta.row_group(g).column(col).statistics for g in range(meta.num_row_groups)]
    if all(s is not None and s.has_min_max for s in stats) and all(s.min >= slot for s in stats):
        return 0
    times = pf.read(columns=[TIME_COL]).column(0)
    return int(pc.sum(pc.less(times, slot)).as_py() or 0)


def _parquet_as_of(folder: Path, slot: int, complete: int) -> SinkCut:
    files = []
    for file in sorted(folder.glob("part-*.parquet")):
        n = _rows_below(file, slot)
        if n:
            m = _BATCH_FILE.match(file.name)
            files.append(CutFile(file.name, n, m["query"] if m else None,
                                 int(m["batch"]) if m else None))
    return SinkCut(str(folder), "parquet", complete, None, tuple(files))


def sink_cut(path: str | Path, slot: int, *, complete: int | None = None) -> SinkCut:
    """One sink's rows below ``slot``: the files that hold them; refused unless the sink
    is complete below ``slot``. ``complete``: the sink's completeness when the output
    publishes none (a ``write_parquet`` output: its sink segment's min time)."""
    folder = Path(path)
    if complete is None and (folder / "_delta_log").is_dir():
        return _delta_as_of(folder, slot)
    if complete is None:
        published = complete_below(folder)
        complete = _check_reached(str(folder), slot,
                                  None if published is None else published.complete_below,
                                  "" if published is None else published.writer)
    else:
        _check_reached(str(folder), slot, complete)
    return _parquet_as_of(folder, slot, complete)


def delta_ms_of(path: str | Path) -> int:
    """The slot width the table at ``path`` published its completeness with."""
    published = complete_below(Path(path))
    if published is None or published.complete_below <= 0:
        raise CutRefused(f"{path} publishes no completeness yet: cut at a slot, or pass "
                         "delta_ms")
    return published.complete_below_ms // published.complete_below


def _slot(path: str | Path, as_of: int | datetime, delta_ms: int | None) -> int:
    return slot_of_ms(as_of, delta_ms or delta_ms_of(path))


def cut(paths: list[str] | dict[str, int | None], as_of: int, *, delta_ms: int) -> Cut:
    """A consistent cut at slot ``as_of`` over every sink in ``paths`` (a list of
    tracked tables, or path -> its sink's min time for outputs that publish none);
    refused with the first sink that has not reached it."""
    known = paths if isinstance(paths, dict) else dict.fromkeys(paths)
    return Cut(as_of, delta_ms, tuple(sink_cut(p, as_of, complete=c) for p, c in known.items()))


def read_complete(spark: Any, path: str, as_of: int | datetime, *,
                  delta_ms: int | None = None) -> Any:
    """The rows of the tracked table at ``path`` before ``as_of`` (a datetime, or ms
    since the epoch), read as of the cut (Delta: the first version complete below it):
    refused unless the table is complete below it. ``delta_ms``: the tracker's slot
    width (default: the one the table's records were published with)."""
    from pyspark.sql import functions as F

    slot = _slot(path, as_of, delta_ms)
    share = sink_cut(path, slot)
    if share.format == "delta":
        df = spark.read.format("delta").option("versionAsOf", share.version).load(str(path))
    elif share.files:
        df = spark.read.parquet(*(str(Path(path) / f.file) for f in share.files))
    else:
        df = spark.read.parquet(str(path))
    return df.where(F.col(TIME_COL) < slot)
