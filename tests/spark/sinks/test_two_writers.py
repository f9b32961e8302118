"""Two tracked queries appending to one Delta table (issue 29 point 6, rule 14): the
table's completeness is the minimum over every declared writer, so no version claims a
time before a slower writer's rows below it were committed, and a query reading the
table waits for both. A writer the others did not declare, joining with rows below what
the table announced, is refused with one line, and none of its rows land."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark import complete_below
from tests.spark.sinks.helpers import assert_never_early, running
from tests.spark.sources.helpers import (
    GRID,
    NEEDS_DELTA,
    SCHEMA,
    LabelFronts,
    has_delta,
    parquet_files,
)

pytestmark = pytest.mark.spark

LAG_B = 200  # slots (2 s) writer b's front labels behind the clock
STUCK_MS = 300_000  # a loaded machine (load 17 on 2 cores) took minutes per batch


def files_stream(spark: Any, folder: Path) -> Any:
    folder.mkdir()
    return spark.readStream.schema(SCHEMA).parquet(str(folder))


def published(table: Path) -> int:
    c = complete_below(table)
    return -1 if c is None else c.complete_below


def empty_delta(spark: Any, path: Path) -> None:
    spark.createDataFrame([], SCHEMA).write.format("delta").save(str(path))


@pytest.mark.slow  # ~30 s; two writers' minimum by default: test_tables_completeness.py
def test_two_writers_publish_their_minimum_and_the_reader_waits_for_both(
        spark, tmp_path: Path) -> None:
    if not has_delta(spark):
        pytest.skip(NEEDS_DELTA)
    table, out = tmp_path / "table", tmp_path / "out"
    empty_delta(spark, table)
    pipe = lowtide.Pipeline(spark, "two-writers", grid=GRID, stuck_after_ms=STUCK_MS)
    a = pipe.read_stream(files_stream(spark, tmp_path / "in_a"), name="in_a")
    b = pipe.read_stream(files_stream(spark, tmp_path / "in_b"), name="in_b")
    reader = pipe.read_stream(spark.readStream.format("delta").load(str(table)), name="silver")
    pipe.start_tracker(pipe.plan((a, "a"), (b, "b"), (reader, "gold")).graph)
    fa = LabelFronts(pipe.tracker.agent, "in_a", {0: 0})
    fb = LabelFronts(pipe.tracker.agent, "in_b", {1: LAG_B})
    both = ("a", "b")
    written, samples = [], []
    with running(pipe) as queries:
        for stream, name in ((a, "a"), (b, "b")):
            queries.append(stream.write_table(
                str(table), checkpoint=str(tmp_path / f"c_{name}"), name=name, writers=both,
                feeds=("silver",), trigger="300 milliseconds"))
        queries.append(reader.write_parquet(str(out), checkpoint=str(tmp_path / "c_gold"),
                                            name="gold", keep_tracking_columns=True,
                                            trigger="300 milliseconds"))
        _qa, qb, gold = queries
        writes = {0: parquet_files(tmp_path / "in_a"), 1: parquet_files(tmp_path / "in_b")}
        for i in range(4):
            for fronts, f in ((fa, 0), (fb, 1)):
                written.append(fronts.write(f, 20 + 5 * i, writes[f]))
                fronts.heartbeat()
            samples.append((gold.min_time("gold"), qb.min_time("b")))  # gold first
            time.sleep(0.4)
        final = min(fa.heartbeat(), fb.heartbeat())
        deadline = time.monotonic() + STUCK_MS / 1000
        while gold.min_time("gold") < final:
            samples.append((gold.min_time("gold"), qb.min_time("b")))
            assert time.monotonic() < deadline and not gold.stuck(), \
                gold.status().render(GRID.delta_ms)
            time.sleep(0.2)
    rows = pd.concat(written, ignore_index=True)
    assert assert_never_early(table, rows, ["front", "seq"]) > int(rows["lt_time"].min())
    published = complete_below(table)
    assert published is not None and dict(published.writers).keys() == set(both)
    assert published.complete_below == min(c for _w, c in published.writers)
    assert all(g <= slow for g, slow in samples), "the reader passed the slower writer"


@pytest.mark.slow  # ~30 s; two writers by default: test_tables_completeness.py
def test_an_undeclared_writer_below_the_table_is_refused(spark, tmp_path: Path) -> None:
    if not has_delta(spark):
        pytest.skip(NEEDS_DELTA)
    table = tmp_path / "table"
    empty_delta(spark, table)
    pipe = lowtide.Pipeline(spark, "late-writer", grid=GRID, stuck_after_ms=STUCK_MS)
    a = pipe.read_stream(files_stream(spark, tmp_path / "in_a"), name="in_a")
    b = pipe.read_stream(files_stream(spark, tmp_path / "in_b"), name="in_b")
    pipe.start_tracker(pipe.plan((a, "a"), (b, "b")).graph)
    fb = LabelFronts(pipe.tracker.agent, "in_b", {1: 10 * LAG_B})  # 20 s behind
    fa = LabelFronts(pipe.tracker.agent, "in_a", {0: 0})
    written = []
    try:
        qa = a.write_table(str(table), checkpoint=str(tmp_path / "c_a"), name="a",
                           trigger="300 milliseconds")
        write_a = parquet_files(tmp_path / "in_a")
        while published(table) <= fb.heartbeat():  # until a's value passes b's rows
            written.append(fa.write(0, 10, write_a))  # (a commit publishes a's value)
            fa.heartbeat()
            time.sleep(1.0)
        qb = b.write_table(str(table), checkpoint=str(tmp_path / "c_b"), name="b",
                           trigger="300 milliseconds")
        late = fb.write(1, 10, parquet_files(tmp_path / "in_b"))
        deadline = time.monotonic() + 240
        while qb.query.exception() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        error = str(qb.query.exception())
        assert "writer 'b' of table" in error and "below slot" in error, error
        qa.stop()
    finally:
        pipe.close()
    held = spark.read.format("delta").load(str(table)).toPandas()
    assert not set(late["seq"]) & set(held[held["front"] == 1]["seq"])
    assert_never_early(table, pd.concat(written, ignore_index=True), ["front", "seq"])
