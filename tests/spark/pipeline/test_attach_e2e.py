"""End to end, a graph that changes while it runs (rule 16): a second query started on
a running pipeline attaches its segments to the pipeline's tracker, while the first
keeps running; the second's exact windows equal a batch recomputation of its input;
detached again, the first runs on alone, and its min time never went back."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
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


def test_a_second_query_attaches_while_the_first_runs(spark, tmp_path: Path) -> None:
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
