"""End to end, DAG shapes: two sources with a lagging front and injected task
failures, unioned into an exact window, equal a batch recomputation of the same
events; two sinks on one tracker are both complete when announced; a second query
attached to a running pipeline's tracker, then detached (rule 16)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, gen_expected
from tests.spark.operators.helpers import (
    AGG_COLS,
    GRID,
    STUCK_MS,
    all_input,
    batch_windows,
    check,
    parse,
    read_results,
    start_slots,
)

pytestmark = pytest.mark.spark

SCHEMA = "front int, seq long, user string, amount double"


def test_two_sources_union_window_equals_batch(spark, tmp_path: Path) -> None:
    """With a lagging front and injected task failures: in one branch before the union
    (after its tracked map sent its acks) and after the window."""
    t0 = int(time.time() * 1000)  # one t0 for both sources, for the recomputation
    a = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 1500}, t0_ms=t0)
    b = GeneratorSpec(fronts=1, first_front=2, rate=150.0, payload_bytes=4, t0_ms=t0)
    pipe = lowtide.Pipeline(spark, "union", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda bid, p: bid % 5 == 3 and p == 0)
    after = fail_once(lambda bid, p: bid % 4 == 2)
    stream = (pipe.generate(a).map(parse, SCHEMA, name="pa")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .union(pipe.generate(b).map(parse, SCHEMA, name="pb"))
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean"))
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["pa", "pb", "win", "win.state", "sink"]
    try:
        query = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                     trigger="200 milliseconds")
        query.wait_for_min_time(GRID.slot_of(t0) + 400, timeout_s=120)
        assert not query.stuck()
        query.stop()
        final = query.min_time()
    finally:
        pipe.close()
    results = read_results(tmp_path / "out")
    horizon = max(final, int(start_slots(results).max()) + 100)
    rows = pd.concat([all_input(a, t0, horizon), all_input(b, t0, horizon)])
    expected = batch_windows(rows, 100, 100)
    check(results, expected, horizon, 100, AGG_COLS)
    got = set(zip(results["user"], start_slots(results), strict=True))
    done = expected[expected["start"] + 100 <= final]
    assert set(zip(done["user"], done["start"], strict=True)) <= got
    assert done["fronts"].max() == 3  # windows hold rows of both sources
    assert len(done) >= 4


def test_union_of_different_columns_names_them(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "union-cols", grid=GRID)
    a = pipe.generate(fronts=1).map(parse, SCHEMA, name="pa")
    b = pipe.generate(fronts=1, first_front=1).map(parse, "front int, seq long", name="pb")
    try:
        with pytest.raises(ValueError, match=r"^union: input 1 and input 2 differ in "
                           r"columns: amount double vs -; user string vs -$"):
            a.union(b).to_null(checkpoint=str(tmp_path / "ckpt"))
    finally:
        pipe.close()


def test_two_sinks_on_one_tracker_both_complete(spark, tmp_path: Path) -> None:
    t0 = int(time.time() * 1000)
    specs = {"out_a": GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4,
                                    lag_ms={1: 1000}, t0_ms=t0),
             "out_b": GeneratorSpec(fronts=1, first_front=2, rate=100.0, payload_bytes=4,
                                    t0_ms=t0)}
    pipe = lowtide.Pipeline(spark, "two-sinks", grid=GRID, stuck_after_ms=STUCK_MS)
    streams = {name: pipe.generate(spec).map(parse, SCHEMA, name=f"p_{name}")
               for name, spec in specs.items()}
    pipe.start_tracker(pipe.plan(*[(s, name) for name, s in streams.items()]).graph)
    seen: dict[str, list[tuple[int, int]]] = {name: [] for name in specs}

    def writer(name: str):  # type: ignore[no-untyped-def]
        def write(df, batch_id):  # type: ignore[no-untyped-def]
            seen[name].extend((r.front, r.seq) for r in df.select("front", "seq").collect())
        return write

    t = GRID.slot_of(t0) + 200
    try:
        queries = {name: s.foreach_batch(writer(name), name=name, trigger="200 milliseconds",
                                         checkpoint=str(tmp_path / name))
                   for name, s in streams.items()}
        for name, q in queries.items():
            q.wait_for_min_time(t, timeout_s=120)
            committed = set(seen[name])  # what the sink had when completeness was announced
            expected = gen_expected(specs[name], t0, t, GRID.delta_ms)
            for front, n in expected.items():
                assert n > 0 and {(front, s) for s in range(n)} <= committed
            assert not q.stuck()
    finally:
        pipe.close()


def test_a_second_query_attaches_while_the_first_runs(spark, tmp_path: Path) -> None:
    """A graph that changes while it runs (rule 16): a second query started on a
    running pipeline attaches its segments to the pipeline's tracker while the first
    keeps running; its exact windows equal a batch recomputation of its input;
    detached again, the first runs on alone, and its min time never went back."""
    first = GeneratorSpec(fronts=1, rate=150.0, payload_bytes=4)
    pipe = lowtide.Pipeline(spark, "attach", grid=GRID, stuck_after_ms=STUCK_MS)
    seen: list[int] = []
    try:
        q1 = (pipe.generate(first).map(parse, SCHEMA, name="p1")
              .to_null(checkpoint=str(tmp_path / "ckpt1"), name="sink1",
                       trigger="200 milliseconds"))
        q1.wait_for_min_time(GRID.slot_of(int(time.time() * 1000)), timeout_s=120)
        seen.append(q1.min_time())
        # its rows start after it attached: a query reading from before the global min
        # time would be refused (rule 16)
        t0 = int(time.time() * 1000) + 5_000
        second = GeneratorSpec(fronts=2, first_front=1, rate=200.0, payload_bytes=4,
                               lag_ms={2: 600}, t0_ms=t0)
        stream = (pipe.generate(second).map(parse, SCHEMA, name="p2")
                  .window("1 second", key="user", name="win2")
                  .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                       hi=("amount", "max"), avg=("amount", "mean")))
        q2 = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt2"),
                                  name="sink2", trigger="200 milliseconds")
        assert pipe.tracker.graph.names[:2] == ("p1", "sink1")  # generation 0 kept its indices
        assert pipe.tracker.status()["generation"] == 1
        q2.wait_for_min_time(GRID.slot_of(t0) + 400, timeout_s=180)
        seen.append(q1.min_time())
        assert q1.isActive and not q2.stuck() and not q1.stuck()
        final = q2.min_time()
        reports = pipe.detach(q2)                 # stopped, its segments detached
        assert pipe.tracker.status()["generation"] == 2
        assert [r.split("'")[1] for r in reports] == ["p2", "win2", "win2.state", "sink2"]
        assert pipe.tracker.graph.detached == (2, 3, 4, 5)
        before = q1.min_time()
        q1.wait_for_min_time(before + 50, timeout_s=60)  # the first runs on, alone
        seen.append(q1.min_time())
    finally:
        pipe.close()
    assert seen == sorted(seen) and seen[-1] > seen[0]  # the first query kept moving
    results = read_results(tmp_path / "out")
    horizon = max(final, int(start_slots(results).max()) + 100)
    expected = batch_windows(pd.concat([all_input(second, t0, horizon)]), 100, 100)
    check(results, expected, horizon, 100, AGG_COLS)
    done = expected[expected["start"] + 100 <= final]
    got = set(zip(results["user"], start_slots(results), strict=True))
    assert len(done) >= 4 and set(zip(done["user"], done["start"], strict=True)) <= got
