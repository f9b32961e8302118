"""Event-time fronts: labels from the records' own column, and the promise holds under
each late policy (clamp, reject, raise), counted in the front's status."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lowtide.core.time import ManualClock
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.lateness import LateRecords
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import GRAPH, GRID, T0, receive


def event_front(agent: CoreAgent, late: str, lag_ms: int = 0) -> Front:
    return Front(None, 9, agent, grid=GRID, clock=ManualClock(0), heartbeat_ms=None,
                 time_from="ts", late=late, lag_ms=lag_ms)


def frame(*ts_ms: int) -> pd.DataFrame:
    return pd.DataFrame({"ts": pd.to_datetime(list(ts_ms), unit="ms"),
                         "v": range(len(ts_ms))})


def started(agent: CoreAgent, late: str) -> tuple[Front, object]:
    """A front that labelled T0..T0+100 ms and promised slot 100_010 (its newest)."""
    front = event_front(agent, late)
    first = front.label(frame(T0, T0 + 50, T0 + 100))
    assert first.times.tolist() == [100_000, 100_005, 100_010]  # from the column, not a clock
    front.written(first)
    assert front.heartbeat() == 100_010
    return front, first


def test_clamp_moves_late_records_to_the_promise_and_counts_them() -> None:
    agent = CoreAgent(GRAPH, GRID)
    front, first = started(agent, "clamp")
    batch = front.label(frame(T0 + 20, T0 + 300))
    assert batch.times.tolist() == [100_010, 100_030]
    assert batch.records["lt_time"].tolist() == [100_010, 100_030]
    assert batch.records["v"].tolist() == [0, 1]  # nothing dropped
    front.written(batch)
    assert front.status()["late_clamped"] == 1
    assert front.close(end=False) == 100_031  # a pause: past its newest label
    receive(agent, "ingest", first.times, first.acks)
    receive(agent, "ingest", batch.times, batch.acks)
    assert agent.step()["ingest"] == 100_031


def test_reject_returns_late_records_to_the_producer() -> None:
    agent = CoreAgent(GRAPH, GRID)
    front, first = started(agent, "reject")
    batch = front.label(pa.table({"ts": pa.array([T0 + 20, T0 + 300], pa.int64()),
                                  "v": [7, 8]}))
    assert batch.times.tolist() == [100_030] and batch.records.column("v").to_pylist() == [8]
    assert batch.rejected.column("v").to_pylist() == [7]
    front.written(batch)
    status = front.status()
    assert status["late_rejected"] == 1 and status["labelled"] == 4
    front.close(end=False)
    receive(agent, "ingest", first.times, first.acks)
    receive(agent, "ingest", batch.times, batch.acks)
    assert agent.step()["ingest"] == 100_031  # the rejected record was never in flight


def test_raise_labels_nothing_of_the_batch() -> None:
    agent = CoreAgent(GRAPH, GRID)
    front, first = started(agent, "raise")
    with pytest.raises(LateRecords, match="late='clamp' or 'reject'"):
        front.label(frame(T0 + 20, T0 + 300))
    assert front.status()["late_raised"] == 1 and front.status()["labelled"] == 3
    front.close(end=False)
    receive(agent, "ingest", first.times, first.acks)
    assert agent.step()["ingest"] == 100_011  # no ack of the refused batch was sent


def test_the_allowed_lag_labels_disorder_as_is() -> None:
    agent = CoreAgent(GRAPH, GRID)
    front = event_front(agent, "raise", lag_ms=100)
    front.written(front.label(frame(T0 + 200)))
    assert front.heartbeat() == 100_010  # newest (100_020) minus the lag
    batch = front.label(frame(T0 + 150, T0 + 100))  # disordered, within the lag
    assert batch.times.tolist() == [100_015, 100_010]


def test_event_time_needs_a_column() -> None:
    front = event_front(CoreAgent(GRAPH, GRID), "clamp")
    with pytest.raises(TypeError, match="needs records with columns"):
        front.label([b"x"])
    with pytest.raises(KeyError, match="no such column"):
        front.label(pd.DataFrame({"v": [1]}))
    with pytest.raises(ValueError, match="late must be one of"):
        Front(None, 1, CoreAgent(GRAPH, GRID), grid=GRID, heartbeat_ms=None, late="drop")
    assert np.isscalar(front.status()["late_clamped"])


def test_late_counts_show_in_the_producers_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from lowtide.spark.sources.front_metrics import FrontCollector

    front, _first = started(CoreAgent(GRAPH, GRID), "clamp")
    registry = CollectorRegistry()
    FrontCollector([front], registry)
    front.label(frame(T0, T0 + 1))
    text = generate_latest(registry).decode()
    assert 'lowtide_front_records_total{front="9",outcome="late_clamped"} 2.0' in text
    assert 'lowtide_front_in_flight_records{front="9"} 2.0' in text
