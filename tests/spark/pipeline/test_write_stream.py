"""``stream.writeStream``, PySpark's builder, and the :class:`TrackedQuery` it returns:
a backfill (``trigger(availableNow=True)``) over an ingest log written before the
query started ends by itself with every window complete and equal to a batch count;
a running query answers what ``StreamingQuery`` answers, and its times are
timestamps; what an exact query cannot do is refused in one line, before Spark."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.ingest import IngestReader

GRID = TimeGrid(delta_ms=10)
WINDOW = 20  # slots


def logged_windows(ingest: Path) -> set[tuple[str, int, int]]:
    """(user, window start ms, rows) of every window of what the fronts logged."""
    rows = []
    for f in (0, 1):
        reader = IngestReader(ingest, f)
        times, payload = reader.read(0, reader.end_offset())
        rows.append(pd.DataFrame({"user": [p.decode() for p in payload.to_pylist()],
                                  "start": times // WINDOW * WINDOW * GRID.delta_ms}))
    counts = pd.concat(rows).groupby(["user", "start"]).size()
    return {(u, int(s), int(n)) for (u, s), n in counts.items()}


@pytest.mark.spark
def test_a_backfill_ends_with_every_window_complete(spark, tmp_path: Path) -> None:
    ingest, out, ckpt = tmp_path / "ingest", tmp_path / "out", str(tmp_path / "ckpt")
    with lowtide.Pipeline(spark, "backfill", grid=GRID) as pipe:
        windows = (pipe.read_log(str(ingest))
                   .selectExpr("CAST(payload AS STRING) AS user")
                   .window(WINDOW * GRID.delta_ms, key="user", name="w").agg(n="count"))
        pipe.start_tracker(windows.graph())
        fronts = [pipe.front(f, fsync="never") for f in (0, 1)]
        for i in range(30):
            for f in fronts:
                f.send([f"u{(i + f.front) % 3}".encode()] * 2)
            time.sleep(0.01)
        time.sleep(2 * WINDOW * GRID.delta_ms / 1000)  # idle heartbeats pass the last window
        for f in fronts:
            f.close(unregister=True)
        query = (windows.writeStream.format("parquet").option("checkpointLocation", ckpt)
                 .outputMode("append").trigger(availableNow=True).queryName("backfill")
                 .start(str(out)))
        assert query.awaitTermination(timeout=300), "the backfill did not end"
        assert not query.isActive and query.exception() is None
        assert query.name == "backfill" and query.lastProgress is not None
        table = pq.read_table(out).to_pandas()
        got = {(u, int(s.timestamp() * 1000), int(n)) for u, s, n in
               zip(table["user"], table["window_start"], table["n"], strict=True)}
        expected = logged_windows(ingest)
        assert got == expected  # every window, once, complete
        last_end = max(s for _, s, _ in expected) + WINDOW * GRID.delta_ms
        assert query.complete_below() >= datetime.fromtimestamp(last_end / 1000, tz=UTC)


@pytest.mark.spark
def test_a_running_query_answers_like_a_streaming_query(spark, tmp_path: Path) -> None:
    seen: list[int] = []
    with lowtide.Pipeline(spark, "answers", grid=GRID) as pipe:
        stream = pipe.generate(fronts=2, rate=50.0).selectExpr("front", "seq")
        query = (stream.writeStream.foreachBatch(lambda df, bid: seen.append(bid))
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(processingTime="200 milliseconds").queryName("answers").start())
        now = datetime.now(tz=UTC)
        assert query.wait_until_complete(now, timeout_s=120) >= now
        assert query.isActive and query.name == "answers"
        assert query.id == str(query.query.id) and query.runId == str(query.query.runId)
        status = query.status
        assert set(status) >= {"message", "isTriggerActive", "completeBelow"}
        assert datetime.fromisoformat(status["completeBelow"]) > now - timedelta(seconds=1)
        deadline = time.monotonic() + 60  # Spark reports a batch's progress after its sink
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.1)
        assert query.recentProgress and query.lastProgress["name"] == "answers"
        assert query.stuck() == [] and query.exception() is None
        assert query.awaitTermination(0.1) is False
        query.stop()
        assert not query.isActive and query.awaitTermination(1) is True
        assert seen
    assert pipe._handle is None  # the with block closed the pipeline


def test_what_an_exact_query_cannot_do_is_refused_before_spark() -> None:
    w = lowtide.Pipeline(None).generate(fronts=1).writeStream
    cases = [
        (lambda: w.outputMode("update"), r"outputMode\('update'\) writes early results: "
                                         r"end the window with .agg\(...\).speculative\(\)"),
        (lambda: w.outputMode("complete"), r"the whole result table as of the min time"),
        (lambda: w.trigger(continuous="1 second"), r"lowtide runs micro-batches"),
        (lambda: w.trigger(), r"trigger\(\) takes one of"),
        (lambda: w.format("kafka"), r"format\('kafka'\) is not a tracked sink"),
        (lambda: w.format("parquet").start("/out"), r"'checkpointLocation', dir\) is required"),
        (lambda: w.option("checkpointLocation", "/c").start(), r"parquet sink needs a path"),
        (lambda: w.toTable("events"), r"written by path"),
        (lambda: w.format("console").option("compression", "zstd").option(
            "checkpointLocation", "/c").start(), r"option 'compression' is not one the console"),
        (lambda: w.partitionBy("user"), r"partitionBy"),
    ]
    early = (lowtide.Pipeline(None).generate(fronts=1).window("1 second", key="front")
             .agg(n="count").speculative(every="1 second"))
    assert early.writeStream.outputMode("update") is not None
    cases.append((lambda: early.writeStream.outputMode("append"),
                  r"speculative\(\) writes a changelog: outputMode\('update'\)"))
    for call, pattern in cases:
        with pytest.raises(lowtide.LowtideError, match=pattern):
            call()
