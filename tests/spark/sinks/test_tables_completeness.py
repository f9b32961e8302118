"""Reading what a tracked table published, without Spark or the tracker: the newest
commit carrying lowtide's metadata (at or before a version), other writers' commits
and metadata skipped; the Parquet manifest; the module's docstring example."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

from lowtide.spark.sinks import completeness
from lowtide.spark.sinks.completeness import complete_below


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
