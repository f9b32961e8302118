"""A tracked sink's acks on a tracker that does not answer (no Spark, no sockets): the
send waits ``hold_wait_s``, not the agent's own 30 s, then hands the query one line
that says what to do and ends the batch with it (so Spark does not commit it).
End to end, with a SIGSTOPped ``lowtide serve``: tests/spark/operators/test_hold_wait_e2e.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lowtide.core.errors import LowtideError
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.sinks.foreach import SinkAcksFailed, TrackedForeachBatch
from lowtide.spark.sinks.tables import TableConfig
from lowtide.spark.tracking.column import AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef, register_scheme

GRAPH = SegmentGraph.of(("m", ()), ("sink", ("m",)), ("reader", ()))
REF = TrackerRef("hung://tracker:7070", GRAPH, TimeGrid(delta_ms=10))


class HungAgent:
    """An agent whose tracker never confirms: each send times out after its wait."""

    def __init__(self) -> None:
        self.waits_s: list[float] = []

    def send_batch(self, key: Any, acks: Any, heartbeats: Any = (), timeout_s: float = 30.0,
                   **_: Any) -> bool:
        self.waits_s.append(timeout_s)
        raise TimeoutError(f"no answer from the tracker within {timeout_s} s")


@pytest.fixture
def hung() -> Any:
    agent = HungAgent()
    register_scheme("hung", lambda ref: agent)
    yield agent
    register_scheme("hung", None)


def one_slot() -> AckAccumulator:
    acc = AckAccumulator()
    acc.add_reduced(GRAPH.index("sink"), np.array([100], np.int64),
                    np.array([7], np.uint64), np.array([-1], np.int64))
    return acc


def test_a_hung_tracker_fails_the_batch_with_one_line_within_hold_wait(hung: Any) -> None:
    failures: list[LowtideError] = []
    sink = TrackedForeachBatch(None, REF, "sink", wait_s=2.5, on_failure=failures.append)
    with pytest.raises(SinkAcksFailed) as raised:
        sink._ack("query-1", 12, one_slot())
    assert hung.waits_s == [2.5]  # the pipeline's hold_wait_s, not the agent's 30 s
    assert failures == [raised.value]  # the query is told before the batch ends
    text = str(raised.value)
    assert "\n" not in text and "batch 12 within 2.5 s (hold_wait_s)" in text
    assert "lowtide status --url hung://tracker:7070" in text and "checkpoint" in text
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_sink_without_acks_never_waits_on_the_tracker(hung: Any) -> None:
    sink = TrackedForeachBatch(None, REF, "sink", wait_s=2.5)
    sink._ack("query-1", 13, AckAccumulator())  # an empty batch: nothing to confirm
    assert hung.waits_s == []


def test_a_tables_feed_into_its_readers_waits_the_same(hung: Any, tmp_path: Any) -> None:
    """``write_table(feeds=...)`` sends the batch's rows into each reader's segment before
    it writes them: that send waits ``hold_wait_s`` too, and fails with the same line."""
    failures: list[LowtideError] = []
    writer = TableConfig(str(tmp_path / "t"), "parquet", feeds=("reader",)).build(
        lambda: REF, "sink")
    writer.wait_for_tracker(1.5, failures.append)
    with pytest.raises(SinkAcksFailed, match=r"batch 4 within 1\.5 s") as raised:
        writer._feed(REF, "query-1", 4, np.array([100], np.int64),
                     np.array([7], np.uint64), np.array([1], np.int64))
    assert hung.waits_s == [1.5] and failures == [raised.value]
    assert str(raised.value).startswith("table sink 'sink''s feeds: the tracker at")


class StoppingBatch:
    """A micro-batch's DataFrame whose query is stopping: its clean-up is interrupted."""

    def __init__(self) -> None:
        self.sparkSession = self
        self.sparkContext = self
        self.unpersisted = 0

    def getLocalProperty(self, key: str) -> str:
        return "query-1"

    def persist(self) -> StoppingBatch:
        return self

    def drop(self, column: str) -> StoppingBatch:
        return self

    def unpersist(self) -> None:
        self.unpersisted += 1
        raise RuntimeError("java.lang.InterruptedException")


def test_a_failed_ack_is_the_batchs_error_though_the_stop_interrupts_its_clean_up(
        hung: Any) -> None:
    """The failed ack stops the query, whose stop interrupts the sink's ``unpersist``:
    the batch still ends with the one-line ack error, not the interruption (py4j
    printed that one's traceback, `bench chaos --spark`, "tracker hung under a sink")."""
    sink = TrackedForeachBatch(lambda df, batch_id: None, REF, "sink", wait_s=1.0)
    sink.acks_of = lambda df: one_slot()  # type: ignore[method-assign]
    batch = StoppingBatch()
    with pytest.raises(SinkAcksFailed, match="did not confirm the acks of batch 5"):
        sink(batch, 5)
    assert batch.unpersisted == 1
