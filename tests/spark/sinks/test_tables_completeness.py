"""Reading what a tracked table published, without Spark or the tracker: the newest
commit carrying lowtide's metadata (at or before a version), other writers' commits
and metadata skipped; the Parquet manifest; the module's docstring example. Several
tracked writers: the minimum over the declared ones, nothing until each published, and
a writer joining late never below what the table announced (its floor)."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from lowtide.spark.sinks import completeness
from lowtide.spark.sinks.completeness import Record, TableState, complete_below, replay
from lowtide.spark.sinks.delta_log import STATE_EVERY, save_state
from lowtide.spark.sinks.table_formats import (
    ParquetTable,
    RowsBelowTable,
    check_floor,
    retire_writer,
)
from lowtide.spark.sinks.tables import TableConfig


def commit(log: Path, version: int, meta: str | None) -> None:
    info = {"timestamp": 1, "operation": "WRITE"}
    if meta is not None:
        info["userMetadata"] = meta
    lines = [json.dumps({"commitInfo": info}), json.dumps({"add": {"path": f"p{version}"}})]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def published(t: int, batch: int) -> str:
    return json.dumps({"lowtide": {"complete_below": t, "complete_below_ms": t * 10,
                                   "wall_ms": 5, "graph": "f", "segment": "gold",
                                   "batch": batch}})


def test_delta_log_newest_lowtide_commit(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    commit(log, 0, None)  # the table's creation
    assert complete_below(tmp_path) is None
    commit(log, 1, published(100, 0))
    commit(log, 2, published(140, 1))
    commit(log, 3, "a note by another writer, not JSON")
    commit(log, 4, json.dumps({"team": "other"}))
    latest = complete_below(tmp_path)
    assert latest is not None
    assert (latest.complete_below, latest.complete_below_ms, latest.batch, latest.version) == (
        140, 1400, 1, 2)
    older = complete_below(tmp_path, version=1)
    assert older is not None and (older.complete_below, older.version) == (100, 1)
    assert complete_below(tmp_path, version=0) is None


def test_docstring_example() -> None:
    result = doctest.testmod(completeness)
    assert result.attempted > 0 and result.failed == 0


def record(writer: str, t: int, writers: tuple[str, ...] = (), query: str = "q") -> Record:
    return Record(writer, t, t * 10, 5, "f", writer, 0, query, writers or (writer,))


def test_delta_two_writers_minimum_and_nothing_until_each_declared_one_published(
        tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    meta = [record("a", 100, ("a", "b")), record("b", 40, ("a", "b")), record("a", 180, ("a", "b")),
            record("b", 90, ("a", "b"))]
    for v, r in enumerate(meta):
        commit(log, v, json.dumps({"lowtide": r.doc()}))
    assert complete_below(tmp_path, version=0) is None  # b declared, nothing from it yet
    at = [complete_below(tmp_path, version=v) for v in (1, 2, 3)]
    assert [(c.complete_below, c.writer) for c in at if c] == [(40, "b"), (40, "b"), (90, "b")]
    latest = complete_below(tmp_path)
    assert latest is not None and latest.writers == (("a", 180), ("b", 90))


def test_parquet_manifest_minimum_and_a_late_writer_floor(tmp_path: Path) -> None:
    table = ParquetTable(str(tmp_path))
    assert table.declare(None, "qa", record("a", 50)) == 0
    table.publish(record("a", 120), floor=0)
    assert complete_below(tmp_path).complete_below == 120  # type: ignore[union-attr]
    # b was not declared by a: it joins at the floor of what the table announced
    floor = table.declare(None, "qb", record("b", 30))
    assert floor == 120
    table.publish(record("b", 60), floor)
    c = complete_below(tmp_path)
    assert c is not None and c.writers == (("a", 120), ("b", 120)) and c.complete_below == 120
    with pytest.raises(RowsBelowTable, match="below slot 120"):
        check_floor(str(tmp_path), "b", 100, floor)
    check_floor(str(tmp_path), "b", 120, floor)


def test_parquet_declared_writers_hold_the_table_back(tmp_path: Path) -> None:
    table = ParquetTable(str(tmp_path))
    both = ("a", "b")
    table.declare(None, "qa", record("a", 50, both))
    table.publish(record("a", 120, both), floor=0)
    assert complete_below(tmp_path) is None
    assert table.declare(None, "qb", record("b", 30, both)) == 0  # nothing announced yet
    assert complete_below(tmp_path).complete_below == 30  # type: ignore[union-attr]


def test_a_writer_missing_from_its_own_writers_is_refused_where_described() -> None:
    config = TableConfig("/t/events", writers=("a", "b"))
    with pytest.raises(ValueError, match="not among writers"):
        config.build(lambda: None, "c")  # type: ignore[arg-type, return-value]
    assert config.build(lambda: None, "a").segment == "a"  # type: ignore[arg-type, return-value]


def test_readers_start_from_a_saved_state_after_the_log_is_cleaned(tmp_path: Path) -> None:
    """A writer saves the replayed state every STATE_EVERY versions; a reader replays
    only what follows, and still knows a writer whose commits the log's cleanup removed."""
    log = tmp_path / "_delta_log"
    log.mkdir()
    both = ("a", "b")
    commit(log, 0, json.dumps({"lowtide": record("b", 7, both).doc()}))
    for v in range(1, 2 * STATE_EVERY + 5):
        commit(log, v, json.dumps({"lowtide": record("a", 10 + v, both).doc()}) if v % 3
               else "someone else's commit")
    full = replay(tmp_path, until=STATE_EVERY + 20)
    save_state(tmp_path, full.scanned, full.doc())
    for v in range(STATE_EVERY + 21):  # Delta's cleanup of old commit files
        (log / f"{v:020d}.json").unlink()
    latest = complete_below(tmp_path)
    assert latest is not None and latest.writers == (("a", 10 + 2 * STATE_EVERY + 3), ("b", 7))
    assert latest.complete_below == 7 and latest.writer == "b"
    assert TableState.of(full.doc()) == full


def test_a_retired_writer_no_longer_holds_the_table_back(tmp_path: Path) -> None:
    both = ("a", "b")
    parquet = tmp_path / "pq"
    table = ParquetTable(str(parquet))
    table.declare(None, "qa", record("a", 120, both))
    table.declare(None, "qb", record("b", 40, both))
    assert complete_below(parquet).complete_below == 40  # type: ignore[union-attr]
    retire_writer(str(parquet), "b")
    assert complete_below(parquet).writers == (("a", 120),)  # type: ignore[union-attr]
    table.publish(record("b", 130, both), floor=120)  # it publishes again: back in
    assert complete_below(parquet).complete_below == 120  # type: ignore[union-attr]
    delta = tmp_path / "delta"
    (delta / "_delta_log").mkdir(parents=True)
    retired = Record("b", 0, 0, 1, "", "b", -2, retired=True)
    for v, r in enumerate([record("a", 90, both), record("b", 30, both), retired]):
        commit(delta / "_delta_log", v, json.dumps({"lowtide": r.doc()}))
    assert complete_below(delta, version=1).complete_below == 30  # type: ignore[union-attr]
    assert complete_below(delta).writers == (("a", 90),)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="spark="):
        retire_writer(str(delta), "a")
