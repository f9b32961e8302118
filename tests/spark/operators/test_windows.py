"""Exact windows without a query: durations, window assignment, acks, the graph."""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest

import lowtide.spark.operators.windows as windows
from lowtide.core.time import TimeGrid
from lowtide.spark.operators.state_clock import holds_under, key_hash
from lowtide.spark.operators.window_state import window_starts
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
    def hold(op: int, key: Any, slot: int) -> int:
        return int(holds_under(op, key_hash(key), np.array([slot], np.int64))[0])

    a = {hold(7, k, s) for k in ("u1", "u2", 3) for s in (0, 100, 200)}
    assert len(a) == 9 and 0 not in a
    assert hold(7, "u1", 100) == hold(7, "u1", 100)
    assert hold(7, "u1", 100) != hold(8, "u1", 100)


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


def test_keys_and_aggregates_are_checked_when_described() -> None:
    from lowtide.spark.operators.windows import parse_keys

    assert parse_keys("user") == ("user",)
    assert parse_keys(["user", "region"]) == ("user", "region")
    for bad in ([], ["a", "a"], [1], None):
        with pytest.raises(ValueError, match="window key"):
            parse_keys(bad)
    assert parse_aggs({"p": ("x", "percentile", 0.9), "a": ("x", "avg")}) == (
        Agg("p", "percentile", "x", 0.9), Agg("a", "mean", "x"))
    for bad_spec in [("x", "percentile"), ("x", "percentile", 1.5), ("x", "sum", 2)]:
        with pytest.raises(ValueError):
            parse_aggs({"p": bad_spec})
    pipe = Pipeline(spark=None, grid=TimeGrid(10))
    win = pipe.generate(fronts=1).window("1 second", key=["front", "seq"])
    with pytest.raises(ValueError, match="taken by a key"):
        win.agg(seq="count")


def test_typed_partials_merge_to_the_whole() -> None:
    """Aggregating two halves and merging equals aggregating all rows, in exact types:
    longs above 2**53 with nulls, decimals, strings, timestamps."""
    from decimal import Decimal

    import pandas as pd

    from lowtide.spark.operators.window_aggs import bind_aggs, merge, partial, results

    fields = {"big": "bigint", "price": "decimal(12,2)", "name": "string", "ts": "timestamp"}
    aggs, columns = bind_aggs("w", parse_aggs({
        "n": "count", "s": ("big", "sum"), "hi": ("big", "max"), "c": ("big", "count"),
        "p": ("price", "sum"), "avg": ("price", "mean"), "lo": ("name", "min"),
        "d": ("name", "count_distinct"), "first": ("ts", "first"), "last": ("big", "last"),
        "med": ("big", "percentile", 0.5)}), fields)
    assert [a.out_type() for a in aggs] == ["bigint", "bigint", "bigint", "bigint",
                                            "decimal(22,2)", "decimal(16,6)", "string",
                                            "bigint", "timestamp", "bigint", "bigint"]
    big = [2**60 + 1, 0, 2**60 + 3, 2**60 + 2]
    valid = [True, False, True, True]
    frame = pd.DataFrame({
        "lt_agg0": big, "lt_valid0": valid,
        "lt_agg1": [Decimal("1.10"), Decimal("2.25"), None, Decimal("0.01")],
        "lt_valid1": [True, True, False, True],
        "lt_agg2": ["b", "a", "b", "c"], "lt_valid2": [True] * 4,
        "lt_agg3": pd.to_datetime([3, 1, 2, 4], unit="s"), "lt_valid3": [True] * 4})
    assert columns == ["big", "price", "name", "ts"]
    times = np.array([30, 10, 20, 40], np.int64)
    ids = np.array([1, 2, 3, 4], np.uint64)
    whole = results(aggs, partial(aggs, frame, times, ids))
    halves = merge(aggs, partial(aggs, frame[:2], times[:2], ids[:2]),
                   partial(aggs, frame[2:], times[2:], ids[2:]))
    assert results(aggs, halves) == whole
    assert whole == [4, 3 * 2**60 + 6, 2**60 + 3, 3, Decimal("3.36"), Decimal("1.120000"),
                     "a", 3, pd.Timestamp(1, unit="s").value, 2**60 + 2, 2**60 + 2]


def test_window_errors_name_the_column_and_type() -> None:
    from lowtide.spark.operators.window_aggs import bind_aggs

    with pytest.raises(ValueError, match="window 'w': aggregate 'x' reads no column 'y'"):
        bind_aggs("w", parse_aggs({"x": ("y", "sum")}), {"a": "int"})
    with pytest.raises(ValueError, match=r"sum of column 'a' \(string\) is not supported"):
        bind_aggs("w", parse_aggs({"x": ("a", "sum")}), {"a": "string"})
    with pytest.raises(ValueError, match="min of column 'a'"):
        bind_aggs("w", parse_aggs({"x": ("a", "min")}), {"a": "map<string,int>"})
