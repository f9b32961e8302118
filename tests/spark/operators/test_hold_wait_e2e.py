"""A window's hold, and a sink's acks, when its tracker stops answering (a real
``lowtide serve`` process, SIGSTOPped): the hold's move, or the sink's ack send, waits
at most ``hold_wait_s``, then the query stops with one line that says what to do,
emits nothing more, and once the tracker runs again its sink has not passed a window
the query did not emit (fail closed).

The tracker is stopped right as a micro-batch's progress is posted: a listener
registered before the query's gets each event first (Spark's listener bus calls them
in order on one thread), so the hold's listener then moves on a tracker that never
answers."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.listener import StreamingQueryListener

import lowtide
from lowtide.spark.operators.window_hold import HoldFailed
from lowtide.spark.sinks.foreach import SinkAcksFailed
from lowtide.spark.sources.generator import GeneratorSpec
from lowtide.spark.tracking.task_errors import TaskAcksFailed
from tests.spark.helpers import t0_of_checkpoint
from tests.spark.operators.helpers import (
    GRID,
    SCHEMA,
    STUCK_MS,
    all_input,
    batch_windows,
    check,
    parse,
    read_results,
    start_slots,
)

pytestmark = pytest.mark.spark

WAIT_S = 3.0
#: Spark's stop of a query whose tasks and source wait on the tracker (their own 30 s)
STOP_SLACK_S = 60.0

try:  # the workers cannot import this test module: ship its functions by value
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # pragma: no cover
    pass


class StopTracker(StreamingQueryListener):  # type: ignore[misc]
    """SIGSTOPs the tracker process on the ``after``-th progress of query ``name``
    that has a watermark (the hold is open and has moved), once the sink published a
    window, noting the time and the files the sink had published then."""

    def __init__(self, pid: int, name: str, out: Path, after: int = 2) -> None:
        super().__init__()
        self.pid, self.name, self.out, self.after = pid, name, out, after
        self.seen = 0
        self.stopped_at: float | None = None
        self.files_then: set[str] = set()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        if p.name != self.name or self.stopped_at is not None:
            return
        if (p.eventTime or {}).get("watermark"):
            self.seen += 1
        if self.seen >= self.after and published(self.out):
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped_at = time.monotonic()
            self.files_then = published(self.out)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def published(out: Path) -> set[str]:
    return set(glob.glob(str(out / "*.parquet")))


def batches_of(files: set[str]) -> set[str]:
    """The micro-batches whose files these are (``part-<query>-<batch>-<part>.parquet``)."""
    return {Path(f).name.rsplit("-", 2)[-2] for f in files}


def test_a_hung_tracker_stops_the_query_within_hold_wait(spark, tmp_path: Path) -> None:
    from tests.service.procs import serve  # the service tests' servers: stopped by pid

    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    with serve(tmp_path, "--delta-ms", str(GRID.delta_ms),
               "--stuck-after-ms", str(STUCK_MS)) as server:
        stopper = StopTracker(server.proc.pid, "hung", out)
        spark.streams.addListener(stopper)
        pipe = lowtide.Pipeline(spark, "hung", tracker=server.url, grid=GRID,
                                stuck_after_ms=STUCK_MS, hold_wait_s=WAIT_S)
        stream = (pipe.generate(spec).map(parse, SCHEMA, name="parse")
                  .window("1 second", key="user", name="win").agg(n="count"))
        query = None
        try:
            query = stream.write_parquet(str(out), checkpoint=str(ckpt),
                                         trigger="200 milliseconds", query_name="hung")
            t0 = t0_of_checkpoint(ckpt, query)
            deadline = time.monotonic() + 180
            while stopper.stopped_at is None and time.monotonic() < deadline:
                assert query.query.exception() is None, query.query.exception()
                time.sleep(0.1)
            assert stopper.stopped_at is not None, "the query made no progress"
            # The hold's move fails, or first the sink's acks of a batch that was
            # sending them when the tracker stopped: each within hold_wait_s, one line.
            with contextlib.suppress(StreamingQueryException):
                query.query.awaitTermination(WAIT_S + STOP_SLACK_S)
            assert not query.query.isActive, "the query still runs on a tracker that hangs"
            took_s = time.monotonic() - stopper.stopped_at
            error = query.exception()
            assert isinstance(error, HoldFailed | SinkAcksFailed), error
            text = str(error)
            assert "\n" not in text and f"within {WAIT_S:g} s (hold_wait_s)" in text
            assert "lowtide status --url" in text and "from its checkpoint" in text
            with pytest.raises(type(error)):
                query.awaitTermination(1)
            # nothing emitted once the tracker stopped: no batch published since (one
            # whose rows were confirmed before may have been publishing its files then,
            # a file per partition: a full local run saw two)
            files_after = published(out)
            assert len(batches_of(files_after - stopper.files_then)) <= 1, took_s
            os.kill(server.proc.pid, signal.SIGCONT)
            time.sleep(1.0)  # acks the tracker received while stopped are applied
            final = query.min_time(query.sink)
            assert published(out) == files_after  # the stopped query wrote nothing more
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
            spark.streams.removeListener(stopper)
            if query is not None:
                query.stop()
            pipe.close()
    print(f"hung tracker: the query stopped {took_s:.1f} s after the SIGSTOP")
    assert took_s < WAIT_S + STOP_SLACK_S
    results = read_results(out)
    # a batch published before the stop may hold windows the failed hold move kept the
    # sink's min time below (fail closed): each published window must still be exact
    horizon = max(final, int(start_slots(results).max()) + 100 if len(results) else 0)
    expected = batch_windows(all_input(spec, t0, horizon), 100, 100)
    check(results, expected, horizon, 100, ["n"])  # the sink passed no unemitted window


@contextlib.contextmanager
def hung_pipeline(spark: Any, tmp_path: Path, name: str) -> Iterator[tuple[Any, Any, list[Any]]]:
    """A ``lowtide serve`` and a pipeline on it; yields (server, pipeline, the queries
    to stop), and in the end resumes the server, stops the queries and the pipeline."""
    from tests.service.procs import serve

    with serve(tmp_path, "--delta-ms", str(GRID.delta_ms),
               "--stuck-after-ms", str(STUCK_MS)) as server:
        pipe = lowtide.Pipeline(spark, name, tracker=server.url, grid=GRID,
                                stuck_after_ms=STUCK_MS, hold_wait_s=WAIT_S)
        queries: list[Any] = []
        try:
            yield server, pipe, queries
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
            for query in queries:
                query.stop()
            pipe.close()


def one_line_error(query: Any, kind: type[Exception]) -> str:
    """The error ``query`` stopped with once its tracker hung: ``kind``, one line, also
    what ``awaitTermination`` raises."""
    with contextlib.suppress(StreamingQueryException):
        query.query.awaitTermination(180)
    assert not query.query.isActive
    error = query.exception()
    assert isinstance(error, kind), error
    text = str(error)
    assert "\n" not in text and f"within {WAIT_S:g} s" in text, text
    with pytest.raises(kind):
        query.awaitTermination(1)
    return text


def test_a_sink_whose_acks_hang_stops_the_query_within_hold_wait(spark, tmp_path: Path) -> None:
    """No window, so no hold: the user's function stops the tracker in its third batch,
    and the sink's acks of that batch are what waits."""
    seen: list[int] = []
    spec = GeneratorSpec(fronts=1, rate=200.0, payload_bytes=4)
    with hung_pipeline(spark, tmp_path, "hung-sink") as (server, pipe, queries):

        def rows(df: Any, batch_id: int) -> None:
            seen.append(batch_id)
            if len(seen) == 3:
                os.kill(server.proc.pid, signal.SIGSTOP)

        queries.append(pipe.generate(spec).map(parse, SCHEMA, name="parse").foreach_batch(
            rows, checkpoint=str(tmp_path / "ckpt"), trigger="200 milliseconds"))
        text = one_line_error(queries[0], SinkAcksFailed)
        assert len(seen) == 3 and f"batch {seen[-1]} within {WAIT_S:g} s" in text, seen


