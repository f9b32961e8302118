"""End to end, ``groupBy(k).agg(...)`` without a window: the running count and sum per
user, one row per (user, 100 ms range with rows), equals a batch aggregation of every
row of the user below the row's ``as_of``, under a lagging front and injected task
failures before and after the step, across a restart from the checkpoint; every
(user, range) complete below the sink's min time is there, none twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.helpers import (
    EVERY,
    GRID,
    SCHEMA,
    STUCK_MS,
    all_input,
    batch_running,
    parse,
    run_timed,
)

pytestmark = pytest.mark.spark

def test_running_aggregates_equal_the_batch_below_each_as_of(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
    pipe = lowtide.Pipeline(spark, "running", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec)
              .map(parse, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .groupBy("user", every=f"{EVERY * GRID.delta_ms} milliseconds", name="totals")
              .agg(n="count", total=("amount", "sum"))
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["parse", "totals", "totals.state", "sink"]
    results, t0, final = run_timed(pipe, stream, tmp_path, 250, restart_at=100)
    assert list(results.columns) == ["user", "n", "total", "as_of", "lt_time", "lt_ack"]
    ends = pd.to_datetime(results["as_of"], utc=True).map(lambda t: t.value // 1_000_000)
    got = results.assign(end=ends.to_numpy() // GRID.delta_ms).set_index(["user", "end"])
    assert got.index.is_unique, "a (user, range) emitted twice"
    assert (got["lt_time"].to_numpy() == got.index.get_level_values("end") - 1).all()
    horizon = max(final, int(got.index.get_level_values("end").max()))
    expected = batch_running(all_input(spec, t0, horizon))
    done = expected[expected.index.get_level_values("end") <= final]
    assert len(done) >= 50
    assert set(done.index) <= set(got.index), "a complete range not emitted"
    assert set(got.index) <= set(expected.index)
    exp = expected.loc[got.index]
    assert (got["n"].to_numpy() == exp["n"].to_numpy()).all()
    np.testing.assert_allclose(got["total"].to_numpy(float), exp["total"].to_numpy(float))
