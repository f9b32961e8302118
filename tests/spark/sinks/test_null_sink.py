"""The null sink (``to_null``): after a tracked operator it is Spark's ``noop`` sink and
that operator's tasks ack the rows as received; after an untracked step the rows are
counted at the sink, so a loss in that step is still named."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lowtide
from lowtide.core.time import TimeGrid

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
SCHEMA = "front int, seq long, event_ms long, x long"


def enrich(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "seq": b["seq"], "event_ms": b["event_ms"],
                            "x": pc.multiply(b["seq"], 2)})


def trace_rows(path: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for line in path.read_text().splitlines():
        batch, _start, _done, rows = (int(x) for x in line.split())
        out[batch] = out.get(batch, 0) + rows
    return out


def test_receipts_from_the_last_operator_are_exact_per_batch(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "null", grid=GRID)
    trace = tmp_path / "trace.txt"
    stream = pipe.generate(fronts=2, rate=300.0).repartition(2).map(enrich, SCHEMA, name="a")
    query = None
    try:
        query = stream.to_null(checkpoint=str(tmp_path / "ckpt"), trigger="100 milliseconds",
                               trace_file=str(trace))
        # the generator's fronts start at the query's first offset, which a slow start
        # puts after any time taken here: wait for rows before picking the time
        deadline = time.monotonic() + 90
        while not any(p["numInputRows"] for p in query.query.recentProgress):
            assert query.query.exception() is None, query.query.exception()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        now = GRID.slot_of(time.time_ns() // 1_000_000)
        assert query.wait_for_min_time(now + 100, timeout_s=90) >= now + 100
        assert not query.stuck()
        sink = next(s for s in pipe.tracker.status()["segments"] if s["segment"] == "sink")
        assert sink["received"] > 0  # the sink's rows count in the status
    finally:
        if query is not None:
            query.stop()
        progress = {int(p["batchId"]): int(p["numInputRows"])
                    for p in (query.query.recentProgress if query else [])}
        pipe.close()
    acked = trace_rows(trace)
    assert sum(acked.values()) > 0
    for batch, rows in acked.items():  # each batch acks exactly the rows it read
        if batch in progress:
            assert rows == progress[batch], (batch, rows, progress[batch])


@pytest.mark.slow  # ~25-65 s; task failures before a null sink: test_e2e_generator
def test_a_filter_last_with_task_retries_completes(spark, tmp_path: Path) -> None:
    """A filter as the last operator, in tasks whose first attempts fail after the
    operator before it has sent its acks: receipts neither lost nor doubled, so the
    sink's min time keeps passing and nothing is stuck."""
    from tests.spark.helpers import fail_once

    pipe = lowtide.Pipeline(spark, "null-retry", grid=GRID)
    stream = (pipe.generate(fronts=2, rate=300.0).map(enrich, SCHEMA, name="a")
              .transform(lambda df: df.mapInArrow(fail_once(lambda b, p: b % 2 == 1),
                                                  df.schema))
              .filter(lambda b: pc.not_equal(pc.bit_wise_and(b["seq"], 3), 0), name="b"))
    query = None
    try:
        query = stream.to_null(checkpoint=str(tmp_path / "ckpt"), trigger="100 milliseconds")
        deadline = time.monotonic() + 90
        while (query.query.lastProgress or {}).get("batchId", -1) < 4:  # 1 and 3 retried
            assert query.query.exception() is None, query.query.exception()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        now = GRID.slot_of(time.time_ns() // 1_000_000)
        assert query.wait_for_min_time(now, timeout_s=90) >= now
        assert not query.stuck()
    finally:
        if query is not None:
            query.stop()
        pipe.close()


def test_loss_in_an_untracked_step_before_the_null_sink_is_named(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "null-loss", grid=GRID, stuck_after_ms=1_500)
    stream = (pipe.generate(fronts=2, rate=150.0).map(enrich, SCHEMA, name="a")
              .transform(lambda df: df.filter("seq % 5 != 3")))
    query = None
    try:
        query = stream.to_null(checkpoint=str(tmp_path / "ckpt"), trigger="100 milliseconds")
        deadline = time.monotonic() + 90
        while not any("segment 'sink'" in s and "missing" in s for s in query.stuck()):
            assert query.query.exception() is None, query.query.exception()
            assert time.monotonic() < deadline, query.stuck()
            time.sleep(0.2)
    finally:
        if query is not None:
            query.stop()
        pipe.close()


def test_a_stopped_querys_leftover_jobs_are_cancelled_before_it_returns(spark) -> None:
    """A job still running in a stopped query's group (CI once saw one outlive stop()
    and block on the closed tracker) is cancelled and waited for."""
    import threading

    from lowtide.spark.pipeline.query import _active_tasks, await_jobs_gone

    group = "lowtide-test-leftover"
    started, outcome = threading.Event(), []

    def slow(it):  # type: ignore[no-untyped-def]
        for b in it:
            time.sleep(30)
            yield b

    def leftover() -> None:
        spark.sparkContext.setJobGroup(group, "a leftover job", interruptOnCancel=True)
        started.set()
        try:
            spark.range(4, numPartitions=2).mapInArrow(slow, "id long").count()
            outcome.append("finished")
        except Exception:
            outcome.append("cancelled")

    thread = threading.Thread(target=leftover, daemon=True)
    thread.start()
    started.wait(10)
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 30
    while not tracker.getJobIdsForGroup(group):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while not _active_tasks(tracker, group):  # the tasks are in their sleep
        assert time.monotonic() < deadline
        time.sleep(0.05)
    spark.sparkContext.cancelJobGroup(group)  # what stop() does: the job ends, its tasks not yet
    assert await_jobs_gone(group, timeout_s=20)
    assert _active_tasks(tracker, group) == 0
    thread.join(20)
    assert outcome == ["cancelled"]