@pytest.mark.slow  # ~20 s; the bounded wait by default: tracking/test_task_errors.py
def test_a_task_whose_acks_hang_stops_the_query_within_hold_wait(spark, tmp_path: Path) -> None:
    """No window, and the sink never sends: a tracked filter stops the tracker in a
    task of the third batch, and that task's acks are what waits. Each attempt of the
    task waits ``hold_wait_s`` (not the agent's 30 s), then fails with one line, which
    the query reports as its own (not Spark's many lines around it)."""
    from lowtide.bench.chaos.hung_fault import StopsTrackerInTask

    spec = GeneratorSpec(fronts=1, rate=200.0, payload_bytes=4)
    with hung_pipeline(spark, tmp_path, "hung-task") as (server, pipe, queries):
        stopper = StopsTrackerInTask(server.proc.pid, str(tmp_path / "stopped"), 3)
        queries.append(pipe.generate(spec).map(parse, SCHEMA, name="parse")
                       .filter(stopper, name="stop")
                       .foreach_batch(lambda df, batch_id: None,
                                      checkpoint=str(tmp_path / "ckpt"),
                                      trigger="200 milliseconds"))
        text = one_line_error(queries[0], TaskAcksFailed)
        assert stopper.stopped_at is not None
        took_s = time.time() - stopper.stopped_at
        assert "(hold_wait_s)" in text and "segment" in text and "lowtide status --url" in text
    print(f"hung tracker under a task: the query stopped {took_s:.1f} s after the SIGSTOP")
    assert took_s < 4 * WAIT_S + STOP_SLACK_S / 2  # 4 attempts (local[2,4]) of hold_wait_s
