"""``write_parquet`` through ``foreachBatch``: no Python data source writer in the
query (so no driver-side planner calls to plan and commit each write), and a batch that
re-runs after a restart from the checkpoint publishes its files and acks its rows once.
(Task failures inside the sink's write tasks: tests/spark/pipeline/test_e2e_generator.py,
``test_task_failures_no_premature_no_stuck``.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sinks.batches import COMMITS
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import wait_batches

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
SCHEMA = "front int, seq long, x long"


def enrich(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "seq": b["seq"],
                            "x": pc.multiply(b["seq"], 2)})


def files_of(out: Path) -> dict[str, int]:
    """Each published file with its modification time (ns)."""
    return {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}


def start(pipe: Any, out: Path, ckpt: Path) -> Any:
    stream = pipe.generate(GeneratorSpec(fronts=2, rate=200.0, payload_bytes=0)).map(
        enrich, SCHEMA, name="enrich")
    return stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="100 milliseconds",
                                keep_tracking_columns=True)


def test_write_parquet_is_a_foreach_batch_sink(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "pq-plan", grid=GRID)
    query = None
    try:
        query = start(pipe, tmp_path / "out", tmp_path / "ckpt")
        wait_batches(query.query, 1)
        sink = query.query.lastProgress["sink"]["description"]
        # before: a Python data source writer (two planner calls a batch)
        assert sink.startswith("ForeachBatchSink"), sink
        assert files_of(tmp_path / "out")
    finally:
        if query is not None:
            query.stop()
        pipe.close()


def test_a_batch_rerun_after_a_restart_publishes_and_acks_once(spark, tmp_path: Path) -> None:
    """The last batch's commit is taken out of the checkpoint: the restarted query runs
    that batch again (the same offsets, the same rows). Its files stay as they were (not
    written twice) and its receipts, sent again under the same key, are applied once: a
    second application would leave its windows non-zero (stuck, extra rows). What attempts
    killed with their process staged (in the re-run batch's folder, and in one of a batch
    the query never reaches) is gone once the re-run is done and the query stopped; before,
    a stop landing in a batch's job left its staged files in ``_tmp`` for good."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    pipe = lowtide.Pipeline(spark, "pq-rerun", grid=GRID)
    query = None
    try:
        query = start(pipe, out, ckpt)
        wait_batches(query.query, 3)
        query.stop()
        last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
        (ckpt / "commits" / str(last)).unlink()
        record = json.loads(next((out / COMMITS).glob("*.json")).read_text())["batches"]
        rerun = {n: files_of(out)[n] for n in record[str(last)]["files"]}
        assert rerun, f"batch {last} published no file"
        # Spark runs the offset log's last batch again: `last`, or the one after it
        # when the stop came once that one was planned
        again = max(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
        left = [out / "_tmp" / f"{query.query.id}-{b}" / "00000-killed.parquet"
                for b in (again, 10**6)]
        for path in left:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"PAR1")
        query = start(pipe, out, ckpt)
        wait_batches(query.query, last + 2)
        assert not left[0].exists(), "the re-run kept a killed attempt's file"
        now = GRID.slot_of(time.time_ns() // 1_000_000)
        assert query.wait_for_min_time(now, timeout_s=90) >= now
        assert not query.stuck()
        assert {n: files_of(out)[n] for n in rerun} == rerun  # kept, not written again
    finally:
        if query is not None:
            query.stop()
        pipe.close()
    table = pa.concat_tables(pq.read_table(out / n) for n in files_of(out))
    keys = list(zip(table["front"].to_pylist(), table["seq"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)), "duplicates after the re-run"
    assert not list((out / "_tmp").glob("*")), "a staged file was left behind"
