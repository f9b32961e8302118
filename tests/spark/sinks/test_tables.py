"""Queries chained through a tracked Delta table: bronze (files -> Delta, keeping the
labels) feeds gold (that table -> exact windows -> Delta) on one tracker. Gold's
windows equal a batch recomputation, and what each table published in its commits
never claims a time before the rows below it were committed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.spark import complete_below
from tests.spark.sinks.helpers import assert_never_early, running
from tests.spark.sources.helpers import (
    GRID,
    NEEDS_DELTA,
    SCHEMA,
    SIZE,
    WINDOW_MS,
    LabelFronts,
    assert_equal_to_batch,
    batch_windows,
    has_delta,
    parquet_files,
    produce,
)

pytestmark = pytest.mark.spark


def test_chained_queries_through_delta(spark, tmp_path: Path) -> None:
    if not has_delta(spark):
        pytest.skip(NEEDS_DELTA)
    folder, bronze_path, gold_path = tmp_path / "in", tmp_path / "bronze", tmp_path / "gold"
    folder.mkdir()
    spark.createDataFrame([], SCHEMA).write.format("delta").save(str(bronze_path))
    pipe = lowtide.Pipeline(spark, "chain", grid=GRID, stuck_after_ms=60_000)
    files = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 3).parquet(str(folder))
    bronze = pipe.read_stream(files, name="ingest").where("v >= 0", name="clean")
    table = spark.readStream.format("delta").load(str(bronze_path))
    gold = (pipe.read_stream(table, name="silver")
            .window(f"{WINDOW_MS} milliseconds", key="k", name="win")
            .agg(n="count", total=("v", "sum")))
    graph = pipe.plan((bronze, "bronze"), (gold, "gold")).graph
    assert set(graph.names) == {"ingest", "clean", "bronze", "silver", "win", "win.state",
                                "gold"}
    pipe.start_tracker(graph)
    fronts = LabelFronts(pipe.tracker.agent, "ingest", {0: 0, 1: 30})
    with running(pipe) as queries:
        queries.append(bronze.write_table(str(bronze_path), checkpoint=str(tmp_path / "c1"),
                                          name="bronze", feeds=("silver",),
                                          trigger="300 milliseconds"))
        queries.append(gold.write_table(str(gold_path), checkpoint=str(tmp_path / "c2"),
                                        name="gold", trigger="300 milliseconds"))
        written = produce(fronts, parquet_files(folder), rounds=3, every_s=0.3)
        last_end = (max(int(w["lt_time"].max()) for w in written) // SIZE + 1) * SIZE
        while fronts.heartbeat() < last_end:
            time.sleep(0.05)
        # the downstream sink's min time: complete through both queries
        queries[1].wait_for_min_time(last_end, timeout_s=240)
    rows = pd.concat(written, ignore_index=True)
    gold_rows = spark.read.format("delta").load(str(gold_path)).toPandas()
    ms = pd.to_datetime(gold_rows["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    assert_equal_to_batch(gold_rows.assign(start=ms // GRID.delta_ms), written)
    assert assert_never_early(bronze_path, rows, ["front", "seq"]) > 0
    windows = batch_windows(rows)
    windows["lt_time"] = windows["start"] + SIZE - 1  # a window's result: its last slot
    assert assert_never_early(gold_path, windows, ["k", "lt_time"]) > 0


def ids(rows: pd.DataFrame) -> list[tuple[int, int]]:
    return list(zip(rows["front"].tolist(), rows["seq"].tolist(), strict=True))


def manifest_samples(folder: Path, until: Any) -> list[tuple[int, set[str]]]:
    """(published complete_below, the table's files at that moment), polled until
    ``until()``: the manifest is rewritten in place, so it is judged as it goes."""
    seen: list[tuple[int, set[str]]] = []
    while not until():
        published = complete_below(folder)
        if published is not None:
            files = {p.name for p in folder.glob("part-*.parquet")}
            seen.append((published.complete_below, files))
        time.sleep(0.1)
    return seen


def test_chained_queries_through_parquet(spark, tmp_path: Path) -> None:
    folder, bronze_path, out = tmp_path / "in", tmp_path / "bronze", tmp_path / "out"
    folder.mkdir()
    bronze_path.mkdir()
    pipe = lowtide.Pipeline(spark, "chain-pq", grid=GRID, stuck_after_ms=60_000)
    files = spark.readStream.schema(SCHEMA).parquet(str(folder))
    bronze = pipe.read_stream(files, name="ingest")
    table = spark.readStream.schema(SCHEMA).parquet(str(bronze_path))
    silver = pipe.read_stream(table, name="silver").where("v >= 0", name="clean")
    pipe.start_tracker(pipe.plan((bronze, "bronze"), (silver, "sink")).graph)
    fronts = LabelFronts(pipe.tracker.agent, "ingest", {0: 0, 1: 30})
    with running(pipe) as queries:
        queries.append(bronze.write_table(str(bronze_path), format="parquet",
                                          checkpoint=str(tmp_path / "c1"), name="bronze",
                                          feeds=("silver",), trigger="300 milliseconds"))
        queries.append(silver.write_parquet(str(out), checkpoint=str(tmp_path / "c2"),
                                            keep_tracking_columns=True,
                                            trigger="300 milliseconds"))
        written = produce(fronts, parquet_files(folder), rounds=3, every_s=0.3)
        final = fronts.heartbeat()
        seen = manifest_samples(bronze_path, lambda: queries[1].min_time() >= final)
    rows = pd.concat(written, ignore_index=True)
    got = pa.concat_tables([pq.read_table(p) for p in out.glob("*.parquet")]).to_pandas()
    assert sorted(ids(got)) == sorted(ids(rows))
    assert seen and max(cb for cb, _ in seen) > int(rows["lt_time"].min())
    for cb, names in seen:
        have = pa.concat_tables([pq.read_table(bronze_path / n) for n in names]).to_pandas() \
            if names else pd.DataFrame({"front": [], "seq": []})
        due = rows[rows["lt_time"] < cb]
        early = set(ids(due)) - set(ids(have))
        assert not early, f"the manifest claimed {cb} before {sorted(early)[:3]} were written"
