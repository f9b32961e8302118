"""A consistent cut over two chained queries (files -> bronze table -> where -> gold
table, one tracker): once both tables are complete below T, the rows below T that
``read_complete`` reads, and those of the files the cut's manifest names, equal the batch
recomputation below T; a cut at a T a table has not reached is refused in one line."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.spark import complete_below
from lowtide.spark.sinks.cuts import CutRefused, cut
from tests.spark.sinks.helpers import running
from tests.spark.sources.helpers import GRID, SCHEMA, LabelFronts, parquet_files, produce

pytestmark = pytest.mark.spark


def ids(rows: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted(zip(rows["front"].tolist(), rows["seq"].tolist(), strict=True))


def test_cut_over_two_chained_queries_equals_batch(spark, tmp_path: Path) -> None:
    folder, bronze_path, gold_path = tmp_path / "in", tmp_path / "bronze", tmp_path / "gold"
    folder.mkdir()
    bronze_path.mkdir()
    pipe = lowtide.Pipeline(spark, "cut", grid=GRID, stuck_after_ms=60_000)
    files = spark.readStream.schema(SCHEMA).parquet(str(folder))
    bronze = pipe.read_stream(files, name="ingest")
    table = spark.readStream.schema(SCHEMA).parquet(str(bronze_path))
    gold = pipe.read_stream(table, name="silver").where("v % 2 = 0", name="even")
    pipe.start_tracker(pipe.plan((bronze, "bronze"), (gold, "gold")).graph)
    fronts = LabelFronts(pipe.tracker.agent, "ingest", {0: 0, 1: 30})
    with running(pipe) as queries:
        queries.append(bronze.write_table(str(bronze_path), format="parquet",
                                          checkpoint=str(tmp_path / "c1"), name="bronze",
                                          feeds=("silver",), trigger="300 milliseconds"))
        queries.append(gold.write_table(str(gold_path), format="parquet", name="gold",
                                        checkpoint=str(tmp_path / "c2"),
                                        trigger="300 milliseconds"))
        written = produce(fronts, parquet_files(folder), rounds=3, every_s=0.3)
        rows = pd.concat(written, ignore_index=True)
        times = sorted(set(rows["lt_time"].tolist()))
        as_of = times[len(times) // 2]  # rows on both sides of it
        deadline = time.monotonic() + 240
        while not all((c := complete_below(p)) is not None and c.complete_below >= as_of
                      for p in (bronze_path, gold_path)):
            fronts.heartbeat()
            assert time.monotonic() < deadline, pipe.status().render(GRID.delta_ms)
            time.sleep(0.2)
        manifest = cut([str(bronze_path), str(gold_path)], as_of, delta_ms=GRID.delta_ms)
        bronze_rows = lowtide.read_complete(spark, str(bronze_path),
                                            as_of * GRID.delta_ms).toPandas()
        gold_rows = lowtide.read_complete(spark, str(gold_path), as_of * GRID.delta_ms).toPandas()
        far = max(times) + 100_000
        with pytest.raises(CutRefused, match=r"^cut at slot \d+ refused: .* complete below"):
            cut([str(bronze_path), str(gold_path)], far, delta_ms=GRID.delta_ms)
    below = rows[rows["lt_time"] < as_of]
    assert len(below) and len(below) < len(rows)
    assert ids(bronze_rows) == ids(below)
    assert ids(gold_rows) == ids(below[below["v"] % 2 == 0])
    for share, expected in zip(manifest.sinks, (below, below[below["v"] % 2 == 0]), strict=True):
        named = pd.concat([pq.read_table(Path(share.path) / f.file).to_pandas()
                           for f in share.files])
        assert ids(named[named["lt_time"] < as_of]) == ids(expected)
        assert share.rows == len(expected) and share.complete_below >= as_of
        assert all(b["query"] and b["batch"] is not None for b in share.batches())
