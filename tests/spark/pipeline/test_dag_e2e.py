"""End to end, DAG shapes: two sources with a lagging front and injected task
failures, unioned into an exact window, equal a batch recomputation of the same
events; two sinks on one tracker are both complete when announced."""

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
