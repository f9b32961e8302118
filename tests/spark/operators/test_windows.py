"""Exact windows without a query: durations, window assignment, acks, the graph."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import lowtide.spark.operators.windows as windows
from lowtide.core.time import TimeGrid
from lowtide.spark.operators.window_state import hold_ack, window_starts
from lowtide.spark.operators.windows import Agg, duration_ms, parse_aggs
from lowtide.spark.pipeline.builder import Pipeline


def test_doctests() -> None:
    result = doctest.testmod(windows)
    assert result.attempted > 0 and result.failed == 0


def test_durations() -> None:
    assert duration_ms("2 seconds") == 2000
    assert duration_ms("1 minute") == 60_000
    with pytest.raises(ValueError):
        duration_ms("soon")


def test_window_starts_tumbling_and_sliding() -> None:
    t = np.array([0, 99, 100, 250], np.int64)
    assert window_starts(t, 100, 100)[:, 0].tolist() == [0, 0, 100, 200]
    s = window_starts(t, 100, 50)
    assert s.tolist() == [[0, -50], [50, 0], [100, 50], [250, 200]]
    # every row lies in each of its windows
    assert ((s <= t[:, None]) & (t[:, None] < s + 100)).all()


def test_aggs_parse() -> None:
    assert parse_aggs({"n": "count", "t": ("x", "sum")}) == (
        Agg("n", "count", None), Agg("t", "sum", "x"))
    with pytest.raises(ValueError):
        parse_aggs({"t": ("x", "median")})


def test_hold_acks_are_deterministic_and_distinct() -> None:
    a = {hold_ack(7, k, s) for k in ("u1", "u2", 3) for s in (0, 100, 200)}
    assert len(a) == 9 and 0 not in a
    assert hold_ack(7, "u1", 100) == hold_ack(7, "u1", 100)
    assert hold_ack(7, "u1", 100) != hold_ack(8, "u1", 100)


def test_graph_has_a_state_segment() -> None:
    pipe = Pipeline(spark=None, grid=TimeGrid(10))
    stream = (pipe.generate(fronts=2, rate=10.0)
              .map(lambda b: b, "x long", name="parse")
              .window("2 seconds", key="x", name="win").agg(n="count"))
    assert stream.segment_names() == ["parse", "win", "win.state", "sink"]
    g = stream.graph()
    assert [g.names[u] for u in g.inbound[g.index("win.state")]] == ["win"]
    assert [g.names[u] for u in g.inbound[g.index("sink")]] == ["win.state"]
    with pytest.raises(ValueError):
        pipe2 = Pipeline(spark=None, grid=TimeGrid(10))
        pipe2.generate(fronts=1).window("15 ms", key="x")
