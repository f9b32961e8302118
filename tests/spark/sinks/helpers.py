"""What the sink tests share: running queries of a pipeline, and the check that a
tracked Delta table never published a time before the rows below it were committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lowtide.spark import complete_below


@contextmanager
def running(pipe: Any) -> Iterator[list[Any]]:
    """The queries started in the block; stopped, with the pipeline, at its end (the
    tracker reported nothing stuck if the block ended normally)."""
    queries: list[Any] = []
    try:
        yield queries
        assert not pipe.status().stuck
    finally:
        for q in queries:
            q.stop()
        pipe.close()


def versions(table: Path) -> list[tuple[int, int | None, pd.DataFrame]]:
    """(version, published complete_below, the table's rows at that version) from the
    Delta log itself: the files each commit added (the sinks only append)."""
    out, files = [], []
    commits = sorted(table.glob("_delta_log/*.json"), key=lambda p: int(p.stem))
    for path in commits:
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files.append(pq.read_table(table / action["add"]["path"]))
        published = complete_below(table, int(path.stem))
        cb = published.complete_below if published and published.version == int(path.stem) \
            else None
        rows = pa.concat_tables(files).to_pandas() if files else pd.DataFrame()
        out.append((int(path.stem), cb, rows))
    return out


def assert_never_early(table: Path, expected: pd.DataFrame, key: list[str]) -> int:
    """At every version, every expected row with ``lt_time`` below what that version
    published is in the table; returns the highest value published."""
    highest = 0
    for version, cb, rows in versions(table):
        if cb is None:
            continue
        highest = max(highest, cb)
        due = expected[expected["lt_time"] < cb]
        have = set(map(tuple, rows[key].to_numpy().tolist())) if len(rows) else set()
        early = [k for k in map(tuple, due[key].to_numpy().tolist()) if k not in have]
        assert not early, f"version {version} claims {cb} before {early[:3]} were committed"
    return highest
