"""Any Spark source as a tracked entry (``Pipeline.read_stream``): records labelled by
fronts, written as files or Delta commits while the query runs, read by Spark's own
sources; exact windows over them equal a batch recomputation, under an injected task
failure; a DataFrame that cannot be an entry is a one-line error where it is
described."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.read_stream import NotLabelled
from tests.spark.sources.helpers import (
    GRID,
    NEEDS_DELTA,
    SCHEMA,
    SIZE,
    LabelFronts,
    assert_equal_to_batch,
    exact_windows,
    has_delta,
    parquet_files,
    produce,
    results_of,
)

pytestmark = pytest.mark.spark


def run_entry(spark: Any, tmp: Path, source_df: Any, write: Any) -> tuple[Any, list]:
    """Produce while the query runs, then wait until the sink is complete through the
    fronts' last heartbeat; returns (results, written rows)."""
    pipe = lowtide.Pipeline(spark, "entry", grid=GRID, stuck_after_ms=60_000)
    stream = exact_windows(pipe, source_df)
    assert stream.segment_names() == ["ingest", "win", "win.state", "sink"]
    pipe.start_tracker(stream.graph())
    fronts = LabelFronts(pipe.tracker.agent, "ingest", {0: 0, 1: 30})  # front 1 lags 300 ms
    query = stream.write_parquet(str(tmp / "out"), checkpoint=str(tmp / "ckpt"),
                                 trigger="300 milliseconds")
    try:
        written = produce(fronts, write, rounds=4, every_s=0.3)
        # heartbeat past the window of the last label: every window is then complete
        last_end = (max(int(w["lt_time"].max()) for w in written) // SIZE + 1) * SIZE
        while fronts.heartbeat() < last_end:
            time.sleep(0.05)
        query.wait_for_min_time(last_end, timeout_s=180)
        assert not query.stuck()
    finally:
        query.stop()
        pipe.close()
    return results_of(tmp / "out"), written


def test_file_source_entry_equals_batch(spark, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 3).parquet(str(folder))
    results, written = run_entry(spark, tmp_path, df, parquet_files(folder))
    assert len(written) == 8 and len(results) >= 6
    assert_equal_to_batch(results, written)


def delta_appends(spark: Any, path: Path) -> Any:
    """A writer of one Delta commit per call."""

    def write(rows: pd.DataFrame) -> None:
        spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(str(path))

    return write


@pytest.mark.slow  # ~25-55 s (Delta); the file and Kafka entries run by default
def test_delta_source_entry_equals_batch(spark, tmp_path: Path) -> None:
    if not has_delta(spark):
        pytest.skip(NEEDS_DELTA)
    table = tmp_path / "table"
    spark.createDataFrame([], SCHEMA).write.format("delta").save(str(table))
    df = spark.readStream.format("delta").option("maxFilesPerTrigger", 2).load(str(table))
    results, written = run_entry(spark, tmp_path, df, delta_appends(spark, table))
    assert_equal_to_batch(results, written)


def test_entry_errors_are_one_line_where_described(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "errors", grid=GRID)
    batch = spark.createDataFrame([], SCHEMA)
    with pytest.raises(NotLabelled, match="streaming DataFrame"):
        pipe.read_stream(batch)
    stream = spark.readStream.schema("k string, v long").parquet(str(tmp_path))
    with pytest.raises(NotLabelled, match="no column 'lt_time'"):
        pipe.read_stream(stream)
    text = spark.readStream.schema("lt_time string, lt_ack long").parquet(str(tmp_path))
    with pytest.raises(NotLabelled, match="'lt_time' is string"):
        pipe.read_stream(text)
    renamed = spark.readStream.schema("t long, a long, k string").parquet(str(tmp_path))
    assert pipe.read_stream(renamed, time="t", ack="a").segment_names() == ["ingest", "sink"]
    with pytest.raises(NotLabelled, match=r"joins_dir= needs .* 'lt_front'"):
        pipe.read_stream(renamed, time="t", ack="a", joins_dir=str(tmp_path / "joins"))


def keep_all(b: Any) -> Any:
    return np.ones(b.num_rows, bool)


def test_the_entry_shares_its_task_with_the_tracked_steps_after_it(spark,
                                                                   tmp_path: Path) -> None:
    """The rows cross to Python once: the entry, a map and a filter are one
    ``mapInArrow`` (the tracked Kafka bench paid for a second one before)."""
    pipe = lowtide.Pipeline(spark, "fused", grid=GRID)
    df = spark.readStream.schema("lt_time long, lt_ack long, k string, v long").parquet(
        str(tmp_path))
    stream = pipe.read_stream(df).map(lambda b: b, name="same").filter(keep_all, name="all")
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            pipe.build(stream).df.explain()
    finally:
        pipe.close()
    assert out.getvalue().count("MapInArrow") == 1, out.getvalue()


def test_fronts_listed_with_the_pipeline_are_declared_when_its_tracker_starts(
        spark, tmp_path: Path) -> None:
    """Issue 29 point 1: ``read_stream(df, fronts=[...])`` and ``read_log(path,
    fronts=...)`` declare their producers' fronts before any query runs, so the ingest
    segment waits for one that starts late; ``pipe.status()`` shows them waiting."""
    pipe = lowtide.Pipeline(spark, "declared", grid=GRID)
    df = spark.readStream.schema(SCHEMA).parquet(str(tmp_path))
    with pytest.raises(ValueError, match="at least one front id"):
        pipe.read_stream(df, fronts=[])
    stream = pipe.read_stream(df, fronts=[3, 4], retire_after_ms=600_000)
    try:
        pipe.start_tracker(stream.graph())
        declared = pipe.tracker.status()["fronts_declared"]
        assert declared == {"3": ["ingest", -1, declared["3"][2]], "4": declared["4"]}
        assert declared["3"][2] > 0  # retired by deadline, in tracker time
        status = pipe.status()
        assert set(status.waiting_fronts) == {"3", "4"}
        assert "declared, not registered" in status.render(GRID.delta_ms)
    finally:
        pipe.close()
    logs = lowtide.Pipeline(spark, "declared-log", grid=GRID)
    stream = logs.read_log(str(tmp_path / "log"), fronts="0-1")
    try:
        logs.start_tracker(stream.graph())
        assert set(logs.tracker.status()["fronts_declared"]) == {"0", "1"}
    finally:
        logs.close()
