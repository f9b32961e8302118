"""A query rerun from a new checkpoint into the folder an earlier run wrote (what a user
does after an upgrade): Spark's batch ids start at 0 again, and no file of the earlier
run is replaced or taken as the rerun's own (rule 14). Real Spark sinks, real files:
every row of both runs is in the folder, and the sink's min time was reached for each
run. Also a batch re-run with the same rows (kept) and with other rows (refused)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.spark.sinks.batches import (
    COMMITS,
    KEPT_BATCHES,
    BatchFiles,
    BatchRewritten,
    digest,
)
from tests.spark.sources.helpers import (
    GRID,
    SCHEMA,
    LabelFronts,
    parquet_files,
    produce,
)

Sink = Callable[[Any, Path, str], Any]  # (stream, out folder, checkpoint) -> query


def rows_in(out: Path) -> pd.DataFrame:
    return pa.concat_tables([pq.read_table(p) for p in sorted(out.glob("part-*.parquet"))]
                            ).to_pandas()


def ids(rows: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted(zip(rows["front"].tolist(), rows["seq"].tolist(), strict=True))


def two_runs(spark: Any, tmp: Path, sink: Sink) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run 1 reads folder in1 into ``out`` from checkpoint c1; stopped; run 2 (new
    checkpoint c2, same sink segment and tracker) reads new records from in2 into the
    same ``out``. Returns (every row written by the fronts, the rows in ``out``)."""
    out = tmp / "out"
    out.mkdir()
    pipe = lowtide.Pipeline(spark, "rerun", grid=GRID, stuck_after_ms=60_000)

    def stream_of(folder: Path) -> Any:
        folder.mkdir()
        return pipe.read_stream(spark.readStream.schema(SCHEMA).parquet(str(folder)),
                                name="ingest")

    first = stream_of(tmp / "in1")
    pipe.start_tracker(first.graph())
    fronts = LabelFronts(pipe.tracker.agent, "ingest", {0: 0, 1: 5})
    written: list[pd.DataFrame] = []
    try:
        for run, stream in enumerate((first, None)):
            stream = stream or stream_of(tmp / f"in{run + 1}")
            query = sink(stream, out, str(tmp / f"c{run + 1}"))
            try:
                written += produce(fronts, parquet_files(tmp / f"in{run + 1}"), rounds=2,
                                   every_s=0.4)
                query.wait_for_min_time(fronts.heartbeat(), timeout_s=180)
                assert not query.stuck()
            finally:
                query.stop()
    finally:
        pipe.close()
    return pd.concat(written, ignore_index=True), rows_in(out)


@pytest.mark.spark
def test_write_parquet_rerun_from_new_checkpoint_keeps_both_runs(spark, tmp_path: Path) -> None:
    def sink(stream: Any, out: Path, ckpt: str) -> Any:
        return stream.write_parquet(str(out), checkpoint=ckpt, trigger="300 milliseconds",
                                    keep_tracking_columns=True)

    written, got = two_runs(spark, tmp_path, sink)
    assert ids(got) == ids(written)  # before: run 2's batch 0 replaced run 1's file
    records = (tmp_path / "out" / COMMITS).glob("*.json")
    runs = {json.loads(r.read_text())["query"] for r in records}
    assert len(runs) == 2 and all(  # each run's files carry its query id
        any(run in p.name for run in runs) for p in (tmp_path / "out").glob("part-*"))


@pytest.mark.spark
def test_parquet_table_rerun_from_new_checkpoint_keeps_both_runs(spark, tmp_path: Path) -> None:
    def sink(stream: Any, out: Path, ckpt: str) -> Any:
        return stream.write_table(str(out), checkpoint=ckpt, format="parquet",
                                  name="sink", trigger="300 milliseconds")

    written, got = two_runs(spark, tmp_path, sink)
    assert ids(got) == ids(written)  # before: run 2's batches were skipped, yet acked
    records = [json.loads(r.read_text()) for r in (tmp_path / "out" / COMMITS).glob("*.json")]
    assert len(records) == 2 and all(r["batches"] for r in records)  # one per run


def test_a_rerun_batch_with_the_same_rows_is_kept_with_other_rows_refused(tmp_path: Path) -> None:
    files = BatchFiles(tmp_path, "q", 3)
    staged = tmp_path / "staged"
    staged.write_text("rows of batch 3")
    same = digest([10, 11], [7, 9], [2, 1])
    assert digest([11, 10], [9, 7], [1, 2]) == same  # any order of the slots
    files.publish([(staged, "00000")], same)
    assert files.committed(same)
    with pytest.raises(BatchRewritten, match="re-ran with other rows"):
        files.committed(digest([10, 11], [7, 8], [2, 1]))
    assert (tmp_path / files.name("00000")).read_text() == "rows of batch 3"


def test_leftovers_of_an_unfinished_commit_are_replaced(tmp_path: Path) -> None:
    files = BatchFiles(tmp_path, "q", 4)
    (tmp_path / files.name("00001")).write_text("renamed before a crash, never recorded")
    assert not files.committed(digest([1], [1], [1]))
    assert not list(tmp_path.glob("part-*"))
    other_run = BatchFiles(tmp_path, "q-other", 4)
    (tmp_path / other_run.name("00000")).write_text("another run's")
    assert not files.committed(digest([1], [1], [1]))
    assert (tmp_path / other_run.name("00000")).exists()  # never touched


def test_the_record_keeps_the_latest_batches_and_refuses_older_ones(tmp_path: Path) -> None:
    d = digest([1], [1], [1])
    for batch in range(KEPT_BATCHES + 2):
        staged = tmp_path / f"staged-{batch}"
        staged.write_text("rows")
        BatchFiles(tmp_path, "q", batch).publish([(staged, "")], d)
    assert len(list((tmp_path / COMMITS).iterdir())) == 1  # one file per query
    assert BatchFiles(tmp_path, "q", KEPT_BATCHES + 1).committed(d)
    with pytest.raises(BatchRewritten):  # never re-run by Spark: cannot be told, kept
        BatchFiles(tmp_path, "q", 0).committed(d)
    assert (tmp_path / BatchFiles(tmp_path, "q", 0).name()).exists()
