"""End to end, a speculative ``groupBy().agg()`` (rule 13): under a lagging front and
injected task failures before and after the step, across a restart from the
checkpoint, the changelog folded after every batch is the latest version of each
(user, ``as_of``) (tombstones cancel the version they name, versions follow each
other, nothing follows a final), every row sits at its range's last slot, a batch run
again writes the same rows, and the finals (the columns of the ``groupBy`` without
``speculative()``) equal the batch aggregation below each ``as_of``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import lowtide
from lowtide.spark.sinks.changelog import finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.changelogs import ByBatch, fold_batches, run_changelog
from tests.spark.operators.helpers import (
    EVERY,
    GRID,
    SCHEMA,
    STUCK_MS,
    all_input,
    batch_running,
    parse,
)

pytestmark = pytest.mark.spark


def ends_of(rows: pd.DataFrame) -> pd.Series:
    ms = pd.to_datetime(rows["as_of"], utc=True).map(lambda t: t.value // 1_000_000)
    return ms // GRID.delta_ms


@pytest.mark.slow  # ~12 s; the changelog of running rows by default: test_speculative_running.py
def test_early_running_rows_then_finals_under_a_lagging_front_failures_and_a_restart(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
    pipe = lowtide.Pipeline(spark, "specrun", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec).map(parse, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .groupBy("user", every=f"{EVERY * GRID.delta_ms} milliseconds", name="totals")
              .agg(n="count", total=("amount", "sum")).speculative()
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["parse", "totals", "totals.state", "sink"]
    sink = ByBatch(("user", "as_of", "version", "op"))
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 1200, restart_at=100,
                                  past=100, operators=1)
    finally:
        pipe.close()
    assert not sink.rerun_differs, f"batches run again with other rows: {sink.rerun_differs}"
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    latest = fold_batches(frames, ends_of, -1, ["n", "total"])
    rows = pd.concat(frames, ignore_index=True)
    assert (rows["op"] == "tombstone").sum() > 0, "no early version was ever replaced"
    exact = finals(rows)
    assert list(exact.columns[:4]) == ["user", "n", "total", "as_of"]  # as without it
    got = exact.assign(end=ends_of(exact)).set_index(["user", "end"])
    assert got.index.is_unique, "a (user, range) final twice"
    horizon = max(final, int(got.index.get_level_values("end").max()))
    expected = batch_running(all_input(spec, t0, horizon))
    done = expected[expected.index.get_level_values("end") <= final]
    assert len(done) >= 50
    assert set(done.index) <= set(got.index), "a complete range without its final"
    assert all(latest[k][1] for k in done.index)
    assert set(got.index) <= set(expected.index)
    exp = expected.loc[got.index]
    assert (got["n"].to_numpy() == exp["n"].to_numpy()).all()
    np.testing.assert_allclose(got["total"].to_numpy(float), exp["total"].to_numpy(float))
