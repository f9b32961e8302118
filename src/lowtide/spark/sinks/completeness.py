"""What a tracked table published: "complete through t", read without the tracker and
without Spark (a batch job, another team, a shell), over every tracked writer.

Each tracked writer of a table publishes its own record (its sink's min time) and the
writers it declares (``write_table(..., writers=(...))``). The table's completeness is
the minimum over every declared writer's latest record, and nothing while a declared
writer has published none: a reader is never told "complete" past rows a slower writer
commits later (rule 14). Delta: records in the commits' ``userMetadata``, replayed
version by version from the newest state a writer saved (:mod:`.delta_log`); Parquet:
one manifest, ``_lowtide_manifest.json``, updated under a lock by every writer.

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> complete_below(folder) is None
True
>>> a = Record("a", 7, 70, 5, "g", "a", 3, "q1", ("a", "b"))
>>> doc = {"writers": {"a": a.doc()}, "announced": 0}
>>> _ = open(f"{folder}/_lowtide_manifest.json", "w").write(json.dumps({META_KEY: doc}))
>>> complete_below(folder) is None  # "b" is declared and has published nothing yet
True
>>> doc["writers"]["b"] = Record("b", 5, 50, 6, "g", "b", 1, "q2", ("a", "b")).doc()
>>> _ = open(f"{folder}/_lowtide_manifest.json", "w").write(json.dumps({META_KEY: doc}))
>>> c = complete_below(folder); c.complete_below, c.writer, c.writers
(5, 'b', (('a', 7), ('b', 5)))
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lowtide.spark.sinks.delta_log import META_KEY, commits, saved_state

MANIFEST = "_lowtide_manifest.json"  # leading "_": Spark's file source skips it


@dataclass(frozen=True)
class Record:
    """One writer's publication: every row it writes with ``lt_time < complete_below``
    is in the table."""

    writer: str  # the writer's sink segment
    complete_below: int
    complete_below_ms: int
    wall_ms: int  # when the sink published it
    graph: str  # fingerprint of the pipeline graph the writer's tracker tracked
    segment: str  # the writer's sink segment
    batch: int  # the sink's micro-batch that published it (-1: the declaration)
    query: str = ""  # the writing query's id (a rerun from a new checkpoint: another)
    writers: tuple[str, ...] = ()  # every writer of the table this one declares
    digest: str = ""  # Delta: the batch's rows (lowtide.spark.sinks.batches.digest)
    retired: bool = False  # the writer stopped for good (retire_writer)

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Record:
        """A record as published (those of lowtide 0.2.0.dev0 before writers: one)."""
        segment = str(doc["segment"])
        return cls(str(doc.get("writer", segment)), int(doc["complete_below"]),
                   int(doc["complete_below_ms"]), int(doc["wall_ms"]), str(doc["graph"]),
                   segment, int(doc["batch"]), str(doc.get("query", "")),
                   tuple(doc.get("writers", ())), str(doc.get("digest", "")),
                   bool(doc.get("retired", False)))

    def doc(self) -> dict[str, Any]:
        return {**asdict(self), "writers": list(self.writers)}


@dataclass(frozen=True)
class Completeness:
    """Every row with ``lt_time < complete_below`` (a slot; ``complete_below_ms`` in
    wall-clock ms) is in the table, from every tracked writer: at Delta version
    ``version``, or in the Parquet folder's files. The other fields are those of
    ``writer``, the writer whose record is the minimum (the one holding it back)."""

    complete_below: int
    complete_below_ms: int
    wall_ms: int
    graph: str
    segment: str
    batch: int
    version: int | None = None  # Delta: the newest version carrying a record
    writer: str = ""
    writers: tuple[tuple[str, int], ...] = ()  # (writer, its own complete_below)

    @classmethod
    def of(cls, records: list[Record], version: int | None = None) -> Completeness:
        low = min(records, key=lambda r: r.complete_below)
        return cls(low.complete_below, low.complete_below_ms, low.wall_ms, low.graph,
                   low.segment, low.batch, version, low.writer,
                   tuple(sorted((r.writer, r.complete_below) for r in records)))


@dataclass
class TableState:
    """The writers' latest records, as of a version; ``announced``: the highest
    completeness the table has shown so far (a writer joining later never writes
    below it); ``scanned``: the last Delta version replayed."""

    records: dict[str, Record] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)
    announced: int = 0
    version: int | None = None
    scanned: int = -1
    retired: set[str] = field(default_factory=set)  # until they publish again

    def apply(self, record: Record, version: int | None = None) -> None:
        if record.retired:
            self.records.pop(record.writer, None)
            self.retired.add(record.writer)
        else:
            self.records[record.writer] = record
            self.retired.discard(record.writer)
            self.declared.update({record.writer, *record.writers})
        self.version = version
        now = self.completeness()
        if now is not None:
            self.announced = max(self.announced, now.complete_below)

    def completeness(self) -> Completeness | None:
        """The minimum over the declared writers; None while one has published nothing."""
        if not self.records or self.declared - self.retired - self.records.keys():
            return None
        return Completeness.of(list(self.records.values()), self.version)

    def doc(self) -> dict[str, Any]:
        return {"records": {w: r.doc() for w, r in sorted(self.records.items())},
                "declared": sorted(self.declared), "announced": self.announced,
                "version": self.version, "scanned": self.scanned,
                "retired": sorted(self.retired)}

    @classmethod
    def of(cls, doc: dict[str, Any]) -> TableState:
        return cls({w: Record.of(r) for w, r in doc["records"].items()}, set(doc["declared"]),
                   int(doc["announced"]), doc["version"], int(doc["scanned"]),
                   set(doc.get("retired", ())))


def replay(table: Path, until: int | None = None, state: TableState | None = None) -> TableState:
    """A Delta table's state as of version ``until`` (None: the latest), from ``state``
    or the newest state saved at or before it, then commit by commit."""
    if state is None:
        saved = saved_state(table, until)
        state = TableState.of(saved) if saved is not None else TableState()
    for v, docs in commits(table, state.scanned, until):
        for doc in docs:
            state.apply(Record.of(doc), v)
        state.scanned = v
    return state


def complete_below(path: str | Path, version: int | None = None) -> Completeness | None:
    """What the tracked table at ``path`` has published (Delta: as of ``version``), over
    all its tracked writers, or None if it published nothing yet."""
    folder = Path(path)
    if (folder / "_delta_log").is_dir():
        return replay(folder, version).completeness()
    return manifest_state(folder).completeness()


def manifest_state(folder: Path) -> TableState:
    """The Parquet table's manifest as a :class:`TableState` (empty if there is none)."""
    state = TableState()
    manifest = folder / MANIFEST
    if manifest.exists():
        doc = json.loads(manifest.read_text())[META_KEY]
        legacy = [doc] if "writers" not in doc else []  # one writer, before writers
        records = [Record.of(r) for r in [*doc.get("writers", {}).values(), *legacy]]
        state.records = {r.writer: r for r in records}
        state.declared = {w for r in records for w in (r.writer, *r.writers)}
        state.announced = int(doc.get("announced", 0))
        state.retired = set(doc.get("retired", ()))
    return state


__all__ = ["MANIFEST", "META_KEY", "Completeness", "Record", "TableState", "complete_below",
           "manifest_state", "replay"]
