"""A Spark bench's ratio rests on several micro-batches per run: a run measures on
after its seconds until it has counted ``min_batches``; its stop waits for the running
batch (a real streaming query on Spark's ``rate`` source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.bench.spark.measure import BenchConfig, measure_query, stop_wait_s

pytestmark = pytest.mark.spark


def start(spark, tmp_path: Path, trigger: str):
    return (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
            .writeStream.format("noop").trigger(processingTime=trigger)
            .option("checkpointLocation", str(tmp_path / "ckpt")).start())


def test_a_run_lasts_until_it_counted_min_batches(spark, tmp_path: Path) -> None:
    """0.05 s of measuring ends within one 300 ms trigger: one batch, were it not for
    min_batches."""
    cfg = BenchConfig(seconds=0.05, warmup_batches=2, min_batches=4)
    m = measure_query(start(spark, tmp_path, "300 milliseconds"), cfg)
    assert m.batches >= cfg.min_batches
    assert m.last - m.first == m.batches


def test_the_stop_waits_for_the_longest_batch(spark, tmp_path: Path) -> None:
    """A stop waits twice the longest recent batch (at least 10 s) for the running one
    to end: a stop inside a batch aborts its write with an ERROR line."""
    query = start(spark, tmp_path, "100 milliseconds")
    try:
        while len(query.recentProgress) < 2:
            query.awaitTermination(0.1)
        longest_s = max(p["durationMs"]["triggerExecution"] for p in query.recentProgress) / 1e3
        assert stop_wait_s(query) == max(10.0, 2 * longest_s)
    finally:
        query.stop()
